"""DLRM benchmark: the same model and data with the sparse part cached (at several
ratios), as whole tables on the device, and as whole tables on the host.

Each variant trains `--steps` steps in its own process (so that its peak memory is its
own) and reports samples/s, hit rate, bytes moved between host and device, and peak
host / device memory. On a CPU-only machine "device" and "host" are the same memory, so
the comparison shows what the cache's bookkeeping costs; on a GPU it shows how close the
cache comes to all-on-GPU tables.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from embcache.bench.common import run_for_summary, write_json
from embcache.paths import datasets_dir, results_dir
from embcache.train.run_cli import add_device_argument, add_threads_argument


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.005, 0.015, 0.05])
    p.add_argument("--rows", type=int, default=400_000, help="training rows of the synthetic set")
    p.add_argument("--scale", type=float, default=0.1,
                   help="multiplies Criteo Kaggle's cardinalities (0.1: 3.4 M embedding rows)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--embedding-dim", type=int, default=16)
    add_device_argument(p)
    p.add_argument("--data-cache", default=str(datasets_dir()))
    p.add_argument("--out", default=str(results_dir()))
    p.add_argument("--name", default="dlrm")
    add_threads_argument(p)
    p.set_defaults(func=run)
    return p


def _variant(args, data_dir: Path, sparse: str, ratio: float | None) -> dict:
    cmd = ["dlrm", "train", "--data", str(data_dir),
           "--sparse", sparse, "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--embedding-dim", str(args.embedding_dim), "--no-progress"]
    if ratio is not None:
        cmd += ["--cache-ratio", str(ratio)]
    if args.device:
        cmd += ["--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    summary, _ = run_for_summary(cmd, f"embcache {' '.join(cmd)}")
    return {"sparse": sparse, "ratio": ratio, **summary}


def run(args) -> int:
    from embcache.data.synthetic import generate_synthetic

    data_dir = Path(args.data_cache) / f"bench-dlrm-r{args.rows}-s{args.scale:g}"
    if not (data_dir / "meta.json").exists():
        print(f"generating {data_dir} ...", flush=True)
        generate_synthetic(data_dir, rows=args.rows, scale=args.scale, seed=0)
    variants = [("cached", r) for r in args.ratios] + [("device", None), ("host", None)]
    results = []
    for sparse, ratio in variants:
        r = _variant(args, data_dir, sparse, ratio)
        results.append(r)
        label = f"cached {ratio:.1%}" if ratio is not None else f"all on {sparse}"
        extra = (f", hit rate {r['hit_rate']:.3f}, "
                 f"{(r['bytes_h2d'] + r['bytes_d2h']) / r['steps'] / 2**20:.2f} MiB moved/step"
                 if ratio is not None else "")
        print(f"  {label:14s} {r['train_samples_per_s']:>10,.0f} samples/s, peak host "
              f"{r['peak_host_mib']:,.0f} MiB{extra}", flush=True)
    base = next(r for r in results if r["sparse"] == "device")["train_samples_per_s"]
    for r in results:
        r["throughput_vs_all_on_device"] = r["train_samples_per_s"] / base
    path = write_json({"benchmark": "dlrm", "config": {k: v for k, v in vars(args).items() if k != "func"},
                       "results": results}, args.name, args.out)
    print(f"wrote {path}")
    return 0
