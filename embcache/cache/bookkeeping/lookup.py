"""What one batch's trip through the cache leaves behind: where its lookups point
(`Lookup`), the rows served beside a full cache (`Overflow`), a prefetch waiting for its
batch (`Prefetched`), and the wording of "how large a cache would hold it"."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def ratio_at_least(rows: int, num_rows: int) -> str:
    """`rows / num_rows` rounded up to two significant digits: the smallest such cache ratio
    whose cache (`ceil(ratio * num_rows)` slots) has `rows` slots.

    Example:
        >>> ratio_at_least(2_345, 46_000), ratio_at_least(7, 7)
        ('0.051', '1')
    """
    if rows >= num_rows:
        return "1"
    exact = rows / num_rows
    digits = 1 - math.floor(math.log10(exact))
    return f"{math.ceil(exact * 10 ** digits - 1e-9) / 10 ** digits:.{max(digits, 0)}f}"


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two batches of ids (or keys) are the same: the very tensor, or equal ones."""
    return a is b or (a.shape == b.shape and torch.equal(a, b))


@dataclass
class Overflow:
    """Rows of one batch that did not fit in the cache, kept beside it for one step."""

    ids: torch.Tensor  # sorted unique ids (host, with the bookkeeping)
    weight: torch.Tensor
    state: dict
    device_ids: torch.Tensor  # the same ids beside the rows (stochastic rounding hashes them)


@dataclass
class Lookup:
    """Where one batch's lookups point: `indices` index `cache.weight` (then the
    overflow rows, from `num_slots` on); `held` slots cannot be evicted until released.
    `ids` are the batch's ids in lookup order (host-side, with the bookkeeping) and
    `segments` the runs of lookups that an uncached model keeps apart: per table, the
    number of lookups of each of its features (None: one table, one feature); together
    they let the gradient be summed exactly as torch sums it."""

    indices: torch.Tensor
    overflow: Overflow | None
    held: torch.Tensor | None
    ids: torch.Tensor | None = None
    segments: list[list[int]] | None = None
    # how many lookups point past the cache (at overflow rows), counted where the indices
    # were made (on the host): the update splits the gradient with it, without asking the device
    overflow_lookups: int | None = None
    # the device bookkeeper's rows for this batch's overflow (`device_cache.Scratch`)
    scratch: object = None


@dataclass
class Prefetched:
    """A prefetched batch: its ids, the distinct slots it holds, its hits and misses, and
    (when the prefetch gave every id a slot) each lookup's slot, which stays valid while
    held: the batch's forward then reuses it instead of looking every id up again.
    `prefetch` returns it: the ticket its batch's `prepare` takes to find it, ids compared
    or not (an open table's may differ: a key new at the prefetch has its row by then)."""

    ids: torch.Tensor
    held: torch.Tensor
    hits: int
    misses: int
    slots: torch.Tensor | None = None
    restored: bool = False  # from a checkpoint: no one holds its ticket (made for the batch that comes first)
