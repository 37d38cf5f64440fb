"""Every figure the README and docs/ state from a result file is that file's: a table of
(doc, phrase, result file, where in it), kept here. The phrase is the doc's text with `{...}`
where the number stands; the number is read from the file (a JSON path, or a function of
the parsed file; for a log, the first group of a pattern), put into the phrase, and the
phrase must be in the doc (line breaks read as spaces) in a paragraph that names the file
(or right after one that does).
A number changed in the doc, or in the file, fails it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _tiled_k64(cf: dict) -> list[float]:
    """HEAT's run kernel, tiled, against torch at K=64: every case and thread count."""
    return [r["speedup_vs_torch"] for c in cf["cases"] if c["negatives"] == 64 for r in c["rows"]
            if r["variant"] == "heat, tiling"]


def _quiet_tiled(quiet: dict) -> float:
    return quiet["cases"][0]["rows"][2]["speedup_vs_torch"]


def _overflow(rows: int) -> str:
    return "no overflow" if rows == 0 else f"{rows:,} rows overflow"


def _profile_line(gpu: dict, name: str, *columns: int) -> tuple[str, ...]:
    """Columns of the profiler's line for `name` (a cached step, device bookkeeper, Triton's
    kernels), units and % signs dropped, as the doc prints them."""
    lines = gpu["blocks"][0]["profile_cached_middle_ratio"]["device, triton kernels"]
    cells = next(line.split() for line in lines if name in line)
    return tuple(cells[c].rstrip("%").removesuffix("ms") for c in columns)


def _log_gpu(pattern: str) -> str:
    """The first group of `pattern` in the log after `bench gpu` starts."""
    return r"=== bench gpu.*?" + pattern


def _hit_rates(bench: dict, trace: str, ratio: float) -> dict:
    """One cache size's hit rates in a `bench cache` file, on the stationary or the drifting trace."""
    hit = bench["hit_rate"]
    return next(r for r in (hit["results"] if trace == "stationary" else hit["drifting"]["results"])
                if r["ratio"] == ratio)


def _hit_rate_cells(bench: dict, trace: str, ratio: float, gap: bool = True) -> str:
    """A hit-rate table's row after its cache size, as the doc prints it: the best online
    policy in bold (ties too), then the references and freq − Belady in points."""
    r = _hit_rates(bench, trace, ratio)
    online = ("freq", "freq+adm", "lfu", "lru")
    cells = [f"**{r[k]:.3f}**" if r[k] == max(r[o] for o in online) else f"{r[k]:.3f}" for k in online]
    cells += [f"{r[k]:.3f}" for k in ("static_top_c", "belady", "belady_bypass")]
    if gap:
        cells.append(f"{100 * (r['freq'] - r['belady']):.1f} pts".replace("-", "−"))
    return " | ".join(cells)


def _points(bench: dict, trace: str, ratio: float, a: str, b: str) -> float:
    r = _hit_rates(bench, trace, ratio)
    return 100 * (r[a] - r[b])


def _timing_line(timing: dict, optimizer: str, key: str, moved: bool) -> tuple[str, ...]:
    """A `bench cache --parts timing` row: the step ratio at each size, and the MiB moved per batch."""
    rows = [r for r in timing["timing"]["results"] if r["optimizer"] == optimizer]
    cells = tuple(f"{r[key]:.2f}" for r in rows)
    mib = [(r["bytes_h2d_per_batch"] + r["bytes_d2h_per_batch"]) / 2**20 for r in rows]
    return cells + (" / ".join(f"{m:.2f}" if m else "0" for m in mib) + " MiB",) if moved else cells


_HOST_CELLS = "{:.2f} | {:,.0f} | {:.1f} | {:,.0f} | {:.2f} | {:.2f} M |"


def _host_line(host: dict, shape: str, ratio: float) -> tuple:
    """`bench host`'s table row: hit rate, 1 thread's samples/s and ms a step, 2 threads'
    samples/s and speed-up, the 16-core projection in millions."""
    one, two = (next(r for r in host["results"] if (r["shape"], r["ratio"], r["threads"]) == (shape, ratio, n))
                for n in (1, 2))
    summary = next(s for s in host["summary"] if (s["shape"], s["ratio"]) == (shape, ratio))
    return (one["hit_rate"], one["samples_per_s"], 1e3 * one["step_s"], two["samples_per_s"], summary["speedup_2"],
            summary["projected"]["samples_per_s"] / 1e6)


def _row_dtype_auc(runs: dict, data: str, dtype: str, rounding: str, sgd: bool) -> tuple[float, float]:
    r = next(r for r in runs["runs"] if (r["data"], r["row_dtype"], r["rounding"], "--epochs" in r["command"])
             == (data, dtype, rounding, sgd))
    return r["val_auc"], r["val_logloss"]


def _row_dtype_line(runs: dict, dtype: str, rounding: str) -> tuple[float, ...]:
    return (*_row_dtype_auc(runs, "synthetic", dtype, rounding, False),
            *_row_dtype_auc(runs, "ml-100k", dtype, rounding, False),
            *_row_dtype_auc(runs, "ml-100k", dtype, rounding, True))


def _row_dtype_gap(runs: dict, dtype: str, rounding: str, data: str = "ml-100k", sgd: bool = True) -> float:
    base = _row_dtype_auc(runs, data, "float32", "nearest", sgd)[0]
    return _row_dtype_auc(runs, data, dtype, rounding, sgd)[0] - base


def _dlrm_variant(bench: dict, sparse: str, ratio: float | None = None) -> dict:
    return next(r for r in bench["results"] if (r["sparse"], r["ratio"]) == (sparse, ratio))


def _dlrm_cached_line(bench: dict, ratio: float) -> tuple:
    """`bench dlrm`'s row of a cached variant, as the doc's table prints it."""
    r = _dlrm_variant(bench, "cached", ratio)
    moved = (r["bytes_h2d"] + r["bytes_d2h"]) / r["steps"] / 2**20
    return (r["cache_rows"], r["train_samples_per_s"], r["throughput_vs_all_on_device"], r["hit_rate"], moved,
            r["overflow_rows"], r["peak_host_mib"], r["val_auc"])


def _scaling(bench: dict, job: str, ranks: int, **match) -> dict:
    return next(r for r in bench["results"] if r["job"] == job and r["ranks"] == ranks
                and all(r.get(k) == v for k, v in match.items()))


def _scaling_ratios(two: dict, one: dict) -> tuple:
    """A 2-rank row's speed-up (median, then each round's) and its CPU a sample in µs against one rank's."""
    return (two["speedup_vs_1_rank"], *two["speedup_vs_1_rank_runs"], 1e6 * one["cpu_seconds_per_sample"],
            1e6 * two["cpu_seconds_per_sample"], two["cpu_per_sample_vs_1_rank"])


def _scaling_dlrm(bench: dict) -> tuple:
    one, two = _scaling(bench, "dlrm", 1), _scaling(bench, "dlrm", 2, variant=None)
    sent, model = two["comm_bytes_per_step"], two["comm_model_bytes_per_step"]
    mib = [v / 2**20 for k in ("ids", "pooled", "dense_allreduce") for v in (sent[k], model[k])]
    return (one["samples_per_s"], two["samples_per_s"], *_scaling_ratios(two, one),
            sum(sent.values()) / 2**20, sum(model.values()) / 2**20, *mib[:4], *mib[4:])


