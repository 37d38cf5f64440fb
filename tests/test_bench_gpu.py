"""`embcache bench gpu` on the CPU (tiny sizes): the run's structure and its exactness check."""
import json

from embcache.cli import main


def test_bench_gpu_compares_cached_and_whole_tables_from_the_same_start(tmp_path, capsys):
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "32", "--steps", "4",
               "--warmup-steps", "2", "--ratios", "0.05", "0.3", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert (tmp_path / "gpu.png").stat().st_size > 0
    rows = data["dims"][0]["results"]
    # whole table, two cache ratios with prefetch, the larger ratio again without prefetch
    assert [(r["variant"], r["ratio"], r["prefetch_depth"]) for r in rows] == [
        ("gpu", None, 0), ("cached", 0.05, 1), ("cached", 0.3, 1), ("cached", 0.3, 0)]
    for r in rows:
        assert len(r["losses"]) == 6 and r["samples_per_s"] > 0
        # same table, batches and dense start: on the CPU every loss equals the whole table's
        assert r["max_loss_diff_vs_gpu_tables"] == 0.0
    assert len(set(rows[0]["losses"])) > 1  # it trained: the loss moved
    cached = rows[1:]
    assert all(0 < r["hit_rate"] <= 1 and r["bytes_h2d_per_step"] >= 0 for r in cached)
    assert cached[0]["hit_rate"] <= cached[1]["hit_rate"]  # a larger cache hits at least as often
    assert data["pinned_copy_gbps"] is None  # no link to measure without CUDA
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(rows)  # header, rule, one row per variant: the GPU table of docs/cache.md
    assert table[2].startswith("| 4 | whole table on the device |") and "| 1.00 |" in table[2]
    assert table[-1].startswith("| 4 | cached 30.0%, no prefetch |")
