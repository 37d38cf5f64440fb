"""A CUDA graph's capture and replay, acted out on the CPU, so that a captured step's
behaviour over many replays is tested without a GPU.

A CUDA graph records the device work of one call of the step function and afterwards
repeats only that: none of the step's Python runs again, every Python number it computed
is baked in, and every tensor the capture wrote (its outputs, new tensors it left behind,
in-place updates) is rewritten at the same address by each replay. A step that keeps any
of its state in Python (a list it appends to, a ticket it swaps, a counter) trains
differently once replayed, and nothing eager shows it.

`ReplayedStep` stands in for `train.step_graph.CapturedStep`: the first `warmup` calls run
the function, the next one runs it under a dispatch mode that records every aten and
custom operator call (the function's effects are that call's, as CUDA's capture-then-replay
gives), and every later call re-issues the recorded calls on the recorded tensors, writing
each result into the tensor the capture got. An operation on tensors the host keeps (the
dense optimizer's step counts: on CUDA they stay on the CPU, so the graph leaves them out)
runs at the capture only. A read of a value by the host (a sync) is refused at the capture,
as CUDA refuses it, and so is a tensor made from host data (`torch.tensor(list)`): on CUDA it
is copied from pageable memory (a sync) or from a temporary pinned buffer whose address the
graph would keep.

What it cannot see: work that bypasses torch's dispatcher (`.numpy()` and what is done
with it); the `meta` tests cover that.
"""
from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import embcache.device
from embcache.train.step_graph import _copies  # the step's outputs as tensors of their own, as CapturedStep's
from tests.sync_counter import syncs


class CaptureRefused(RuntimeError):  # as CUDA raises it
    pass


class _Recorder(TorchDispatchMode):
    def __init__(self, host: set[int]):
        super().__init__()
        self.host, self.calls = host, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if (tensors and all(id(t) in self.host for t in tensors)) or func.namespace == "profiler":
            return func(*args, **kwargs)  # the host's own numbers, a profiler's marks: not in a graph
        if syncs(func, args, kwargs):
            raise CaptureRefused(f"{func} reads the device on the host (a sync) at {_where()}: CUDA cannot capture it")
        if func in _FROM_HOST_DATA:
            raise CaptureRefused(f"a tensor made from host data at {_where()}: on CUDA it is copied from pageable "
                                 "(or a temporary pinned) buffer, which a capture refuses (or bakes in)")
        out = func(*args, **kwargs)
        if not all(t is None or isinstance(t, torch.Tensor) for t in tree_flatten(out)[0]):
            raise CaptureRefused(f"{func} returns a value to the host (a sync) at {_where()}: CUDA cannot capture it")
        self.calls.append((func, args, kwargs, out))
        return out


# `torch.tensor(data)`, `torch.as_tensor(data)`, and pinning: host data bound for the device
_FROM_HOST_DATA = (torch.ops.aten.lift_fresh.default, torch.ops.aten._pin_memory.default)


def _where() -> str:
    """The innermost frame of the project's code: where a refused operation was asked for."""
    ours = [f for f in traceback.extract_stack() if "/embcache/" in f.filename]
    return f"{ours[-1].filename.rsplit('/embcache/', 1)[-1]}:{ours[-1].lineno}" if ours else "?"


def _aliases(func) -> bool:
    """Whether `func` returns (a view of) an input: a replay then needs no copy."""
    return any(r.alias_info is not None for r in func._schema.returns)


class ReplayedStep:
    """`step_fn(*inputs)` captured on its `warmup + 1`-th call and replayed from then on (see
    the module docstring). `host`: tensors the host keeps (their ops are not recorded), or a
    function returning them, asked at the capture."""

    def __init__(self, step_fn, warmup: int = 3, host=()):
        self.step_fn, self.warmup, self.host = step_fn, warmup, host
        self.static, self.calls, self._outputs = None, None, None
        self.steps = 0
        self.replays = 0

    @property
    def captured(self) -> bool:
        return self.calls is not None

    def __call__(self, *batch):
        if self.static is None:
            self.static = [None if x is None else x.clone() for x in batch]
        for static, x in zip(self.static, batch):
            if x is not None:
                if (x.shape, x.dtype) != (static.shape, static.dtype):
                    raise ValueError("a batch for a captured step must have the shapes and dtypes of the first")
                static.copy_(x)
        self.steps += 1
        if self.steps <= self.warmup:
            return _copies(self.step_fn(*self.static))
        if self.calls is None:
            host = self.host() if callable(self.host) else self.host
            recorder = _Recorder({id(t) for t in host})
            embcache.device.CPU_CAPTURING = True
            try:
                with recorder:
                    self._outputs = self.step_fn(*self.static)
            finally:
                embcache.device.CPU_CAPTURING = False
            self.calls = recorder.calls
        else:
            self._replay()
        return _copies(self._outputs)

    def _replay(self) -> None:
        self.replays += 1
        with torch.no_grad():
            for func, args, kwargs, out in self.calls:
                new = func(*args, **kwargs)
                if _aliases(func):
                    continue
                for dst, src in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                    if dst is not None:
                        dst.copy_(src)

