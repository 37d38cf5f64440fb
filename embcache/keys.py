"""Raw 64-bit keys: what an open table (a table without a vocabulary) is indexed by.

A key is a feature value's 64-bit code (`data.delimited.string_keys` for text; an integer
value is its own key), stored as int64 (the bits of a uint64). Key 0 is "missing", a key
like any other to an open table: it gets a row on first sight.

A row made for a key starts from `initial_rows(keys, dim, seed, bound)`: a function of the
key and the seed alone, so the order in which keys arrive, the row a key is given, the
rank that owns it and whether it was retired and came back never change its first value.
The numbers are uniform in `[-bound, bound)`, as torchrec's default init with
`bound = sqrt(1 / num_embeddings)`, drawn by a splitmix64 hash of (seed, key, column).
"""
from __future__ import annotations

import torch

_MIX1, _MIX2 = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64)  # splitmix64, as int64
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser over int64 tensors (wrapping arithmetic): a bijection of
    64-bit words whose outputs look independent even for consecutive inputs."""
    for shift, mul in ((30, _MIX1), (27, _MIX2)):
        x = (x ^ shift_right(x, shift)) * mul
    return x ^ shift_right(x, 31)


_INV1, _INV2 = (pow(m + (1 << 64), -1, 1 << 64) for m in (_MIX1, _MIX2))
_INV1, _INV2 = (m - (1 << 64) if m >= 1 << 63 else m for m in (_INV1, _INV2))


def _unshift_xor(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `x ^ (x >>> bits)`."""
    y = x
    for _ in range(64 // bits + 1):
        y = x ^ shift_right(y, bits)
    return y


def unmix64(x: torch.Tensor) -> torch.Tensor:
    """The inverse of `mix64`: `unmix64(mix64(k)) == k` for every int64 k.

    Example:
        >>> k = torch.tensor([0, 1, -5, 2**62])
        >>> torch.equal(unmix64(mix64(k)), k)
        True
    """
    x = _unshift_xor(x, 31) * _INV2
    x = _unshift_xor(x, 27) * _INV1
    return _unshift_xor(x, 30)


def initial_rows(keys: torch.Tensor, dim: int, seed, bound) -> torch.Tensor:
    """float32 `[len(keys), dim]`: each key's first row, uniform in `[-bound, bound)`
    (`seed` and `bound`: numbers, or tensors of one a key).

    Example:
        >>> a = initial_rows(torch.tensor([7, 3]), 4, seed=1, bound=0.5)
        >>> b = initial_rows(torch.tensor([3]), 4, seed=1, bound=0.5)
        >>> torch.equal(a[1], b[0]), bool((a.abs() <= 0.5).all())
        (True, True)
    """
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1, 1)
    seed = torch.as_tensor(seed, dtype=torch.int64).reshape(-1, 1)  # one, or one a key
    salt = mix64((seed & ((1 << 63) - 1)) + _GOLDEN)
    cols = torch.arange(int(dim), dtype=torch.int64) * _GOLDEN
    bits = mix64(mix64(keys ^ salt) + cols)  # [n, dim]
    unit = shift_right(bits, 40).to(torch.float64) * (1.0 / (1 << 24))  # 24 bits: [0, 1)
    bound = torch.as_tensor(bound, dtype=torch.float64).reshape(-1, 1)
    return ((unit * 2.0 - 1.0) * bound).to(torch.float32)