def _scaling_face(bench: dict, batch_norm: str) -> tuple:
    one, two = _scaling(bench, "face", 1), _scaling(bench, "face", 2, batch_norm=batch_norm)
    sent, model = two["comm_bytes_per_step"], two["comm_model_bytes_per_step"]
    parts = ("gallery_allgather", "ddp_gradients") if batch_norm == "local" else ("batch_norm_allreduce",)
    return (one["samples_per_s"], two["samples_per_s"], *_scaling_ratios(two, one),
            sum(sent.values()) / 2**20, sum(model.values()) / 2**20,
            *(v / 2**20 for k in parts for v in (sent[k], model[k])))


def _cf_case(cf: dict, data: str, dim: int = 64, negatives: int = 64) -> dict:
    return next(c for c in cf["cases"] if (c["data"], c["dim"], c["negatives"]) == (data, dim, negatives))


def _cf_row(case: dict, variant: str, threads: int, rows: str = "rows") -> dict:
    return next(r for r in case[rows] if r["variant"] == variant and r["threads"] == threads)


def _cf_line(cf: dict, data: str, dim: int, threads: int) -> tuple[str, ...]:
    """`bench cf`'s K=64 row as docs/heat.md prints it: torch's epoch, the per-sample kernel
    ("before") against the run kernel ("after"), both tiled, and their accuracy."""
    case = _cf_case(cf, data, dim)
    torch_, after = _cf_row(case, "torch", threads), _cf_row(case, "heat, tiling", threads)
    before = _cf_row(case, "heat per-sample, tiling", threads, "baseline_rows")
    seconds = f"{torch_['epoch_s']:.2f}" if torch_["epoch_s"] < 10 else f"{torch_['epoch_s']:.1f}"
    quality = [" / ".join([f"{torch_[k]:.4f}" if k in torch_ else "–", f"{before[k]:.4f}", f"{after[k]:.4f}"])
               for k in ("recall_at_20", "ndcg_at_20")]
    return (data, str(dim), str(threads), seconds, f"{before['epoch_s']:.3f} → {after['epoch_s']:.3f} s",
            f"{before['speedup_vs_torch']:.1f} → **{after['speedup_vs_torch']:.1f}**", *quality)


def _cf_device_line(cf: dict, negatives: int) -> tuple:
    case = _cf_case(cf, "ml-100k", 64, negatives)
    rows = [_cf_row(case, v, 16) for v in ("torch", "heat, no tiling", "heat, tiling")]
    return (rows[0]["epoch_s"], rows[1]["epoch_s"], rows[1]["speedup_vs_torch"], rows[2]["epoch_s"],
            rows[2]["speedup_vs_torch"], *(r["recall_at_20"] for r in rows), *(r["ndcg_at_20"] for r in rows))


def _cf_best(row: dict) -> tuple:
    return row["epoch_s"], row["best_recall_at_20"], row["best_ndcg_at_20"]


_DAYS = ("day_1", "day_2", "day_3", "day_4", "day_5")


def _vocab(bench: dict, mode: str) -> dict:
    return next(r for r in bench["results"] if r["mode"] == mode)


def _vocab_line(bench: dict, mode: str) -> tuple:
    """`bench vocab`'s row of a variant: next-day AUC each day, the mean, memory, speed, CPU a
    sample in µs, and for open its retired keys and key-index bytes a live key."""
    r = _vocab(bench, mode)
    extra = (f"{r['retired_keys']:,}", f"{r['key_index_bytes_per_live_key']:.1f}") if mode == "open" else ("–", "–")
    return (*(f"{r['next_day_auc'][d]:.4f}" for d in _DAYS), f"{r['mean_auc']:.4f}", f"{r['peak_host_mib']:.0f}",
            f"{r['samples_per_s']:,.0f}", f"{1e6 * r['cpu_seconds_per_sample']:.1f}", *extra)


def _oracle_line(bench: dict, key: str) -> tuple[float, ...]:
    days = [bench["data"]["oracle"][d][key] for d in _DAYS]
    return (*days, sum(days[1:]) / 4)


def _raw_keys_line(bench: dict, shape: str) -> tuple:
    """`bench host --keys ids raw raw-new`'s row of a shape: the ids' samples/s, raw and raw-new
    against them at 1 and 2 threads, the three hit rates."""
    def run(keys, threads):
        return next(r for r in bench["results"] if (r["shape"], r["keys"], r["threads"]) == (shape, keys, threads))
    ids = run("ids", 1)
    return (ids["samples_per_s"], run("raw", 1)["samples_per_s"] / ids["samples_per_s"],
            run("raw", 2)["samples_per_s"] / run("ids", 2)["samples_per_s"],
            run("raw-new", 1)["samples_per_s"] / ids["samples_per_s"],
            *(run(k, 1)["hit_rate"] for k in ("ids", "raw", "raw-new")))


def _raw_keys_steps(bench: dict, shape: str) -> tuple[float, float]:
    return tuple(1e3 * next(r["step_s"] for r in bench["results"] if (r["shape"], r["keys"], r["threads"])
                            == (shape, keys, 1)) for keys in ("ids", "raw"))


def _plan_freq(plan: dict, ratio: float) -> float:
    return next(r["hit_rate"]["freq"] for r in plan["rows"] if r["ratio"] == ratio)


def _projection_line(r: dict) -> str:
    """`bench projection`'s row as docs/scaling.md's table prints it."""
    placement = f"{r['row_wise_rows'] or 'default'}: {r['split_tables']}"  # a best split may be the default
    cells = (str(r["gpus"]), f"{r['rate_per_gpu'] / 1e6:.1f} M", placement, f"{r['compute_ms']:.2f}",
             f"{r['link_ms']:.2f}", f"{r['bytes_per_rank_mib']:.1f}", f"{r['imbalance']:.2f}",
             f"{r['speedup_no_overlap']:.2f} - {r['speedup_full_overlap']:.2f}", r["binds"])
    return "| " + " | ".join(cells) + " |"


def _cf_defaults(sweep: dict, *settings: str, key: str = "best_recall_at_20") -> list[float]:
    return [r[key] for r in sweep["rows"] if r["setting"] in settings]


def _face_traffic(bn_global: dict, bn_local: dict) -> tuple:
    total, local = sum(bn_global.values()), sum(bn_local.values())
    return (bn_global["gallery_allgather"], bn_global["batch_norm_allreduce"], bn_global["ddp_gradients"],
            total, total / 2**20, local, local / 2**20)


_TIERS_DOC, _SCALING_DOC = "docs/tables-larger-than-memory.md", "docs/scaling.md"
_VOCAB_DOC = "docs/open-vocabularies.md"


def _face_row(face: dict, head: str, classes: int) -> dict:
    return next(r for r in face["rows"] if r["head"] == head and r["classes"] == classes)


def _face_cell(row: dict) -> str:
    """A head-benchmark table cell as the doc prints it: step time and head memory (MiB, GiB
    from 1 GiB on), or the skip with its state and cap."""
    if "skipped" in row:
        state, cap = re.fullmatch(r"persistent state (\S+) GiB > --max-gib (\S+)", row["skipped"]).groups()
        return f"skipped: state {state} GiB > {cap} GiB cap"
    size = row["head_peak_bytes"]
    memory = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"
    return f"{row['step_ms']:,.1f} ms · {memory}"


def _face_table_line(face: dict, head: str) -> tuple[str, ...]:
    return tuple(_face_cell(_face_row(face, head, n)) for n in (10**4, 10**5, 10**6, 10**7))


def _face_accuracy(face: dict, head: str) -> tuple:
    r = face["accuracy"]["results"][head]
    return (r["verification_accuracy"], r["accuracy_std"], r["tar@far=1e-3"], r["identification_top1"],
            r["train_seconds"])


