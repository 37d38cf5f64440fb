"""The memory-mapped host store: training on it equals training on the memory store to
the bit; a checkpoint copies its files so a resume after a kill never sees rows written
later; bad directories (other shape, truncated, missing, damaged, full disk) are one line
naming the file, with nothing changed or half-written."""
import errno
import gc
import os
from dataclasses import replace
from functools import partial

import pytest
import torch
from embcache.sparse_types import EmbeddingBagConfig

import embcache.cache.stores.table_files as tf
from embcache import CachedEmbeddingBag, CachedEmbeddingBagCollection
from embcache.errors import CheckpointError, DataFormatError, DataOutputError
from tests.cache_helpers import zipf_batches

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
N, D = 3001, 8  # N * D not a multiple of 16: the last chunk of the initial draw is ragged


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few hundred bytes, so that small tables are made and copied in many."""
    monkeypatch.setattr(tf, "CHUNK_BYTES", 16 * 4 * D * 3)


def make_bag(store="memory", optimizer="adagrad", seed=0, **kw):
    torch.manual_seed(seed)
    return CachedEmbeddingBag(N, D, cache_ratio=0.03, optimizer=optimizer, lr=0.05, device="cpu",
                              eviction="lru", host_store=store, **kw)


def train(bags, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for ids, offsets in zipf_batches(N, steps, 32, 3, seed=seed):
        target = torch.randn(32, D, generator=gen)
        for bag in bags:
            (bag(ids, offsets) * target).sum().backward()


def tables(bag):
    bag.cache.sync_host()  # an observation: dirty bits and traffic counts stay as they are
    return {k: v.clone() for k, v in bag.cache.host.tensors().items()}


def assert_same(a, b):
    ta, tb = tables(a), tables(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), f"{k}: max difference {(ta[k].float() - tb[k].float()).abs().max()}"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_mmap_store_trains_exactly_as_the_memory_store(tmp_path, small_chunks, optimizer):
    memory, mapped = make_bag(optimizer=optimizer), make_bag(f"mmap:{tmp_path}", optimizer)
    assert torch.equal(memory.full_weight(), mapped.full_weight()), "the chunked initial draw differs"
    train([memory, mapped], 120)
    assert mapped.cache_stats()["evictions"] > 0.9 * 120 * 32
    assert mapped.cache_stats() == memory.cache_stats()
    assert_same(memory, mapped)
    header = tf.read_header(tmp_path)
    assert set(header["tensors"]) == set(mapped.cache.host.tensors())
    # the rows really are the files: read them back from disk
    on_disk = torch.from_file(str(tmp_path / "weight.bin"), size=N * D, dtype=torch.float32).view(N, D)
    assert torch.equal(on_disk, memory.full_weight())


def test_collection_made_chunk_by_chunk_equals_the_memory_one(tmp_path, small_chunks):
    """One table's init_fn uses the global generator (torchrec's default), one its own
    (as the DLRM trainer's); chunks cut through both."""
    def own(t, seed):
        t.copy_(torch.rand(t.shape, generator=torch.Generator().manual_seed(seed)))

    configs = [EmbeddingBagConfig(name="a", embedding_dim=D, num_embeddings=1000, feature_names=["fa"]),
               EmbeddingBagConfig(name="b", embedding_dim=D, num_embeddings=777, feature_names=["fb"],
                                  init_fn=partial(own, seed=3)),
               EmbeddingBagConfig(name="c", embedding_dim=4, num_embeddings=50, feature_names=["fc"])]
    out = []
    for store in ("memory", f"mmap:{tmp_path}"):
        torch.manual_seed(0)
        ebc = CachedEmbeddingBagCollection(configs, cache_ratio=0.05, device="cpu", host_store=store)
        out.append({t.name: ebc.table_weight(t.name).clone() for t in configs})
    for name in out[0]:
        assert torch.equal(out[0][name], out[1][name]), name
    assert (tmp_path / "group0" / "weight.bin").is_file() and (tmp_path / "group1" / "weight.bin").is_file()


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_kill_after_checkpoint_then_resume_equals_uninterrupted(tmp_path, small_chunks, optimizer):
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    reference = make_bag(optimizer=optimizer)
    train([reference], 40, seed=1)
    run = make_bag(f"mmap:{store}", optimizer)
    train([run], 40, seed=1)
    run.save_checkpoint(ckpt)
    at_checkpoint = tables(run)
    train([run], 30, seed=2)  # rows written after the checkpoint land in the store's files
    assert not torch.equal(tables(run)["weight"], at_checkpoint["weight"])
    del run  # killed: no flush, no goodbye
    gc.collect()
    resumed = make_bag(f"mmap:{store}", optimizer, seed=5)  # a new process: its own initial draw
    resumed.load_checkpoint(ckpt)
    for k, v in tables(resumed).items():
        assert torch.equal(v, at_checkpoint[k]), k
    train([reference, resumed], 30, seed=2)
    assert resumed.cache_stats() == reference.cache_stats()
    assert_same(reference, resumed)


def test_checkpoint_of_a_memory_store_resumes_on_a_mapped_one(tmp_path):
    a = make_bag()
    train([a], 20)
    a.save_checkpoint(tmp_path / "ckpt")
    b = make_bag(f"mmap:{tmp_path / 'store'}", seed=9)
    b.load_checkpoint(tmp_path / "ckpt")
    train([a, b], 20, seed=3)
    assert_same(a, b)


def _damage(path, how):
    if how == "flipped byte":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
    elif how == "truncated":
        os.truncate(path, path.stat().st_size - 4)
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "missing"])
@pytest.mark.parametrize("file", ["weight.bin", "optimizer.sum.bin"])
def test_a_damaged_checkpoint_is_refused_naming_the_file_before_anything_changes(tmp_path, how, file):
    bag = make_bag(f"mmap:{tmp_path / 'store'}")
    train([bag], 10)
    bag.save_checkpoint(tmp_path / "ckpt")
    train([bag], 10, seed=4)
    before, stats = tables(bag), bag.cache_stats()
    _damage(tmp_path / "ckpt" / file, how)
    with pytest.raises(CheckpointError) as err:
        bag.load_checkpoint(tmp_path / "ckpt")
    assert str(tmp_path / "ckpt" / file) in str(err.value) and "\n" not in str(err.value)
    for k, v in tables(bag).items():
        assert torch.equal(v, before[k]), k
    assert bag.cache_stats() == stats


