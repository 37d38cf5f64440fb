"""`embcache bench cf`: HEAT against the PyTorch reference, side by side in one run on the same cores and data
(MovieLens-100k and the Gowalla-scale synthetic set): epoch time of the torch engine, HEAT without tiling and
HEAT with tiling, with 1 thread and with all cores; beside them (`baseline_rows`, unless --no-baseline) HEAT's
per-sample kernel with tiling, the kernel before the runs kernel (issue 14), so that before and after are
measured in the same run; Recall@20 and NDCG@20 of each after the same number of epochs; the bytes a HEAT epoch
touches and a model of the part of them that must come from memory, each against this machine's memory bandwidth
(a copy kernel measured in the same run). Writes bench/results/cf.json and cf.png.

Epoch time is the median over the epochs run (the kernels are compiled before any timing). On the synthetic set,
where a full torch epoch would take too long (more training pairs than --torch-max-pairs), torch is timed on a
fixed seeded subset of the pairs and its epoch time is projected from its pairs/s; its accuracy is then not
measured (the row says so). Accuracy is compared on MovieLens-100k, where every engine runs the same full epochs,
at K=64 and at K=1000, the K of the largest speed-up (fewer epochs there: a torch epoch at K=1000 takes over a
minute on one core). On MovieLens-100k the tile is --ml-tile items, by default the size at which the tiles cover
its item table as many times per epoch as the default tile (2048 items) covers the synthetic set's: 861 of its
1,682 items (a tile of 2048 would hold them all, and tiled would sample exactly like untiled).

Bytes touched per HEAT epoch count the embedding-row accesses of the kernel, each once, float32: per sample
the user row (read + write), SimpleX's history rows (read + write), the positive (read + write), the K
negatives (read) and the negatives inside the margin (write); W (d x d) stays in cache and is left out. Their
rate is reported against the copy bandwidth, but it is not a fraction of DRAM bandwidth: with tiling most
negative reads are served by the thread's tile in its private L2 and the rate can exceed the copy kernel's.
The memory-traffic model counts what cannot come from that tile: the user, history and positive rows as above,
and for the negatives, with tiling, one load of the tile per refresh (tile x d x 4 bytes) and at most that
much written back; without tiling every negative read and write. It is an upper bound of the DRAM traffic (it
assumes nothing else stays cached), so its fraction of the copy bandwidth should stay at or below 1; above 1
means a larger cache (a shared L3 that holds the whole table) served part of it.

Negatives (issue 23): every variant draws them from the items the user has no training pair with (the default
"unseen" rule). Beside them (`old_rule_rows`, unless --no-old-rule) HEAT's default kernel, tiled, and torch
(where its accuracy is measured) run under the old rule ("all": from every item), for the accuracy of both
rules; and the cost of the exclusion is measured apart (`exclusion_cost`): --cost-epochs epochs of each rule's
engine interleaved (all, unseen, unseen, all, ...), so that a busy machine slows both alike, and the ratio of
their median epoch times.

--defaults-sweep instead trains HEAT on MovieLens-100k at the defaults and at the published SimpleX settings one
at a time (margin, negative weight, gamma, history, learning rate) and writes the best Recall@20 / NDCG@20 of
each over --sweep-epochs epochs to cf_defaults.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from embcache.cf.bench_report import BASELINE, format_cost, format_row, fmt_topk, print_table, plot  # the tables and the plot

DATASETS = ("ml-100k", "synthetic")
VARIANTS = ("torch", "heat, no tiling", "heat, tiling")
OLD_RULE = ("torch", "heat, tiling")  # run again with negatives from all items (CFConfig.negatives_from)


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.arg_types import positive_int

    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    p.add_argument("--ml-epochs", type=positive_int, nargs="+", default=[10, 3],
                   help="epochs per engine on ml-100k: one value per --ml-negatives value, or one for all "
                        "(default 10 at K=64, 3 at K=1000)")
    p.add_argument("--synthetic-epochs", type=positive_int, default=3, help="epochs per engine on the synthetic set")
    p.add_argument("--ml-negatives", type=positive_int, nargs="+", default=[64, 1000],
                   help="K values run on ml-100k (1000: accuracy measured at the K of the largest speed-up)")
    p.add_argument("--synthetic-negatives", type=positive_int, nargs="+", default=[64, 1000],
                   help="K values run on the synthetic set (the published SimpleX runs use K = 800..2000)")
    p.add_argument("--ml-tile", type=positive_int, default=None,
                   help="items per thread tile on ml-100k (default: the tiles cover its item table as often "
                        "per epoch as the default tile covers the synthetic set's)")
    p.add_argument("--wide-dim", type=positive_int, default=None,
                   help="also run each data set at this embedding dimension (128: the setting issue 14 names "
                        "as the paper's), at the K values of --wide-negatives only")
    p.add_argument("--wide-negatives", type=positive_int, nargs="+", default=[64],
                   help="K values run at --wide-dim (epochs on ml-100k: those of the same K in --ml-negatives, "
                        "else the first --ml-epochs value)")
    p.add_argument("--user-run", type=positive_int, default=None,
                   help="HEAT's runs kernel: most samples of one user in a run (default HeatOptions.user_run)")
    p.add_argument("--no-baseline", action="store_true",
                   help="leave out the per-sample kernel (HEAT before the runs kernel)")
    p.add_argument("--no-old-rule", action="store_true",
                   help="leave out the runs under the old negative rule (from all items) and the exclusion cost")
    p.add_argument("--cost-epochs", type=positive_int, default=5,
                   help="epochs of each rule, interleaved, that the exclusion cost is the median ratio of")
    p.add_argument("--defaults-sweep", action="store_true",
                   help="only the table of the defaults against the published SimpleX settings on ml-100k "
                        "(writes <name>_defaults.json)")
    p.add_argument("--sweep-epochs", type=positive_int, default=20, help="epochs per setting of --defaults-sweep")
    p.add_argument("--threads", type=positive_int, nargs="+", default=None,
                   help="thread counts (default: 1 and all cores)")
    p.add_argument("--model", choices=("simplex", "mf-ccl"), default="simplex")
    p.add_argument("--torch-device", default="cpu",
                   help="where the torch engine trains (cpu, cuda: HEAT on this host's cores against a GPU)")
    p.add_argument("--torch-max-pairs", type=positive_int, default=50_000,
                   help="synthetic set: above this many training pairs torch is timed on a seeded "
                        "subset of this size (ml-100k always runs full torch epochs)")
    p.add_argument("--synthetic-users", type=positive_int, default=30_000)
    p.add_argument("--synthetic-items", type=positive_int, default=40_000)
    p.add_argument("--synthetic-interactions", type=positive_int, default=1_000_000)
    p.add_argument("--copy-mib", type=positive_int, default=512, help="size of each array of the copy kernel")
    p.add_argument("--out", "--out-dir", dest="out_dir", metavar="OUT", help="results dir (default: bench/results)")
    p.add_argument("--name", default="cf", help="results file stem: <--out>/<--name>.json and .png")
    p.add_argument("--no-plot", action="store_true", help="no PNG")
    p.set_defaults(func=run)
    return p


# --------------------------------------------------------------------------- measurements
def epoch_bytes(params, users: np.ndarray, active_negatives: int, tile: int = 0, refresh: int | None = None,
                threads: int = 1) -> dict:
    """Bytes of one HEAT epoch (see the module docstring): {"bytes", "parts"} touched, and
    "model": {"bytes", "parts"}, the traffic that cannot come from a thread's tile.
    `refresh` defaults to HeatOptions.refresh."""
    from cpu_kernels.heat import HeatOptions

    refresh = HeatOptions.refresh if refresh is None else refresh
    c = params.config
    row = 4 * c.dim
    n = len(users)
    hist = int(params.hist_len[users].sum()) if c.simplex else 0
    rows = {"user": 2 * n * row, "history": 2 * hist * row, "positive": 2 * n * row}
    touched = {**rows, "negative_reads": n * c.negatives * row, "negative_writes": int(active_negatives) * row}
    if tile > 0:
        # each thread draws a tile first, then again every `refresh` of its samples
        tile_bytes = (-(-n // refresh) + threads) * tile * row
        negatives = {"tile_loads": tile_bytes, "tile_writebacks": min(touched["negative_writes"], tile_bytes)}
    else:
        negatives = {"negative_reads": touched["negative_reads"], "negative_writes": touched["negative_writes"]}
    model = {**rows, **negatives}
    return {"bytes": sum(touched.values()), "parts": touched,
            "model": {"bytes": sum(model.values()), "parts": model}}


def run_variant(variant: str, data, config, threads: int, epochs: int, torch_max_pairs: int,
                tile: int | None = None, user_run: int | None = None, rule: str | None = None,
                torch_device: str = "cpu") -> dict:
    """Train a fresh model with one engine; epoch times, throughput, final accuracy. `tile`:
    items per tile of the tiled HEAT variants (default HeatOptions.tile); `user_run`: the
    runs kernel's (default HeatOptions.user_run). BASELINE is the per-sample kernel, tiled.
    `rule`: where negatives come from (default config.negatives_from); `torch_device`: where
    the torch engine trains (HEAT runs on the CPU)."""
    import dataclasses

    import torch

    from cpu_kernels.heat import HeatOptions
    from cpu_kernels.model import CFParams
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    torch.set_num_threads(threads)
    config = dataclasses.replace(config, negatives_from=rule or config.negatives_from)
    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    row = {"variant": variant, "threads": threads, "train_pairs": data.num_train, "negatives_from": config.negatives_from,
           **({"device": torch_device} if variant == "torch" else {})}
    if variant == "torch" and torch_max_pairs is not None and data.num_train > torch_max_pairs:
        return {**row, **_torch_on_a_subset(data, params, threads, torch_max_pairs, torch_device)}
    tile = 0 if variant == "heat, no tiling" else tile or HeatOptions.tile
    kernel = "sample" if variant == BASELINE else "runs"
    # MovieLens-100k (torch_max_pairs None) is evaluated after every epoch (0.01 s), for the best epoch's figures
    every = 1 if torch_max_pairs is None else epochs
    cfg = CFTrainConfig.for_model(config, engine="torch" if variant == "torch" else "heat", threads=threads,
                                  tile=tile, epochs=epochs, eval_every=every, progress=False, kernel=kernel,
                                  user_run=user_run or HeatOptions.user_run,
                                  device=torch_device if variant == "torch" else "cpu")
    trainer = CFTrainer(cfg, data, params)
    engine = trainer.engine
    if variant != "torch":
        row.update(tile=engine.tile, refresh=cfg.refresh, kernel=kernel,
                   user_run=cfg.user_run if kernel == "runs" and config.simplex else 1)
    trainer.fit()
    records = trainer.history
    times = [r["seconds"] for r in records]
    last = records[-1]
    row.update(epochs=epochs, epoch_s=statistics.median(times), epoch_s_all=times,
               samples_per_s=data.num_train / statistics.median(times), loss=last["loss"],
               recall_at_20=last["recall@20"], ndcg_at_20=last["ndcg@20"])
    if every == 1:
        row.update(best_recall_at_20=max(r["recall@20"] for r in records),
                   best_ndcg_at_20=max(r["ndcg@20"] for r in records))
    if variant != "torch":
        users, _ = data.train_pairs()
        active = statistics.median(r["active_negatives"] for r in records)
        row.update(redraws_per_epoch=records[-1].get("redraws", 0),
                   seen_negatives_per_epoch=records[-1].get("seen_negatives", 0))
        counted = epoch_bytes(params, users, active, engine.tile, cfg.refresh, engine.threads)
        model = counted.pop("model")
        row["bytes_per_epoch"] = counted
        row["dram_model_bytes_per_epoch"] = model
    return row


def _torch_on_a_subset(data, params, threads: int, pairs: int, device: str) -> dict:
    """The torch engine timed on a seeded subset of `pairs` training pairs (one pass after a
    warm-up on a tenth of them), its epoch time projected from pairs/s (a large data set's
    full epoch would take hours)."""
    from cpu_kernels.torch_reference import TorchEngine, TorchOptions

    users, items = data.train_pairs()
    pick = np.sort(np.random.default_rng(0).choice(len(users), pairs, replace=False))
    warm = max(len(pick) // 10, 1)
    options = TorchOptions(threads=threads, device=device)
    TorchEngine(params, users[pick[:warm]], items[pick[:warm]], options).epoch(0)
    engine = TorchEngine(params, users[pick], items[pick], options)
    t0 = time.perf_counter()
    engine.epoch(1)
    rate = pairs / (time.perf_counter() - t0)
    return {"timed_on": f"seeded subset of {pairs:,} training pairs (one pass, after a warm-up on a tenth of them); "
                        f"epoch time projected from pairs/s; accuracy not measured",
            "subset_pairs": pairs, "samples_per_s": rate, "epoch_s": data.num_train / rate}


def exclusion_cost(data, config, threads: int, epochs: int, tile: int | None = None) -> dict:
    """Median epoch time of HEAT's default kernel (tiled) drawing negatives from the unseen
    items over the same from all items, `epochs` epochs each, interleaved (all, unseen,
    unseen, all, ...) after one untimed epoch each, on fresh seeded models: the cost of the
    exclusion, side by side on a shared machine. Also the redraws and the negatives kept
    although the user's, per sample of the last epoch."""
    import dataclasses

    from cpu_kernels.heat import HeatEngine, HeatOptions
    from cpu_kernels.model import CFParams

    users, items = data.train_pairs()
    engines = {}
    for rule in ("all", "unseen"):
        c = dataclasses.replace(config, negatives_from=rule)
        params = CFParams.init(c, data.num_users, data.num_items, data.train_indptr, data.train_indices)
        engines[rule] = HeatEngine(params, users, items, HeatOptions(threads=threads, tile=tile or HeatOptions.tile))
        engines[rule].epoch(0)
    times, last = {"all": [], "unseen": []}, {}
    for e in range(1, epochs + 1):
        for rule in (("all", "unseen") if e % 2 else ("unseen", "all")):
            t0 = time.perf_counter()
            last[rule] = engines[rule].epoch(e)
            times[rule].append(time.perf_counter() - t0)
    med = {rule: statistics.median(v) for rule, v in times.items()}
    n = max(len(users), 1)
    return {"threads": threads, "tile": engines["unseen"].tile, "epochs": epochs, "epoch_s_unseen": med["unseen"],
            "epoch_s_all": med["all"], "epoch_s_unseen_all": times["unseen"], "epoch_s_all_all": times["all"],
            "time_ratio_unseen_vs_all": med["unseen"] / med["all"],
            "redraws_per_sample": last["unseen"]["redraws"] / n,
            "seen_negatives_per_sample": last["unseen"]["seen_negatives"] / n,
            "active_negatives_per_sample": {r: last[r]["active_negatives"] / n for r in last}}


