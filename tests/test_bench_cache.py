"""The cache benchmark's parts: the Belady ceiling, the Criteo-shaped trace, the command."""
import json

import torch

from embcache.bench.belady import belady_hit_rate, next_uses
from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES, CriteoTrace
from embcache.cli import main


def test_next_uses_by_hand():
    uniques = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1]), torch.tensor([2])]
    got = [t.tolist() for t in next_uses(uniques)]
    assert got == [[2.0, 3.0], [float("inf")], [float("inf")], [float("inf")]]


def test_belady_evicts_the_row_used_farthest_in_the_future():
    # C=2. Batch 1 needs 3: row 1 is used again at batch 2, row 2 only at batch 3 -> evict 2.
    batches = [torch.tensor([1, 2, 2]), torch.tensor([3]), torch.tensor([1]), torch.tensor([2])]
    got = belady_hit_rate(batches, num_rows=5, cache_rows=2)
    assert (got["hits"], got["misses"]) == (1, 4)


def test_belady_is_a_ceiling_for_the_online_policies():
    from embcache import CachedEmbeddingBag

    trace = CriteoTrace(scale=0.002, batch_size=64, batches=30, seed=3)
    batches = list(trace)
    freq = trace.frequencies()
    for ratio in (0.01, 0.05):
        rates = {}
        for policy in ("freq", "lfu", "lru"):
            bag = CachedEmbeddingBag(trace.num_rows, 1, cache_ratio=ratio, eviction=policy, ids_freq=freq,
                                     device="cpu", weight=torch.zeros(trace.num_rows, 1)).eval()
            initial = bag.cache.slots.slot_to_id[bag.cache.slots.slot_to_id >= 0].clone()
            with torch.no_grad():
                for b in batches:
                    bag(b)
            rates[policy] = bag.cache_stats()["hit_rate"]
        best = belady_hit_rate(batches, trace.num_rows, bag.cache.num_slots, initial=initial)["hit_rate"]
        assert all(best >= r for r in rates.values()), (ratio, best, rates)


def test_trace_has_kaggle_shape_and_skew():
    trace = CriteoTrace(scale=0.01, batch_size=512, batches=4, seed=0)
    assert len(trace.cardinalities) == len(CRITEO_KAGGLE_CARDINALITIES) == 26
    assert trace.cardinalities[2] == round(10131227 * 0.01)
    b = trace.batch(0)
    assert b.shape == (512, 26)
    for j, (lo, n) in enumerate(zip(trace.offsets, trace.cardinalities)):
        assert bool(((b[:, j] >= lo) & (b[:, j] < lo + n)).all())
    assert torch.equal(trace.batch(1), CriteoTrace(scale=0.01, batch_size=512, batches=4).batch(1))
    # Zipf skew: in the largest feature, the most frequent 1% of its rows take > 30% of lookups
    col = torch.cat([trace.batch(i)[:, 2] for i in range(4)])
    counts = torch.bincount(col - int(trace.offsets[2])).sort(descending=True).values
    assert counts[: trace.cardinalities[2] // 100].sum() > 0.3 * col.numel()


def test_bench_cache_command_writes_results(tmp_path, capsys):
    rc = main(["bench", "cache", "--scale", "0.002", "--batches", "8", "--batch-size", "256",
               "--timing-scale", "0.002", "--timing-steps", "3", "--optimizers", "sgd",
               "--ratios", "0.02", "0.1", "--out", str(tmp_path), "--device", "cpu", "--day-batches", "3"])
    assert rc == 0
    data = json.loads((tmp_path / "cache.json").read_text())
    assert (tmp_path / "cache_hit_rate.png").stat().st_size > 0
    assert data["hardware"]["cpu_count"] >= 1
    rows = data["hit_rate"]["results"]
    assert [r["ratio"] for r in rows] == [0.02, 0.1]
    for r in rows:
        assert 0 <= r["lru"] <= 1 and r["belady"] >= r["freq"] - 1e-12
        # with bypass, Belady can only do better; and it bounds admission control too
        assert r["belady_bypass"] >= r["belady"] - 1e-12 and r["belady_bypass"] >= r["freq+adm"] - 1e-12
    assert rows[1]["freq"] >= rows[0]["freq"]  # a bigger cache never hits less here
    drifting = data["hit_rate"]["drifting"]
    assert drifting["day_batches"] == 3 and [r["ratio"] for r in drifting["results"]] == [0.02, 0.1]
    t = data["timing"]["results"]
    assert len(t) == 2 and all(x["bookkeeping_ratio"] > 0 for x in t)
    # on the CPU both bookkeeping paths are timed in the same run (before/after the fusion)
    assert all(x["bookkeeping_ratio_tensor_ops"] > 0 for x in t)


def test_bench_cache_measures_only_the_parts_asked_for(tmp_path):
    rc = main(["bench", "cache", "--parts", "timing", "--timing-scale", "0.002", "--timing-steps", "2",
               "--batch-size", "128", "--optimizers", "sgd", "--ratios", "0.05", "--out", str(tmp_path),
               "--device", "cpu"])
    data = json.loads((tmp_path / "cache.json").read_text())
    assert rc == 0 and data["hit_rate"] is None and len(data["timing"]["results"]) == 1
    assert not (tmp_path / "cache_hit_rate.png").exists()


def test_the_drifting_trace_moves_its_hot_set_by_day():
    from embcache.bench.criteo_trace import CriteoTrace

    still = CriteoTrace(scale=0.01, batch_size=2048, batches=4, seed=1)
    drift = CriteoTrace(scale=0.01, batch_size=2048, batches=4, seed=1, day_batches=2, day_shift=0.05)
    assert torch.equal(still.batch(0), drift.batch(0)) and torch.equal(still.batch(1), drift.batch(1))
    col = int(torch.argmax(torch.tensor(still.cardinalities)))  # the largest table

    def hottest(trace, i):
        return int(torch.mode(trace.batch(i)[:, col]).values)

    assert hottest(still, 2) == hottest(still, 0)  # the same ids stay hot
    day1 = drift.batch(2)[:, col]
    assert hottest(drift, 2) != hottest(drift, 0)  # a new day, another hottest id
    assert (day1 == hottest(drift, 0)).float().mean() < 0.01  # yesterday's hottest fell to the tail
