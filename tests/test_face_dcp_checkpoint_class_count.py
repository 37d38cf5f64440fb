"""A dcp checkpoint from someone else (docs/integrity.md, "Opening files from others"): the
dynamic class pool keeps no row a class, so no tensor says `num_classes`, and the head was left
out of the check of the settings that size the model. `num_classes` 10^11 beside a small run's
tensors sized a pool of 10^10 slots (terabytes) and an identity table of 800 GB before anything
was compared. The pool's slots bound it now: refused in one line naming the file and the
setting, the builders replaced by ones that fail, so no test allocates what is asked for."""
import pytest

from embcache.cli import main
from tests.test_files_from_others_sizes import _changed, _one_line, _refuse_building


def _dcp_run(root, num_classes: int, batch_size: int):
    from embcache.face.trainer import FaceConfig, FaceTrainer

    cfg = FaceConfig(num_classes=num_classes, feat_dim=8, head="dcp", epochs=1, max_steps=1, batch_size=batch_size,
                     eval_classes=10, eval_pairs=40, synthetic_dim=24, progress=False, device="cpu",
                     checkpoint_dir=str(root))
    trainer = FaceTrainer(cfg)
    trainer.fit()
    return root / "face-last.pt", trainer.head.pool.num_slots


@pytest.fixture(scope="module")
def dcp_run(tmp_path_factory):
    """100 classes at pool_ratio 0.1: a pool of 10 slots."""
    return _dcp_run(tmp_path_factory.mktemp("dcp_sizes"), 100, 16)[0]


HOSTILE = {
    "10^11 classes (10^10 slots at pool_ratio 0.1)": {"num_classes": 10 ** 11},
    "10^11 classes on an image folder's data": {"num_classes": 10 ** 11, "data": "/elsewhere/faces"},
    "10^11 classes a step at a tiny pool_ratio": {"num_classes": 10 ** 11, "pool_ratio": 1e-12,
                                                   "batch_size": 10 ** 12},
    "a pool_ratio that is not a number": {"pool_ratio": float("nan")},
}


@pytest.mark.parametrize("settings", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_dcp_checkpoints_classes_are_bounded_by_its_pool_before_anything_is_built(dcp_run, settings, tmp_path,
                                                                                     capsys, monkeypatch):
    from embcache.face import trainer

    path = _changed(dcp_run, "face", tmp_path, **settings)
    _refuse_building(monkeypatch, trainer.FaceTrainer, "__init__")
    line = _one_line(["face", "evaluate", path, "--device", "cpu"], capsys, path.name, "num_classes")
    assert "10 pool slots" in line and "in its tensors" in line


def test_classes_a_tiny_pool_ratio_allows_size_nothing_evaluate_builds(dcp_run, tmp_path, capsys, monkeypatch):
    """num_classes 10^11 at pool_ratio 10^-10 sizes the pool of the run's 10 slots, as an honest
    run of those settings would: nothing refuses it, and nothing evaluate builds is a table of
    the classes (the identity loader took arange(num_classes), 800 GB, before any step)."""
    from embcache.face.data.synthetic import SyntheticFaces

    path = _changed(dcp_run, "face", tmp_path, num_classes=10 ** 11, pool_ratio=1e-10)
    _refuse_building(monkeypatch, SyntheticFaces, "eligible_identities")
    assert main(["face", "evaluate", str(path), "--device", "cpu"]) == 0, capsys.readouterr().err
    assert '"synthetic": {"accuracy"' in capsys.readouterr().out


@pytest.mark.parametrize("num_classes,batch_size,slots", [(100, 16, 10), (20, 32, 8)], ids=["unraised", "raised"])
def test_an_honest_dcp_checkpoint_passes(num_classes, batch_size, slots, tmp_path):
    """Its pool as pool_ratio sizes it, or raised to the identities a step brings: passes."""
    from embcache.checkpoint import load_checkpoint
    from embcache.face.config import FaceConfig
    from embcache.train.run import checkpoint_to_evaluate

    path, built = _dcp_run(tmp_path, num_classes, batch_size)
    assert built == slots
    assert FaceConfig.sizes_in_checkpoint(load_checkpoint(path, "face")) == {"feat_dim": 8, "synthetic_dim": 24}
    checkpoint_to_evaluate(path, "face", FaceConfig, "cpu")


def test_the_loader_draws_the_same_identities_without_a_table_of_them():
    """A synthetic source's identities are all of 0 .. C-1: the order drawn is the table's."""
    import torch

    from embcache.face.data.loaders import IdentityLoader
    from embcache.face.data.synthetic import SyntheticFaces

    source = SyntheticFaces(50, dim=8, id_dim=4)
    lazy, table = IdentityLoader(source, 8, seed=3), IdentityLoader(source, 8, seed=3)
    table.identities = source.eligible_identities()
    assert lazy.identities is None and lazy.count == 50 and lazy.steps_per_epoch == 6
    for epoch, step in ((0, 0), (0, 5), (1, 2)):
        assert all(torch.equal(x, y) for x, y in zip(lazy.batch(epoch, step), table.batch(epoch, step)))
