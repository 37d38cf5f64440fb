"""Files from someone else, read adversarially (docs/integrity.md, "Opening files from others"):
the sizes a hostile file sets before anything is checked. A checkpoint's settings size the
model a command builds (`embedding_dim`, the MLPs, `dim`, `feat_dim`, `num_classes`), a pickle's
numpy `_reconstruct` sizes an array, and `--image-size` sizes what a checkpoint embeds. Each is
refused in one line naming the file and the setting, before the model or the array is made:
the builders are replaced by ones that fail the test, so no test ever allocates the sizes asked
for. Every file is a few kilobytes."""
import pytest
import numpy as np
import torch

from embcache.cli import main
from embcache.errors import UserFacingError


class Built(AssertionError):
    """The model was built from the hostile settings: the check came too late."""


def _refuse_building(monkeypatch, owner, name):
    def built(*args, **kwargs):
        raise Built(f"{name} was called with the checkpoint's settings")
    monkeypatch.setattr(owner, name, built)


def _one_line(argv, capsys, *names):
    """Run the command: exit 1 and one line (notes and warnings aside) naming each of `names`."""
    got = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith(("warning:", "note:"))]
    assert got == 1 and "Traceback" not in "\n".join(err), err
    assert len(lines) == 1 and all(n in lines[0] for n in names), err
    return lines[0]


def _changed(path, kind, tmp_path, **settings):
    """A copy of checkpoint `path` whose config says `settings`, its tensors unchanged."""
    from embcache.checkpoint import load_checkpoint, save_checkpoint

    ck = load_checkpoint(path, kind)
    out = tmp_path / "hostile" / path.name
    save_checkpoint({**ck, "config": {**ck["config"], **settings}}, out, kind)
    return out


# ----------------------------------------------------------------- DLRM
@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    """A DLRM checkpoint of one step on a tiny synthetic set (whole tables: no table files)."""
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    root = tmp_path_factory.mktemp("sizes_dlrm")
    generate_synthetic(root / "data", rows=400, scale=0.00005, seed=0, val_rows=100, test_rows=100)
    cfg = DLRMConfig(sparse="device", epochs=1, max_steps=1, batch_size=64, dense_arch=[8], over_arch=[8],
                     embedding_dim=4, checkpoint_dir=str(root / "ck"), progress=False, device="cpu")
    DLRMTrainer(cfg, root / "data").fit()
    return root / "ck" / "dlrm-last.pt"


DLRM_SIZES = {
    "embedding_dim 10^9": ({"embedding_dim": 10 ** 9}, "embedding_dim"),
    "a bottom MLP 10^9 wide": ({"dense_arch": [10 ** 9]}, "dense_arch"),
    "a top MLP 10^9 wide": ({"over_arch": [10 ** 9]}, "over_arch"),
}


@pytest.mark.parametrize("settings,name", DLRM_SIZES.values(), ids=DLRM_SIZES.keys())
def test_a_dlrm_checkpoints_sizes_are_checked_against_its_tensors_before_the_model_is_built(
        dlrm_run, settings, name, tmp_path, capsys, monkeypatch):
    from embcache.dlrm import trainer
    from embcache.dlrm.config import DLRMConfig
    from embcache.train.run import checkpoint_to_evaluate

    path = _changed(dlrm_run, "dlrm", tmp_path, **settings)
    _refuse_building(monkeypatch, trainer, "build_model")
    line = _one_line(["dlrm", "evaluate", path, "--device", "cpu"], capsys, path.name, name)
    assert "tensors" in line
    _one_line(["dlrm", "export", path, "--out", tmp_path / "export"], capsys, path.name, name)
    with pytest.raises(UserFacingError, match=f"dlrm-last.pt: .*{name}"):
        checkpoint_to_evaluate(path, "dlrm", DLRMConfig, "cpu")


