"""A face checkpoint from someone else (docs/integrity.md, "Opening files from others"): the
settings that size a synthetic run's evaluation, which no tensor of the file holds and so
`held_sizes` cannot compare. `face evaluate` generated what the config said: eval_pairs
10^12 pairs, eval_classes 10^9 held-out identities (and their 2e x e identification
scores), a synthetic image run's synthetic_dim 10^6 (a 10^6 x 10^6 rotation and its QR), or
an image side whose evaluation set alone is 170 GB. Each is bounded now by a constant of
`embcache.face.config`, and refused in one line naming the file, the setting and its limit,
the builders replaced by ones that fail, so no test allocates what is asked for."""
import pytest

from embcache.cli import main
from embcache.face import config
from tests.test_files_from_others_sizes import _changed, _one_line, _refuse_building


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A face checkpoint (fc head) of one step on synthetic feature vectors."""
    from embcache.face.trainer import FaceConfig, FaceTrainer

    root = tmp_path_factory.mktemp("eval_sizes")
    cfg = FaceConfig(num_classes=20, feat_dim=8, head="fc", epochs=1, max_steps=1, batch_size=16, eval_classes=10,
                     eval_pairs=40, synthetic_dim=24, progress=False, device="cpu", checkpoint_dir=str(root))
    FaceTrainer(cfg).fit()
    return root / "face-last.pt"


HOSTILE = {
    "10^12 verification pairs": ({"eval_pairs": 10 ** 12}, "eval_pairs", f"{config.MAX_EVAL_PAIRS}"),
    "10^9 held-out identities": ({"eval_classes": 10 ** 9}, "eval-classes", f"{config.MAX_EVAL_CLASSES}"),
    "pairs that are not a number": ({"eval_pairs": "many"}, "eval_pairs", f"{config.MAX_EVAL_PAIRS}"),
    "an image run's synthetic_dim 10^6": ({"image_size": 16, "synthetic_dim": 10 ** 6}, "synthetic_dim",
                                          f"{config.MAX_SYNTHETIC_DIM}"),
    "images whose evaluation set is 170 GB": ({"image_size": config.MAX_SIDE, "eval_pairs": 6000, "eval_classes": 500},
                                              "image_size", "MAX_SYNTHETIC_BYTES"),
}


@pytest.mark.parametrize("settings,name,limit", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_checkpoints_evaluation_sizes_are_bounded_before_anything_is_built(run, settings, name, limit, tmp_path,
                                                                              capsys, monkeypatch):
    from embcache.face import trainer
    from embcache.face.data.synthetic import SyntheticFaces

    path = _changed(run, "face", tmp_path, **settings)
    _refuse_building(monkeypatch, trainer.FaceTrainer, "__init__")
    _refuse_building(monkeypatch, SyntheticFaces, "__init__")
    _one_line(["face", "evaluate", path, "--device", "cpu"], capsys, path.name, name, limit)


def test_an_honest_checkpoint_is_still_evaluated(run, capsys):
    assert main(["face", "evaluate", str(run), "--device", "cpu"]) == 0, capsys.readouterr().err
    assert '"synthetic": {"accuracy"' in capsys.readouterr().out


def test_the_defaults_and_each_limit_alone_are_taken():
    """No honest setting is refused: the defaults (and images of the face sets' 112), and each
    limit with the others at their defaults; a synthetic image side is bounded by what its
    evaluation set holds, an image folder's by MAX_SIDE alone."""
    FaceConfig = config.FaceConfig
    FaceConfig(), FaceConfig(image_size=112), FaceConfig(data="faces", image_size=config.MAX_SIDE)
    FaceConfig(eval_pairs=config.MAX_EVAL_PAIRS), FaceConfig(eval_classes=config.MAX_EVAL_CLASSES)
    FaceConfig(synthetic_dim=config.MAX_SYNTHETIC_DIM)
    with pytest.raises(ValueError, match=f"eval_pairs {config.MAX_EVAL_PAIRS + 1}: .* to {config.MAX_EVAL_PAIRS}"):
        FaceConfig(eval_pairs=config.MAX_EVAL_PAIRS + 1)
    with pytest.raises(ValueError, match="image_size 1024.* GB, more than the 16 GiB"):
        FaceConfig(image_size=config.MAX_SIDE)


@pytest.mark.parametrize("flags,said", [(["--eval-classes", str(config.MAX_EVAL_CLASSES + 1)],
                                          f"must be from 2 to {config.MAX_EVAL_CLASSES}"),
                                         (["--eval-classes", "1"], "must be from 2 to"),
                                         (["--image-size", "512"], "MAX_SYNTHETIC_BYTES")],
                         ids=["eval-classes over the limit", "one identity, no impostor pairs", "synthetic images"])
def test_a_users_flag_past_the_limit_is_one_line_before_any_work(flags, said, capsys, monkeypatch):
    """The flag's bound is the config's (`SIZE_LIMITS`): refused as a checkpoint saying it
    would be. --eval-classes 1 trained a whole epoch and then failed in a traceback (no
    impostor pair has two identities to draw from)."""
    from embcache.face import trainer

    _refuse_building(monkeypatch, trainer.FaceTrainer, "__init__")
    try:
        got = main(["face", "train", "--device", "cpu", "--no-progress", *flags])
    except SystemExit as exit:  # argparse: its usage, then the one line of the error
        got = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert got in (1, 2) and "Traceback" not in "\n".join(err) and said in err[-1], err
