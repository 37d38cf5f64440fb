"""Validation AUC of `embcache dlrm train` (its defaults: the built-in synthetic data, one
epoch) with `--precision fp32` against `--precision bf16` on the CPU, where bf16 is CPU
autocast over the dense part. Issue 48's target: bf16 within 0.002 of fp32. Each seed is its
own synthetic data set (the data's name carries the seed) and its own initial model; seed 0
is the default run. tf32 is run once at seed 0: on the CPU it is fp32, and its AUC must be
fp32's to the bit. Writes bench/results/precision_cpu.json.

    python bench/precision_cpu.py [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from embcache.train.bench_results import run_for_summary, write_json  # noqa: E402

KEPT = ("val_auc", "val_logloss", "steps", "train_samples_per_s", "precision", "device")
TARGET = 0.002


def run(precision: str, seed: int) -> dict:
    argv = ["dlrm", "train", "--device", "cpu", "--precision", precision, "--seed", str(seed), "--no-progress"]
    summary, wall = run_for_summary(argv, f"dlrm train --precision {precision}", dict(os.environ, PYTHONPATH=str(ROOT)))
    row = {"command": "embcache " + " ".join(argv), "asked": precision, "seed": seed, "wall_s": round(wall, 1),
           **{k: summary[k] for k in KEPT if k in summary}}
    print(row, flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    runs = []
    for seed in args.seeds:
        runs += [run("fp32", seed), run("bf16", seed)]
        if seed == 0:
            runs.append(run("tf32", seed))
    diffs = []
    for seed in args.seeds:
        auc = {r["asked"]: r["val_auc"] for r in runs if r["seed"] == seed}
        diffs.append({"seed": seed, "fp32": auc["fp32"], "bf16": auc["bf16"], "bf16_minus_fp32": auc["bf16"] - auc["fp32"]})
    worst = max(abs(d["bf16_minus_fp32"]) for d in diffs)
    tf32 = [r["val_auc"] for r in runs if r["asked"] == "tf32"]
    path = write_json({"benchmark": "precision_cpu", "target": f"|bf16 - fp32| validation AUC <= {TARGET}",
                       "note": "one run per cell, sequential, on a shared 2-core machine (samples/s not comparable)",
                       "runs": runs, "auc_difference": diffs, "largest_abs_difference": worst,
                       "within_target": worst <= TARGET,
                       "tf32_equals_fp32_on_cpu": [t == d["fp32"] for t, d in zip(tf32, diffs)]}, "precision_cpu")
    print(f"largest |bf16 - fp32| AUC difference {worst:.5f} ({'within' if worst <= TARGET else 'NOT within'} "
          f"{TARGET}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
