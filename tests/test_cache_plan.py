"""`embcache cache plan` and its planner: predictions against real cached runs, memory
figures against a real cache's tensors, the counts-only prediction against the trace's,
`dlrm train --cache-ratio auto`, and bad input as one line."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from embcache.bench.criteo_trace import CriteoTrace
from embcache.cache.planning import hit_curves, planner
from embcache.cache.optimizers import OPTIMIZERS, make_optimizer
from embcache.cache.bookkeeping.row_cache import RowCache
from embcache.cli import main
from embcache.data.synthetic import generate_synthetic
from embcache.dlrm.config import DLRMConfig

RATIOS = (0.0025, 0.025, 0.1)  # 0.25 %: smaller than a batch's distinct rows (overflow)


@pytest.fixture(scope="module")
def trace():
    """A small Criteo-shaped trace: 675 k rows, 40 batches of 1,024 x 26 ids (4.6 k distinct)."""
    t = CriteoTrace(scale=0.02, batch_size=1024, batches=40, seed=0)
    return [b.flatten().numpy() for b in t], t.frequencies().numpy(), t.num_rows


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan") / "syn"
    generate_synthetic(d, rows=8_000, scale=0.002, seed=3, progress=False)
    return d


def real_hit_rate(batches, freq, num_rows, cache_rows, policy, depth=0, admission=False) -> float:
    """A real cache's hit rate on `batches`, looked up one after another, or as the DLRM
    trainer does it (`depth`: the next `depth` batches are admitted while this one is held)."""
    cache = RowCache(torch.zeros(num_rows, 1), cache_rows, make_optimizer("sgd", 0.1), policy,
                     torch.from_numpy(freq), 0.7, admission=admission)
    batches = [torch.from_numpy(ids) for ids in batches]
    for ids in batches[1: depth]:  # the trainer's first step prefetches the batches after it
        cache.prefetch(ids)
    for i, ids in enumerate(batches):
        lookup = cache.prepare(ids, keep=depth > 0)
        if depth and i + depth < len(batches):
            cache.prefetch(batches[i + depth])
        cache.release(lookup)
    return cache.stats.hit_rate


@pytest.mark.parametrize("depth, admission, policies", [(0, False, planner.POLICIES), (1, False, ("freq",)),
                                                        (1, True, ("freq", "lfu")), (3, False, ("freq",))])
def test_trace_prediction_is_within_two_points_of_a_real_cache(trace, depth, admission, policies):
    batches, freq, n = trace
    sizes = planner.cache_sizes(RATIOS, n)
    predicted = hit_curves.replay(batches, freq, sizes, 0.7, len(batches), policies, held=1 + depth,
                                  admission=admission)
    assert sizes[0] < predicted.max_unique < sizes[1]  # one size overflows, the others do not
    for policy in policies:
        for size, guess in zip(sizes, predicted.hit_rate(policy)):
            real = real_hit_rate(batches, freq, n, int(size), policy, depth, admission)
            if depth >= 1 and size < predicted.max_unique:
                # prefetch into a cache smaller than one batch's rows: the model is a lower
                # bound there (a prefetched batch is admitted once, what does not fit is
                # served beside: measured 3.5 points under at depth 1, 4-6 at depth 2-4)
                assert guess <= real + 0.02 and real - guess <= 0.08, (policy, int(size), guess, real)
            else:
                assert abs(guess - real) <= 0.02, (policy, int(size), guess, real)


def test_counts_alone_predict_what_the_trace_does(trace):
    batches, freq, n = trace
    sizes = planner.cache_sizes(RATIOS, n)
    from_trace = hit_curves.replay(batches, freq, sizes, 0.7, len(batches))
    surrogate = hit_curves.surrogate_batches(freq, len(batches))
    from_counts = hit_curves.replay(surrogate, freq, sizes, 0.7, len(surrogate))
    assert from_counts.batches == len(batches) and sum(b.size for b in surrogate) == freq.sum()
    distinct = from_trace.accesses / len(batches)
    assert abs(hit_curves.expected_distinct(freq, len(batches)) - distinct) <= 0.01 * distinct
    assert abs(from_counts.accesses / len(batches) - distinct) <= 0.01 * distinct
    for policy in planner.POLICIES:
        assert np.abs(from_counts.hit_rate(policy) - from_trace.hit_rate(policy)).max() <= 0.02, policy


def test_fenwick_prefix_sums_follow_updates():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, 1000)
    tree = hit_curves._Fenwick(counts.copy())
    for _ in range(20):
        idx = rng.integers(0, 1000, 50)
        delta = rng.integers(-2, 3, 50)
        tree.add(idx, delta)
        np.add.at(counts, idx, delta)
        query = np.concatenate([[-1], rng.integers(0, 1000, 30)])
        assert np.array_equal(tree.prefix(query), np.concatenate([[0], np.cumsum(counts)])[query + 1])


def test_lru_with_one_id_per_batch_counts_hits_exactly():
    """With one id per batch and no warm-up there are no ties: the stack distances give an
    LRU cache's hits exactly, at every size in the same pass."""
    ids = np.random.default_rng(1).integers(0, 40, 300)
    sizes = (1, 3, 8, 20)
    model = hit_curves.RankedCache("lru", np.zeros(40), sizes, 0.0, ids.size)
    for i in ids:
        model.add(np.array([i]))
    for size, predicted in zip(sizes, model.hits):
        resident, hits = [], 0
        for i in ids.tolist():
            hits += i in resident
            resident = ([i] + [r for r in resident if r != i])[:size]
        assert predicted == hits


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("eviction", planner.POLICIES)
def test_device_bytes_are_those_of_a_real_cache(optimizer, eviction):
    n, dim, rows = 500, 8, 37
    cache = RowCache(torch.zeros(n, dim), rows, make_optimizer(optimizer, 0.1), eviction, torch.ones(n), 0.5)
    rows_and_state = [cache.weight, *cache.state.values()]
    book = [cache.slots.slot_to_id, cache.slots.id_to_slot, cache.dirty, cache.holds, cache.policy.slot_last,
            cache.policy.slot_primary, *(t for t in (cache.policy.id_count, cache.policy.prior) if t is not None)]
    assert all(t.device == cache.device for t in rows_and_state) and all(t.device == cache.book for t in book)
    footprint = planner.Footprint(n, dim, optimizer, eviction)
    assert footprint.device_bytes(rows) == sum(t.numel() * t.element_size() for t in rows_and_state)
    assert footprint.bookkeeping_bytes(rows) == sum(t.numel() * t.element_size() for t in book)
    assert footprint.host_bytes() == sum(t.numel() * t.element_size()
                                         for t in (cache.host.weight, *cache.host.state.values()))
    assert footprint.row_bytes == cache.host.row_bytes()
    assert footprint.largest_cache(footprint.device_bytes(rows)) == rows
    assert footprint.largest_cache(footprint.device_bytes(rows) - 1) == rows - 1


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("eviction", planner.POLICIES)
def test_the_device_bookkeepers_bytes_are_those_of_a_real_cache(optimizer, eviction):
    """With device bookkeeping, the maps and counts (and a batch's overflow rows) are device
    memory: `cache plan` and --cache-ratio auto size the cache with them."""
    n, dim, rows, lookups = 500, 8, 37, 64
    cache = RowCache(torch.zeros(n, dim), rows, make_optimizer(optimizer, 0.1), eviction, torch.ones(n), 0.5,
                     bookkeeping="device")
    cache._take_region(lookups)  # one batch's overflow rows, as its first forward makes them
    on_device = [*cache._work.values(), cache._work_ids, *cache._pad.values(), cache._arange]
    footprint = planner.Footprint(n, dim, optimizer, eviction, "device", lookups)
    assert footprint.device_bytes(rows) == sum(t.numel() * t.element_size() for t in on_device)
    assert footprint.bookkeeping_bytes(rows) == 0  # none on the host
    assert footprint.host_bytes() == sum(t.numel() * t.element_size() for t in cache.host.with_spare().values())
    assert footprint.largest_cache(footprint.device_bytes(rows)) == rows
    assert footprint.largest_cache(footprint.device_bytes(rows) - 1) == rows - 1
    assert footprint.largest_cache(footprint.device_bytes(0) - 1) == 0


