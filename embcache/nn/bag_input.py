"""Checks of an embedding bag's input, kept apart from the lookup they guard.

Bad input must be refused before the cache changes (a half-admitted batch would leave
rows held or counted), and refused with a message naming the problem, where torch's own
kernel would index out of bounds or train on NaN. Every check runs where the input
lives: on CPU tensors it costs no device sync, so callers check before they move the
input to the device. A batch already on the device is checked there, without reading a
value back (`input_errors`): given an `InputErrors` ledger, the value checks of a device
batch write into it and the step runs on the batch made harmless; the ledger raises the
same message when it is read. Checks of dtypes and shapes (metadata, known on the host)
raise at once wherever the batch is.
"""
from __future__ import annotations

import torch

from embcache.device import to_device_async, values_on_host

from .input_errors import (InputErrors, check_ids_on_device, check_offsets_on_device,
                           check_weights_on_device)

ID_DTYPES = (torch.int64, torch.int32)


def check_bag_input(input, offsets, per_sample_weights, num_embeddings: int | None, mode: str,
                    errors: InputErrors | None = None, on_device: bool | None = None):
    """Check a batch as `nn.EmbeddingBag` would, and more (id range, offsets order,
    finite weights). Returns 1-D ids, offsets and weights, where they were.
    `num_embeddings` None: raw keys (an open table), any int64 value. `errors`: where a
    batch off the CPU records its value checks (None: they are made on the host, reading
    the values); `on_device` forces either way (None: by where `input` is).

    Example:
        >>> import torch
        >>> check_bag_input(torch.tensor([[1, 7]]), None, None, num_embeddings=5, mode="sum")
        Traceback (most recent call last):
        ...
        ValueError: id 7 at position 1 is outside [0, 5)
    """
    errors = device_side(input, errors, on_device)
    ids, offsets, weights = check_layout(input, offsets, per_sample_weights, errors)
    if num_embeddings is not None:
        if errors is None:
            check_id_range(ids, num_embeddings)
        else:
            flat = ids
            ids = errors.reuse(input, lambda: check_ids_on_device(flat, num_embeddings, errors))
    return ids, offsets, check_weights(weights, mode, errors)


def device_side(input, errors: InputErrors | None, on_device: bool | None) -> InputErrors | None:
    """The ledger the value checks write into, or None where they run on the host: on CPU
    tensors (reading them costs no sync), or where no ledger is given."""
    if on_device is None:
        on_device = torch.is_tensor(input) and not values_on_host(input)
    return errors if on_device else None


def check_layout(input, offsets, weights, errors: InputErrors | None = None):
    """Dtypes and shapes, as torch checks them. The cache works on one layout, so 2-D
    input comes back as 1-D ids with offsets (one bag per row). `errors`: offsets' values
    checked on the device (see `check_bag_input`)."""
    if not torch.is_tensor(input):
        raise ValueError(f"input must be a tensor of ids, got {type(input).__name__}")
    if input.dtype not in ID_DTYPES:
        raise ValueError(f"input must hold int64 or int32 ids, got {input.dtype}")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError("offsets must be None when input is 2-D (each row is one bag)")
        bags, width = input.shape
        offsets = torch.arange(0, bags * width, width, device=input.device) if width else \
            torch.zeros(bags, dtype=torch.long, device=input.device)
        if weights is not None:
            if weights.shape != (bags, width):
                raise ValueError(f"per_sample_weights shape {tuple(weights.shape)} does not match "
                                 f"input shape {(bags, width)}")
            weights = weights.reshape(-1)
        return input.reshape(-1), offsets, weights
    if input.dim() != 1:
        raise ValueError(f"input must be 1-D (with offsets) or 2-D, got {input.dim()}-D")
    if offsets is None:
        raise ValueError("1-D input needs offsets (the start of each bag)")
    offsets = check_offsets(offsets, input.numel(), errors)
    if weights is not None and weights.shape != input.shape:
        raise ValueError(f"per_sample_weights shape {tuple(weights.shape)} does not match "
                         f"input shape {tuple(input.shape)}")
    return input, offsets, weights


