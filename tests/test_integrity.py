"""Nothing read silently wrong: every zip-based file the project writes carries its CRC-32
(`embcache.integrity`), checked before anything is read. Damaged variants of real files (byte
flips in payload and structure, truncations, zero length, foreign files) are each refused in
one line naming the file, and left on disk as they were; files from before the seals load with
a note, once."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.errors import CheckpointError
from embcache.integrity import ChecksumError, seal_zip, verify_zip
from tests.damage import damaged_variants

ROOT = Path(__file__).resolve().parents[1]


def test_every_damaged_variant_of_a_sealed_checkpoint_is_refused_by_name(tmp_path):
    path = save_checkpoint({"step": 7, "w": torch.randn(2000), "cfg": {"lr": 0.1}}, tmp_path / "ck.pt", kind="dlrm")
    assert verify_zip(path) is True
    good = path.read_bytes()
    refused = 0
    for name, data in damaged_variants(good):
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match=r"ck\.pt: (corrupt|no such|cannot)") as err:
            load_checkpoint(path, kind="dlrm")
        assert "\n" not in str(err.value), name
        assert path.read_bytes() == data, name  # a refusal changes nothing on disk
        refused += 1
    assert refused == 24 + 2 + 1 + 3 + 3
    path.write_bytes(good)
    assert load_checkpoint(path, kind="dlrm")["step"] == 7


def test_a_payload_flip_names_the_crc(tmp_path):
    w = torch.full((4096,), 0.03)
    path = save_checkpoint({"w": w}, tmp_path / "ck.pt", kind="dlrm")
    data = bytearray(path.read_bytes())
    at = bytes(data).index(w.numpy().tobytes()[:64]) + 1000  # inside the tensor's bytes
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"ck\.pt: corrupt checkpoint: CRC-32 [0-9a-f]{8}, written with"):
        load_checkpoint(path, kind="dlrm")
    # torch alone reads the damaged file without a word: the seal is what catches it
    assert not torch.equal(torch.load(path)["w"], w)


def test_files_from_before_the_seals_load_with_one_note(tmp_path, caplog):
    path = tmp_path / "old.pt"
    torch.save({"embcache_checkpoint": 1, "kind": "face", "step": 3}, path)
    with caplog.at_level(logging.WARNING, logger="embcache"):
        assert load_checkpoint(path, kind="face")["step"] == 3
        assert load_checkpoint(path, kind="face")["step"] == 3
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "old.pt has no checksum" in notes[0] and "cannot be verified" in notes[0]


@pytest.mark.parametrize("loader", ["checkpoint", "load_torch"])
def test_a_checkpoint_renamed_over_mid_read_loads_whole_old_one(tmp_path, monkeypatch, loader):
    """A reader (`dlrm evaluate`, a watcher) opens a run's checkpoint just as the run renames
    its next one over it: the check and the load read one open file, so the reader gets the
    old checkpoint whole, never the old seal against the new bytes (a false "corrupt")."""
    import embcache.integrity as integrity

    path = tmp_path / "dlrm-last.pt"
    save_checkpoint({"step": 15, "w": torch.arange(4000.0)}, path, "dlrm")
    real_crc, swapped = integrity.file_crc32, []

    def crc_after_the_writer_renamed(*args, **kwargs):
        if not swapped:  # the run writes its next checkpoint between the seal read and the CRC
            swapped.append(30)
            save_checkpoint({"step": 30, "w": torch.arange(9000.0)}, path, "dlrm")
        return real_crc(*args, **kwargs)

    monkeypatch.setattr(integrity, "file_crc32", crc_after_the_writer_renamed)
    got = load_checkpoint(path, "dlrm") if loader == "checkpoint" else integrity.load_torch(path)
    assert swapped and got["step"] == 15 and torch.equal(got["w"], torch.arange(4000.0))
    assert load_checkpoint(path, "dlrm")["step"] == 30  # the next read sees the new one


def test_seal_refuses_a_file_it_cannot_seal_and_npz_stays_readable(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, a=np.arange(5))
    seal_zip(path)
    assert verify_zip(path) is True and np.load(path)["a"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="empty comment"):
        seal_zip(path)  # sealed already
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a zip"):
        seal_zip(tmp_path / "t.txt")


def test_a_damaged_cache_state_is_refused_before_anything_changes(tmp_path):
    from embcache import CachedEmbeddingBag

    torch.manual_seed(0)
    bag = CachedEmbeddingBag(500, 4, cache_ratio=0.1, optimizer="adagrad", lr=0.05, device="cpu")
    ids = torch.randint(0, 500, (64,))
    (bag(ids, torch.arange(0, 64, 4)) ** 2).sum().backward()
    bag.save_checkpoint(tmp_path / "c")
    state = next(p for p in (tmp_path / "c").rglob("cache*.pt"))
    data = bytearray(state.read_bytes())
    data[len(data) // 3] ^= 0x01  # an eviction count, a residency entry: whatever lies there
    state.write_bytes(bytes(data))
    (bag(ids, torch.arange(0, 64, 4)) ** 2).sum().backward()
    before = {k: v.clone() for k, v in bag.state_dict().items()}
    with pytest.raises(CheckpointError, match="corrupt file: CRC-32"):
        bag.load_checkpoint(tmp_path / "c")
    after = bag.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_resume_from_a_damaged_run_checkpoint_is_one_line(small_synthetic, tmp_path):
    common = [sys.executable, "-m", "embcache", "dlrm", "train", "--data", str(small_synthetic), "--batch-size", "64",
              "--embedding-dim", "4", "--no-progress", "--checkpoint-dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(common + ["--max-steps", "2"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    last = tmp_path / "dlrm-last.pt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x10
    last.write_bytes(bytes(data))
    again = subprocess.run(common + ["--max-steps", "4", "--resume"], capture_output=True, text=True, cwd=ROOT,
                           env=env)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    lines = again.stderr.splitlines()
    assert len(lines) == 1, again.stderr[-2000:]  # one line, and it names the file and the check
    assert f"{last}: corrupt checkpoint: CRC-32" in lines[0]
    assert last.read_bytes() == bytes(data)


def _cf_params():
    from cpu_kernels.model import CFConfig, CFParams

    indptr, indices = np.array([0, 2, 3, 5]), np.array([0, 2, 1, 0, 3])
    return CFParams.init(CFConfig(dim=8), 3, 4, indptr, indices), indptr, indices


@pytest.mark.parametrize("suffix", [".npz", ".npy", ".parquet"])
def test_cf_embeddings_files_refuse_a_flipped_row_byte(tmp_path, suffix):
    from embcache.cf.data.embeddings_file import load, save

    params, _, _ = _cf_params()
    path = save(params, tmp_path / f"emb{suffix}")
    assert np.array_equal(load(path)[1], params.I)
    data = bytearray(path.read_bytes())
    at = bytes(data).index(params.I[1].tobytes()) + 2  # inside an item's row
    data[at] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"emb\{suffix}: (corrupt embeddings file|not a readable)"):
        load(path)


def test_a_cf_model_file_refuses_any_flip(tmp_path):
    from embcache.cf import CFModel

    params, indptr, indices = _cf_params()
    path = CFModel(params, indptr, indices, ["u1", "u2", "u3"], None).save(tmp_path / "m.npz")
    good = path.read_bytes()
    for name, data in damaged_variants(good, seed=1, flips=12):
        path.write_bytes(data)
        with pytest.raises((ValueError, FileNotFoundError), match=r"m\.npz: "):
            CFModel.load(path)
    path.write_bytes(good)
    assert CFModel.load(path).recommend(["u2"], k=2, exclude_seen=True)


# ------------------------------------------------------------------ prepared Parquet shards

@pytest.fixture
def prepared(tmp_path):
    from embcache.data.synthetic import generate_synthetic

    generate_synthetic(tmp_path / "d", rows=4000, scale=0.0005, seed=0)
    return tmp_path / "d"


def _flip_middle(path, count=8):
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    for i in range(count):
        data[at + i] ^= 0x5A
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_flipped_shard_is_refused_before_its_rows_are_used(prepared):
    import json

    from embcache.data.loader import CTRBatches
    from embcache.errors import DataFormatError

    meta = json.loads((prepared / "meta.json").read_text())
    rel = meta["splits"]["train"]["files"][0]
    assert set(meta["shard_crc32"]) == {f for s in meta["splits"].values() for f in s["files"]}
    damaged = _flip_middle(prepared / rel)
    with pytest.raises(DataFormatError, match=rf"{rel}: corrupt Parquet shard(, row group \d+ \(|: |\s\(its footer)"
                                              r".*CRC-32 [0-9a-f]{8}, prepared with [0-9a-f]{8}"):
        next(iter(CTRBatches(prepared, "train", 64)))
    assert (prepared / rel).read_bytes() == damaged


def test_a_flip_in_a_values_page_names_the_row_group(prepared):
    import pyarrow.parquet as pq

    from embcache.data.shard_check import damaged_row_group

    path = next((prepared / "train").glob("*.parquet"))
    column = pq.ParquetFile(path).metadata.row_group(0).column(5)  # dense_4's pages in the first row group
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert damaged_row_group(path).startswith(", row group 0 (")


def test_a_damaged_shard_stops_training_in_one_line(prepared, tmp_path):
    rel = next(iter(sorted((prepared / "train").glob("*.parquet"))))
    flipped = _flip_middle(rel)
    done = subprocess.run([sys.executable, "-m", "embcache", "dlrm", "train", "--data", str(prepared), "--batch-size",
                           "64", "--embedding-dim", "4", "--max-steps", "3", "--no-progress"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-2000:]  # one line, and it names the shard
    assert "corrupt Parquet shard" in lines[0] and rel.name in lines[0] and "AUC" not in done.stdout
    assert rel.read_bytes() == flipped  # read, not repaired or rewritten


def test_data_prepared_before_the_checksums_reads_with_one_note(prepared, caplog):
    import json

    from embcache.data.loader import CTRBatches

    meta = json.loads((prepared / "meta.json").read_text())
    del meta["shard_crc32"]
    (prepared / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="embcache"):
        rows = sum(len(b) for b in CTRBatches(prepared, "train", 500)) + sum(len(b) for b in CTRBatches(prepared, "val", 500))
    assert rows == meta["splits"]["train"]["rows"] + meta["splits"]["val"]["rows"]
    notes = [r.getMessage() for r in caplog.records if r.name == "embcache"]
    assert len(notes) == 1 and "prepared before shards carried checksums" in notes[0]


def test_a_resume_on_other_shards_with_the_same_shape_is_refused(prepared, tmp_path):
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.trainer import DLRMTrainer, data_difference, data_differs, data_fingerprint
    from embcache.data.ctr_format import read_meta

    other = tmp_path / "other"
    generate_synthetic(other, rows=4000, scale=0.0005, seed=1)  # the same features and rows, other values
    a, b = data_fingerprint(read_meta(prepared)), data_fingerprint(read_meta(other))
    assert data_differs(a, b) and not data_differs(a, a)
    assert data_difference(a, b) == "the same features and rows, but not the same shard files (prepared again, or changed)"
    old = {k: v for k, v in a.items() if k != "shards_crc32"}  # a checkpoint from before the shard checksums
    assert not data_differs(old, b)