def defaults_sweep(args) -> int:
    """HEAT on MovieLens-100k (runs kernel, one thread, the unseen rule) at the defaults and
    at each published SimpleX setting changed alone; best Recall@20 / NDCG@20 over the
    epochs, three seeds of the defaults for the noise."""
    from cpu_kernels.model import CFConfig
    from embcache.train.bench_results import write_json
    from embcache.cf.data.ratings import load_ml100k
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    data = load_ml100k()
    c = CFConfig()
    settings = [("defaults", {}), ("defaults, seed 1", {"seed": 1}), ("defaults, seed 2", {"seed": 2}),
                ("negatives from all items", {"negatives_from": "all"})]
    published = {"margin": (0.4, 0.9), "neg_weight": (150.0, 250.0, 300.0), "gamma": (0.8, 1.0),
                 "history": (10, 50), "lr": (0.05, 0.2)}
    for name, values in published.items():
        settings += [(f"{name} {v:g}", {name: v}) for v in values]
    settings += [("margin 0.4, neg_weight 300 (Amazon-Books)", {"margin": 0.4, "neg_weight": 300.0}),
                 ("margin 0.9, neg_weight 250, gamma 0.8 (Gowalla)", {"margin": 0.9, "neg_weight": 250.0, "gamma": 0.8})]
    rows = []
    t_start = time.perf_counter()
    for label, change in settings:
        cfg = CFTrainConfig(**{"epochs": args.sweep_epochs, "threads": 1, "progress": False, **change})
        trainer = CFTrainer(cfg, data)
        trainer.fit()
        h = trainer.history
        best = max(h, key=lambda r: r["recall@20"])
        rows.append({"setting": label, "change": change, "best_recall_at_20": best["recall@20"],
                     "best_epoch": best["epoch"], "best_ndcg_at_20": max(r["ndcg@20"] for r in h),
                     "last_recall_at_20": h[-1]["recall@20"], "last_ndcg_at_20": h[-1]["ndcg@20"]})
        r = rows[-1]
        print(f"{label:48s} best Recall@20 {r['best_recall_at_20']:.4f} (epoch {r['best_epoch']:>2})  best NDCG@20 "
              f"{r['best_ndcg_at_20']:.4f}  last {r['last_recall_at_20']:.4f} / {r['last_ndcg_at_20']:.4f}", flush=True)
    payload = {"benchmark": "HEAT defaults against the published SimpleX settings on MovieLens-100k",
               "command": " ".join(["embcache bench cf"] + _argv(args)), "epochs": args.sweep_epochs,
               "defaults": {"margin": c.margin, "neg_weight": c.neg_weight, "gamma": c.gamma, "history": c.history,
                            "negatives": c.negatives, "negatives_from": c.negatives_from, "lr": _options("heat")["lr"]},
               "method": "HEAT runs kernel, tiled (default tile), 1 thread, seed 0 unless named; one setting changed "
                         "at a time; best of the epochs and the last epoch's Recall@20 / NDCG@20 on the test split",
               "wall_seconds": time.perf_counter() - t_start, "rows": rows}
    path = write_json(payload, f"{args.name}_defaults", args.out_dir)
    print(f"\nwrote {path}")
    return 0