def test_a_checkpoint_without_header_or_of_another_table_is_refused(tmp_path):
    bag = make_bag()
    bag.save_checkpoint(tmp_path / "ckpt")
    other = make_bag(optimizer="adam")
    with pytest.raises(CheckpointError, match="header.json"):
        other.load_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "header.json").unlink()
    with pytest.raises(CheckpointError, match="header.json: missing"):
        bag.load_checkpoint(tmp_path / "ckpt")


def test_a_store_directory_holding_another_shape_is_refused_unchanged(tmp_path):
    make_bag(f"mmap:{tmp_path}")
    gc.collect()
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.bin")}
    with pytest.raises(DataFormatError) as err:
        torch.manual_seed(0)
        CachedEmbeddingBag(N + 1, D, device="cpu", optimizer="adagrad", host_store=f"mmap:{tmp_path}")
    assert "weight.bin" in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(DataFormatError, match="header.json"):
        CachedEmbeddingBag(N, D, device="cpu", optimizer="adam", host_store=f"mmap:{tmp_path}")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.bin")} == before


def test_a_truncated_store_file_is_refused_naming_it(tmp_path):
    make_bag(f"mmap:{tmp_path}")
    gc.collect()
    os.truncate(tmp_path / "optimizer.sum.bin", 100)
    with pytest.raises(DataFormatError, match=r"optimizer\.sum\.bin: 100 bytes.*truncated"):
        make_bag(f"mmap:{tmp_path}")
    (tmp_path / "header.json").unlink()  # stray files without a header: still checked
    with pytest.raises(DataFormatError, match=r"optimizer\.sum\.bin: 100 bytes"):
        make_bag(f"mmap:{tmp_path}")


def test_the_same_directory_cannot_serve_two_live_stores(tmp_path):
    first = make_bag(f"mmap:{tmp_path}")
    with pytest.raises(DataFormatError, match="in use"):
        make_bag(f"mmap:{tmp_path}")
    del first
    gc.collect()
    make_bag(f"mmap:{tmp_path}")  # free again once the first is gone


def test_a_store_nothing_references_any_more_does_not_hold_its_directory(tmp_path):
    """A finished trainer caught in a reference cycle keeps its store until the collector
    runs: opening the same directory again must not depend on when that happens."""
    gc.disable()
    try:
        first = make_bag(f"mmap:{tmp_path}")
        cycle = {"bag": first}
        cycle["self"] = cycle
        del first, cycle  # unreachable, but not yet collected (the collector is off)
        make_bag(f"mmap:{tmp_path}")
    finally:
        gc.enable()


def _no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_when_making_a_store_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    with pytest.raises(DataOutputError) as err:
        make_bag(f"mmap:{tmp_path}")
    message = str(err.value)
    assert "No space left on device" in message and str(tmp_path) in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_a_full_disk_when_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    bag = make_bag()
    train([bag], 5)
    bag.save_checkpoint(tmp_path / "ckpt")
    saved = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    train([bag], 5, seed=2)
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    with pytest.raises(DataOutputError, match="No space left on device"):
        bag.save_checkpoint(tmp_path / "ckpt")
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_bad_host_store_spec_is_refused():
    with pytest.raises(ValueError, match="host_store"):
        CachedEmbeddingBag(10, 2, device="cpu", host_store="disk")


