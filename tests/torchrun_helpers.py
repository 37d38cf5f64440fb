"""Running the `embcache` command under torchrun (or a plain process group) from tests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(extra: dict | None = None) -> dict:
    """The environment of a launched rank: one compute thread each (two ranks share the
    CI machine's two cores), the repository importable."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(extra or {})}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    return env


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m embcache ARGS` (the launcher contract)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", "-m", "embcache", *map(str, args)]


def torchrun(nproc: int, *args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the command on `nproc` ranks; the test fails (not hangs) past `timeout` seconds."""
    return subprocess.run(torchrun_command(nproc, *args), capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=rank_env(env))


def embcache(*args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """The same command in one plain process (no torchrun)."""
    return subprocess.run([sys.executable, "-m", "embcache", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=rank_env(env))
