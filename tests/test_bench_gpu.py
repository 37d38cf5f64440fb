"""`embcache bench gpu` on the CPU (tiny sizes): the run's structure and its exactness check."""
import json

import pytest
import torch

from embcache.cli import main


def test_bench_gpu_compares_cached_and_whole_tables_from_the_same_start(tmp_path, capsys):
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "32", "--steps", "4",
               "--warmup-steps", "2", "--ratios", "0.05", "0.3", "--device", "cpu", "--out", str(tmp_path),
               "--shapes", "one-hot", "--link-table-mib", "1", "--bookkeeping", "host"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert (tmp_path / "gpu.png").stat().st_size > 0
    rows = data["blocks"][0]["results"]
    # whole table, two cache ratios with prefetch, the larger ratio again without prefetch
    assert [(r["variant"], r["ratio"], r["prefetch_depth"]) for r in rows] == [
        ("gpu", None, 0), ("cached", 0.05, 1), ("cached", 0.3, 1), ("cached", 0.3, 0)]
    for r in rows:
        assert len(r["losses"]) == 6 and r["samples_per_s"] > 0
        # same table, batches and dense start: on the CPU every loss equals the whole table's
        assert r["max_loss_diff_vs_gpu_tables"] == 0.0
    assert len(set(rows[0]["losses"])) > 1  # it trained: the loss moved
    # each batch's distinct rows (warm-up and timed), as the trace draws them
    from embcache.bench.criteo_trace import CriteoTrace
    trace = CriteoTrace(scale=0.0005, batch_size=32, batches=6, seed=0)
    assert data["blocks"][0]["distinct_rows_per_batch"] == [int(trace.batch(i).unique().numel()) for i in range(6)]
    cached = rows[1:]
    assert all(0 < r["hit_rate"] <= 1 and r["bytes_h2d_per_step"] >= 0 for r in cached)
    assert cached[0]["hit_rate"] <= cached[1]["hit_rate"]  # a larger cache hits at least as often
    assert data["pinned_copy_gbps"] is None  # no link to measure without CUDA
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(rows)  # header, rule, one row per variant: the GPU table of docs/cache.md
    assert table[2].startswith("| one-hot | 4 | whole table on the device |") and "| 1.00 |" in table[2]
    assert table[-1].startswith("| one-hot | 4 | cached 30.0%, host bookkeeping, no prefetch |")
    # one flat row per run, with the keys compared across cards and bookkeepers
    flat = data["rows"]
    assert [(r["bookkeeping"], r["shape"], r["dim"], r["cache_ratio"]) for r in flat] == [
        (None, "one-hot", 4, None), ("host", "one-hot", 4, 0.05), ("host", "one-hot", 4, 0.3),
        ("host", "one-hot", 4, 0.3)]
    assert flat[0]["vs_all_on_gpu"] == 1.0 and flat[0]["link_bound_fraction"] is None
    assert [r["samples_per_s"] for r in flat] == [r["samples_per_s"] for r in rows]
    # the bound: the step's bytes at the measured random-row rate (memory's, on the CPU)
    rate = data["random_rows"]["4"]
    assert rate["row_bytes"] == 16 and rate["gathered_right"] and rate["written_right"]
    small = rows[1]
    link_s = small["bytes_h2d_per_step"] / (rate["gather_gbps"] * 1e9) + \
        small["bytes_d2h_per_step"] / (rate["scatter_gbps"] * 1e9)
    assert small["bytes_h2d_per_step"] > 0
    assert abs(flat[1]["link_bound_fraction"] - small["samples_per_s"] * link_s / 32) < 1e-9 * flat[1]["link_bound_fraction"] + 1e-12


