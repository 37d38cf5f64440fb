"""A CUDA tensor over pinned host memory, so that device kernels read and write host rows
themselves (zero-copy, over the link) with no host thread in the loop.

With unified virtual addressing every page-locked allocation is mapped into the device's
address space at the same address, so a CUDA tensor can alias it. torch makes such a tensor
from any object that offers `__cuda_array_interface__` (the protocol numba and CuPy speak),
and checks that the pointer is registered with CUDA: ordinary (pageable) memory is refused.
An index_select on the view is then a gather kernel whose loads cross the link; an
index_copy_ writes host rows from the device.

On the CPU the view is the tensor itself, so code written against the view runs unchanged
where there is no GPU (and in CI); on `meta` it is a tensor of the same shape without values.
"""
from __future__ import annotations

import torch


class _HostRows:
    """Owns a reference to the pinned tensor for as long as the device view lives (torch
    keeps the interface object alive through the view's deleter)."""

    def __init__(self, host: torch.Tensor):
        self.host = host
        self.__cuda_array_interface__ = {"shape": (host.numel() * host.element_size(),), "typestr": "|u1",
                                         "data": (host.data_ptr(), False), "version": 3, "strides": None}


def device_view(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` as a tensor on `device` that shares its memory (same shape and dtype).

    CUDA needs `host` pinned and contiguous; anywhere else `host` itself is returned.
    Writes through the view land in `host`; a host read of them must wait for the kernels
    that wrote (synchronize, or an event), as for any device work.
    """
    device = torch.device(device)
    if device.type == "meta":  # shapes without values: what proves a step asks the device nothing
        return torch.empty(host.shape, dtype=host.dtype, device="meta")
    if device.type != "cuda":
        return host
    if not host.is_contiguous():
        raise ValueError("device_view: the host tensor must be contiguous")
    if not host.is_pinned():
        raise ValueError("device_view: the host tensor must be pinned (page-locked) for the device to map it")
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    with torch.cuda.device(device):
        raw = torch.as_tensor(_HostRows(host), device=device)  # uint8 bytes at the same address
    return raw.view(host.dtype).view(host.shape)
