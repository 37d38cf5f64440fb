"""Per-feature id counts over the training split: what the cache warms up with and what its
`freq` eviction policy ranks by. Accumulated chunk by chunk while a converter writes, so the
counts cost one `bincount` per chunk and never a second pass over the data."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class IdFrequency:
    """Running int64 counts of every id of every feature.

    Args:
        cardinalities: `{feature name: number of ids}`; counts have exactly that length.

    Example:
        >>> f = IdFrequency({"sparse_0": 4})
        >>> f.update("sparse_0", np.array([1, 1, 3]))
        >>> f.counts["sparse_0"].tolist()
        [0, 2, 0, 1]
    """

    def __init__(self, cardinalities: dict[str, int]):
        self.counts = {name: np.zeros(int(c), dtype=np.int64) for name, c in cardinalities.items()}

    def update(self, name: str, ids: np.ndarray) -> None:
        """Add one chunk of ids (already in `[0, cardinality)`) of feature `name`."""
        counts = self.counts[name]
        if len(ids):
            counts += np.bincount(ids, minlength=len(counts))[: len(counts)]

    def save(self, path: str | os.PathLike) -> None:
        """Write an `.npz` keyed by feature name (written to a temporary name, then renamed)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
        np.savez(tmp, **self.counts)
        os.replace(tmp, path)


def load_frequency_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """`{feature name: int64 counts}` from a file written by `IdFrequency.save`."""
    with np.load(path) as data:
        return {name: data[name].astype(np.int64, copy=False) for name in data.files}