def test_bench_gpu_multi_hot_pools_the_same_ids_in_the_cache_and_the_whole_table(tmp_path):
    """MLPerf's pooling (214 ids a sample): the cached bag and the whole table see the same
    bags and agree to the bit on the CPU, through a cache too small for a batch (overflow)."""
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "3",
               "--warmup-steps", "1", "--ratios", "0.05", "--device", "cpu", "--out", str(tmp_path),
               "--shapes", "multi-hot", "--no-price-prefetch", "--link-table-mib", "1"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    (block,) = data["blocks"]
    assert block["shape"] == "multi-hot"
    whole, host, device = block["results"]
    for cached in (host, device):  # both bookkeepers, to the bit of the whole table
        assert cached["max_loss_diff_vs_gpu_tables"] == 0.0 and len(set(whole["losses"])) > 1
        assert cached["overflow_rows"] > 0  # 214 ids a sample do not fit a 5 % cache of this toy table
    assert host["hit_rate"] == device["hit_rate"] and host["bytes_h2d_per_step"] == device["bytes_h2d_per_step"]
    assert [(r["shape"], r["bookkeeping"]) for r in data["rows"]] == [
        ("multi-hot", None), ("multi-hot", "host"), ("multi-hot", "device")]


def test_pooled_batch_has_one_bag_per_sample_and_feature():
    from embcache.bench.criteo_trace import MULTI_HOT_SIZES, CriteoTrace

    trace = CriteoTrace(scale=0.001, batch_size=8, batches=1, seed=3)
    ids, offsets = trace.pooled_batch(0, MULTI_HOT_SIZES)
    assert ids.numel() == 8 * sum(MULTI_HOT_SIZES) and offsets.numel() == 8 * 26
    lengths = torch.diff(torch.cat([offsets, torch.tensor([ids.numel()])]))
    assert lengths.tolist() == MULTI_HOT_SIZES * 8  # sample-major: bag b * 26 + f
    bounds = torch.tensor(list(trace.offsets) + [trace.num_rows])
    feature = torch.arange(26).repeat(8).repeat_interleave(lengths)
    assert bool(((ids >= bounds[feature]) & (ids < bounds[feature + 1])).all())  # each id in its own table
    again, _ = trace.pooled_batch(0, MULTI_HOT_SIZES)
    assert torch.equal(ids, again)  # seeded: the same batch every time


def test_a_sync_site_names_the_innermost_project_frame():
    import traceback

    from embcache.bench.gpu import _project_frame

    def inner():
        return traceback.extract_stack()

    stack = inner()
    stack.append(traceback.FrameSummary("/x/embcache/cache/bookkeeping/row_cache.py", 466, "apply_gradient", line="self.dirty"))
    stack.append(traceback.FrameSummary("/usr/lib/torch/x.py", 3, "f", line="g()"))
    assert _project_frame(stack) == "cache/bookkeeping/row_cache.py:466 in apply_gradient: self.dirty"


def _replaying(replayed: list):
    """A stand-in for `CapturedStep` that replays on the CPU (`tests.cpu_graph`), each one
    made kept in `replayed`; the dense Adagrad's step counts stay on the host, as on CUDA."""
    from tests.cpu_graph import ReplayedStep

    def make(step_fn, device, warmup):
        variant = getattr(step_fn, "variant", None) or step_fn.__self__.variant
        dense_opt = variant[3]
        host = lambda: [st["step"] for st in dense_opt.state.values()]  # noqa: E731
        replayed.append(ReplayedStep(step_fn, warmup=warmup, host=host))
        return replayed[-1]

    return make


