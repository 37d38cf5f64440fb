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
    import embcache.train.dlrm as dlrm
    import embcache.train.face as face

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
