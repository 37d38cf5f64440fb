"""Parallel reading (`embcache.data.parallel`): the one-thread loader's batches to the bit, in its
order, with its resume, rank slices and errors (at the same batch), bounded memory, and no
reader thread left behind however the loop ends."""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embcache.data.ctr_format import CTRDatasetWriter, read_meta
from embcache.data.loader import CTRBatches
from embcache.data.parallel import ParallelBatches, chunk_plan, default_readers
from embcache.data.synthetic import generate_synthetic
from embcache.errors import DataFormatError
from tests.shard_edit import write_shard
from tests.test_data_loader import FEATURES, row_lists


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """2,500 Criteo-shaped rows in shards of 900, row groups of at most 256 rows (the
    generator's chunks): batches and chunks cross both."""
    out = tmp_path_factory.mktemp("parallel_synthetic")
    generate_synthetic(out, rows=2500, scale=0.0005, seed=1, chunk_rows=256, rows_per_shard=900)
    return out


def readers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("embcache-reader")]


def assert_same(got: list, want: list) -> None:
    """Batch by batch, to the bit: dense (as raw bits), ids, lengths, labels, global size."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a.dense.view(torch.int32), b.dense.view(torch.int32))
        assert torch.equal(a.labels.view(torch.int32), b.labels.view(torch.int32))
        assert torch.equal(a.sparse.values(), b.sparse.values())
        assert torch.equal(a.sparse.lengths(), b.sparse.lengths())
        assert a.sparse.keys() == b.sparse.keys() and a.global_size == b.global_size


def parallel(loader, readers, chunk_rows=150, **options) -> list:
    with ParallelBatches(loader, readers, chunk_rows=chunk_rows, **options) as batches:
        assert len(batches) == len(loader)
        return list(batches)


@pytest.mark.parametrize("readers", [1, 2, 3])
@pytest.mark.parametrize("options", [
    {}, {"start_batch": 7}, {"shuffle_shards": True, "seed": 3}, {"drop_last": True},
    {"part": (1, 3)}, {"start_batch": 5, "part": (0, 2), "shuffle_shards": True},
])
def test_parallel_batches_are_the_one_thread_batches_to_the_bit(shards, readers, options):
    loader = CTRBatches(shards, "train", 64, **options)
    assert_same(parallel(loader, readers), list(loader))


def test_chunks_of_any_length_and_a_start_past_the_end(shards):
    loader = CTRBatches(shards, "train", 100)
    want = list(loader)
    for chunk_rows in (1, 100, 250, 10_000):  # one batch a chunk, ..., the whole epoch in one chunk
        assert_same(parallel(loader, 2, chunk_rows), want)
    assert parallel(CTRBatches(shards, "train", 100, start_batch=25), 2) == []
    assert parallel(CTRBatches(shards, "train", 100, start_batch=99), 2) == []


def test_stop_ends_before_a_batch_and_reads_no_further(shards):
    loader = CTRBatches(shards, "train", 64, start_batch=3)
    made = []
    for stop in (3, 4, 10, 11, 30, 100):
        made.clear()
        with ParallelBatches(loader, 2, chunk_rows=128, stop=stop, transform=lambda b: made.append(1) or b) as it:
            assert len(it) == max(min(stop, loader.batches_per_epoch()) - 3, 0)
            got = list(it)
        assert_same(got, list(loader)[: max(stop - 3, 0)])
        assert len(made) == len(got)  # nothing past `stop` was made


def test_multi_hot_batches_are_the_same(tmp_path):
    w = CTRDatasetWriter(tmp_path, 2, FEATURES, source="test", rows_per_shard=7, row_group_rows=3)
    for start, n in ((0, 10), (10, 13), (23, 30)):
        _, label, dense, sparse, _ = row_lists(n, start)
        w.write("train", label, dense, sparse)
    w.finish()
    for options in ({}, {"start_batch": 3}, {"part": (1, 2)}):
        loader = CTRBatches(tmp_path, "train", 4, **options)
        for readers in (1, 2, 3):
            assert_same(parallel(loader, readers, chunk_rows=5), list(loader))


def _one_thread_until_error(loader) -> tuple[list, str]:
    got = []
    with pytest.raises(DataFormatError) as err:
        for batch in loader:
            got.append(batch)
    return got, str(err.value)


def _parallel_until_error(loader, readers) -> tuple[list, str]:
    got = []
    with pytest.raises(DataFormatError) as err:
        with ParallelBatches(loader, readers, chunk_rows=150) as batches:
            for batch in batches:
                got.append(batch)
    return got, str(err.value)


def test_a_bad_row_stops_at_the_same_batch_with_the_same_line(shards, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(shards, data)
    path = data / read_meta(data)["splits"]["train"]["files"][1]
    table = pq.read_table(path)
    ids = table.column("sparse_3").to_numpy().copy()
    ids[500] = 10**9  # row 500 of the second shard: row 1,400 of the epoch, batch 21 at 64 a batch
    table = table.set_column(table.schema.get_field_index("sparse_3"), "sparse_3", pa.array(ids))
    write_shard(table, path, row_group_size=256)
    loader = CTRBatches(data, "train", 64)
    want, message = _one_thread_until_error(loader)
    assert len(want) == 21 and "part-00001.parquet: row 500: sparse_3 id 1000000000 outside" in message
    for readers in (1, 2, 3):
        got, line = _parallel_until_error(loader, readers)
        assert line == message
        assert_same(got, want)
    assert not readers_alive()


def test_a_damaged_shard_stops_at_the_same_batch(shards, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(shards, data)
    path = data / read_meta(data)["splits"]["train"]["files"][2]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # its CRC-32 no longer matches meta.json's
    path.write_bytes(bytes(raw))
    loader = CTRBatches(data, "train", 64)
    want, message = _one_thread_until_error(loader)
    assert "part-00002.parquet: corrupt Parquet shard" in message and len(want) == 1800 // 64
    for readers in (2, 3):
        got, line = _parallel_until_error(loader, readers)
        assert line == message
        assert_same(got, want)
    assert not readers_alive()


def test_no_reader_outlives_close_break_or_ctrl_c(shards):
    loader = CTRBatches(shards, "train", 32)
    batches = ParallelBatches(loader, 3, chunk_rows=64)
    next(batches)
    batches.close()
    batches.close()  # twice is fine
    assert not readers_alive() and list(batches) == []
    with ParallelBatches(loader, 2, chunk_rows=64) as batches:
        for _ in batches:
            break
    assert not readers_alive()
    with pytest.raises(KeyboardInterrupt):
        with ParallelBatches(loader, 2, chunk_rows=64) as batches:
            next(batches)
            raise KeyboardInterrupt
    assert not readers_alive()

    def interrupted(batch):
        raise KeyboardInterrupt  # as a reader meets it: handed to the consumer, raised there

    with pytest.raises(KeyboardInterrupt):
        next(ParallelBatches(loader, 2, chunk_rows=64, transform=interrupted))
    assert not readers_alive()


def test_readers_decode_their_own_chunks_and_open_each_shard_once(tmp_path, monkeypatch):
    """Row groups of 32 rows, chunks of 5 batches of 64: the three readers together decode
    the epoch once and at most two row groups more a chunk (where a chunk starts or ends
    inside one), not each the whole epoch; each opens every shard once."""
    from embcache.data import loader as module

    generate_synthetic(tmp_path, rows=2500, scale=0.0005, seed=1, chunk_rows=32, rows_per_shard=900)
    decoded, opened = [], []
    read = module.read_shard
    monkeypatch.setattr(module, "read_shard", lambda *a, **k: (decoded.append(r.num_rows) or r for r in read(*a, **k)))
    open_shard = CTRBatches._open
    monkeypatch.setattr(CTRBatches, "_open", lambda self, path: opened.append((threading.current_thread().name, path))
                        or open_shard(self, path))
    loader = CTRBatches(tmp_path, "train", 64)
    want = list(loader)
    decoded.clear()
    opened.clear()
    with ParallelBatches(loader, 3, chunk_rows=320) as batches:
        assert_same(list(batches), want)
        chunks = len(batches._chunks)
    assert chunks == 8 and 2500 <= sum(decoded) <= 2500 + 2 * 32 * chunks
    assert len(opened) == len(set(opened)) <= 3 * 3  # three shards, three readers


def test_memory_is_a_chunk_per_reader(shards):
    """Readers stop when their chunk's batches wait untaken: at most a chunk queued per
    reader, and the one each reader has in hand."""
    made = []
    loader = CTRBatches(shards, "train", 16)
    with ParallelBatches(loader, 2, ahead=3, chunk_rows=1, transform=lambda b: made.append(1) or b) as batches:
        next(batches)
        time.sleep(0.5)  # readers run until their queues are full
        assert batches.chunk_batches == 3
        assert len(made) <= 1 + 2 * (3 + 1)
    assert not readers_alive() and len(loader) > 20


def test_transform_runs_in_the_readers_and_keeps_the_order(shards):
    loader = CTRBatches(shards, "train", 100)
    seen = set()

    def first_label(batch):
        seen.add(threading.current_thread().name)
        return float(batch.dense[0, 0])

    assert parallel(loader, 2, transform=first_label) == [float(b.dense[0, 0]) for b in loader]
    assert seen == {"embcache-reader-train-0", "embcache-reader-train-1"}


def test_a_pipelined_dlrm_run_reads_in_parallel_with_the_same_results(monkeypatch, tmp_path):
    """A run over an epoch's end (12 batches an epoch, shards shuffled), read by 3 readers
    (chunks of 2 batches) to step 7 and resumed by 2, ends where one run read by one thread
    ends: tables, optimizer state, residency, history."""
    from embcache.data import parallel as module
    from embcache.dlrm.trainer import DLRMTrainer
    from tests.test_dlrm import assert_same_checkpoint
    from tests.test_dlrm_pipeline import small_config

    data = tmp_path / "data"
    generate_synthetic(data, rows=3000, scale=0.001, seed=0, rows_per_shard=700, chunk_rows=300)
    monkeypatch.setattr(module, "CHUNK_ROWS", 512)
    made = []
    monkeypatch.setattr(module.ParallelBatches, "_put", lambda self, w, e, put=module.ParallelBatches._put:
                        made.append(w) or put(self, w, e))
    ck = {name: tmp_path / name for name in ("whole", "parts")}
    DLRMTrainer(small_config(epochs=2, max_steps=15, readers=1, checkpoint_dir=str(ck["whole"])), data).fit()
    assert not made  # one reader: the background thread, as before
    DLRMTrainer(small_config(epochs=2, max_steps=7, readers=3, checkpoint_dir=str(ck["parts"])), data).fit()
    assert set(made) == {0, 1, 2}  # all three readers read
    DLRMTrainer(small_config(epochs=2, max_steps=15, readers=2, checkpoint_dir=str(ck["parts"]), resume=True),
                data).fit()
    assert_same_checkpoint(ck["whole"] / "dlrm-last.pt", ck["parts"] / "dlrm-last.pt", residency=True)
    assert not readers_alive()


def test_default_readers_and_the_chunk_plan(monkeypatch):
    import os

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for cores, want in ((1, 1), (2, 1), (4, 2), (8, 4), (16, 8), (64, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert default_readers() == want
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 64 cores shared by 8 ranks: 8 each
    assert default_readers() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert default_readers() == 1
    assert chunk_plan(0, 5, 2) == [(0, 2), (2, 4), (4, None)] and chunk_plan(5, 5, 2) == []
    with pytest.raises(ValueError, match="readers must be >= 1"):
        ParallelBatches(CTRBatches.__new__(CTRBatches), 0)