def _face_headline(face: dict) -> tuple:
    dcp, fc = _face_row(face, "dcp 1%", 10**6), _face_row(face, "fc", 10**6)
    acc = face["accuracy"]["results"]
    return (dcp["step_ms"], fc["step_ms"] / 1e3, face["fc_over_dcp1_step_time"]["1000000"],
            dcp["head_peak_bytes"] / 2**20, fc["head_peak_bytes"] / 2**30,
            acc["dcp 1%"]["verification_accuracy"], acc["fc"]["verification_accuracy"])


FIGURES = [
    # README: the headline figures
    ("README.md", "a 1.5 % cache finds {:.3f}", "cache.json", ("hit_rate", "results", 1, "freq")),
    ("README.md", "(Belady's offline optimum: {:.3f};", "cache.json", ("hit_rate", "results", 1, "belady")),
    ("README.md", "validation AUC to every digit ({:.6f})", "dlrm.json", ("results", 1, "val_auc")),
    ("README.md", "throughput on this CPU ({:.2f}x;", "dlrm.json", ("results", 1, "throughput_vs_all_on_device")),
    ("README.md", "beats a day-0 vocabulary by {:.2f} points", "vocab.json",
     ("open_minus", "first-day", "mean_auc_points")),
    ("README.md", "and hashing by {:.2f} (", "vocab.json", ("open_minus", "hash", "mean_auc_points")),
    ("README.md", "({:.4f} vs {:.4f} and {:.4f})", "vocab.json",
     lambda d: tuple(d["results"][i]["mean_auc"] for i in (2, 0, 1))),
    ("README.md", "raw keys at {:.2f}x the ids' samples/s one-hot", "host_raw_keys.json",
     ("summary", 1, "raw_vs_ids_1")),
    ("README.md", "one-hot, {:.2f}x multi-hot", "host_raw_keys.json", ("summary", 4, "raw_vs_ids_1")),
    ("README.md", "2 DLRM ranks reach {:.2f}x one process", "scaling.json", ("results", 1, "speedup_vs_1_rank")),
    ("README.md", "half-batch processes reach {:.2f}x", "scaling.json", ("results", 2, "speedup_vs_1_rank")),
    ("README.md", "the projection gives {:.1f}x at 8 GPUs ({:.1f}x with", "projection.json",
     lambda d: (d["results"][9]["speedup_no_overlap"], d["results"][9]["speedup_full_overlap"])),
    ("README.md", "the {} CUDA tests of commit 0802062 passed", "cuda_tests.json", ("counts", "passed")),
    ("README.md", "the cache ({:,.0f} MiB against {:,.0f} MiB one-hot;", "gpu.json",
     lambda d: (d["rows"][1]["peak_device_mib"], d["rows"][0]["peak_device_mib"])),
    ("README.md", "1.5 % runs at **{:.2f}x** the whole table on the GPU one-hot", "gpu.json",
     ("rows", 1, "vs_all_on_gpu")),
    ("README.md", "one-hot and **{:.2f}x** multi-hot", "gpu.json", ("rows", 3, "vs_all_on_gpu")),
    ("README.md", "16 cores is **{:.1f}x** the torch engine on the H200 at K=64 and {:.1f}x at K=1000",
     "cf_device.json", lambda d: tuple(d["cases"][i]["rows"][2]["speedup_vs_torch"] for i in (0, 1))),
    ("README.md", "the cached DLRM step at **{:.2f}x** the whole table, {:.1f}x the host bookkeeper",
     "device_2026-11-28/gpu.json",
     lambda d: (d["blocks"][0]["results"][2]["ratio_to_gpu_tables"],
                d["blocks"][0]["results"][2]["samples_per_s"] / d["blocks"][0]["results"][4]["samples_per_s"])),
    ("README.md", "captured as one CUDA graph reached {:.2f} M samples/s", "device_2026-11-28/gpu_graphs.json",
     lambda d: d["blocks"][0]["results"][1]["samples_per_s"] / 1e6),
    ("README.md", "Its {} failing CUDA tests of {}", "device_2026-11-28/cuda_tests.json",
     lambda d: (d["counts"]["failure"], sum(d["counts"].values()))),
    ("README.md", "share of a step is **{} operations**", "host_ops.json", ("summary", 1, "launches_per_step")),
    ("README.md", "the step issues {} (`bench/results/host_ops_triton.json`", "host_ops_triton.json",
     ("summary", 1, "launches_per_step")),
    ("README.md", "a HEAT epoch is {:.0f}–{:.0f}× faster", "cf.json",
     lambda d: (min(_tiled_k64(d) + [_quiet_tiled(_load("cf_negatives_quiet.json"))]),
                max(_tiled_k64(d) + [_quiet_tiled(_load("cf_negatives_quiet.json"))]))),
    ("README.md", "{:.1f}–{:.1f}× in the benchmark's run", "cf.json",
     lambda d: (min(_tiled_k64(d)), max(_tiled_k64(d)))),
    ("README.md", "{:.1f}× on MovieLens-100k, d 64, one thread", "cf.json",
     ("cases", 0, "rows", 2, "speedup_vs_torch")),
    ("README.md", "on a slower day {:.1f}× tiled, {:.1f}× untiled", "cf_negatives_quiet.json",
     lambda d: (_quiet_tiled(d), d["cases"][0]["rows"][1]["speedup_vs_torch"])),
    ("README.md", "MovieLens-100k: {:.4f} for both", "cf_negatives.json",
     ("cases", 0, "rows", 0, "best_recall_at_20")),
    ("README.md", "MovieLens-100k: {:.4f} for both", "cf_negatives.json",
     ("cases", 0, "rows", 2, "best_recall_at_20")),
    ("README.md", "`make run` about {:.0f} s after the set-up", "make_run.json", ("wall_s",)),
    ("README.md", "other work: load {:.0f}; val AUC {:.4f};", "make_run.json",
     lambda d: (d["hardware"]["loadavg_1_5_15min"][0], d["summary"]["val_auc"])),
    ("README.md", "only reporting the finished one ({:.0f} s;", "make_run.json", ("again_wall_s",)),
    # docs/dlrm.md: make run
    ("docs/dlrm.md", "(load {:.0f}), the whole run, data generation included, took {:.0f} s", "make_run.json",
     lambda d: (d["hardware"]["loadavg_1_5_15min"][0], d["wall_s"])),
    ("docs/dlrm.md", "val AUC {:.4f}, hit rate {:.3f} at the default 1.5 % cache", "make_run.json",
     lambda d: (d["summary"]["val_auc"], d["summary"]["hit_rate"])),
    ("docs/dlrm.md", "cache, {}, {:,.0f} MiB peak host memory", "make_run.json",
     lambda d: (_overflow(d["summary"]["overflow_rows"]), d["summary"]["peak_host_mib"])),
    # docs/dlrm.md: --precision on the CPU
    ("docs/dlrm.md", "the default run of {} steps, seeds 0-2", "precision_cpu.json", ("runs", 0, "steps")),
    ("docs/dlrm.md", "validation AUC {:.4f} with fp32 and {:.4f} with bf16 at the default seed", "precision_cpu.json",
     lambda d: (d["auc_difference"][0]["fp32"], d["auc_difference"][0]["bf16"])),
    ("docs/dlrm.md", "the largest difference over the three seeds {:.4f}", "precision_cpu.json",
     ("largest_abs_difference",)),
    # docs/dlrm.md: reading batches in parallel
    ("docs/dlrm.md", "1 reader: **{:,.0f} rows/s** ({:.2f} CPU-s a million rows)", "loader.json",
     lambda d: (d["rates"][0]["rows_per_s"], d["rates"][0]["cpu_s_per_million_rows"])),
    ("docs/dlrm.md", "2 readers: **{:,.0f} rows/s** ({:.2f} CPU-s a million rows)", "loader.json",
     lambda d: (d["rates"][1]["rows_per_s"], d["rates"][1]["cpu_s_per_million_rows"])),
    ("docs/dlrm.md", "(`--readers 1`), {:,.0f} rows/s", "loader.json", ("background_one_thread_rows_per_s",)),
    ("docs/dlrm.md", "shared with other work, load {:.0f};", "loader.json",
     lambda d: d["hardware"]["loadavg_1_5_15min"][0]),
    # docs/dlrm.md: the shards' codec
    ("docs/dlrm.md", "lz4 reads **{:.2f}x zstd's rows/s** ({:.2f} against {:.2f} CPU-s a million rows) for {:.2f}x the",
     "shard_codecs.json", lambda d: (d["codecs"][1]["speed_vs_zstd"], d["codecs"][1]["cpu_s_per_million_rows"],
                                     d["codecs"][0]["cpu_s_per_million_rows"], d["codecs"][1]["bytes_vs_zstd"])),
    ("docs/dlrm.md", "uncompressed reads {:.2f}x for {:.2f}x the", "shard_codecs.json",
     lambda d: (d["codecs"][2]["speed_vs_zstd"], d["codecs"][2]["bytes_vs_zstd"])),
    ("docs/dlrm.md", "the same {:,} synthetic rows with each codec", "shard_codecs.json", ("rows",)),
    ("docs/dlrm.md", "(`python bench/shard_codecs.py`, `bench/results/shard_codecs.json`; 2 cores, load {:.0f})",
     "shard_codecs.json", lambda d: d["hardware"]["loadavg_1_5_15min"][0]),
    # docs/cache.md: the device bookkeeper's operations, the GPU run
    ("docs/cache.md", "issues **{} operations a step**", "host_ops_triton.json", ("summary", 1, "launches_per_step")),
    ("docs/cache.md", "issues **{} operations a step**", "host_ops_triton.json", ("summary", 3, "launches_per_step")),
    ("docs/cache.md", "the forward {}, the prefetch's admission {}, the backward {} instead of {}",
     "host_ops_triton.json",
     lambda d: (*d["summary"][1]["launches_by_part"].values(),
                json.loads((RESULTS / "host_ops.json").read_text())["summary"][1]["launches_by_part"]["backward"])),
    ("docs/cache.md", "**{} operations a step**", "host_ops.json", ("summary", 1, "launches_per_step")),
    ("docs/cache.md", "**{} operations a step**", "host_ops.json", ("summary", 3, "launches_per_step")),
    ("docs/cache.md", "the prefetch's admission pass {}", "host_ops.json",
     ("summary", 1, "launches_by_part", "prefetch")),
    ("docs/cache.md", "the forward's lookup {}, the backward {}", "host_ops.json",
     lambda d: (d["summary"][1]["launches_by_part"]["forward"], d["summary"][1]["launches_by_part"]["backward"])),
    ("docs/cache.md", "{} of {} passed", "cuda_tests.json",
     lambda d: (d["counts"]["passed"], sum(d["counts"].values()))),
    ("docs/cache.md", "pinned host-to-device copy moves {:.1f} GB/s", "probe.json", ("pinned_copy_gbps",)),
    ("docs/cache.md", "| 512 B (dim 128) | {:.1f} | {:.1f} | {:.1f} | {:.1f} |", "probe.json",
     lambda d: (d["unified_view"]["rows"][2]["gather_gbps"], d["unified_view"]["rows"][2]["gather_rows_per_s"] / 1e6,
                d["unified_view"]["rows"][2]["scatter_gbps"], d["triton_gather"]["rows"][2]["gather_gbps"])),
    ("docs/cache.md", "the probe's {:.1f} above", "probe.json", ("unified_view", "rows", 2, "gather_gbps")),
    ("docs/cache.md", "({:.1f} GB/s in, {:.1f} out: `gpu.json`'s", "gpu.json",
     lambda d: (d["random_rows"]["128"]["gather_gbps"], d["random_rows"]["128"]["scatter_gbps"])),
    ("docs/cache.md", "| one-hot | cached 1.5 %, host bookkeeping | {:,.0f} | **{:.2f}** |", "gpu.json",
     lambda d: (d["rows"][1]["samples_per_s"], d["rows"][1]["vs_all_on_gpu"])),
    ("docs/cache.md", "| multi-hot | cached 1.5 %, host bookkeeping | {:,.0f} | **{:.2f}** |", "gpu.json",
     lambda d: (d["rows"][3]["samples_per_s"], d["rows"][3]["vs_all_on_gpu"])),
    ("docs/cache.md", "table: {:,.0f} MiB against {:,.0f} MiB one-hot", "gpu.json",
     lambda d: (d["rows"][1]["peak_device_mib"], d["rows"][0]["peak_device_mib"])),
    ("docs/cache.md", "*One-hot*, {:.1f} ms a step against the whole table's {:.1f}", "gpu.json",
     lambda d: (d["blocks"][0]["results"][1]["step_ms"], d["blocks"][0]["results"][0]["step_ms"])),
    ("docs/cache.md", "*Multi-hot*, {:.0f} ms a step against {:.1f}", "gpu.json",
     lambda d: (d["blocks"][1]["results"][1]["step_ms"], d["blocks"][1]["results"][0]["step_ms"])),
    ("docs/cache.md", "its bookkeeping takes {:.1f} ms a step on 1 thread and {:.1f} ms on 16", "host_device.json",
     lambda d: (1e3 * d["results"][0]["step_s"], 1e3 * d["results"][2]["step_s"])),
    # docs/cache.md: the second GPU run (device_2026-11-28/)
    ("docs/cache.md", "{} of {} passed, {} failed", "device_2026-11-28/cuda_tests.json",
     lambda d: (d["counts"]["passed"], sum(d["counts"].values()), d["counts"]["failure"])),
    *[("docs/cache.md", "| " + label + " | {:,.0f} | {:.2f} | {:.1f} |", "device_2026-11-28/gpu.json",
       lambda d, k=k: (d["blocks"][0]["results"][k]["samples_per_s"],
                       d["blocks"][0]["results"][k]["ratio_to_gpu_tables"],
                       d["blocks"][0]["results"][k]["step_ms"]))
      for k, label in enumerate(["whole table, torch's kernels", "whole table, Triton's kernels",
                                 "cached, device bookkeeper, Triton's kernels",
                                 "cached, device bookkeeper, torch's kernels",
                                 "cached, host bookkeeper"])],
    ("docs/cache.md", "`index_copy_` took {:.1f} % of the GPU time, most of it in {} calls of {:.2f} ms over 5",
     "device_2026-11-28/gpu.json", lambda d: (float(_profile_line(d, "aten::index_copy_", 7)[0]),
                                              *(f(v) for f, v in zip((int, float), _profile_line(
                                                  d, "index_elementwise_kernel<128,", 13, 12))))),
    ("docs/cache.md", "Triton's kernels | {:,.0f} | {:.2f} | {:.1f} | {:.3f} | {:,.0f} |", "device_2026-11-28/gpu.json",
     lambda d: tuple(d["blocks"][0]["results"][2][k] for k in ("samples_per_s", "ratio_to_gpu_tables", "step_ms",
                                                                "hit_rate", "peak_device_mib"))),
    ("docs/cache.md", "(`syncs_per_step` {:.1f}) and runs {:.1f}x the host bookkeeper", "device_2026-11-28/gpu.json",
     lambda d: (d["blocks"][0]["results"][2]["syncs_per_step"],
                d["blocks"][0]["results"][2]["samples_per_s"] / d["blocks"][0]["results"][4]["samples_per_s"])),
    ("docs/cache.md", "captured and replayed, {:,.0f} samples/s against the eager torch whole table's {:,.0f} in the "
     "same run ({:.2f})", "device_2026-11-28/gpu_graphs.json",
     lambda d: (d["blocks"][0]["results"][1]["samples_per_s"], d["blocks"][0]["results"][0]["samples_per_s"],
                d["blocks"][0]["results"][1]["ratio_to_gpu_tables"])),
    ("docs/cache.md", "reads at {:.1f} % of the copy bandwidth one-hot, {:.2f}x torch's",
     "device_2026-11-28/kernels.json",
     lambda d: (100 * d["rows"][0]["triton"]["forward_share_of_copy"], d["rows"][0]["forward_speedup"])),
    ("docs/cache.md", "reaches {:.1f} %, {:.2f}x torch's sparse path one-hot ({:.2f}x multi-hot)",
     "device_2026-11-28/kernels.json",
     lambda d: (100 * d["rows"][0]["triton"]["backward_share_of_copy"], d["rows"][0]["backward_speedup"],
                d["rows"][1]["backward_speedup"])),
    ("docs/cache.md", "Whole table at bf16 with graphs: {:.2f} M samples/s", "device_2026-11-28/gpu_graphs.json",
     lambda d: d["blocks"][0]["results"][1]["samples_per_s"] / 1e6),
    ("docs/cache.md", "`overflow_rows` {:,} over the {} timed steps", "gpu.json",
     lambda d: (d["blocks"][1]["results"][1]["overflow_rows"], d["config"]["steps"])),
    ("docs/cache.md", "so {:.0f} k rows a step are served beside it", "gpu.json",
     lambda d: d["blocks"][1]["results"][1]["overflow_rows"] / d["config"]["steps"] / 1e3),
    ("docs/cache.md", "`bytes_moved_per_step` {:.0f} MB", "gpu.json",
     lambda d: d["rows"][3]["bytes_moved_per_step"] / 1e6),
    ("docs/cache.md", "the cache ({} slots) is smaller", "device_check.log",
     _log_gpu(r"the cache holds ([\d,]+) rows")),
    ("docs/cache.md", "than a batch's {} distinct rows", "device_check.log",
     _log_gpu(r"a batch needs ([\d,]+) distinct rows")),
    # README and docs/class-pool.md: the face head benchmark
    ("README.md", "a 1 % pool's head step takes {:.0f} ms against full FC's {:.1f} s ({:.0f}×), in {:.0f} MiB against "
     "{:.1f} GiB, and its verification accuracy on the synthetic task is {:.4f} against full FC's {:.4f}",
     "face.json", _face_headline),
    *[("docs/class-pool.md", "| " + head + " | {} | {} | {} | {} |", "face.json",
       lambda d, head=head: _face_table_line(d, head))
      for head in ("fc", "pfc 0.1", "dcp 1%", "dcp 10%", "dcp Q=10,000")],
    ("docs/class-pool.md", "DCP 1 % takes {:.0f} ms per head step against full FC's {:.1f} s: **{:.0f}× faster** "
     "({:.0f}× at 10^4, {:.0f}× at 10^5), with {:.0f} MiB of head memory against {:.1f} GiB", "face.json",
     lambda d: (*_face_headline(d)[:3], d["fc_over_dcp1_step_time"]["10000"], d["fc_over_dcp1_step_time"]["100000"],
                *_face_headline(d)[3:5])),
    ("docs/class-pool.md", "(load average {:.1f} before, {:.1f} after;", "face.json",
     lambda d: (d["loadavg_before"][0], d["loadavg_after"][0])),
    *[("docs/class-pool.md", "| " + head + " | {:.4f} ± {:.4f} | {:.3f} | {:.3f} | {:.1f} |", "face.json",
       lambda d, head=head: _face_accuracy(d, head)) for head in ("fc", "pfc 0.1", "dcp 1%", "dcp 10%")],
    ("docs/class-pool.md", "(in `face.json` it is {:.1f}–{:.1f} points above it;", "face.json",
     lambda d: tuple(100 * (d["accuracy"]["results"][h]["verification_accuracy"]
                            - d["accuracy"]["results"]["fc"]["verification_accuracy"]) for h in ("dcp 1%", "dcp 10%"))),
    # docs/cache.md: the cache benchmark (hit rates; bookkeeping cost)
    *[("docs/cache.md", f"| {trace} | {100 * ratio:g} % | {{}} |", "cache.json",
       lambda d, trace=trace, ratio=ratio: _hit_rate_cells(d, trace, ratio))
      for trace in ("stationary", "drifting") for ratio in (0.005, 0.015, 0.05)],
    *[("docs/cache.md", f"| {trace} | {100 * ratio:g} % | {{}} |", "cache_scale0.1.json",
       lambda d, trace=trace, ratio=ratio: _hit_rate_cells(d, trace, ratio, gap=False))
      for trace in ("stationary", "drifting") for ratio in (0.005, 0.015, 0.05)],
    ("docs/cache.md", "(its 26 cardinalities at full scale: {:.1f} M rows in one id space;", "cache.json",
     lambda d: d["hit_rate"]["num_rows"] / 1e6),
    ("docs/cache.md", "is still {:.1f} and {:.1f} points below Belady", "cache.json",
     lambda d: tuple(_points(d, "stationary", r, "belady", "static_top_c") for r in (0.005, 0.015))),
    ("docs/cache.md", "`freq` is within {:.1f} and {:.1f} points of that oracle at 0.5 % and 1.5 %", "cache.json",
     lambda d: tuple(_points(d, "stationary", r, "static_top_c", "freq") for r in (0.005, 0.015))),
    ("docs/cache.md", "`freq` {:.3f} at 5 % with either warm-up, the oracle {:.3f})", "cache_scale0.1.json",
     lambda d: (_hit_rates(d, "stationary", 0.05)["freq"], _hit_rates(d, "stationary", 0.05)["static_top_c"])),
    ("docs/cache.md", "With admission control it is the same ({:.3f}, and no row bypassed)", "cache_scale0.1.json",
     lambda d: _hit_rates(d, "stationary", 0.05)["freq+adm"]),
    ("docs/cache.md", "`freq` beats `lru` at every size (+{:.1f}, +{:.1f}, +{:.1f} points)", "cache.json",
     lambda d: tuple(_points(d, "drifting", r, "freq", "lru") for r in (0.005, 0.015, 0.05))),
    ("docs/cache.md", "moves the hit rate by {:.1f} to +{:.1f} point here", "cache.json",
     lambda d: (lambda gains: (min(gains), max(gains)))(
         [_points(d, tr, r, "freq+adm", "freq") for tr in ("stationary", "drifting") for r in (0.005, 0.015, 0.05)])),
    ("docs/cache.md", "({:.1f} M rows; a 0.5 % cache of {:.1f} k slots", "cache_scale0.1.json",
     lambda d: (d["hit_rate"]["num_rows"] / 1e6, _hit_rates(d, "stationary", 0.005)["cache_rows"] / 1e3)),
    ("docs/cache.md", "At 0.5 % `freq+adm` is {:.1f} points above `freq` and {:.1f} above Belady without bypass, "
     "{:.1f} below Belady with it", "cache_scale0.1.json",
     lambda d: tuple(_points(d, "stationary", 0.005, a, b)
                     for a, b in (("freq+adm", "freq"), ("freq+adm", "belady"), ("belady_bypass", "freq+adm")))),
    ("docs/cache.md", "at 5 %, `freq` is {:.1f} points below", "cache.json",
     lambda d: _points(d, "stationary", 0.05, "belady", "freq")),
    ("docs/cache.md", "trace at scale {} = {:.1f} M rows, {} timed steps", "cache_timing.json",
     lambda d: (d["config"]["timing_scale"], d["timing"]["num_rows"] / 1e6, d["timing"]["steps"])),
    *[("docs/cache.md", "| " + label + (" | {} | {} | {} | {} |" if moved else " | {} | {} | {} | |"),
       "cache_timing.json",
       lambda d, opt=opt, key=key, moved=moved: _timing_line(d, opt, key, moved))
      for label, opt, key, moved in (("SGD, compiled pass", "sgd", "bookkeeping_ratio", True),
                                     ("SGD, tensor ops", "sgd", "bookkeeping_ratio_tensor_ops", False),
                                     ("Adagrad (bit-exact), compiled pass", "adagrad", "bookkeeping_ratio", True),
                                     ("Adagrad, tensor ops", "adagrad", "bookkeeping_ratio_tensor_ops", False))],
    # docs/cache.md: the host's ceiling (bench host) and row precision
    *[("docs/cache.md", f"| {shape} | {100 * ratio:g} % | " + _HOST_CELLS, "host.json",
       lambda d, shape=shape, ratio=ratio: _host_line(d, shape, ratio))
      for shape, ratio in (("one-hot", 0.005), ("one-hot", 0.05), ("multi-hot", 0.005), ("multi-hot", 0.015),
                           ("multi-hot", 0.05))],
    ("docs/cache.md", "| one-hot | **1.5 %** | {:.2f} | **{:,.0f}** | {:.1f} | {:,.0f} | **{:.2f}** | **{:.2f} M** |",
     "host.json", lambda d: _host_line(d, "one-hot", 0.015)),
    *[("docs/cache.md", "| " + label + " | {:.4f} ({:.4f}) | {:.4f} ({:.4f}) | {:.4f} ({:.4f}) |", "row_dtype.json",
       lambda d, dtype=dtype, rounding=rounding: _row_dtype_line(d, dtype, rounding))
      for label, dtype, rounding in (("float32", "float32", "nearest"), ("bfloat16, nearest", "bfloat16", "nearest"),
                                     ("bfloat16, stochastic", "bfloat16", "stochastic"),
                                     ("float16, nearest", "float16", "nearest"),
                                     ("float16, stochastic", "float16", "stochastic"))],
    ("docs/cache.md", "(all within ±{:.4f} AUC of float32)", "row_dtype.json",
     lambda d: max(abs(_row_dtype_gap(d, t, r, data, False)) for t in ("bfloat16", "float16")
                   for r in ("nearest", "stochastic") for data in ("synthetic", "ml-100k"))),
    ("docs/cache.md", "drops most updates under nearest rounding ({:.4f} AUC); stochastic rounding recovers three "
     "quarters of that ({:.4f}), float16 with it is within {:.4f}", "row_dtype.json",
     lambda d: (_row_dtype_gap(d, "bfloat16", "nearest"), _row_dtype_gap(d, "bfloat16", "stochastic"),
                -_row_dtype_gap(d, "float16", "stochastic"))),
    # docs/dlrm.md: the DLRM benchmark (bench dlrm; compare_commits)
    *[("docs/dlrm.md", f"| cached {100 * ratio:g} % " + "({:,} rows) | {:,.0f} | {:.2f} | {:.3f} | {:.2f} MiB | {:,} | "
       "{:,.0f} MiB | {:.6f} |", "dlrm.json", lambda d, ratio=ratio: _dlrm_cached_line(d, ratio))
      for ratio in (0.005, 0.015, 0.05)],
    *[("docs/dlrm.md", f"| all tables on {sparse} | " + "{:,.0f} | {:.2f} | | | | {:,.0f} MiB | {:.6f} |", "dlrm.json",
       lambda d, sparse=sparse: tuple(_dlrm_variant(d, sparse)[k] for k in (
           "train_samples_per_s", "throughput_vs_all_on_device", "peak_host_mib", "val_auc")))
      for sparse in ("device", "host")],
    ("docs/dlrm.md", "(`dlrm.json`: this session's run, {},", "dlrm.json", lambda d: d["hardware"]["date"][:10]),
    ("docs/dlrm.md", "The 0.5 % cache now overflows ({:,} rows over the {} steps, served beside the cache, "
     "exactly) and hits {:.3f} instead", "dlrm.json",
     lambda d: tuple(_dlrm_variant(d, "cached", 0.005)[k] for k in ("overflow_rows", "steps", "hit_rate"))),
    ("docs/dlrm.md", "the train shards' CRC-32 takes {:.3f} s, {:.2f} % of an epoch ({:.1f} s at the 0.5 % cache's "
     "rate), and a resume's verification of its sealed files {:.1f} ms, {:.2f} % of its {:.2f} s load "
     "(a {:.0f} MB checkpoint",
     "dlrm.json", lambda d: (lambda c: (c["shards_seconds"], 100 * c["shards_fraction_of_epoch"], c["epoch_seconds"],
                                        1e3 * c["verify_seconds"], 100 * c["verify_fraction_of_load"],
                                        c["load_seconds"], c["checkpoint_bytes"] / 1e6))(d["checksums"])),
    ("docs/dlrm.md", "head/base {:.2f}, {:.2f}, {:.2f}, {:.2f}, median **{:.2f}**", "dlrm_ab.json",
     lambda d: (*(r["ratio"] for r in d["rounds"]), d["median_ratio"])),
    ("docs/dlrm.md", "hit rate {}, on the CPU of that session", "make_run.json", ("summary", "hit_rate")),
    ("docs/dlrm.md", "the same run gives val AUC {:.4f} (`bench/results/make_run.json`)", "make_run.json",
     ("summary", "val_auc")),
    # docs/scaling.md: the scaling benchmark
    (_SCALING_DOC, "| DLRM | {:,.0f} samples/s | {:,.0f} samples/s | **{:.2f}** ({:.2f}, {:.2f}, {:.2f}; target 1.7: "
     "missed) | {:.1f} -> {:.1f} µs, **x{:.2f}** (target 1.15: missed) | {:.2f} / {:.2f} MiB: ids {:.2f} / {:.2f}, "
     "pooled {:.2f} / {:.2f} and as much in gradients, dense all-reduce {:.3f} / {:.3f} |", "scaling.json",
     _scaling_dlrm),
    (_SCALING_DOC, "| DLRM, 2 independent processes (the host's ceiling) | | {:,.0f} samples/s | **{:.2f}** ({:.2f}, "
     "{:.2f}, {:.2f}) | {:.1f} -> {:.1f} µs, x{:.2f} | nothing |", "scaling.json",
     lambda d: (_scaling(d, "dlrm", 2, variant="independent")["samples_per_s"],
                *_scaling_ratios(_scaling(d, "dlrm", 2, variant="independent"), _scaling(d, "dlrm", 1)))),
    (_SCALING_DOC, "| face (dcp), `--batch-norm local` | {:,.0f} samples/s | {:,.0f} samples/s | **{:.2f}** ({:.2f}, "
     "{:.2f}, {:.2f}; target 1.4: met on the median) | {:.1f} -> {:.1f} µs, x{:.2f} | {:.3f} / {:.3f} MiB a rank: "
     "gallery all-gather {:.3f} / {:.3f}, DDP gradients {:.3f} / {:.3f} |", "scaling.json",
     lambda d: _scaling_face(d, "local")),
    (_SCALING_DOC, "| face (dcp), `--batch-norm global` (exact) | {:,.0f} samples/s | {:,.0f} samples/s | {:.2f} "
     "({:.2f}, {:.2f}, {:.2f}) | {:.1f} -> {:.1f} µs, x{:.2f} | {:.3f} / {:.3f} MiB a rank: as local, and batch norm "
     "{:.3f} / {:.3f} |", "scaling.json", lambda d: _scaling_face(d, "global")),
    (_SCALING_DOC, "{:.1f}k against 50.7k samples/s for one DLRM process", "scaling.json",
     lambda d: _scaling(d, "dlrm", 1)["samples_per_s"] / 1e3),
    (_SCALING_DOC, "on 2 ranks that is {:,.0f} + {:,.0f} + {:,.0f} = {:,.0f} bytes ({:.3f} MiB) with global batch "
     "norm and {:,.0f} ({:.3f} MiB) with local", "scaling.json",
     lambda d: _face_traffic(*(_scaling(d, "face", 2, batch_norm=bn)["comm_model_bytes_per_step"]
                               for bn in ("global", "local")))),
    # docs/open-vocabularies.md and README: bench vocab
    *[(_VOCAB_DOC, f"| {mode} |" + " {} |" * 11, "vocab.json", lambda d, mode=mode: _vocab_line(d, mode))
      for mode in ("first-day", "hash", "open")],
    *[(_VOCAB_DOC, f"| {label} |" + " {:.4f} |" * 6 + " – |" * 5, "vocab.json",
       lambda d, key=key: _oracle_line(d, key))
      for label, key in (("oracle: the hidden model", "oracle_auc"),
                         ("oracle: day 0's values only", "oracle_auc_day0_values_only"))],
    *[(_VOCAB_DOC, f"| {mode} |" + " {:+.2f} |" * 6, "vocab.json",
       lambda d, mode=mode: (d["open_minus"][mode]["mean_auc_points"],
                             *(d["open_minus"][mode]["auc_points"][day] for day in _DAYS)))
      for mode in ("first-day", "hash")],
    (_VOCAB_DOC, "at the same rows: {:+.2f} points over a day-0 vocabulary and {:+.2f} over hashing",
     "vocab.json", lambda d: tuple(d["open_minus"][m]["mean_auc_points"] for m in ("first-day", "hash"))),
    (_VOCAB_DOC, "It gets within {:.1f} points of the hidden model", "vocab.json",
     lambda d: 100 * (_oracle_line(d, "oracle_auc")[-1] - _vocab(d, "open")["mean_auc"])),
    (_VOCAB_DOC, "It trains at {:.2f}x the vocabulary's samples/s and {:.2f}x hashing's (CPU a sample "
     "+{:.0f} % over", "vocab.json",
     lambda d: (_vocab(d, "open")["samples_per_s"] / _vocab(d, "first-day")["samples_per_s"],
                _vocab(d, "open")["samples_per_s"] / _vocab(d, "hash")["samples_per_s"],
                100 * _vocab(d, "open")["cpu_seconds_per_sample"] / _vocab(d, "first-day")["cpu_seconds_per_sample"]
                - 100)),
    *[(_VOCAB_DOC, f"| {label} | " + "{:,.0f} | **{:.2f}** | {:.2f} | {:.2f} | {:.3f} / {:.3f} / {:.3f} |",
       "host_raw_keys.json", lambda d, shape=shape: _raw_keys_line(d, shape))
      for shape, label in (("one-hot", "one-hot (26 a sample, 426 k a step)"),
                           ("multi-hot", "multi-hot (214 a sample, 3.5 M a step)"))],
    *[(_VOCAB_DOC, "ms of a {:.1f} ms ids step (raw: {:.1f} ms) |", "host_raw_keys.json",
       lambda d, shape=shape: _raw_keys_steps(d, shape)) for shape in ("one-hot", "multi-hot")],
    ("README.md", "at {:.1f} bytes of key index a live key (`bench/results/vocab.json`)", "vocab.json",
     lambda d: _vocab(d, "open")["key_index_bytes_per_live_key"]),
    # README and docs/planning.md: cache plan on the built-in data
    ("README.md", "a default `dlrm train` run's within {:.1f} ({:.3f} predicted, {:.3f} run, at 1.5 %;", "plan.json",
     lambda d: (lambda plan, run: (100 * (plan - run), plan, run))(
         _plan_freq(d, 0.015), _load("make_run.json")["summary"]["hit_rate"])),
    ("docs/planning.md", "0.1 %: {:.3f} predicted, 0.199 run; 0.5 %: {:.3f}, 0.564; 1.5 %: {:.3f}, {:.3f} (the last",
     "plan.json", lambda d: (*(_plan_freq(d, r) for r in (0.001, 0.005, 0.015)),
                             _load("make_run.json")["summary"]["hit_rate"])),
    ("docs/planning.md", "a batch needs Σ(1-(1-1/B)^f) distinct rows on average ({:,.0f} here, `plan.json`",
     "plan.json",
     ("distinct_rows_per_batch_expected",)),
    *[(_SCALING_DOC, "{}", "projection.json", lambda d, i=i: _projection_line(d["results"][i])) for i in range(33)],
    # README and docs/tables-larger-than-memory.md: bench tiers
    ("README.md", "A {:.0f} GiB table trains through the cache on a machine with {:.1f} GiB of RAM", "tiers.json",
     lambda d: (d["larger_than_memory"]["file_gib"], d["larger_than_memory"]["ram_gib"])),
    (_TIERS_DOC, "load average about {:.0f} during the run; {:.1f} GiB RAM;", "tiers.json",
     lambda d: (d["hardware"]["loadavg_1_5_15min"][0], d["larger_than_memory"]["ram_gib"])),
    (_TIERS_DOC, "| table | {:,} rows x {}, float32 + Adagrad state: **{:.1f} GiB of files**, "
     "RAM {:.1f} GiB |", "tiers.json",
     lambda d: tuple(d["larger_than_memory"][k] for k in ("rows", "dim", "file_gib", "ram_gib"))),
    (_TIERS_DOC, "| cache | {:.1f} % of rows ({:,}), LRU; batches of {:,} bags x {} Zipf ids",
     "tiers.json", lambda d: (100 * d["config"]["cache_ratio"], d["larger_than_memory"]["cache_rows"],
                              d["config"]["batch_size"], d["config"]["bag_size"])),
    (_TIERS_DOC, "| making the files | {:.0f} s (drawing", "tiers.json",
     ("larger_than_memory", "create_seconds")),
    (_TIERS_DOC, "| training, {} batches | **{:,.0f} samples/s**, hit rate {:.3f}, {:,} evictions, "
     "{:.0f} MiB of rows in, {:.0f} MiB of dirty rows out |", "tiers.json",
     lambda d: (lambda b: (b["steps"], b["samples_per_s"], b["hit_rate"], b["evictions"], b["bytes_h2d"] / 2**20,
                           b["bytes_d2h"] / 2**20))(d["larger_than_memory"])),
    (_TIERS_DOC, "| peak resident memory | **{:.0f} MiB anonymous** (cache, maps, batches) + {:,.0f} "
     "MiB of mapped file pages", "tiers.json",
     lambda d: (d["larger_than_memory"]["peak_rss_anon_mib"], d["larger_than_memory"]["peak_rss_file_mib"])),
    (_TIERS_DOC, "the part below, {:,.0f} MiB) |", "tiers.json",
     ("larger_than_memory", "peak_rss_mib_getrusage")),
    (_TIERS_DOC, "| disk | {:.2f} GiB read ({:,} major faults, about one 4 KiB page per missed row "
     "and one for its state: the page cache served about {:.0f} % of those page reads), {:.2f} GiB written back",
     "tiers.json", lambda d: (lambda b: (b["disk_read_bytes"] / 2**30, b["disk_major_faults"],
                                         100 * (1 - b["disk_major_faults"] / (b["bytes_h2d"] / (b["dim"] * 8) * 2)),
                                         b["disk_write_bytes"] / 2**30))(d["larger_than_memory"])),
    (_TIERS_DOC, "the mapped store ran at {:.2f}x the memory store's samples/s overall, {:.2f}x as "
     "the median of the rounds, with rounds from {:.2f}x to {:.2f}x", "tiers.json",
     lambda d: (lambda f: (f["mmap_vs_memory"], f["mmap_vs_memory_median_of_rounds"], min(f["round_ratios"]),
                           max(f["round_ratios"])))(d["fits_in_memory"])),
    (_TIERS_DOC, "The tables came out {}", "tiers.json",
     lambda d: "equal" if d["fits_in_memory"]["tables_equal"] else "different"),
    # docs/heat.md: the HEAT benchmark (bench cf), on the GPU host, the negative rule
    *[("docs/heat.md", "| {} | {} | {} | {} | {} | {} | {} | {} |", "cf.json",
       lambda d, data=data, dim=dim, threads=threads: _cf_line(d, data, dim, threads))
      for data in ("ml-100k", "synthetic") for dim in (64, 128) for threads in (1, 2)],
    ("docs/heat.md", "At K=1000 (3 epochs; `cf.json`): {:.1f}× / {:.0f}× torch on ml-100k and {:.1f}× / {:.0f}× on "
     "the synthetic set (1 / 2 threads), against {:.0f}× / {:.0f}× and {:.0f}× / {:.0f}× with the per-sample kernel",
     "cf.json",
     lambda d: tuple(_cf_row(_cf_case(d, data, 64, 1000), variant, n, rows)["speedup_vs_torch"]
                     for variant, rows in (("heat, tiling", "rows"), ("heat per-sample, tiling", "baseline_rows"))
                     for data in ("ml-100k", "synthetic") for n in (1, 2))),
    *[("docs/heat.md", f"| {k} | " + "{:.3f} | {:.3f} s | **{:.1f}** | {:.3f} s | **{:.1f}** | "
       "{:.4f} / {:.4f} / {:.4f} | {:.4f} / {:.4f} / {:.4f} |", "cf_device.json",
       lambda d, k=k: _cf_device_line(d, k)) for k in (64, 1000)],
    *[("docs/heat.md", f"| {label} | {n} | " + cells, "cf_negatives.json",
       lambda d, n=n, variant=variant, old=old: (lambda case: (
           *_cf_best(_cf_row(case, variant, n)),
           *(_cf_best(_cf_row(case, variant, n, "old_rule_rows")) if old else ())))(_cf_case(d, "ml-100k")))
      for n in (1, 2) for label, variant, old, cells in (
          ("torch", "torch", True, "{:.2f} | {:.4f} / {:.4f} | {:.2f} | {:.4f} / {:.4f} |"),
          ("HEAT, tiled", "heat, tiling", True, "{:.3f} | **{:.4f}** / {:.4f} | {:.3f} | {:.4f} / {:.4f} |"),
          ("HEAT, untiled", "heat, no tiling", False, "{:.3f} | {:.4f} / {:.4f} | | |"))],
    ("docs/heat.md", "gave on MovieLens-100k torch {:.2f} s, HEAT {:.3f} s untiled", "cf_negatives_quiet.json",
     lambda d: tuple(_cf_row(_cf_case(d, "ml-100k"), v, 1)["epoch_s"] for v in ("torch", "heat, no tiling"))),
    ("docs/heat.md", "on the synthetic set HEAT tiled {:.3f} s against torch's projected {:.1f} s ({:.0f}×)",
     "cf_negatives_quiet.json",
     lambda d: (lambda tiled, torch_: (tiled["epoch_s"], torch_["epoch_s"], tiled["speedup_vs_torch"]))(
         _cf_row(_cf_case(d, "synthetic"), "heat, tiling", 1), _cf_row(_cf_case(d, "synthetic"), "torch", 1))),
    ("docs/heat.md", "(margin 0.5, negative weight 10, gamma 0.5, history 20, lr 0.1) give {:.4f} / {:.4f} (seeds 1 "
     "and 2: {:.4f}, {:.4f})", "cf_defaults.json",
     lambda d: (*_cf_defaults(d, "defaults"), *_cf_defaults(d, "defaults", key="best_ndcg_at_20"),
                *_cf_defaults(d, "defaults, seed 1", "defaults, seed 2"))),
    ("docs/heat.md", "lr 0.05 or 0.2 stay within {:.4f}-{:.4f}, inside", "cf_defaults.json",
     lambda d: (lambda v: (min(v), max(v)))(_cf_defaults(d, "margin 0.4", "margin 0.9", "gamma 0.8", "gamma 1",
                                                        "history 10", "history 50", "lr 0.05", "lr 0.2"))),
    ("docs/heat.md", "fall to {:.2f}-{:.2f} on this small set", "cf_defaults.json",
     lambda d: (lambda v: (min(v), max(v)))([r["best_recall_at_20"] for r in d["rows"]
                                             if r["change"].get("neg_weight", 0) >= 150])),
    # docs/heat.md: the quiet run
    ("docs/heat.md", "untiled (**{:.1f}×**) and 0.141 s tiled ({:.1f}×;", "cf_negatives_quiet.json",
     lambda d: (d["cases"][0]["rows"][1]["speedup_vs_torch"], _quiet_tiled(d))),
    ("docs/heat.md", "and {:.0f}–{:.0f}× torch at K=64 in this run", "cf.json",
     lambda d: (min(_tiled_k64(d)), max(_tiled_k64(d)))),
]


