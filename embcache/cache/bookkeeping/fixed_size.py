"""Fixed-size tensor helpers of the device bookkeeper: operations whose result's size is
known to the host before the device has computed anything (no count goes back)."""
from __future__ import annotations

import torch

_CONSTANTS: dict = {}


def const(value, like: torch.Tensor) -> torch.Tensor:
    """`value` as a 0-d tensor of `like`'s type on its device, made once: a Python number
    handed to an operation beside device tensors becomes such a tensor every time (a fill
    kernel on a GPU). Not for 0.0 and -0.0, which a dict cannot tell apart."""
    key = (value, like.dtype, like.device)
    t = _CONSTANTS.get(key)
    if t is None:
        # a fill on the device: `torch.tensor(value, device=...)` copies from pageable host
        # memory, which CUDA's sync check counts as a wait (seen on an H200, 2026-11-28)
        t = _CONSTANTS[key] = torch.full((), value, dtype=like.dtype, device=like.device)
    return t


def pick(mask: torch.Tensor, a: torch.Tensor, b) -> torch.Tensor:
    """`torch.where(mask, a, b)`, a Python number `b` taken as a device constant."""
    return torch.where(mask, a, b if isinstance(b, torch.Tensor) else const(b, a))


def write_where(dst: torch.Tensor, target: torch.Tensor, values, mask: torch.Tensor, kernels: str = "torch",
                add: bool = False) -> None:
    """`dst[target[i]] = values[i]` (a number or a 0-d tensor: that value; `add`: `+=`) for
    the entries i where `mask[i]`; `target` holds a spare "trash" entry of `dst` where the
    mask is False. Torch's ops write the masked entries there (one op for the whole list);
    `kernels="triton"` skips them (`kernels.masked_scatter`): on a GPU the trash writes of a
    long, mostly masked list all hit one address and serialise."""
    if kernels == "triton":
        from embcache.kernels.masked_scatter import scatter_masked  # Triton: only when chosen

        one = values if isinstance(values, torch.Tensor) else const(values, dst)
        scatter_masked(dst, target, one, mask, add)
    elif add:
        dst.index_add_(0, target, values if values.numel() == target.numel() else values.expand(target.numel()))
    elif isinstance(values, torch.Tensor) and values.dim() > 0:
        dst.index_copy_(0, target, values)
    else:
        dst.index_fill_(0, target, values)


def summed_in_torch_order(keys: torch.Tensor, values: torch.Tensor,
                          stable: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """What `torch.sparse_coo_tensor(keys, values).coalesce()` gives, in a fixed size: the
    distinct keys ascending, each with its values summed in the order coalesce sums them
    (its sort of the keys, then a running sum), first; then -1 keys with -0.0 values, one
    per duplicate. Bit for bit coalesce's on the CPU (tests/test_device_bookkeeping.py),
    with no count handed to the host (coalesce needs its result's size). `stable`: equal
    keys summed in the order they come, as CUDA's coalesce (a radix sort) sums them; the
    CPU's sort is not stable, and without it each table must be summed on its own, as
    torch's uncached tables are."""
    n = keys.numel()
    sorted_keys, perm = keys.sort(stable=True, dim=0) if stable else keys.sort(0)
    first = torch.ones(n, dtype=torch.bool, device=keys.device)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = torch.cumsum(first, 0) - 1
    # -0.0 + v is v to the bit (+0.0 + -0.0 would not be): the running sum starts exact
    sums = torch.full((n, *values.shape[1:]), -0.0, dtype=values.dtype, device=values.device)
    if values.device.type != "cpu":  # CUDA's index_add_ adds a key's terms by atomics, in no fixed order; an
        # accumulating index_put_ sorts the keys stably and adds each one's terms in turn: the
        # same bits run after run, the order coalesce sums in (the CPU's index_add_ runs in order)
        sums.index_put_((group,), values.index_select(0, perm), accumulate=True)
    else:
        sums.index_add_(0, group, values.index_select(0, perm))
    out_keys = torch.full((n + 1,), -1, dtype=keys.dtype, device=keys.device)
    out_keys.index_copy_(0, pick(first, group, n), sorted_keys)
    return out_keys[:n], sums


def first_positions(values: torch.Tensor) -> torch.Tensor:
    """For each entry of `values` (1-D), the position of the first entry equal to it: a
    name for each distinct value, as `unique(return_inverse=True)` gives one, in a fixed
    size (`unique` makes the device report how many values are distinct).

    Example:
        >>> first_positions(torch.tensor([7, 3, 7, 7, 3, 9]))
        tensor([0, 1, 0, 0, 1, 5])
    """
    n = values.numel()
    sorted_values, perm = values.sort(stable=True)  # equal values keep their order: the first leads
    first = torch.ones(n, dtype=torch.bool, device=values.device)
    first[1:] = sorted_values[1:] != sorted_values[:-1]
    positions = torch.arange(n, device=values.device)
    lead = torch.cummax(pick(first, positions, 0), 0).values  # each sorted entry's first equal one
    out = torch.empty_like(perm)
    out.index_copy_(0, perm, perm.index_select(0, lead))
    return out


class DeviceCount:
    """A count the host keeps (the eviction clock, the step), copied on the device, so that
    a step replayed from a CUDA graph reads its own value there, not the capture's.
    `follow(host)` advances the copy by one add where it held the host's previous count, and
    sets it where anything else moved the host's (a checkpoint loaded): one op either way.
    `replayed(n)`: replays advanced it `n` times without the host's Python, which then adds
    the same to its own count."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.value = torch.zeros((), dtype=dtype, device=device)
        self.mirror: int | None = None  # the host's count `value` holds (None: not yet set)

    def follow(self, host: int) -> torch.Tensor:
        if self.mirror == host - 1:
            self.value.add_(1)
        else:
            self.value.fill_(host)
        self.mirror = host
        return self.value

    def replayed(self, n: int) -> None:
        if self.mirror is not None:
            self.mirror += n
