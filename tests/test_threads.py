"""--threads: a default that does not oversubscribe (the cores this process may use, shared
among torchrun's local ranks), and the flag reaching torch and numba in every trainer."""
from __future__ import annotations

import os

import numba
import pytest
import torch

from embcache import threads
from embcache.cli import main
from embcache.errors import UserFacingError


@pytest.fixture
def eight_cores(monkeypatch):
    """This process may run on 8 cores (whatever the machine has); no torchrun, no OMP_NUM_THREADS."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for name in ("LOCAL_WORLD_SIZE", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def threads_put_back():
    t, n = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(t)
    numba.set_num_threads(n)


@pytest.mark.parametrize("local_ranks,expected", [(None, 8), ("1", 8), ("2", 4), ("3", 2), ("16", 1)])
def test_the_default_shares_the_usable_cores_among_local_ranks(eight_cores, local_ranks, expected):
    if local_ranks is not None:
        eight_cores.setenv("LOCAL_WORLD_SIZE", local_ranks)
    assert threads.default_threads() == expected


def test_the_default_follows_the_affinity_mask_not_the_machine(eight_cores):
    eight_cores.setattr(os, "sched_getaffinity", lambda pid: {3})  # e.g. `taskset -c 3`
    eight_cores.setattr(os, "cpu_count", lambda: 64)
    assert threads.usable_cores() == 1 and threads.default_threads() == 1


def test_omp_num_threads_is_the_users_only_outside_torchrun(eight_cores):
    eight_cores.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    eight_cores.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun sets OMP_NUM_THREADS=1 for every worker
    eight_cores.setenv("OMP_NUM_THREADS", "1")
    assert threads.default_threads() == 4


def test_set_threads_reaches_torch_and_numba(eight_cores, threads_put_back):
    seen = {}
    eight_cores.setattr(torch, "set_num_threads", lambda n: seen.__setitem__("torch", n))
    eight_cores.setattr(numba, "set_num_threads", lambda n: seen.__setitem__("numba", n))
    eight_cores.setattr(numba.config, "NUMBA_NUM_THREADS", 8)
    assert threads.set_threads(3) == 3 and seen == {"torch": 3, "numba": 3}
    eight_cores.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.set_threads() == 4 and seen == {"torch": 4, "numba": 4}
    eight_cores.setattr(numba.config, "NUMBA_NUM_THREADS", 2)  # numba's pool is fixed when it starts
    assert threads.set_threads(3) == 3 and seen == {"torch": 3, "numba": 2}


class Built(UserFacingError):
    pass


def _record_threads_at_build(monkeypatch, module, name):
    """Replace the trainer class `module.name` by one that notes the threads it is built
    with, then stops the command."""
    seen = {}

    def build(*args, **kw):
        seen.update(torch=torch.get_num_threads(), numba=numba.get_num_threads())
        raise Built("built")

    monkeypatch.setattr(module, name, build)
    return seen


def test_the_flag_reaches_torch_and_numba_before_dlrm_and_face_build(small_synthetic, monkeypatch, capsys,
                                                                     threads_put_back):
    import embcache.dlrm.trainer as dlrm
    import embcache.face.trainer as face

    torch.set_num_threads(2)
    seen = _record_threads_at_build(monkeypatch, dlrm, "DLRMTrainer")
    assert main(["dlrm", "train", "--data", str(small_synthetic), "--device", "cpu", "--threads", "1"]) == 1
    assert seen == {"torch": 1, "numba": 1}
    torch.set_num_threads(2)
    seen = _record_threads_at_build(monkeypatch, face, "FaceTrainer")
    assert main(["face", "train", "--device", "cpu", "--threads", "1"]) == 1
    assert seen == {"torch": 1, "numba": 1}
    assert "built" in capsys.readouterr().err


def test_cf_threads_default_to_the_usable_cores(monkeypatch, capsys, threads_put_back):
    from cpu_kernels.heat import max_threads

    args = ["cf", "train", "--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
            "--synthetic-interactions", "900", "--negatives", "4", "--no-progress", "--epochs", "1"]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(args) == 0
    expected = min(threads.default_threads(), max_threads())
    assert f", {expected} thread(s)" in capsys.readouterr().out
    torch.set_num_threads(2)
    assert main([*args, "--threads", "1"]) == 0
    assert ", 1 thread(s)" in capsys.readouterr().out
    assert torch.get_num_threads() == 2  # a command run in-process leaves the caller's setting


@pytest.mark.parametrize("cores,ranks,expected", [
    (range(8), 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (range(7), 3, [[0, 1, 2], [3, 4], [5, 6]]),
    ([5, 2, 9, 3], 2, [[2, 3], [5, 9]]),  # a mask's cores, in order
    (range(2), 4, [[0, 1]] * 4),  # fewer cores than ranks: each keeps them all
])
def test_each_local_rank_gets_its_own_contiguous_share_of_the_cores(cores, ranks, expected):
    shares = [threads.local_share(list(cores), r, ranks) for r in range(ranks)]
    assert shares == expected


def _pinned(env: dict, *flags: str) -> str:
    """The affinity a `run_cli.apply_threads` leaves in a fresh process (and the threads it set)."""
    import subprocess
    import sys

    code = ("import argparse, os, sys; from embcache.train.run_cli import add_threads_argument, apply_threads; "
            "p = argparse.ArgumentParser(); add_threads_argument(p); n = apply_threads(p.parse_args(sys.argv[1:])); "
            "print(sorted(os.sched_getaffinity(0)), n)")
    full = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", code, *flags], env={**full, **env}, capture_output=True, text=True,
                          check=True)
    return proc.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs affinity masks and 2 cores")
def test_a_torchrun_rank_keeps_to_its_share_of_the_cores_unless_told_not_to():
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    assert _pinned({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == f"{cores[half:]} {half}"
    assert _pinned({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}) == f"{cores[:half]} {half}"
    # the threads are the share the rank had before pinning, not a share of the share
    assert _pinned({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "--no-pin-cores") == f"{cores} {half}"
    assert _pinned({}) == f"{cores} {len(cores)}"  # one process: left alone