def test_a_raw_key_dlrm_checkpoints_max_rows_is_checked_against_its_tables(tmp_path, capsys, monkeypatch):
    """Hashed raw keys: every table has --max-rows rows, which a checkpoint could say are 10^12."""
    from embcache.checkpoint import load_checkpoint
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm import trainer

    generate_synthetic(tmp_path / "raw", rows=300, scale=0.00005, seed=0, val_rows=100, test_rows=100, keys="raw")
    cfg = trainer.DLRMConfig(sparse="device", raw_keys="hash", max_rows=50, epochs=1, max_steps=1, batch_size=64,
                             dense_arch=[8], over_arch=[8], embedding_dim=4, checkpoint_dir=str(tmp_path / "ck"),
                             progress=False, device="cpu")
    trainer.DLRMTrainer(cfg, tmp_path / "raw").fit()
    held = trainer.DLRMConfig.sizes_in_checkpoint(load_checkpoint(tmp_path / "ck" / "dlrm-last.pt", "dlrm"))
    assert held == {"dense_arch": [8], "embedding_dim": 4, "over_arch": [8], "max_rows": 50}
    path = _changed(tmp_path / "ck" / "dlrm-last.pt", "dlrm", tmp_path, max_rows=10 ** 12)
    _refuse_building(monkeypatch, trainer, "build_model")
    _one_line(["dlrm", "evaluate", path, "--device", "cpu"], capsys, path.name, "max_rows 1000000000000")


def test_an_honest_dlrm_checkpoint_still_says_its_own_sizes(dlrm_run):
    from embcache.dlrm.config import DLRMConfig
    from embcache.train.run import checkpoint_to_evaluate

    _, ck, cfg = checkpoint_to_evaluate(dlrm_run, "dlrm", DLRMConfig, "cpu")
    assert DLRMConfig.sizes_in_checkpoint(ck) == {"dense_arch": [8], "embedding_dim": 4, "over_arch": [8]}


# ----------------------------------------------------------------- cf
@pytest.fixture(scope="module")
def cf_run(tmp_path_factory):
    """A cf checkpoint of one epoch on a tiny LightGCN-format directory."""
    from embcache.cf.data.synthetic import power_law_interactions

    root = tmp_path_factory.mktemp("sizes_cf")
    data = power_law_interactions(num_users=60, num_items=80, interactions=900, communities=3, seed=2)
    (root / "data").mkdir()
    for name, indptr, indices in (("train.txt", data.train_indptr, data.train_indices),
                                  ("test.txt", data.test_indptr, data.test_indices)):
        lines = [" ".join(map(str, [u, *indices[indptr[u]:indptr[u + 1]]])) for u in range(data.num_users)]
        (root / "data" / name).write_text("\n".join(lines) + "\n")
    assert main(["cf", "train", "--no-progress", "--negatives", "4", "--threads", "1", "--dim", "8", "--epochs", "1",
                 "--data", str(root / "data"), "--checkpoint-dir", str(root / "ck")]) == 0
    return root / "ck" / "cf-last.pt", root / "data"


def test_a_cf_checkpoints_dim_is_checked_against_its_rows_before_tables_are_made(cf_run, tmp_path, capsys,
                                                                                  monkeypatch):
    from cpu_kernels.model import CFParams

    checkpoint, data = cf_run
    path = _changed(checkpoint, "cf", tmp_path, dim=10 ** 9)
    _refuse_building(monkeypatch, CFParams, "init")
    capsys.readouterr()
    _one_line(["cf", "train", "--no-progress", "--threads", "1", "--data", data, "--epochs", "2",
               "--checkpoint-dir", path.parent, "--resume"], capsys, path.name, "dim")
    _one_line(["cf", "evaluate", path, "--data", data], capsys, path.name, "dim")


# ----------------------------------------------------------------- face, with its training data
@pytest.fixture(scope="module")
def face_run(tmp_path_factory):
    """A face checkpoint (fc head: a row a class) of a few steps on synthetic feature vectors."""
    from embcache.face.trainer import FaceConfig, FaceTrainer

    root = tmp_path_factory.mktemp("sizes_face")
    cfg = FaceConfig(num_classes=20, feat_dim=8, head="fc", epochs=1, max_steps=2, batch_size=16, eval_classes=10,
                     eval_pairs=40, synthetic_dim=24, progress=False, device="cpu", checkpoint_dir=str(root / "ck"))
    FaceTrainer(cfg).fit()
    return root / "ck" / "face-last.pt"


