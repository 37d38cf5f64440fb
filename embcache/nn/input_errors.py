"""Checks of a batch that is already on the device, made there, and the ledger that keeps
what they found until someone reads it.

Why: a batch handed over on the device (torchrec's way, and a captured step's staging
tensors) would be checked on the host only by reading its values back, which makes the host
wait for the device every step and cannot be captured in a CUDA graph. So each check here
is a fixed list of fixed-size tensor ops: it writes the first problem it finds into a small
buffer on the device (`InputErrors`) and hands back the batch made harmless (a bad id
becomes id 0, bad offsets a valid layout, a non-finite weight 0), so that the step cannot
index out of bounds (on CUDA a device-side assert would end the process with no message).
The run stops with the same one-line `ValueError` a host batch gets, when the ledger is
read: `InputErrors.raise_pending`, which the bag calls whenever its results are read
(`cache_stats`, `flush`, checkpoints) and a trainer calls where it reads the step's loss.
Until then the flagged step trained on the harmless batch; nothing reads or saves its
results without passing through the raise.
"""
from __future__ import annotations

import weakref
from itertools import accumulate
from typing import Callable

import torch

from embcache.device import host_numbers

FIELDS = 3  # per record: what the message needs, as int64 (a position, a value, a bound)


class InputErrors:
    """The first input error found on the device, as `[site, a, b, c]` (int64; site 0:
    none), and per site the host-side message to format `a, b, c` into. First error wins,
    so a batch's message is the one the host checks (which run in the same order) give.

    Example:
        >>> import torch
        >>> errors = InputErrors()
        >>> ids = check_ids_on_device(torch.tensor([1, 7]), 5, errors)
        >>> ids.tolist()
        [1, 0]
        >>> errors.raise_pending()
        Traceback (most recent call last):
        ...
        ValueError: id 7 at position 1 is outside [0, 5)
    """

    def __init__(self):
        self._code: torch.Tensor | None = None
        self._sites: dict = {}
        self._formats: list[Callable[[int, int, int], str]] = []
        self._recent: list[tuple] = []  # (source, its version, the checked ids): see `reuse`

    def reuse(self, source: torch.Tensor, check: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`check()`'s ids for `source`, the very tensor given last time while `source` is
        unchanged: a prefetch and its forward check the same batch, and the cache matches
        them by identity (comparing device values would make the host wait)."""
        for ref, version, checked in self._recent:
            if ref() is source and source._version == version:
                return checked
        checked = check()
        self._recent = [(weakref.ref(source), source._version, checked)] + self._recent[:1]
        return checked

    def record(self, key, fmt: Callable[[int, int, int], str], flag: torch.Tensor,
               fields: list[torch.Tensor]) -> None:
        """Keep `fields` (0-d int64 tensors) under `key`'s message where `flag` (0-d bool) is
        set and nothing was kept before. The buffer is updated in place (a captured graph
        keeps writing the same tensor)."""
        if key not in self._sites:
            self._formats.append(fmt)
            self._sites[key] = len(self._formats)
        code = self.buffer(flag.device)
        site = flag.to(torch.int64).reshape(1) * self._sites[key]
        new = torch.cat([site] + [f.to(torch.int64).reshape(1) for f in fields])
        code.copy_(torch.where(code[0] != 0, code, new))

    def buffer(self, device: torch.device) -> torch.Tensor:
        """The ledger's tensor on `device` (made on first use: before a graph is captured)."""
        if self._code is None or self._code.device != device:
            self._code = torch.zeros(1 + FIELDS, dtype=torch.int64, device=device)
        return self._code

    def raise_pending(self) -> None:
        """Raise the kept error, if any, as the host check would have (and clear it).
        Reads four numbers from the device: call it where the step's result is read."""
        if self._code is None or self._code.device.type == "meta":
            return
        site, a, b, c = self._code.tolist()
        if site:
            self._code.zero_()
            self._recent = []  # a batch raised once is checked (and raised) again if seen again
            raise ValueError(self._formats[site - 1](a, b, c))


def _at(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """`t[pos]` for a 0-d index tensor, kept on the device (plain indexing reads `pos`)."""
    return t.index_select(0, pos.reshape(1))[0]


def first_bad(bad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any set, the position of the first set entry; 0 when none), on the device."""
    return bad.any(), torch.argmax(bad.to(torch.uint8))


def check_offsets_on_device(offsets: torch.Tensor, num_ids: int, errors: InputErrors) -> torch.Tensor:
    """`bag_input.check_offsets`'s value checks on the device; returns the offsets made a
    valid layout (the same tensor's values where they were valid)."""
    first = offsets[0]
    errors.record("offset0", lambda a, b, c: f"offsets must start at 0, got {a}", first != 0,
                  [first, first, first])
    if offsets.numel() > 1:
        any_bad, pos = first_bad(offsets[1:] < offsets[:-1])
        at = pos + 1
        errors.record("order", lambda a, b, c: f"offsets must be non-decreasing; offsets[{a}]={b} "
                      f"< offsets[{a - 1}]={c}", any_bad, [at, _at(offsets, at), _at(offsets, pos)])
    last = offsets[-1]
    errors.record("last", lambda a, b, c: f"offsets[-1]={a} exceeds the number of ids ({b})",
                  last > num_ids, [last, torch.full_like(last, num_ids), last])
    safe = torch.cummax(offsets.clamp(0, num_ids), 0).values
    return torch.cat([torch.zeros_like(safe[:1]), safe[1:]])


def check_ids_on_device(ids: torch.Tensor, num_embeddings: int, errors: InputErrors) -> torch.Tensor:
    """`bag_input.check_id_range` on the device; a bad id is looked up as id 0."""
    if ids.numel() == 0:
        return ids
    bad = (ids < 0) | (ids >= num_embeddings)
    any_bad, pos = first_bad(bad)
    errors.record(("id", num_embeddings),
                  lambda a, b, c: f"id {b} at position {a} is outside [0, {num_embeddings})",
                  any_bad, [pos, _at(ids, pos), pos])
    return torch.where(bad, torch.zeros_like(ids), ids)


def check_weights_on_device(weights: torch.Tensor, errors: InputErrors) -> torch.Tensor:
    """`bag_input.check_weights`'s finiteness check on the device; a bad weight becomes 0."""
    if weights.numel() == 0:
        return weights
    finite = torch.isfinite(weights)
    any_bad, pos = first_bad(~finite)
    value = _at(weights.detach(), pos)
    kind = torch.where(torch.isnan(value), torch.zeros_like(value), torch.sign(value))
    errors.record("weights", lambda a, b, c: f"per_sample_weights[{a}] is {_NON_FINITE[b]}: weights "
                  f"must be finite", any_bad, [pos, kind, pos])
    return torch.where(finite, weights, torch.zeros_like(weights))


_NON_FINITE = {0: "nan", 1: "inf", -1: "-inf"}


def check_feature_ids_on_device(ids: torch.Tensor, counts: list[int], features: list[tuple[str, str, int]],
                                errors: InputErrors) -> torch.Tensor:
    """`bag_input.check_feature_ids` on the device: the message names the feature and the
    position within its ids (found from the feature's first position, on the device).
    `counts`: each feature's number of ids; `features`: (feature, table, rows) each."""
    sizes = [rows for _, _, rows in features]
    bound = sizes[0] if len(set(sizes)) == 1 else torch.repeat_interleave(
        host_numbers(sizes, ids.device), host_numbers(counts, ids.device), output_size=ids.numel())
    bad = (ids < 0) | (ids >= bound)
    any_bad, pos = first_bad(bad)
    starts = host_numbers([0, *accumulate(counts[:-1])], ids.device)
    feature = torch.searchsorted(starts, pos.reshape(1), right=True)[0] - 1
    names = tuple(features)

    def message(a: int, b: int, c: int) -> str:
        name, table, rows = names[c]
        return f"feature {name!r}: id {b} at position {a} is outside table {table!r} [0, {rows})"

    errors.record(("feature", names), message, any_bad, [pos - _at(starts, feature), _at(ids, pos), feature])
    return torch.where(bad, torch.zeros_like(ids), ids)