def _load(name: str):
    text = (RESULTS / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def read_value(name: str, where):
    """The figure `where` names in result file `name`: a tuple of values where it gives several."""
    data = _load(name)
    if isinstance(where, str):  # a log: the pattern's first group, as the log writes it
        match = re.search(where, data, re.S)
        assert match, f"{name}: {where!r} not found"
        return match.group(1)
    if callable(where):
        return where(data)
    for key in where:
        data = data[key]
    return data


def stated(phrase: str, value) -> str:
    return phrase.format(*value) if isinstance(value, tuple) else phrase.format(value)


def paragraphs(text: str) -> list[str]:
    """The paragraphs of a doc's text, each with its line breaks read as spaces."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]


def where_stated(text: str, phrase: str, name: str, value) -> list[str]:
    """The paragraphs of a doc's `text` that state `phrase` with `value` and name `name`
    (or follow one that does: a table, a list under the sentence that cites its file)."""
    shown, paras = stated(phrase, value), paragraphs(text)
    return [p for i, p in enumerate(paras) if shown in p and (name in p or i and name in paras[i - 1])]


@pytest.mark.parametrize("doc,phrase,name,where", FIGURES, ids=[f"{f[0]}:{f[1][:40]}" for f in FIGURES])
def test_a_figure_in_the_docs_is_its_result_files(doc, phrase, name, where):
    value = read_value(name, where)
    assert where_stated((ROOT / doc).read_text(), phrase, name, value), (
        f"{doc} does not state {stated(phrase, value)!r} in a paragraph naming {name}")


def _changed(value):
    if isinstance(value, tuple):
        return (_changed(value[0]),) + value[1:]
    if isinstance(value, str):
        return value.replace(value[-1], "0" if value[-1] != "0" else "1")
    return value * 1.37 + 3


@pytest.mark.parametrize("doc,phrase,name,where", FIGURES[::6], ids=[f"{f[0]}:{f[1][:40]}" for f in FIGURES[::6]])
def test_the_check_fails_when_the_file_or_the_doc_changes_the_number(doc, phrase, name, where):
    value = read_value(name, where)
    text = (ROOT / doc).read_text()
    assert where_stated(text, phrase, name, value)
    assert not where_stated(text, phrase, name, _changed(value))  # the file's number changed
    edited = " ".join(text.split()).replace(stated(phrase, value), stated(phrase, _changed(value)))
    assert not where_stated(edited, phrase, name, value)  # the doc's number changed
