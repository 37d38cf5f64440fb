import pytest
import torch

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.errors import CheckpointError


def test_round_trip_and_kind_check(tmp_path):
    path = save_checkpoint({"step": 3, "w": torch.arange(4)}, tmp_path / "a.pt", kind="dlrm")
    got = load_checkpoint(path, kind="dlrm")
    assert got["step"] == 3 and torch.equal(got["w"], torch.arange(4))
    with pytest.raises(CheckpointError, match="'dlrm' checkpoint, expected 'face'"):
        load_checkpoint(path, kind="face")


def test_truncated_checkpoint_is_refused_with_its_name(tmp_path):
    path = save_checkpoint({"w": torch.randn(1000)}, tmp_path / "b.pt", kind="dlrm")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"b\.pt: corrupt or truncated"):
        load_checkpoint(path, kind="dlrm")


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope.pt", kind="dlrm")