def test_first_within_one_point_is_the_first_such_size():
    sizes, rates = np.array([10, 20, 40, 80]), np.array([0.5, 0.7, 0.81, 0.82])
    assert planner.first_within(sizes, rates, 0.82, 0.01) == 2
    assert planner.first_within(sizes, rates, 0.82, 0.5) == 0


def test_plan_command_table_and_plot(data_dir, tmp_path, capsys):
    png = tmp_path / "plan.png"
    assert main(["cache", "plan", str(data_dir), "--trace", "8", "--batch-size", "512", "--ratios", "0.01", "0.1",
                 "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "replay of the first 8 training batches" in text and "largest cache in 16.0 GiB" in text
    assert text.count("%  ") >= 2 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_json_and_the_largest_cache_that_fits(data_dir, capsys):
    assert main(["cache", "plan", str(data_dir), "--json", "--device-memory", "3e6", "--ratios", "0.01", "0.5",
                 "--embedding-dim", "16", "--optimizer", "adam"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["row_bytes"] == 3 * 16 * 4 and plan["device_memory"] == 3_000_000 and not plan["traced"]
    assert plan["prefetch"] and plan["prefetch_depth"] == 1 and plan["admission"] == DLRMConfig().admission
    assert "1-(1-1/B)^f" in plan["assumption"] and len(plan["curve"]["cache_rows"]) > 10
    low, high = plan["rows"]
    assert (low["ratio"], high["ratio"]) == (0.01, 0.5) and low["cache_rows"] == math.ceil(0.01 * plan["num_rows"])
    assert 0 < low["hit_rate"]["freq"] <= high["hit_rate"]["freq"] <= 1
    footprint = planner.Footprint(plan["num_rows"], 16, "adam", "freq")
    largest = plan["largest_cache_rows"]
    assert footprint.device_bytes(largest) <= 3e6 < footprint.device_bytes(largest + 1)
    assert (low["fits"], high["fits"]) == (True, False) and low["device_bytes"] == footprint.device_bytes(
        low["cache_rows"])


@pytest.mark.parametrize("text, size", [("16 GiB", 16 * 2**30), ("16GiB", 16 * 2**30), ("16e9", 16 * 10**9),
                                        ("512MB", 512 * 10**6), ("1.5G", 3 * 2**29)])
def test_memory_sizes_parse(text, size):
    from embcache.dlrm.plan_cli import build_parser

    assert build_parser("plan").parse_args(["d", "--device-memory", text]).device_memory == size


def test_plan_assumes_the_trainers_defaults():
    """One default per setting: what `cache plan` assumes unless told is what `dlrm train` does."""
    from embcache.dlrm.plan_cli import build_parser

    args, d = build_parser("plan").parse_args(["d"]), DLRMConfig()
    assert (args.embedding_dim, args.optimizer, args.eviction, args.batch_size, args.warmup_ratio,
            args.prefetch_depth, args.admission == "on", args.seed) == (
        d.embedding_dim, d.sparse_optimizer, d.eviction, d.batch_size, d.warmup_ratio, d.prefetch_depth, d.admission,
        d.seed)


def test_bad_input_is_one_line(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["cache", "plan", str(data_dir), "--device-memory", "lots"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --device-memory: 'lots' is not a memory size (e.g. 16GiB, 16 GiB, 512MB, 16e9)")
    cases = [(tmp_path / "none", "none/meta.json: missing")]
    no_key = tmp_path / "no_key"
    no_key.mkdir()
    meta = json.loads((data_dir / "meta.json").read_text())
    (no_key / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "id_frequency_file"}))
    cases.append((no_key, "lacks the key 'id_frequency_file'"))
    no_file = tmp_path / "no_file"
    no_file.mkdir()
    train = {"train": {"files": [], "rows": 10}}
    (no_file / "meta.json").write_text(json.dumps({**meta, "id_frequency_file": "gone.npz", "splits": train}))
    cases.append((no_file, "gone.npz: cannot read id frequencies"))
    no_rows = tmp_path / "no_rows"
    no_rows.mkdir()
    (no_rows / "meta.json").write_text(json.dumps({**meta, "splits": {}}))
    cases.append((no_rows, "no_rows/meta.json: has no training rows"))
    for where, words in cases:
        assert main(["cache", "plan", str(where)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_dlrm_train_cache_ratio_auto_records_the_planners_choice(data_dir, capsys):
    common = ["dlrm", "train", "--data", str(data_dir), "--embedding-dim", "4", "--dense-arch", "8",
              "--over-arch", "8", "--batch-size", "512", "--max-steps", "2", "--device", "cpu", "--no-progress"]
    assert main(common + ["--cache-ratio", "auto", "--device-memory", "4MiB"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    chosen, why = planner.auto_cache_ratio(data_dir, embedding_dim=4, optimizer="adagrad", eviction="freq",
                                           batch_size=512, warmup_ratio=0.7, device_memory=4 * 2**20)
    assert summary["cache_ratio"] == chosen and summary["cache_rows"] == math.ceil(chosen * summary["table_rows"])
    assert out.count("cache ratio auto: ") == 1 and f"{why} (--device-memory)" in out
    assert main(common + ["--cache-ratio", "0.015"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["cache_ratio"] == 0.015 and summary["cache_rows"] == math.ceil(0.015 * summary["table_rows"])