def ml_tile(data, args) -> int:
    """The ml-100k tile whose draws cover its item table as many times per epoch as the
    default tile's cover the synthetic set's (train pairs / refresh x tile / items equal)."""
    from cpu_kernels.heat import HeatOptions
    from embcache.cf.data.interactions import TEST_FRACTION

    if args.ml_tile:
        return min(args.ml_tile, data.num_items)
    # `load` splits the synthetic set with power_law_interactions' default test fraction
    synthetic_pairs = (1 - TEST_FRACTION) * args.synthetic_interactions
    per_item = (synthetic_pairs / args.synthetic_items) / (data.num_train / data.num_items)
    return int(min(max(round(HeatOptions.tile * per_item), 1), data.num_items))


def topk_backends(data, config) -> dict:
    """Seconds of one full evaluation with each top-k back-end that imports here (same
    ranking either way); one that does not is named in `missing`, not a failure."""
    import importlib

    from cpu_kernels.heat import user_vectors
    from cpu_kernels.model import CFParams
    from embcache.cf import evaluation as cf_eval

    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    z = user_vectors(params)
    def importable(name: str) -> bool:
        try:
            importlib.import_module(name)
        except ImportError:
            return False
        return True

    backends = [b for b in cf_eval.BACKENDS if importable(b)]
    out = {"missing": [b for b in cf_eval.BACKENDS if b not in backends]}
    for backend in backends:
        t0 = time.perf_counter()
        res = cf_eval.evaluate(z, params.I, data.train_indptr, data.train_indices, data.test_indptr,
                               data.test_indices, backend=backend)
        out[f"{backend}_s"] = time.perf_counter() - t0
        out[f"{backend}_recall@20"] = res["recall@20"]
    out["faster"] = min(backends, key=lambda b: out[f"{b}_s"])
    return out


