"""Multi-hot batches padded to a fixed number of ids, so that a captured step (a CUDA graph,
which replays fixed shapes) takes every batch of a run.

Why this layout: the padding must change no result. The pad lookups sit in one extra bag
after the batch's bags (offsets gain one entry), so no real bag changes size (mean pooling
divides by it) and the caller drops the extra bag's output (`pooled[:batch]`). They all
look up one row kept for them, `pad_id`, beyond the real ids (the bag is built with one row
more, `padded_rows`): its gradient is zero, but the optimizers' state changes even for a
zero gradient (Adam's lazy moments decay, Adagrad's step counts), so the row must be one no
real id reads. The real lookups keep their order, so every real row's gradient is summed
in the same order and its update is the same to the bit.

A batch with more ids than the capacity is not split: two parts would be two optimizer
steps (two updates of a row in both, Adam's step counted twice), which is not the
unsplit step. It runs outside the graph, eagerly and unpadded (`FixedCapacity.pad` returns
None), counted, and said once.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch


def padded_rows(num_embeddings: int) -> int:
    """The rows of a bag that takes padded batches: the real ones and the pad row (the
    last, id `num_embeddings`)."""
    return num_embeddings + 1


def choose_capacity(id_counts: Sequence[int], quantile: float = 0.999, margin: float = 1.1,
                    round_to: int = 1024) -> int:
    """The ids a padded batch holds, from the data's pooling: the `quantile` of per-batch id
    counts (say, of a sample of the training batches), times `margin`, rounded up to a
    multiple of `round_to` (a few graph-friendly sizes, whatever the sample).

    Example:
        >>> choose_capacity([900, 1000, 1100], quantile=1.0, margin=1.1, round_to=256)
        1280
    """
    if not len(id_counts):
        raise ValueError("choose_capacity needs the id counts of at least one batch")
    if not 0 < quantile <= 1 or margin < 1 or round_to < 1:
        raise ValueError(f"need 0 < quantile <= 1, margin >= 1, round_to >= 1; got {quantile}, {margin}, {round_to}")
    counts = torch.tensor(list(id_counts), dtype=torch.float64)
    top = float(torch.quantile(counts, quantile))
    return max(round_to, math.ceil(top * margin / round_to) * round_to)


def pad_batch(ids: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None, capacity: int,
              pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`ids` `[capacity]`, `offsets` `[bags + 1]`, `weights` `[capacity]` (or None): the batch's
    lookups unchanged and in order, then `capacity - n` lookups of `pad_id` in one extra
    bag (weight 0). Takes the loader's host tensors (1-D ids with offsets); `n <= capacity`.

    Example:
        >>> import torch
        >>> pad_batch(torch.tensor([4, 2, 9]), torch.tensor([0, 2]), None, 5, pad_id=10)[:2]
        (tensor([ 4,  2,  9, 10, 10]), tensor([0, 2, 3]))
    """
    n = ids.numel()
    if n > capacity:
        raise ValueError(f"a batch of {n} ids does not fit a capacity of {capacity}")
    pad = capacity - n
    ids = torch.cat([ids, torch.full((pad,), pad_id, dtype=ids.dtype, device=ids.device)])
    offsets = torch.cat([offsets, torch.full((1,), n, dtype=offsets.dtype, device=offsets.device)])
    if weights is not None:
        weights = torch.cat([weights, torch.zeros(pad, dtype=weights.dtype, device=weights.device)])
    return ids, offsets, weights


class FixedCapacity:
    """Pads each batch to `capacity` ids (`pad_batch`) and counts the batches that do not
    fit: those run eagerly, unpadded, and the first one is said (`say`, one line).

    Args:
        capacity: ids a padded batch holds (`choose_capacity`).
        pad_id: the row kept for pad lookups (`padded_rows(num_embeddings) - 1`).
        say: where the one line goes (default: print).

    Example:
        >>> import torch
        >>> fixed = FixedCapacity(4, pad_id=10, say=lambda line: None)
        >>> fixed.pad(torch.tensor([1, 2]), torch.tensor([0]), None)[0].tolist()
        [1, 2, 10, 10]
        >>> fixed.pad(torch.arange(6), torch.tensor([0]), None), fixed.over_capacity
        (None, 1)
    """

    def __init__(self, capacity: int, pad_id: int, say: Callable[[str], None] = print):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity, self.pad_id, self.say = int(capacity), int(pad_id), say
        self.over_capacity = 0  # batches run outside the graph

    def pad(self, ids: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None):
        """The padded batch, or None where it has more ids than the capacity (counted)."""
        if ids.numel() > self.capacity:
            self.over_capacity += 1
            if self.over_capacity == 1:
                self.say(f"a batch of {ids.numel()} ids is over the graph's capacity of {self.capacity}: "
                         f"such batches run outside the graph, unpadded (counted in over_capacity)")
            return None
        return pad_batch(ids, offsets, weights, self.capacity, self.pad_id)


def pad_features(values: torch.Tensor, lengths: torch.Tensor, capacities: Sequence[int]):
    """A keyed batch's ids (`values`, feature after feature; `lengths` `[F * B]`) padded to
    `capacities[f]` ids a feature, so that a captured step takes every batch of a multi-hot
    run: returns `(values, lengths)` with `lengths` `[F * (B + 1)]`, each feature's ids then
    its pad lookups in one extra sample of its own (the last), or None where a feature has
    more ids than its capacity, or none at all though its capacity is not 0 (it has no id of
    its own to repeat, and a pad of another would add a row the batch does not look up).

    The extra sample is dropped from the pooled output (a collection given
    `padded_samples=1`), so its gradient is zero. A pad lookup repeats the first id its
    feature has in the batch: a row the batch looks up anyway, so the
    cache's decisions and counts (per distinct id) are the unpadded batch's. Once the cache
    has decided, the training forward points the pad lookups at a row of their own
    (`DeviceUpdates.set_pads_aside`), so that their zero terms sort after every real one and
    each real row's sum is the unpadded batch's. Reads the lengths and the first ids: meant
    for the loader's host batches (on a device, one sync).

    Example:
        >>> import torch
        >>> v, n = pad_features(torch.tensor([4, 2, 9, 7]), torch.tensor([2, 0, 1, 1]), [3, 2])
        >>> v.tolist(), n.tolist()
        ([4, 2, 4, 9, 7], [2, 0, 1, 1, 1, 0])
    """
    per_sample = lengths.view(len(capacities), -1)
    counts = feature_counts(lengths, len(capacities))
    if any(n > cap or (n == 0 < cap) for n, cap in zip(counts, capacities)):
        return None
    parts, start = [], 0
    for n, cap in zip(counts, capacities):
        ids = values[start:start + n]
        parts += [ids, ids[:1].expand(cap - n)] if n else []  # a feature with none has capacity 0
        start += n
    pads = torch.tensor([cap - n for n, cap in zip(counts, capacities)], dtype=lengths.dtype, device=lengths.device)
    return (torch.cat(parts) if parts else values[:0]), torch.cat([per_sample, pads.view(-1, 1)], dim=1).reshape(-1)


def feature_counts(lengths: torch.Tensor, num_features: int) -> list[int]:
    """Ids each feature has in a batch (`lengths` `[F * B]`, on the host: no sync)."""
    return lengths.view(num_features, -1).sum(1).tolist()
