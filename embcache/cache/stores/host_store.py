"""The full table and its optimizer state on the host, in id order, always.

Two backings, chosen by a spec string, behind one interface (`gather`, `scatter`, the
`weight` and `state` tensors): nothing in the cache engine knows which it has.

- `"memory"`: ordinary tensors. When CUDA is present they are pinned (page-locked host
  memory, in torch's words) so that rows gathered for the device can be copied
  asynchronously.
- `"mmap:DIR"`: one file per tensor under DIR with a JSON header (`table_files`), mapped
  into memory. The operating system's page cache is the RAM tier and the disk the last
  one; a table larger than memory trains with the pages it touches resident. A mapping
  cannot be pinned: with CUDA, gathers land in pinned staging buffers instead, which is
  what the device copy reads.

(Not to be confused with a slot *held* in the device cache by a batch in flight, which
only keeps it from eviction.)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from embcache.cache.stores import table_files as tf

MEMORY = "memory"
MMAP_PREFIX = "mmap:"


def parse_host_store(spec: str) -> Path | None:
    """None for "memory", the directory for "mmap:DIR"; ValueError for anything else."""
    if spec == MEMORY:
        return None
    if isinstance(spec, str) and spec.startswith(MMAP_PREFIX) and len(spec) > len(MMAP_PREFIX):
        return Path(spec[len(MMAP_PREFIX):]).expanduser()
    raise ValueError(f"host_store must be 'memory' or 'mmap:DIR', got {spec!r}")


@dataclass(frozen=True)
class RowInit:
    """A table to be made rather than given: `fill(out, start)` writes float32 rows
    `[start, start + len(out))` into `out`. A mapped store calls it chunk by chunk (a huge
    table is never whole in memory), the memory store once over the whole table: the
    filler must give the same values either way."""

    num_rows: int
    dim: int
    fill: Callable[[torch.Tensor, int], None]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.dim)


class HostStore:
    """Host weights `[N, D]` plus per-row state tables `{name: [N, w]}`.

    Args:
        weight: the table (id order); taken over, not copied, unless pinning.
        state: optimizer state tables with N rows each.
        pin: gather into page-locked memory (only meaningful with CUDA); the memory
            backing also pins its tables.
        directory: the files behind mapped tensors (None: the memory backing).
        spare_rows: rows allocated past the table's end, in each table (memory backing
            only): a device that writes rows through a view of the store sends the writes
            it masks out there (`with_spare`), so that a fixed-size write needs no count.

    Build one with `HostStore.create`.

    Example:
        >>> store = HostStore.create("memory", torch.ones(4, 2), {"sum": (2, 0.0)}, torch.bfloat16)
        >>> rows, state = store.gather(torch.tensor([1, 3]))
        >>> rows.dtype, tuple(state["sum"].shape), store.row_bytes()
        (torch.bfloat16, (2, 2), 12)
    """

    def __init__(self, weight: torch.Tensor, state: dict[str, torch.Tensor], pin: bool = False,
                 directory: Path | None = None, spare_rows: int = 0):
        pin_tables = pin and directory is None
        if spare_rows and directory is not None:
            raise ValueError("spare rows need the memory backing (a mapped table keeps its files' shape)")
        self.spare_rows = int(spare_rows)
        self._padded = {}  # name -> the table with its spare rows (`with_spare`)

        def keep(name: str, table: torch.Tensor) -> torch.Tensor:
            if not self.spare_rows:
                return table.pin_memory() if pin_tables and not table.is_pinned() else table
            padded = torch.empty((table.shape[0] + self.spare_rows, *table.shape[1:]), dtype=table.dtype,
                                 pin_memory=pin_tables)
            padded[: table.shape[0]].copy_(table)
            padded[table.shape[0]:].zero_()
            self._padded[name] = padded
            return padded[: table.shape[0]]

        self.weight = keep("weight", weight)
        self.state = {k: keep(f"optimizer.{k}", v) for k, v in state.items()}
        self.pinned = pin
        self.directory = directory

    def with_spare(self) -> dict[str, torch.Tensor]:
        """Every table with its spare rows after the last row (`tensors()`'s names); the
        rows before them are the very tensors of `tensors()`."""
        if not self.spare_rows:
            raise ValueError("this store was made without spare rows")
        return dict(self._padded)

    @classmethod
    def create(cls, spec: str, weight: torch.Tensor | RowInit, state: dict[str, tuple[int, float]],
               row_dtype: torch.dtype = torch.float32, pin: bool = False, spare_rows: int = 0) -> "HostStore":
        """A store for `spec` ("memory" | "mmap:DIR") holding `weight` (rounded to
        `row_dtype`) and state tables `{name: (width, initial value)}` in float32.
        A mapped store rewrites DIR's files (see `table_files`)."""
        directory = parse_host_store(spec)
        num_rows, dim = weight.shape
        if directory is None:
            if isinstance(weight, RowInit):
                table = torch.empty(num_rows, dim)
                weight.fill(table, 0)
                weight = table
            tables = {k: torch.full((num_rows, w), v, dtype=torch.float32) for k, (w, v) in state.items()}
            return cls(weight.to(row_dtype), tables, pin, spare_rows=spare_rows)
        if spare_rows:
            raise ValueError(f"device bookkeeping needs the memory host store, not {spec!r}: the device writes "
                             f"rows through a view of pinned memory, which a mapped file cannot be")
        specs = [tf.TensorSpec("weight", (num_rows, dim), row_dtype),
                 *(tf.TensorSpec(f"optimizer.{k}", (num_rows, w), torch.float32) for k, (w, _) in state.items())]
        fills = {"weight": weight.fill if isinstance(weight, RowInit) else _copier(weight),
                 **{f"optimizer.{k}": _constant(v) for k, (_, v) in state.items()}}
        lock = tf.lock_directory(directory)
        try:
            mapped = tf.create_files(directory, specs, fills)
        except BaseException:
            lock.close()
            raise
        store = cls(mapped["weight"], {k: mapped[f"optimizer.{k}"] for k in state}, pin, directory)
        store._lock = lock  # held as long as the store lives
        return store

    @property
    def backing(self) -> str:
        return MEMORY if self.directory is None else f"{MMAP_PREFIX}{self.directory}"

    def row_bytes(self) -> int:
        """Bytes one row occupies with its state: what moving it costs."""
        per = self.weight.shape[1] * self.weight.element_size()
        return per + sum(t.shape[1] * t.element_size() for t in self.state.values())

    def grow(self, num_rows: int, state_init: dict[str, float]) -> None:
        """Append rows up to `num_rows` (an open table's new rows: zero weights, each state
        table at its initial value; the rows are given their keys' values when keys take
        them). The memory backing only: a mapped table is made at its bound once."""
        old = self.weight.shape[0]
        if num_rows <= old:
            return
        if self.directory is not None:
            raise ValueError(f"a host store mapped from {self.directory} cannot grow past its {old:,} rows: "
                             f"give an open table on an mmap store its max_rows")
        if self.spare_rows:
            raise ValueError("a store with spare rows (device bookkeeping) cannot grow")
        pin = self.pinned

        def extend(table: torch.Tensor, value: float) -> torch.Tensor:
            out = torch.empty((num_rows, table.shape[1]), dtype=table.dtype, pin_memory=pin)
            out[:old].copy_(table)
            out[old:].fill_(value)
            return out

        self.weight = extend(self.weight, 0.0)
        self.state = {k: extend(v, state_init[k]) for k, v in self.state.items()}

    def gather(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Copies of rows `ids` (host tensors, pinned when the store is)."""
        ids = ids.cpu()
        return (self._take(self.weight, ids),
                {k: self._take(v, ids) for k, v in self.state.items()})

    def _take(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if not self.pinned:
            return table.index_select(0, ids)
        out = torch.empty((ids.numel(), table.shape[1]), dtype=table.dtype, pin_memory=True)
        return torch.index_select(table, 0, ids, out=out)

    def scatter(self, ids: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """Write rows back (from any device; a device->host copy when needed)."""
        ids = ids.cpu()
        self.weight.index_copy_(0, ids, weight.to("cpu"))
        for k, v in state.items():
            self.state[k].index_copy_(0, ids, v.to("cpu"))

    # ------------------------------------------------------------------ files
    def tensors(self) -> dict[str, torch.Tensor]:
        """Every table under its `state_dict` name: `weight`, `optimizer.<k>`."""
        return {"weight": self.weight, **{f"optimizer.{k}": v for k, v in self.state.items()}}

    def specs(self) -> list[tf.TensorSpec]:
        return [tf.TensorSpec(k, tuple(v.shape), v.dtype) for k, v in self.tensors().items()]

    def save_files(self, directory: Path) -> None:
        """Copy every table into `directory` (raw files, CRC-32 each, header last), chunk
        by chunk whatever the backing: the table as it is now, which training on will not
        change."""
        tf.save_tensors(directory, self.tensors())

    def verify_files(self, directory: Path) -> None:
        """CheckpointError naming the file unless `directory` holds this store's tables,
        complete and undamaged. Reads every file; changes nothing."""
        tf.verify_saved(directory, self.specs())

    def load_files(self, directory: Path) -> None:
        """Overwrite the tables from `directory` (verified first by the caller)."""
        for spec, table in zip(self.specs(), self.tensors().values()):
            tf.load_into(directory, spec, table)


def _copier(weight: torch.Tensor) -> Callable[[torch.Tensor, int], None]:
    def fill(out: torch.Tensor, start: int) -> None:
        out.copy_(weight[start: start + out.shape[0]])
    return fill


def _constant(value: float) -> Callable[[torch.Tensor, int], None]:
    def fill(out: torch.Tensor, start: int) -> None:
        out.fill_(value)
    return fill