def load(name: str, args):
    """The data set of one case: the offline MovieLens-100k or the seeded synthetic set."""
    from embcache.cf.data.ratings import load_ml100k
    from embcache.cf.data.synthetic import power_law_interactions

    if name == "ml-100k":
        return load_ml100k()
    return power_law_interactions(args.synthetic_users, args.synthetic_items, args.synthetic_interactions)


# --------------------------------------------------------------------------- the run
def run(args) -> int:
    from cpu_kernels.heat import compile_kernels
    from cpu_kernels.model import CFConfig
    from embcache.train.bench_results import write_json

    if args.defaults_sweep:
        return defaults_sweep(args)
    threads = thread_counts(args)
    if threads is None:
        return 2
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    print("compiling the kernels ...", flush=True)
    compile_kernels()
    bandwidth = measure_bandwidth(threads, args.copy_mib)
    cases, topk = [], {}
    for name in args.datasets:
        data = load(name, args)
        cases += run_dataset(name, data, args, threads, bandwidth)
        topk[name] = topk_backends(data, CFConfig(model=args.model))
        print(f"  top-k back-ends, one full evaluation: {fmt_topk(topk[name])}", flush=True)
    payload = {**describe(args, threads, bandwidth), "topk_seconds": topk, "loadavg_before": load_before,
               "loadavg_after": os.getloadavg(), "wall_seconds": time.perf_counter() - t_start, "cases": cases}
    path = write_json(payload, args.name, args.out_dir)
    if not args.no_plot:
        plot(cases, path.with_suffix(".png"))
    print_table(cases)
    print(f"\nwrote {path}" + ("" if args.no_plot else f" and {path.with_suffix('.png')}"))
    return 0