def check_offsets(offsets, num_ids: int, errors: InputErrors | None = None) -> torch.Tensor:
    """Bag starts that `F.embedding_bag` would misread rather than refuse. Returns the
    offsets (on the device, made harmless where `errors` keeps a problem)."""
    if not torch.is_tensor(offsets) or offsets.dim() != 1 or offsets.dtype not in ID_DTYPES:
        raise ValueError("offsets must be a 1-D int64 or int32 tensor")
    if offsets.numel() == 0:
        raise ValueError("offsets is empty: at least one bag is needed")
    if errors is not None:
        return check_offsets_on_device(offsets, num_ids, errors)
    if int(offsets[0]) != 0:
        raise ValueError(f"offsets must start at 0, got {int(offsets[0])}")
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        bad = int(torch.nonzero(offsets[1:] < offsets[:-1])[0]) + 1
        raise ValueError(f"offsets must be non-decreasing; offsets[{bad}]={int(offsets[bad])} "
                         f"< offsets[{bad - 1}]={int(offsets[bad - 1])}")
    if int(offsets[-1]) > num_ids:
        raise ValueError(f"offsets[-1]={int(offsets[-1])} exceeds the number of ids ({num_ids})")
    return offsets


def check_id_range(ids: torch.Tensor, num_embeddings: int) -> None:
    """An id out of range would fail deep in the cache's admission, half-way through."""
    if ids.numel():
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= num_embeddings:
            pos = int(torch.nonzero((ids < 0) | (ids >= num_embeddings))[0])
            raise ValueError(f"id {int(ids[pos])} at position {pos} is outside "
                             f"[0, {num_embeddings})")


def check_feature_ids(ids: torch.Tensor, counts: list[int], features: list[tuple[str, str, int]]) -> None:
    """The ids of several features, concatenated, each against its own table, in one
    comparison with a per-lookup bound: a few tensor ops per batch, not per feature.
    The message names the feature and the position within its ids.

    Args:
        ids: the features' ids, one after the other.
        counts: how many of `ids` each feature has.
        features: per feature, (feature name, table name, table rows).
    """
    if ids.numel() == 0:
        return
    sizes = [rows for _, _, rows in features]
    if len(set(sizes)) == 1:
        bound = sizes[0]
    else:
        bound = torch.repeat_interleave(torch.tensor(sizes, device=ids.device),
                                        torch.tensor(counts, device=ids.device),
                                        output_size=ids.numel())
    bad = (ids < 0) | (ids >= bound)
    if not bool(bad.any()):
        return
    first = int(torch.nonzero(bad)[0])
    start = 0
    for (feature, table, rows), n in zip(features, counts):
        if first < start + n:
            raise ValueError(f"feature {feature!r}: id {int(ids[first])} at position {first - start} "
                             f"is outside table {table!r} [0, {rows})")
        start += n


def check_weights(weights: torch.Tensor | None, mode: str, errors: InputErrors | None = None):
    """Weights torch would take but the cache should not: NaN or inf would spread into
    the rows and their optimizer state; another dtype would be cast silently. Returns the
    weights (made finite on the device where `errors` keeps a problem)."""
    if weights is None:
        return None
    if mode != "sum":
        raise ValueError(f"per_sample_weights need mode='sum', this bag uses {mode!r}")
    if weights.dtype != torch.float32:
        raise ValueError(f"per_sample_weights must be float32 (the table's dtype), got {weights.dtype}")
    if errors is not None:
        return check_weights_on_device(weights, errors)
    if not bool(torch.isfinite(weights).all()):
        pos = int(torch.nonzero(~torch.isfinite(weights))[0])
        raise ValueError(f"per_sample_weights[{pos}] is {float(weights[pos])}: weights must be finite")
    return weights


def to_device(ids: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None,
              device: torch.device):
    """Checked input for the lookup: offsets and weights on the cache's device; ids as
    int64 where they are, since the cache's bookkeeping reads them on the host (ids
    from the host never make it wait for the device) and moves what the device needs."""
    device = torch.device(device)
    return (ids.to(dtype=torch.long), to_device_async(offsets.to(dtype=torch.long), device),
            None if weights is None else to_device_async(weights, device))