FACE_SIZES = {
    "feat_dim 10^11": ({"feat_dim": 10 ** 11}, "feat_dim"),
    "10^12 classes": ({"num_classes": 10 ** 12}, "num_classes"),
    "feature vectors of 10^10": ({"synthetic_dim": 10 ** 10}, "synthetic_dim"),
    "images of side 10^6": ({"image_size": 10 ** 6}, "--image-size 1000000"),
}


@pytest.mark.parametrize("settings,name", FACE_SIZES.values(), ids=FACE_SIZES.keys())
def test_a_face_checkpoints_sizes_are_checked_before_its_trainer_is_built(face_run, settings, name, tmp_path,
                                                                           capsys, monkeypatch):
    from embcache.face import trainer

    path = _changed(face_run, "face", tmp_path, **settings)
    _refuse_building(monkeypatch, trainer.FaceTrainer, "__init__")
    _one_line(["face", "evaluate", path, "--device", "cpu"], capsys, path.name, name)


def test_an_honest_face_checkpoint_still_says_its_own_sizes(face_run):
    from embcache.face.config import FaceConfig
    from embcache.train.run import checkpoint_to_evaluate

    _, ck, cfg = checkpoint_to_evaluate(face_run, "face", FaceConfig, "cpu")
    assert FaceConfig.sizes_in_checkpoint(ck) == {"feat_dim": 8, "num_classes": 20, "synthetic_dim": 24}


# ----------------------------------------------------------------- face: one largest image side
def test_face_training_takes_no_image_side_a_checkpoint_could_not_be_opened_with(capsys):
    from embcache.face import use
    from embcache.face.config import MAX_SIDE, FaceConfig

    assert use.MAX_SIDE is MAX_SIDE  # one bound for training and for opening
    assert FaceConfig(data="faces", image_size=MAX_SIDE).image_size == MAX_SIDE  # synthetic: MAX_SYNTHETIC_BYTES
    with pytest.raises(ValueError, match=f"--image-size {MAX_SIDE + 1}: .*0 to {MAX_SIDE}"):
        FaceConfig(image_size=MAX_SIDE + 1)
    with pytest.raises(SystemExit):
        main(["face", "train", "--image-size", str(MAX_SIDE + 1)])
    assert f"must be from 0 to {MAX_SIDE}" in capsys.readouterr().err


# ----------------------------------------------------------------- numpy's _reconstruct in a torch file
class _LargerThanItsFile:
    """Unpickled, numpy's `_reconstruct` (an allowed type) makes an empty array of 10 MB: small
    for a test, and ten thousand times the file that asks for it."""

    def __reduce__(self):
        return (np.core.multiarray._reconstruct, (np.ndarray, (10_000_000,), b"b"))


def test_a_torch_file_cannot_ask_numpy_for_an_array_larger_than_itself(tmp_path, capsys, monkeypatch):
    from embcache.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint({"rows": _LargerThanItsFile()}, tmp_path / "dlrm-last.pt", "dlrm")
    assert path.stat().st_size < 10_000
    with pytest.raises(UserFacingError, match="dlrm-last.pt: .*an array of shape \\(10000000,\\), more than the "
                                              "file's [0-9,]+ bytes hold"):
        load_checkpoint(path, "dlrm")
    assert "more than the file's" in _one_line(["upgrade", path], capsys, path.name)
    # numpy arrays a real file holds (as cf's rows and object arrays) still load
    rows = np.arange(5000, dtype=np.float32).reshape(1000, 5)
    path = save_checkpoint({"rows": rows, "names": np.array(["a", {"b": 1}], dtype=object)}, path, "dlrm")
    ck = load_checkpoint(path, "dlrm")
    assert np.array_equal(ck["rows"], rows) and ck["names"][1] == {"b": 1} and torch.is_tensor(torch.ones(1))