def thread_counts(args) -> list[int] | None:
    """The sorted thread counts to run, or None (after saying why) when the flags are wrong."""
    from cpu_kernels.heat import max_threads
    from embcache.device import resolve_device

    all_threads = max_threads()
    threads = sorted(set(args.threads or (1, all_threads)))
    if any(not 1 <= t <= all_threads for t in threads):
        print(f"bench cf: --threads must be in 1..{all_threads}")
        return None
    if len(args.ml_epochs) not in (1, len(args.ml_negatives)):
        print(f"bench cf: --ml-epochs takes one value or one per --ml-negatives value ({len(args.ml_negatives)})")
        return None
    try:  # --torch-device cuda without a GPU was a traceback after the HEAT runs
        resolve_device(args.torch_device)
    except ValueError as err:
        print(f"bench cf: --torch-device: {err}")
        return None
    return threads


def measure_bandwidth(threads: list[int], mib: int) -> dict[str, float]:
    """The copy kernel's bytes/s on each thread count, keyed by the count as a string."""
    from cpu_kernels.heat import copy_bandwidth

    bandwidth = {}
    for t in threads:
        bandwidth[str(t)] = copy_bandwidth(t, mib)
        print(f"copy bandwidth, {t} thread(s): {bandwidth[str(t)] / 1e9:.2f} GB/s", flush=True)
    return bandwidth


