"""How long `make run` takes after the set-up, and what it reports: its command
(`embcache dlrm train --checkpoint-dir runs/dlrm --metrics-out runs/dlrm/metrics.jsonl`) in a
fresh home (`EMBCACHE_HOME`, so the synthetic data is generated as in a fresh clone), then
the same command again with `--resume`, as `make run` does when `runs/dlrm` holds a run
(a finished run only reports). Writes both wall times and the first run's summary to
bench/results/make_run.json.

    python bench/make_run_time.py
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from embcache.train.bench_results import run_for_summary, write_json  # noqa: E402

KEPT = ("val_auc", "val_logloss", "hit_rate", "overflow_rows", "train_samples_per_s", "peak_host_mib", "steps")


def main() -> int:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, EMBCACHE_HOME=home, PYTHONPATH=str(ROOT))
        run_dir = Path(home) / "runs" / "dlrm"
        argv = ["dlrm", "train", "--checkpoint-dir", str(run_dir), "--metrics-out", str(run_dir / "metrics.jsonl"),
                "--no-progress"]
        first, first_s = run_for_summary(argv, "make run", env)
        _, again_s = run_for_summary(argv + ["--resume"], "make run again", env)
    summary = {k: first[k] for k in KEPT if k in first}
    path = write_json({"command": "make run (" + " ".join(["embcache", *argv[:2], "--checkpoint-dir runs/dlrm",
                                                           "--metrics-out runs/dlrm/metrics.jsonl"]) + ")",
                       "wall_s": first_s, "again_wall_s": again_s, "summary": summary}, "make_run")
    print(f"make run: {first_s:.1f} s (data generation included), again {again_s:.1f} s; {summary}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
