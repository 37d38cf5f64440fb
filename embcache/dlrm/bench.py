"""DLRM benchmark: the same model and data with the sparse part cached (at several
ratios), as whole tables on the device, and as whole tables on the host.

Each variant trains `--steps` steps in its own process (so that its peak memory is its
own) and reports samples/s, hit rate, bytes moved between host and device, and peak
host / device memory. On a CPU-only machine "device" and "host" are the same memory, so
the comparison shows what the cache's bookkeeping costs; on a GPU it shows how close the
cache comes to all-on-GPU tables.

Then what the checksums cost (`embcache.integrity`, `embcache.data.shard_check`): the CRC-32
of every training shard against one epoch at the first cached variant's measured rate, and
the verification of a checkpoint's sealed files against the whole resume's load (a short run
writes the checkpoint; the load is `DLRMTrainer.restore`, verification included).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from embcache.arg_types import add_output_arguments, positive_float, positive_int, ratio
from embcache.paths import datasets_dir
from embcache.train.bench_results import run_for_summary, write_json
from embcache.train.run_cli import add_device_argument, add_threads_argument


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=ratio, nargs="+", default=[0.005, 0.015, 0.05], help="cache ratios")
    p.add_argument("--rows", type=positive_int, default=400_000, help="training rows of the synthetic set")
    p.add_argument("--scale", type=positive_float, default=0.1,
                   help="multiplies Criteo Kaggle's cardinalities (0.1: 3.4 M embedding rows)")
    p.add_argument("--steps", type=positive_int, default=120)
    p.add_argument("--batch-size", type=positive_int, default=4096)
    p.add_argument("--embedding-dim", type=positive_int, default=16)
    add_device_argument(p)
    p.add_argument("--data-cache", default=str(datasets_dir()))
    add_output_arguments(p, "dlrm")
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
    from embcache.device import device_argument

    device_argument(args.device)  # before the data set is generated (each child refuses a bad one, but after it)
    data_dir = Path(args.data_cache) / f"bench-dlrm-r{args.rows}-s{args.scale:g}"
    if not (data_dir / "meta.json").exists():
        print(f"generating {data_dir} ...", flush=True)
        generate_synthetic(data_dir, rows=args.rows, scale=args.scale, seed=0)
    variants = [("cached", r) for r in args.ratios] + [("device", None), ("host", None)]
    results = []
    for sparse, ratio in variants:
        r = _variant(args, data_dir, sparse, ratio)
        results.append(r)
        label = _label(r)
        extra = (f", hit rate {r['hit_rate']:.3f}, "
                 f"{(r['bytes_h2d'] + r['bytes_d2h']) / r['steps'] / 2**20:.2f} MiB moved/step"
                 if ratio is not None else "")
        print(f"  {label:14s} {r['train_samples_per_s']:>10,.0f} samples/s, peak host "
              f"{r['peak_host_mib']:,.0f} MiB{extra}", flush=True)
    base = next(r for r in results if r["sparse"] == "device")["train_samples_per_s"]
    for r in results:
        r["throughput_vs_all_on_device"] = r["train_samples_per_s"] / base
    print_side_by_side(results)
    checks = checksum_costs(args, data_dir, next(r for r in results if r["ratio"] is not None))
    print(f"  checksums: the train shards' CRC-32 {checks['shards_seconds']:.3f} s = "
          f"{checks['shards_fraction_of_epoch']:.2%} of an epoch; a resume's verification "
          f"{checks['verify_seconds'] * 1e3:.1f} ms = {checks['verify_fraction_of_load']:.2%} of its load", flush=True)
    path = write_json({"benchmark": "dlrm", "config": {k: v for k, v in vars(args).items() if k != "func"},
                       "results": results, "checksums": checks}, args.name, args.out)
    print(f"wrote {path}")
    return 0


def _label(r: dict) -> str:
    return f"cached {r['ratio']:.1%}" if r["ratio"] is not None else f"all on {r['sparse']}"


def print_side_by_side(results: list[dict]) -> None:
    """The comparison the benchmark is for (README: the same AUC, 1.00x): each variant's
    throughput as a ratio to the whole tables on the device, beside its validation AUC."""
    print("  side by side (throughput vs all on device, validation AUC):")
    for r in results:
        auc = r.get("val_auc")
        print(f"  {_label(r):14s} {r['throughput_vs_all_on_device']:5.2f}x  AUC "
              + ("n/a" if auc is None else f"{auc:.4f}"), flush=True)


def checksum_costs(args, data_dir: Path, cached: dict) -> dict:
    """(see the module docstring) Seconds and fractions; the epoch's time is the train
    split's rows at `cached`'s samples/s."""
    import tempfile
    import time

    from embcache.data.ctr_format import read_meta
    from embcache.integrity import file_crc32, verify_zip

    meta = read_meta(data_dir)
    start = time.perf_counter()
    for rel in meta["splits"]["train"]["files"]:
        file_crc32(data_dir / rel)
    shards = time.perf_counter() - start
    epoch = meta["splits"]["train"]["rows"] / cached["train_samples_per_s"]
    with tempfile.TemporaryDirectory() as ck_dir:
        cmd = ["dlrm", "train", "--data", str(data_dir), "--sparse", "cached", "--cache-ratio", str(cached["ratio"]),
               "--max-steps", "5", "--batch-size", str(args.batch_size), "--embedding-dim", str(args.embedding_dim),
               "--no-progress", "--checkpoint-dir", ck_dir]
        run_for_summary(cmd, f"embcache {' '.join(cmd)}")
        load = _timed_restore(Path(ck_dir) / "dlrm-last.pt", data_dir)
        sealed = sorted(Path(ck_dir).rglob("*.pt"))
        start = time.perf_counter()
        for path in sealed:
            verify_zip(path)
        verify = time.perf_counter() - start
        checkpoint_bytes = sum(p.stat().st_size for p in Path(ck_dir).rglob("*") if p.is_file())
    return {"shards_seconds": shards, "epoch_seconds": epoch, "shards_fraction_of_epoch": shards / epoch,
            "verify_seconds": verify, "load_seconds": load, "verify_fraction_of_load": verify / load,
            "sealed_files": len(sealed), "checkpoint_bytes": checkpoint_bytes}


def _timed_restore(path: Path, data_dir: Path) -> float:
    """Seconds of a resume's load of checkpoint `path` (the trainer built beforehand)."""
    import time

    from embcache.dlrm.config import DLRMConfig
    from embcache.dlrm.trainer import DLRMTrainer
    from embcache.train.run import checkpoint_to_evaluate

    _, _, cfg = checkpoint_to_evaluate(path, "dlrm", DLRMConfig)
    trainer = DLRMTrainer(cfg, data_dir)
    start = time.perf_counter()
    trainer.restore(path)
    return time.perf_counter() - start