@pytest.mark.parametrize("shape, optimizer", [("one-hot", "adagrad"), ("multi-hot", "adagrad"), ("one-hot", "adam")])
def test_the_cached_step_replayed_with_its_prefetch_trains_as_the_eager_one(tmp_path, monkeypatch, shape, optimizer):
    """`bench gpu --cuda-graphs on`'s cached step with the device bookkeeper, its next
    batch's prefetch inside the graph (`bench.step_ahead`), captured and replayed as CUDA
    would (`tests.cpu_graph`, the CPU taking the device's path): every loss equals the whole
    table's and the eager cached step's to the bit, with the same hit rate and traffic.
    Adam: its step size read at the device's step count, which each replay advances."""
    import embcache.device
    from embcache.train import step_graph

    monkeypatch.setattr(embcache.device, "CPU_ACTS_AS_DEVICE", True)
    replayed = []

    rows = {}
    for graphs in ("off", "on"):
        if graphs == "on":
            monkeypatch.setattr(step_graph, "choose_graphs", lambda *a, **k: step_graph.GraphChoice(True))
            monkeypatch.setattr(step_graph, "CapturedStep", _replaying(replayed))
        out = tmp_path / graphs
        assert main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "6",
                     "--warmup-steps", "2", "--ratios", "0.05", "--device", "cpu", "--out", str(out),
                     "--shapes", shape, "--bookkeeping", "device", "--kernels", "torch", "--no-price-prefetch",
                     "--link-table-mib", "1", "--cuda-graphs", graphs, "--optimizer", optimizer]) == 0
        rows[graphs] = json.loads((out / "gpu.json").read_text())["blocks"][0]["results"]
    (whole, eager), (_, captured) = rows["off"], rows["on"]
    assert captured["cuda_graphs"] == "on" and captured["prefetch_depth"] == 1 and eager["prefetch_depth"] == 1
    assert len(replayed) == 1 and replayed[0].replays == 3  # 8 steps: 1 eager, 2 warm-up, the capture, 3, the last
    assert captured["losses"] == eager["losses"] == whole["losses"] and len(set(whole["losses"])) > 1
    for key in ("hit_rate", "bytes_h2d_per_step", "bytes_d2h_per_step", "overflow_rows"):
        assert captured[key] == eager[key], key


def test_the_whole_table_replayed_with_the_project_s_kernels_trains_as_torch(tmp_path, monkeypatch):
    """The whole-table baseline `bench gpu --cuda-graphs` captures (the table trained inside its
    backward by the project's Triton kernels, interpreted here), replayed as CUDA would: its
    losses equal torch's `nn.EmbeddingBag` with its sparse optimizer, to the bit. The CPU
    keeps its own sort here (`CPU_ACTS_AS_DEVICE` off), as torch's CPU `coalesce` does."""
    from embcache.train import step_graph

    monkeypatch.setattr(step_graph, "choose_graphs", lambda *a, **k: step_graph.GraphChoice(True))
    replayed = []

    monkeypatch.setattr(step_graph, "CapturedStep", _replaying(replayed))
    assert main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "5",
                 "--warmup-steps", "2", "--device", "cpu", "--out", str(tmp_path), "--shapes", "one-hot",
                 "--kernels", "triton", "--no-cached", "--link-table-mib", "1", "--cuda-graphs", "on"]) == 0
    torch_rows, triton_rows = json.loads((tmp_path / "gpu.json").read_text())["blocks"][0]["results"]
    assert (torch_rows["kernels"], triton_rows["kernels"], triton_rows["cuda_graphs"]) == ("torch", "triton", "on")
    assert len(replayed) == 1 and replayed[0].replays == 4  # 7 steps: 2 warm-up, the capture, 4 replays
    assert triton_rows["losses"] == torch_rows["losses"] and len(set(torch_rows["losses"])) > 1


def test_a_bench_gpu_run_cut_short_keeps_every_variant_it_finished(tmp_path, monkeypatch):
    """On a GPU machine's few minutes a step's time limit may kill the run mid-block: the JSON
    is written after each variant, not after each block."""
    import embcache.bench.gpu as gpu

    measured, real = [], gpu.measure

    def measure_then_killed(*args, **kwargs):
        if len(measured) == 2:
            raise KeyboardInterrupt  # as the limit's signal ends the run
        measured.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu, "measure", measure_then_killed)
    assert main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "2",
                 "--warmup-steps", "1", "--ratios", "0.05", "0.3", "--device", "cpu", "--out", str(tmp_path),
                 "--shapes", "one-hot", "--link-table-mib", "1", "--bookkeeping", "host", "--no-price-prefetch"]) == 130
    data = json.loads((tmp_path / "gpu.json").read_text())
    (block,) = data["blocks"]
    assert [(r["variant"], r["ratio"]) for r in block["results"]] == [("gpu", None), ("cached", 0.05)]
    assert [r["cache_ratio"] for r in data["rows"]] == [None, 0.05] and block["distinct_rows_per_batch"]