def run_dataset(name: str, data, args, threads: list[int], bandwidth: dict[str, float]) -> list[dict]:
    """One case per (dimension, K) of this data set: every variant on every thread count
    (and the per-sample baseline), with the ratios to torch and the popularity baseline."""
    from embcache.cf.evaluation import popularity

    pop = popularity(data)
    if name == "ml-100k":
        ks = args.ml_negatives
        epochs_of = dict(zip(ks, args.ml_epochs * len(ks) if len(args.ml_epochs) == 1 else args.ml_epochs))
        wide_epochs, tile = args.ml_epochs[0], ml_tile(data, args)
    else:
        ks, epochs_of, wide_epochs, tile = args.synthetic_negatives, {}, args.synthetic_epochs, None
    settings = [(64, k) for k in ks] + [(args.wide_dim, k) for k in (args.wide_negatives if args.wide_dim else [])]
    cases = []
    for dim, k in settings:
        epochs = epochs_of.get(k, wide_epochs)
        cases.append(run_case(name, data, args, threads, bandwidth, dim, k, epochs, tile))
        cases[-1].update(popularity_recall_at_20=pop["recall@20"], popularity_ndcg_at_20=pop["ndcg@20"])
    return cases


def run_case(name: str, data, args, threads: list[int], bandwidth: dict[str, float], dim: int, k: int,
             epochs: int, tile: int | None) -> dict:
    """Every variant (and the baseline) at one dimension and K, on every thread count."""
    from dataclasses import asdict

    from cpu_kernels.model import CFConfig

    # accuracy is compared on MovieLens-100k: torch runs its full epochs there
    max_pairs = None if name == "ml-100k" else args.torch_max_pairs
    config = CFConfig(model=args.model, negatives=k, dim=dim)
    print(f"\n{data.summary()}; d={dim}, K={k}, {epochs} epochs per engine", flush=True)
    rows, baseline = [], []
    for t in threads:
        variants = VARIANTS + (() if args.no_baseline else (BASELINE,))
        for variant in variants:
            row = run_variant(variant, data, config, t, epochs, max_pairs, tile, args.user_run,
                              torch_device=args.torch_device)
            if "bytes_per_epoch" in row:
                add_rates(row, bandwidth[str(t)])
            (baseline if variant == BASELINE else rows).append(row)
            print("  " + format_row(row), flush=True)
    add_ratios(rows, baseline)
    old_rule, cost = [], []
    if not args.no_old_rule:
        for t in threads:
            for variant in OLD_RULE:
                if variant == "torch" and max_pairs is not None and data.num_train > max_pairs:
                    continue  # its accuracy is not measured there
                row = run_variant(variant, data, config, t, epochs, max_pairs, tile, args.user_run, rule="all",
                                  torch_device=args.torch_device)
                new = next(r for r in rows if r["variant"] == variant and r["threads"] == t)
                row["recall_unseen_vs_all"] = new["recall_at_20"] / row["recall_at_20"]
                row["ndcg_unseen_vs_all"] = new["ndcg_at_20"] / row["ndcg_at_20"]
                old_rule.append(row)
                print("  " + format_row(row), flush=True)
            cost.append(exclusion_cost(data, config, t, args.cost_epochs, tile))
            print("  " + format_cost(cost[-1]), flush=True)
    return {"data": name, "dim": dim, "negatives": k, "config": asdict(config), "users": data.num_users,
            "items": data.num_items, "train_pairs": data.num_train, "test_pairs": data.num_test, "epochs": epochs,
            "rows": rows, "baseline_rows": baseline, "old_rule_rows": old_rule, "exclusion_cost": cost}