def test_dlrm_on_a_mapped_store_equals_the_memory_store(tmp_path):
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    data = tmp_path / "syn"
    generate_synthetic(data, rows=4000, scale=0.0005, seed=0)
    cfg = DLRMConfig(batch_size=256, embedding_dim=4, dense_arch=[8], over_arch=[8], device="cpu",
                     progress=False, max_steps=8, cache_ratio=0.02)
    memory = DLRMTrainer(cfg, data)
    mapped = DLRMTrainer(replace(cfg, host_store=f"mmap:{tmp_path / 'store'}"), data)
    memory.fit(), mapped.fit()
    for t in memory.sparse.embedding_bag_configs():
        assert torch.equal(memory.sparse.table_weight(t.name), mapped.sparse.table_weight(t.name)), t.name
    assert (tmp_path / "store" / "group0" / "header.json").is_file()


def test_dlrm_resume_on_a_mapped_store_ignores_rows_written_after_the_checkpoint(tmp_path):
    import shutil

    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    data = tmp_path / "syn"
    generate_synthetic(data, rows=4000, scale=0.0005, seed=0)
    cfg = DLRMConfig(batch_size=128, embedding_dim=4, dense_arch=[8], over_arch=[8], device="cpu",
                     progress=False, cache_ratio=0.02, checkpoint_every=4)
    store = f"mmap:{tmp_path / 'store'}"
    whole = DLRMTrainer(replace(cfg, max_steps=8), data)
    whole.fit()
    first = DLRMTrainer(replace(cfg, max_steps=4, host_store=store, checkpoint_dir=str(tmp_path / "ck")), data)
    first.fit()
    shutil.copytree(tmp_path / "ck", tmp_path / "ck4")
    del first
    gc.collect()
    on = DLRMTrainer(replace(cfg, max_steps=7, host_store=store, checkpoint_dir=str(tmp_path / "ck"), resume=True),
                     data)
    on.fit()  # rows of steps 5-7 are in the store's files now; then the process dies
    del on
    gc.collect()
    resumed = DLRMTrainer(replace(cfg, max_steps=8, host_store=store, checkpoint_dir=str(tmp_path / "ck4"),
                                  resume=True), data)
    resumed.fit()
    for t in whole.sparse.embedding_bag_configs():
        assert torch.equal(whole.sparse.table_weight(t.name), resumed.sparse.table_weight(t.name)), t.name


def test_a_collection_checkpoint_holds_every_group_and_resumes_exactly(tmp_path):
    from embcache.sparse_types import KeyedJaggedTensor

    configs = [EmbeddingBagConfig(name=f"t{d}", embedding_dim=d, num_embeddings=500, feature_names=[f"f{d}"])
               for d in (4, 8)]

    def make(store):
        torch.manual_seed(0)
        return CachedEmbeddingBagCollection(configs, cache_ratio=0.02, device="cpu", host_store=store,
                                            optimizer="adagrad", lr=0.05, eviction="lru")

    def steps(ebcs, n, seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(n):
            kjt = KeyedJaggedTensor(keys=["f4", "f8"], values=torch.randint(0, 500, (64,), generator=gen),
                                    lengths=torch.full((32,), 2))
            for ebc in ebcs:
                ebc(kjt).values().sum().backward()

    reference, run = make("memory"), make(f"mmap:{tmp_path / 'store'}")
    steps([reference, run], 10, 1)
    run.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["group0", "group1"]
    steps([run], 10, 2)
    del run
    gc.collect()
    resumed = make(f"mmap:{tmp_path / 'store'}")
    broken = tmp_path / "ckpt" / "group1" / "cache.pt"
    saved = broken.read_bytes()
    broken.unlink()
    with pytest.raises(CheckpointError, match="group1"):
        resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.optimizer_steps() == 0, "group 0 checked fine, yet must not be loaded alone"
    broken.write_bytes(saved)
    resumed.load_checkpoint(tmp_path / "ckpt")
    steps([reference, resumed], 10, 2)
    for t in configs:
        assert torch.equal(reference.table_weight(t.name), resumed.table_weight(t.name)), t.name
    assert resumed.cache_stats() == reference.cache_stats()


def test_bench_tiers_reports_both_parts_and_deletes_its_files(tmp_path):
    import json

    from embcache.bench import tiers, tiers_cli

    args = tiers_cli.build_parser("tiers").parse_args(
        ["--rows", "3000", "--dim", "8", "--steps", "4", "--rounds", "2", "--batch-size", "16", "--bag-size", "2",
         "--cache-ratio", "0.02", "--big-gib", "0.0005", "--big-steps", "3", "--dir", str(tmp_path / "work"),
         "--out", str(tmp_path / "out")])
    assert tiers.run(args) == 0
    result = json.loads((tmp_path / "out" / "tiers.json").read_text())
    fits, big = result["fits_in_memory"], result["larger_than_memory"]
    assert fits["tables_equal"] and fits["mmap"]["steps"] == fits["memory"]["steps"] == 4
    assert big["file_bytes"] == big["rows"] * 8 * 4 * 2 and big["steps"] == 3 and big["peak_rss_anon_mib"] > 0
    assert not any((tmp_path / "work").glob("*/*.bin")), "the table files must be deleted"
