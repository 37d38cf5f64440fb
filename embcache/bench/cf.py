"""`embcache bench cf`: HEAT against the PyTorch reference, side by side in one run on the same
cores and data (MovieLens-100k and the Gowalla-scale synthetic set): epoch time of the torch
engine, HEAT without tiling and HEAT with tiling, with 1 thread and with all cores; Recall@20
and NDCG@20 of each after the same number of epochs; the bytes a HEAT epoch must move and the
fraction of this machine's memory bandwidth (a copy kernel measured in the same run) that it
achieves. Writes bench/results/cf.json and cf.png.

Epoch time is the median over the epochs run (the kernels are compiled before any timing).
On the synthetic set, where a full torch epoch would take too long (more training pairs
than --torch-max-pairs), torch is timed on a fixed seeded subset of the pairs and its epoch
time is projected from its pairs/s; its accuracy is then not measured (the row says so).
Accuracy is compared on MovieLens-100k, where every engine runs the same full epochs.

Bytes per HEAT epoch count the embedding-row traffic the kernel cannot avoid, each row access
once, float32: per sample the user row (read + write), SimpleX's history rows (read + write),
the positive (read + write), the K negatives (read) and the negatives inside the margin
(write); W (d x d) stays in cache and is left out. With tiling the negative reads are served
by the thread's cache-sized tile, so that share need not come from memory.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

DATASETS = ("ml-100k", "synthetic")
VARIANTS = ("torch", "heat, no tiling", "heat, tiling")


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    p.add_argument("--ml-epochs", type=int, default=10, help="epochs per engine on ml-100k")
    p.add_argument("--synthetic-epochs", type=int, default=3, help="epochs per engine on the synthetic set")
    p.add_argument("--ml-negatives", type=int, nargs="+", default=[64], help="K values run on ml-100k")
    p.add_argument("--synthetic-negatives", type=int, nargs="+", default=[64, 1000],
                   help="K values run on the synthetic set (the published SimpleX runs use K = 800..2000)")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all cores)")
    p.add_argument("--model", choices=("simplex", "mf-ccl"), default="simplex")
    p.add_argument("--torch-max-pairs", type=int, default=50_000,
                   help="synthetic set: above this many training pairs torch is timed on a seeded "
                        "subset of this size (ml-100k always runs full torch epochs)")
    p.add_argument("--synthetic-users", type=int, default=30_000)
    p.add_argument("--synthetic-items", type=int, default=40_000)
    p.add_argument("--synthetic-interactions", type=int, default=1_000_000)
    p.add_argument("--copy-mib", type=int, default=512, help="size of each array of the copy kernel")
    p.add_argument("--out-dir", default=None, help="default bench/results")
    p.add_argument("--name", default="cf", help="result file name")
    p.add_argument("--no-plot", action="store_true", help="no PNG")
    p.set_defaults(func=run)
    return p


# --------------------------------------------------------------------------- measurements
def copy_bandwidth(threads: int, mib: int, reps: int = 5) -> float:
    """Bytes/s of a parallel array copy (read + write counted), best of `reps` passes."""
    import numba

    from cpu_kernels import _kernels

    n = mib * 2**20 // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    numba.set_num_threads(threads)
    _kernels.stream_copy(src, dst, 1)  # compile, touch the pages
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        _kernels.stream_copy(src, dst, 1)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def epoch_bytes(params, users: np.ndarray, active_negatives: int) -> dict:
    """Row traffic of one HEAT epoch (see the module docstring)."""
    c = params.config
    row = 4 * c.dim
    n = len(users)
    hist = int(params.hist_len[users].sum()) if c.simplex else 0
    parts = {"user": 2 * n * row, "history": 2 * hist * row, "positive": 2 * n * row,
             "negative_reads": n * c.negatives * row, "negative_writes": int(active_negatives) * row}
    return {"bytes": sum(parts.values()), "parts": parts}


def run_variant(variant: str, data, config, threads: int, epochs: int, torch_max_pairs: int) -> dict:
    """Train a fresh model with one engine; epoch times, throughput, final accuracy."""
    import torch

    from cpu_kernels.fit import fit, make_engine
    from cpu_kernels.model import CFParams
    from cpu_kernels.reference import TorchEngine, TorchOptions
    from cpu_kernels.train import HeatOptions

    torch.set_num_threads(threads)
    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    row = {"variant": variant, "threads": threads, "train_pairs": data.num_train}
    if variant == "torch" and torch_max_pairs is not None and data.num_train > torch_max_pairs:
        users, items = data.train_pairs()
        pick = np.sort(np.random.default_rng(0).choice(len(users), torch_max_pairs, replace=False))
        warm = max(len(pick) // 10, 1)
        TorchEngine(params, users[pick[:warm]], items[pick[:warm]], TorchOptions(threads=threads)).epoch(0)
        engine = TorchEngine(params, users[pick], items[pick], TorchOptions(threads=threads))
        t0 = time.perf_counter()
        engine.epoch(1)
        seconds = time.perf_counter() - t0
        rate = torch_max_pairs / seconds
        row.update(timed_on=f"seeded subset of {torch_max_pairs:,} training pairs (one pass, after a warm-up on a "
                            f"tenth of them); epoch time projected from pairs/s; accuracy not measured",
                   subset_pairs=torch_max_pairs, samples_per_s=rate, epoch_s=data.num_train / rate)
        return row
    heat = HeatOptions(threads=threads, tile=0 if variant == "heat, no tiling" else HeatOptions.tile)
    engine = make_engine("torch" if variant == "torch" else "heat", params, data, heat, TorchOptions(threads=threads))
    records = fit(engine, params, data, epochs, eval_every=epochs, progress=False)
    times = [r["seconds"] for r in records]
    last = records[-1]
    row.update(epochs=epochs, epoch_s=statistics.median(times), epoch_s_all=times,
               samples_per_s=data.num_train / statistics.median(times), loss=last["loss"],
               recall_at_20=last["recall@20"], ndcg_at_20=last["ndcg@20"])
    if variant != "torch":
        users, _ = data.train_pairs()
        active = statistics.median(r["active_negatives"] for r in records)
        row["bytes_per_epoch"] = epoch_bytes(params, users, active)
    return row


def topk_backends(data, config) -> dict:
    """Seconds of one full evaluation with each top-k back-end (same ranking either way)."""
    from cpu_kernels import metrics
    from cpu_kernels.model import CFParams
    from cpu_kernels.train import user_vectors

    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    z = user_vectors(params)
    out = {}
    for backend in metrics.BACKENDS:
        t0 = time.perf_counter()
        res = metrics.evaluate(z, params.I, data.train_indptr, data.train_indices, data.test_indptr,
                               data.test_indices, backend=backend)
        out[f"{backend}_s"] = time.perf_counter() - t0
        out[f"{backend}_recall@20"] = res["recall@20"]
    out["faster"] = min(metrics.BACKENDS, key=lambda b: out[f"{b}_s"])
    return out


def load(name: str, args):
    """The data set of one case: the offline MovieLens-100k or the seeded synthetic set."""
    from cpu_kernels.data import load_ml100k
    from cpu_kernels.synthetic import power_law_interactions

    if name == "ml-100k":
        return load_ml100k()
    return power_law_interactions(args.synthetic_users, args.synthetic_items, args.synthetic_interactions)


# --------------------------------------------------------------------------- the run
def run(args) -> int:
    from dataclasses import asdict

    from cpu_kernels import metrics
    from cpu_kernels.fit import compile_kernels
    from cpu_kernels.model import CFConfig
    from cpu_kernels.train import max_threads
    from embcache.bench.common import write_json

    all_threads = max_threads()
    threads = sorted(set(args.threads or (1, all_threads)))
    if any(not 1 <= t <= all_threads for t in threads):
        print(f"bench cf: --threads must be in 1..{all_threads}")
        return 2
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    print("compiling the kernels ...", flush=True)
    compile_kernels()
    bandwidth = {}
    for t in threads:
        bandwidth[str(t)] = copy_bandwidth(t, args.copy_mib)
        print(f"copy bandwidth, {t} thread(s): {bandwidth[str(t)] / 1e9:.2f} GB/s", flush=True)
    cases, topk = [], {}
    for name in args.datasets:
        data = load(name, args)
        u, v = metrics.popularity_scores(data.train_indices, data.num_users, data.num_items)
        pop = metrics.evaluate(u, v, data.train_indptr, data.train_indices, data.test_indptr, data.test_indices,
                               cosine=False)
        epochs = args.ml_epochs if name == "ml-100k" else args.synthetic_epochs
        for k in (args.ml_negatives if name == "ml-100k" else args.synthetic_negatives):
            config = CFConfig(model=args.model, negatives=k)
            print(f"\n{data.summary()}; K={k}, {epochs} epochs per engine", flush=True)
            rows = []
            for t in threads:
                for variant in VARIANTS:
                    # accuracy is compared on MovieLens-100k: torch runs its full epochs there
                    max_pairs = None if name == "ml-100k" else args.torch_max_pairs
                    row = run_variant(variant, data, config, t, epochs, max_pairs)
                    if "bytes_per_epoch" in row:
                        rate = row["bytes_per_epoch"]["bytes"] / row["epoch_s"]
                        row["achieved_bytes_per_s"] = rate
                        row["fraction_of_copy_bandwidth"] = rate / bandwidth[str(t)]
                    rows.append(row)
                    print("  " + format_row(row), flush=True)
            add_ratios(rows)
            cases.append({"data": name, "negatives": k, "config": asdict(config), "users": data.num_users,
                          "items": data.num_items, "train_pairs": data.num_train, "test_pairs": data.num_test,
                          "epochs": epochs, "popularity_recall_at_20": pop["recall@20"],
                          "popularity_ndcg_at_20": pop["ndcg@20"], "rows": rows})
        topk[name] = topk_backends(data, CFConfig(model=args.model))
        print(f"  top-k back-ends, one full evaluation: {fmt_topk(topk[name])}", flush=True)
    payload = {"benchmark": "HEAT vs PyTorch reference: epoch time, accuracy, memory traffic",
               "command": " ".join(["embcache bench cf"] + _argv(args)),
               "heat_options": _options("heat"), "torch_options": _options("torch"), "threads": threads,
               "copy_bandwidth_bytes_per_s": bandwidth,
               "bandwidth_method": f"numba parallel copy of two {args.copy_mib} MiB float64 arrays, best of 5, "
                                   f"read + write bytes counted",
               "timing_method": "median epoch over the epochs run, kernels compiled beforehand; torch on the synthetic set above "
                                "--torch-max-pairs training pairs: one timed pass over a seeded subset after a "
                                "warm-up on a tenth of it, epoch time projected from pairs/s",
               "bytes_method": "embedding-row traffic per epoch: user, history (SimpleX) and positive rows read + "
                               "written, K negatives read, negatives inside the margin written; float32; W excluded",
               "topk_seconds": topk, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
               "wall_seconds": time.perf_counter() - t_start, "cases": cases}
    path = write_json(payload, args.name, args.out_dir)
    if not args.no_plot:
        plot(cases, path.with_suffix(".png"))
    print_table(cases)
    print(f"\nwrote {path}" + ("" if args.no_plot else f" and {path.with_suffix('.png')}"))
    return 0


def add_ratios(rows: list[dict]) -> None:
    """Speed-up of each HEAT row over torch on the same threads; recall relative to torch."""
    torch_rows = {r["threads"]: r for r in rows if r["variant"] == "torch"}
    for r in rows:
        ref = torch_rows.get(r["threads"])
        if r["variant"] == "torch" or ref is None:
            continue
        r["speedup_vs_torch"] = ref["epoch_s"] / r["epoch_s"]
        if "recall_at_20" in ref:
            r["recall_vs_torch"] = r["recall_at_20"] / ref["recall_at_20"]


def _argv(args) -> list[str]:
    """The flags that differ from the defaults, to record the command that made the file."""
    out = []
    defaults = build_parser("x").parse_args([])
    for key, value in vars(args).items():
        if key == "func" or value == getattr(defaults, key, None):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag)
        else:
            out += [flag] + ([str(v) for v in value] if isinstance(value, list) else [str(value)])
    return out


def _options(engine: str) -> dict:
    from dataclasses import asdict

    from cpu_kernels.reference import TorchOptions
    from cpu_kernels.train import HeatOptions

    return asdict(HeatOptions() if engine == "heat" else TorchOptions())


# --------------------------------------------------------------------------- output
def format_row(r: dict) -> str:
    s = f"{r['variant']:16s} {r['threads']:>2} thr  {r['epoch_s']:9.3f} s/epoch  {r['samples_per_s']:>12,.0f} pairs/s"
    if "recall_at_20" in r:
        s += f"  Recall@20 {r['recall_at_20']:.4f}  NDCG@20 {r['ndcg_at_20']:.4f}"
    if "timed_on" in r:
        s += "  (subset timing, projected)"
    if "fraction_of_copy_bandwidth" in r:
        s += (f"  {r['bytes_per_epoch']['bytes'] / 2**30:.2f} GiB/epoch, "
              f"{r['fraction_of_copy_bandwidth']:.0%} of copy bandwidth")
    return s


def fmt_topk(t: dict) -> str:
    return f"torch {t['torch_s']:.2f} s, faiss {t['faiss_s']:.2f} s (faster: {t['faster']})"


def print_table(cases: list[dict]) -> None:
    head = (f"{'data':9s} {'K':>5} {'engine':16s} {'thr':>3} {'s/epoch':>9} {'pairs/s':>11} {'x torch':>8} "
            f"{'Recall@20':>9} {'NDCG@20':>8} {'GiB/ep':>7} {'% bw':>5}")
    print("\n" + head)
    print("-" * len(head))
    for c in cases:
        for r in c["rows"]:
            sp = f"{r['speedup_vs_torch']:.1f}" if "speedup_vs_torch" in r else "1*" if "timed_on" in r else "1"
            rec = f"{r['recall_at_20']:.4f}" if "recall_at_20" in r else "-"
            nd = f"{r['ndcg_at_20']:.4f}" if "ndcg_at_20" in r else "-"
            gib = f"{r['bytes_per_epoch']['bytes'] / 2**30:.2f}" if "bytes_per_epoch" in r else "-"
            bw = f"{100 * r['fraction_of_copy_bandwidth']:.0f}" if "fraction_of_copy_bandwidth" in r else "-"
            print(f"{c['data']:9s} {c['negatives']:>5} {r['variant']:16s} {r['threads']:>3} {r['epoch_s']:9.3f} "
                  f"{r['samples_per_s']:>11,.0f} {sp:>8} {rec:>9} {nd:>8} {gib:>7} {bw:>5}")
        print(f"{c['data']:9s} {'':>5} {'popularity':16s} {'':>3} {'':>9} {'':>11} {'':>8} "
              f"{c['popularity_recall_at_20']:>9.4f} {c['popularity_ndcg_at_20']:>8.4f}")
    if any("timed_on" in r for c in cases for r in c["rows"]):
        print("* torch timed on a seeded subset of the training pairs, epoch time projected from its pairs/s; "
              "its accuracy is not measured there")


def plot(cases: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 4), squeeze=False)
    colors = {"torch": "tab:gray", "heat, no tiling": "tab:blue", "heat, tiling": "tab:orange"}
    for ax, c in zip(axes[0], cases):
        threads = sorted({r["threads"] for r in c["rows"]})
        width = 0.8 / len(VARIANTS)
        for j, variant in enumerate(VARIANTS):
            ys = [next((r["epoch_s"] for r in c["rows"] if r["variant"] == variant and r["threads"] == t), 0)
                  for t in threads]
            xs = [i + (j - 1) * width for i in range(len(threads))]
            ax.bar(xs, ys, width, label=variant + (" (projected)" if variant == "torch" and any(
                "timed_on" in r for r in c["rows"]) else ""), color=colors[variant])
        ax.set_xticks(range(len(threads)), [f"{t} thread{'s' if t > 1 else ''}" for t in threads])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per epoch")
        ax.set_title(f"{c['data']}, K={c['negatives']}: {c['train_pairs']:,} pairs", fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
