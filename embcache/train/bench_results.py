"""What every benchmark writes beside its numbers: where they were measured, and where
the results go; and how a benchmark runs a trainer in a process of its own and reads its
summary. On the run skeleton's floor, below the rooms, so that the rooms' benchmarks
(`embcache.dlrm.bench`, `embcache.cf.bench`, `embcache.face.bench`) and those of
`embcache.bench` share it; light: torch is imported only when the hardware is read."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from embcache.paths import results_dir, source_root


def hardware() -> dict:
    """The machine the numbers came from; benchmarks on shared machines are only
    comparable within one run, so this is recorded next to every result."""
    import torch  # here, not at the top: the benchmarks' parsers import this module, their --help without torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        # at the time of writing, i.e. the end of the run: a busy machine shows here
        "loadavg_1_5_15min": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_json(payload: dict, name: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Write `payload` (plus the hardware) to `<out_dir>/<name>.json` and return the path."""
    out = Path(out_dir) if out_dir else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"hardware": hardware(), **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def run_for_summary(argv: list[str], what: str, env: dict | None = None,
                    launcher: list[str] | None = None) -> tuple[dict, float]:
    """(the JSON summary a command prints last, its wall seconds) of `python -m embcache
    argv` in a process of its own (under `launcher`, e.g. torchrun's module, when given).
    A failure is one UserFacingError line: `what` failed with its status and the last line
    it wrote, or ended without its summary."""
    from embcache.errors import UserFacingError

    cmd = [sys.executable, *(launcher or []), "-m", "embcache", *argv]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=source_root())
    wall = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        said = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        raise UserFacingError(f"{what} failed with status {proc.returncode}: {said[-1] if said else 'no output'}")
    try:
        return json.loads(lines[-1]), wall
    except json.JSONDecodeError:
        raise UserFacingError(f"{what} ended without its JSON summary: {lines[-1][:200]}") from None
