"""Before/after: the same `embcache dlrm train` run from two commits, interleaved.

    python bench/compare_commits.py BASE [--rounds 3] [-- extra dlrm train flags]

Checks BASE out into a temporary worktree, then runs the DLRM trainer of BASE and of the
working tree one after the other, `--rounds` times, on the same synthetic data and flags
(the cached collection at 1.5 % by default), and writes the samples/s of each run, each
round's ratio and their median to bench/results/dlrm_ab.json. Interleaving is what
makes the ratio mean something on a shared machine whose speed drifts by tens of percent
over minutes: a drift touches both sides of a round alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from embcache.train.bench_results import write_json  # noqa: E402
from embcache.paths import results_dir  # noqa: E402


def train_rate(tree: Path, data: Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "embcache", "dlrm", "train", "--data", str(data), "--no-progress", *extra]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"compare_commits: {tree}: {' '.join(cmd)} failed:\n{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["train_samples_per_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the commit to compare against (hash, tag or branch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--name", default="dlrm_ab")
    p.add_argument("extra", nargs="*", help="dlrm train flags (after --)")
    args = p.parse_args()
    extra = args.extra or ["--sparse", "cached", "--cache-ratio", "0.015", "--max-steps", "120",
                           "--batch-size", "4096", "--embedding-dim", "16"]
    from embcache.data.synthetic import generate_synthetic

    data = ROOT / "datasets" / f"bench-dlrm-r{args.rows}-s{args.scale:g}"
    if not (data / "meta.json").exists():
        generate_synthetic(data, rows=args.rows, scale=args.scale, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(base_tree), args.base],
                       check=True, capture_output=True)
        try:
            train_rate(base_tree, data, extra + ["--max-steps", "5"])  # its numba cache, compiled untimed
            rounds = []
            for r in range(args.rounds):
                base, head = train_rate(base_tree, data, extra), train_rate(ROOT, data, extra)
                rounds.append({"base_samples_per_s": base, "head_samples_per_s": head, "ratio": head / base})
                print(f"round {r + 1}: base {base:,.0f}  head {head:,.0f} samples/s  head/base {head / base:.3f}",
                      flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                           capture_output=True)
    median = statistics.median(r["ratio"] for r in rounds)
    print(f"median head/base: {median:.3f}")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    path = write_json({"benchmark": "dlrm before/after", "base": args.base, "head": head, "flags": extra,
                       "rounds": rounds, "median_ratio": median}, args.name, results_dir())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
