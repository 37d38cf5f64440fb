"""The numba kernels of `open_table`: a batch's rows touched (last use, uses), keys coded
with their table's salt, the first position of each new row in a batch, and the rows a
retirement forgets."""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _touch(rows: np.ndarray, last_seen: np.ndarray, uses: np.ndarray, clock: int) -> None:
    for r in rows:
        last_seen[r] = clock
        uses[r] += 1


@numba.njit(cache=True, nogil=True)
def _code(keys: np.ndarray, tables: np.ndarray, salts: np.ndarray, out: np.ndarray) -> None:
    """`out[i] = mix64(keys[i]) ^ salts[tables[i]]` (tables empty: table 0), in one pass;
    the same bits as `keys.mix64` (numba's uint64 arithmetic wraps)."""
    one = tables.size == 0
    for i in range(keys.size):
        x = np.uint64(keys[i])
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        out[i] = np.int64(x ^ np.uint64(salts[0 if one else tables[i]]))


@numba.njit(cache=True, nogil=True)
def _first_positions(rows: np.ndarray, new_rows: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """The first position in `rows` of each of `new_rows` (each occurs), in O(len(rows));
    `scratch` (one entry an index row, -1) is left as it was found."""
    for j in range(new_rows.size):
        scratch[new_rows[j]] = j
    out = np.full(new_rows.size, -1, np.int64)
    left = new_rows.size
    for i in range(rows.size):
        j = scratch[rows[i]]
        if j >= 0 and out[j] < 0:
            out[j] = i
            left -= 1
            if left == 0:
                break
    for j in range(new_rows.size):
        scratch[new_rows[j]] = -1
    return out


@numba.njit(cache=True, nogil=True)
def _forget(rows: np.ndarray, gone: np.ndarray) -> None:
    """rows[i] = -1 where `gone[rows[i]]` (a kept lookup whose key retired since)."""
    for i in range(rows.size):
        r = rows[i]
        if r >= 0 and gone[r]:
            rows[i] = -1
