"""The DLRM checkpoint's table parts: raw files with CRC-32, copied chunk by chunk and read
back through private mappings; damaged ones refused in one line naming the file; the
torch-file parts of earlier versions still resumed."""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from embcache.checkpoint import FORMAT_KEY, load_checkpoint, save_checkpoint
from embcache.distributed.table_checkpoint import full_tables
from embcache.errors import CheckpointError
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer


@pytest.fixture(scope="module")
def synthetic(small_synthetic):
    return small_synthetic


def _config(checkpoint_dir, **kw):
    return replace(DLRMConfig(batch_size=256, eval_batch_size=4096, embedding_dim=8, dense_arch=[16],
                              over_arch=[16], device="cpu", progress=False, epochs=1, cache_ratio=0.02,
                              checkpoint_dir=str(checkpoint_dir), checkpoint_every=5), **kw)


@pytest.fixture(scope="module")
def checkpointed(synthetic, tmp_path_factory):
    """A run stopped at step 10 with its checkpoint, and the same run taken to step 20."""
    ck = tmp_path_factory.mktemp("ck")
    DLRMTrainer(_config(ck, max_steps=10), synthetic).fit()
    whole = DLRMTrainer(_config(tmp_path_factory.mktemp("whole"), max_steps=20), synthetic)
    whole.fit()
    return ck, whole


def _parts(ck: Path) -> list[Path]:
    manifest = load_checkpoint(ck / "dlrm-last.pt", "dlrm")["tables"]
    return [ck / manifest["dir"] / file for t in manifest["tables"].values() for _, _, file in t["parts"]]


def _resume_tables(synthetic, ck: Path) -> dict:
    trainer = DLRMTrainer(_config(ck, max_steps=20, resume=True), synthetic)
    trainer.fit()
    return {t.name: trainer.sparse.local.table_weight(t.name).clone() for t in trainer.sparse.embedding_bag_configs()}


def _whole_tables(whole) -> dict:
    return {t.name: whole.sparse.local.table_weight(t.name) for t in whole.sparse.embedding_bag_configs()}


def test_parts_are_checked_files_and_read_back_unchangeable(checkpointed, tmp_path):
    ck, _ = checkpointed
    parts = _parts(ck)
    assert parts and all(p.is_dir() and (p / "header.json").is_file() for p in parts)
    ckpt = load_checkpoint(ck / "dlrm-last.pt", "dlrm")
    tables = full_tables(ck / "dlrm-last.pt", ckpt["tables"])
    name = next(iter(tables))
    before = (parts[0] / "weight.bin").read_bytes()
    tables[name]["weight"].add_(1.0)  # a private mapping: the file stays as saved
    assert (parts[0] / "weight.bin").read_bytes() == before


def test_resume_from_parts_equals_the_uninterrupted_run(synthetic, checkpointed, tmp_path):
    import shutil

    ck, whole = checkpointed
    copy = tmp_path / "ck"
    shutil.copytree(ck, copy)
    got, want = _resume_tables(synthetic, copy), _whole_tables(whole)
    assert got.keys() == want.keys()
    for name in got:
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_a_damaged_part_is_one_line_naming_it(synthetic, checkpointed, tmp_path, damage):
    import shutil

    ck, _ = checkpointed
    copy = tmp_path / "ck"
    shutil.copytree(ck, copy)
    part = _parts(copy)[-1]
    target = part / ("header.json" if damage == "header" else "weight.bin")
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = data[:10]
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        DLRMTrainer(_config(copy, max_steps=20, resume=True), synthetic).fit()
    message = str(err.value)
    assert str(target) in message and "\n" not in message


def test_torch_file_parts_of_earlier_versions_still_resume(synthetic, checkpointed, tmp_path):
    """Parts were one torch file each (`<table>.<start>-<stop>.pt`) before they were
    directories of raw files."""
    import shutil

    ck, whole = checkpointed
    copy = tmp_path / "ck"
    shutil.copytree(ck, copy)
    payload = load_checkpoint(copy / "dlrm-last.pt", "dlrm")
    manifest = payload["tables"]
    tables = full_tables(copy / "dlrm-last.pt", manifest)
    for name, table in manifest["tables"].items():
        for part in table["parts"]:
            start, stop, file = part
            torch.save({k: v[start:stop].clone() for k, v in tables[name].items()},
                       copy / manifest["dir"] / f"{file}.pt")
            shutil.rmtree(copy / manifest["dir"] / file)
            part[2] = f"{file}.pt"
    save_checkpoint({k: v for k, v in payload.items() if k not in (FORMAT_KEY, "kind")}, copy / "dlrm-last.pt", "dlrm")
    got, want = _resume_tables(synthetic, copy), _whole_tables(whole)
    for name in got:
        assert torch.equal(got[name], want[name]), name
