"""Which device a run uses: one rule for every module, trainer and benchmark; and the peak
memory a run reports."""
from __future__ import annotations

import resource

import torch


def default_device() -> torch.device:
    """CUDA when a GPU is present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(name: str | torch.device | None) -> torch.device:
    """`name` as a device (None: `default_device()`). A name that is not a device, a
    device kind other than cpu/cuda, or cuda on a machine without a GPU is a ValueError
    saying so, not a failure somewhere inside the first step."""
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {str(name)!r} is not a device (cpu, cuda or cuda:N)") from None
    if device.type == "meta":  # rows with shapes and no values: what `bench host` measures the host's work on
        return device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(name)!r}: only cpu and cuda are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(name)!r}: no CUDA device is available on this machine")
    return device


# Set by tests that act a device out on the CPU (tests/cpu_graph.py replays a captured step
# there): a batch's ids on the CPU then take the path ids on a GPU take (checked and grouped
# by device operations, nothing read on the host), which is the path a CUDA graph holds.
CPU_ACTS_AS_DEVICE = False


def values_on_host(t: torch.Tensor) -> bool:
    """Whether the host may read `t`'s values for free (no device to wait for): a batch's
    checks and grouping then run on the host; elsewhere they are device operations."""
    return t.device.type == "cpu" and not CPU_ACTS_AS_DEVICE


# Set by tests/cpu_graph.py while it records a step on the CPU as a CUDA graph's capture:
# `capturing` then answers as it would on a GPU.
CPU_CAPTURING = False


def capturing(device: torch.device) -> bool:
    """Whether work on `device` is being recorded into a CUDA graph now."""
    if device.type == "cuda":
        return torch.cuda.is_current_stream_capturing()
    return CPU_CAPTURING


def host_numbers(values: list[int], device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A few numbers the host knows (a batch's layout, a group's offsets) as a tensor on
    `device`, without the host waiting: one pinned copy sent non-blocking. Inside a CUDA
    graph's capture a copy from host memory is refused (pageable) or baked in (a temporary
    pinned buffer, which later work reuses), so there each number is written by a fill the
    graph records: every replay writes them anew."""
    if capturing(device):
        out = torch.empty(len(values), dtype=dtype, device=device)
        for i, v in enumerate(values):
            out[i].fill_(v)
        return out
    return to_device_async(torch.tensor(values, dtype=dtype), device)


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device` without making the host wait: a host tensor bound for CUDA is
    copied into pinned memory (torch's pinned allocator keeps that buffer until the copy
    has run) and sent with `non_blocking=True`; a plain `.to(device)` from pageable memory
    would wait for the copy."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def peak_memory(device: torch.device) -> dict:
    """Peak resident host memory of this process and peak device memory allocated."""
    out = {"peak_host_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["peak_device_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def device_argument(name) -> torch.device:
    """A command's `--device` as a device, or the command's one-line error: `resolve_device`'s
    ValueError (cuda on a machine without a GPU, a name that is no device) was a traceback."""
    from embcache.errors import UserFacingError

    try:
        return resolve_device(name)
    except ValueError as err:
        raise UserFacingError(f"--device: {err}") from None