def describe(args, threads: list[int], bandwidth: dict[str, float]) -> dict:
    """The head of the result file: the command, the settings and how each figure is measured."""
    return {"benchmark": "HEAT vs PyTorch reference: epoch time, accuracy, memory traffic",
            "command": " ".join(["embcache bench cf"] + _argv(args)),
            "heat_options": _options("heat"), "torch_options": _options("torch"), "threads": threads,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "bandwidth_method": f"numba parallel copy of two {args.copy_mib} MiB float64 arrays, best of 5, "
                                f"read + write bytes counted",
            "timing_method": "median epoch over the epochs run, kernels compiled beforehand; torch on the synthetic set above "
                             "--torch-max-pairs training pairs: one timed pass over a seeded subset after a "
                             "warm-up on a tenth of it, epoch time projected from pairs/s",
            "bytes_method": "bytes touched: embedding-row accesses per epoch: user, history (SimpleX) and "
                            "positive rows read + written, K negatives read, negatives inside the margin written; "
                            "float32; W excluded. touched_rate_vs_copy_bandwidth is their rate over the copy "
                            "kernel's, not a fraction of DRAM bandwidth (tiled negative reads hit L2)",
            "dram_model_method": "upper bound of the DRAM traffic per epoch: user, history and positive rows as "
                                 "above; negatives with tiling: one tile load per refresh per thread "
                                 "(tile x d x 4 bytes) and at most as much written back; without tiling every "
                                 "negative read and write. Its fraction of the copy bandwidth should be <= 1; "
                                 "above 1, a shared cache (L3) held part of the table",
            "ml_tile_method": "heat, tiling on ml-100k: --ml-tile, or by default the tile whose draws cover "
                              "the item table as often per epoch as the default tile's cover the synthetic "
                              "set's (train pairs / refresh x tile / items equal)"}


def add_rates(row: dict, copy_bandwidth: float) -> None:
    """Bytes touched and the DRAM model per second, each against the copy bandwidth."""
    touched = row["bytes_per_epoch"]["bytes"] / row["epoch_s"]
    model = row["dram_model_bytes_per_epoch"]["bytes"] / row["epoch_s"]
    row.update(achieved_bytes_per_s=touched, touched_rate_vs_copy_bandwidth=touched / copy_bandwidth,
               dram_model_bytes_per_s=model, dram_model_fraction_of_copy_bandwidth=model / copy_bandwidth)


def add_ratios(rows: list[dict], baseline: list[dict] = ()) -> None:
    """Speed-up of each HEAT row (baseline rows included) over torch on the same threads,
    recall and NDCG relative to torch; and of each runs-kernel row over the per-sample
    kernel (tiled) on the same threads."""
    torch_rows = {r["threads"]: r for r in rows if r["variant"] == "torch"}
    before = {r["threads"]: r for r in baseline}
    for r in [*rows, *baseline]:
        ref = torch_rows.get(r["threads"])
        if r["variant"] == "torch" or ref is None:
            continue
        r["speedup_vs_torch"] = ref["epoch_s"] / r["epoch_s"]
        if "recall_at_20" in ref:
            r["recall_vs_torch"] = r["recall_at_20"] / ref["recall_at_20"]
            r["ndcg_vs_torch"] = r["ndcg_at_20"] / ref["ndcg_at_20"]
        old = before.get(r["threads"])
        if old is not None and r is not old:
            r["speedup_vs_per_sample"] = old["epoch_s"] / r["epoch_s"]
            r["recall_vs_per_sample"] = r["recall_at_20"] / old["recall_at_20"]
            r["ndcg_vs_per_sample"] = r["ndcg_at_20"] / old["ndcg_at_20"]


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

    from cpu_kernels.heat import HeatOptions
    from cpu_kernels.torch_reference import TorchOptions

    return asdict(HeatOptions() if engine == "heat" else TorchOptions())


# --------------------------------------------------------------------------- output
