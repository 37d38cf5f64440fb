"""`KeyStage`: what makes a cached bag an open table, a key stage in front of its rows.

Its inputs are raw 64-bit keys, not ids: a key gets a row of the closed bag's store on first
sight (`cache.open_table.OpenTable`: the key index, the first values, retirement under a
bound), and from there on the lookup is the closed bag's, row for row. The stage talks to
the rows only through their lifecycle (`row_store`: grow, reset rows, rows held, set
prior), and a prefetch's key lookup travels in its ticket to the forward of its batch.

`KeyedEmbeddingBag` (in `nn.cached_embedding_bag`) is this stage over the closed bag:
`CachedEmbeddingBag(..., keys="raw")` makes one (the form users write), and a collection one
for each group of open tables (`nn.table_groups.OpenGroup`). The stage calls the closed bag
through `super()` alone, so this module needs nothing of it.
"""
from __future__ import annotations

import inspect
import math

import torch

from embcache.cache.stores.host_store import RowInit
from embcache.cache.bookkeeping.lookup import Lookup
from embcache.cache.open_keys.open_table import OpenTable, RowStore

# the key stage's own settings (the closed bag's it passes on)
KEY_SETTINGS = ("max_rows", "retire", "ttl", "key_seed", "init_bound", "key_freq")


class KeyStage:
    """The key stage of a `CachedEmbeddingBag` whose inputs are raw keys (`keys="raw"`).
    Takes the closed bag's arguments (`num_embeddings` is then the expected number of keys:
    it sizes the cache, the first host store and the initial values' bound, not a limit;
    `weight` and `ids_freq` do not apply) and its own:

    Args:
        max_rows, retire, ttl: the bound on keys held (one a table for a shared index),
            which keys retire first under it ("lru" | "lfu"), and the steps without use
            after which a key retires (None: never).
        key_seed: seeds a key's first row (`keys.initial_rows`, uniform in `+-init_bound`,
            by default `sqrt(1 / num_embeddings)` as torchrec's init). Lists of seeds and
            bounds (one a table) make one index serve several tables (a collection's):
            the forward then takes each key's table.
        key_freq: the keys' counts over the training data, `(keys, counts)` (keys ascending
            and distinct, as `load_key_frequencies` gives a feature's), or a list of them
            (or None) one a table: a key's row gets its count as the `freq` policy's prior
            when the key takes it (0 for a key not counted), as `ids_freq` gives an id's.
            Ignored by the other policies.
    """

    def __init__(self, *args, keys: str = "raw", max_rows: int | list[int | None] | None = None, retire: str = "lru",
                 ttl: int | None = None, key_seed: int | list[int] = 0, init_bound: float | list[float] | None = None,
                 key_freq=None, **kwargs):
        settings = _settings(super().__init__, *args, **kwargs)
        if keys != "raw":
            raise ValueError(f"a keyed bag takes raw keys (keys='raw'), got keys={keys!r}")
        if settings["weight"] is not None or settings["ids_freq"] is not None:
            raise ValueError("keys='raw' makes a key's row on first sight: weight and ids_freq do not apply")
        if settings["bookkeeping"] == "device":
            raise ValueError("open tables (keys='raw') keep the host bookkeeper: their key index lives on the "
                             "host; give bookkeeping='host' or 'auto'")
        n, dim, store = int(settings["num_embeddings"]), int(settings["embedding_dim"]), settings["host_store"]
        bound = math.sqrt(1.0 / n) if init_bound is None else init_bound
        table = OpenTable(dim, key_seed, bound, max_rows, retire, ttl,
                          key_freq=key_freq if settings["eviction"] == "freq" else None)  # a `freq` prior alone
        first_rows = 1 + min(n, table.max_rows or n)  # the expected keys and the default row, zeros
        if store != "memory":  # a mapped store is made at its bound once (and a batch's keys past it)
            if table.max_rows is None:  # every table's bound, when a list
                raise ValueError("an open table on an mmap host store needs max_rows (the files are made at "
                                 "the bound)")
            first_rows = 1 + table.max_rows + max(64, table.max_rows // 8)
        optimizer_kwargs = settings.pop("optimizer_kwargs")
        kernels = "torch" if settings["kernels"] == "auto" else settings["kernels"]  # the host bookkeeper's
        super().__init__(**{**settings, "weight": RowInit(first_rows, dim, _zeros), "bookkeeping": "host",
                            "kernels": kernels},
                         **optimizer_kwargs)
        self.open = table

    @property
    def row_store(self) -> RowStore:
        """The rows' lifecycle (`open_table.RowStore`: grow, reset rows, rows held, set
        prior): all the key stage uses of the cache; lookups and prefetches go through
        the closed bag."""
        return self.cache

    def _id_limit(self) -> int | None:
        return None  # any int64 is a key

    # ------------------------------------------------------------------ lookups
    @torch.compiler.disable  # a compile boundary, as the closed bag's
    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        keys, offsets, weights = self.normalize_input(input, offsets, per_sample_weights)
        rows, ticket = self.rows_of_keys(keys)
        return self.lookup_normalized(rows, offsets, weights, ticket=ticket)

    def lookup_checked(self, keys: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None,
                       segments: list[list[int]] | None = None, tables: torch.Tensor | None = None,
                       ticket=None, padded: tuple[int, int] | None = None) -> torch.Tensor:
        rows, ticket = self.rows_of_keys(keys, tables, ticket)
        return super().lookup_checked(rows, offsets, weights, segments, ticket=ticket, padded=padded)

    def rows_of_keys(self, keys: torch.Tensor, tables: torch.Tensor | None = None,
                     ticket=None) -> tuple[torch.Tensor, object]:
        """Store rows for raw keys (of `tables`, one a key, when it serves several): made
        for new keys in training, the default row for unseen keys otherwise (evaluation,
        `frozen`, no gradients). Returns them and the ticket their lookup takes: in
        training the kept lookup of their prefetch (`ticket`, from `prefetch_ids`; without
        one, found by the keys), if still kept; else None."""
        train = self.updates_rows() and not self.read_only
        if not train:
            return self.open.peek(keys, tables).to(keys.device), None
        ticket = self.open.kept_lookup(keys, tables, ticket)
        return self.open.map(keys, self.row_store, tables, ahead=ticket).to(keys.device), ticket

    def _prepare(self, ids: torch.Tensor, keep: bool, segments, ticket) -> Lookup:
        """A key new at the prefetch had the default row then and has its own now: the
        cache takes the prefetch the kept lookup names although some rows differ. Without
        one, a prefetch a checkpoint restored (made for the batch that comes first) is this
        batch's."""
        return super()._prepare(ids, keep, segments, ticket.prefetched if ticket is not None
                                else self.restored_prefetch())

    def prefetch_ids(self, keys: torch.Tensor, tables: torch.Tensor | None = None):
        """The keys' rows known now are loaded (a new key's row is made by its forward);
        the ticket is the kept lookup of the keys, which names the cache's prefetch."""
        rows, ahead = self.open.rows_ahead(keys, tables)
        ahead.prefetched = super().prefetch_ids(rows)
        return ahead

    # ------------------------------------------------------------------ keys and their rows
    def add_keys(self, keys: torch.Tensor, tables: torch.Tensor | None = None) -> None:
        """Rows for the keys not held yet, at their first values (no use counted)."""
        self.open.add(keys, self.row_store, tables)

    def keyed_weight(self, table: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, rows): every key held and its row, current, in row order (of its
        `table`-th table when it serves several)."""
        keys, rows = self.open.live_rows(table)
        return torch.from_numpy(keys), self.host_weight().index_select(0, torch.from_numpy(rows))

    def open_stats(self) -> dict:
        """Keys live, made, retired, and the key index's bytes."""
        return self.open.stats()

    def table_stats(self, table: int) -> dict:
        return self.open.table_stats(table)

    def table_part(self, table: int, members: int) -> dict[str, torch.Tensor]:
        """Table `table`'s live keys' rows and optimizer state (copies), with the keys,
        their usage and what the shared index needs to be rebuilt (`open.<k>`, see
        `OpenTable.table_part`); `members`: a digest of the tables sharing the index."""
        part = self.open.table_part(table, members)
        return {**self.table_rows(torch.from_numpy(part["rows"] + 1)),
                **{f"open.{k}": torch.from_numpy(v.reshape(-1, 1)) for k, v in part.items()}}

    def restore_table_parts(self, parts: list[dict[str, torch.Tensor]], members: int, step: int) -> None:
        """Every table's `table_part`, with the cache empty: keys first (they say where the
        rows go), then the rows, then the keys' priors."""
        where = self.open.load_table_parts(
            [{k[len("open."):]: v.numpy() for k, v in p.items() if k.startswith("open.")} for p in parts], members)
        self.row_store.grow(self.open.rows_needed())
        self.restore_rows_at(torch.from_numpy(where), torch.cat([p["weight"] for p in parts]),
                             {k: torch.cat([p[f"optimizer.{k}"] for p in parts]) for k in self.optimizer_state_names()},
                             step)
        self.open.restore_prior(self.row_store)

    # ------------------------------------------------------------------ state
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for key, value in self.open.state_tensors().items():
            destination[prefix + "open." + key] = value

    def _missing_state(self, state_dict: dict, prefix: str) -> set[str]:
        return set() if any(k.startswith(prefix + "open.") for k in state_dict) else {"open.index"}

    def _load_state(self, mine: dict, state_dict: dict, prefix: str) -> None:
        """The keys (checked whole before anything changes), the store grown to the saved
        rows, the rows and cache, then the keys' priors."""
        self.open.load_tensors({k[len(prefix) + 5:]: v for k, v in state_dict.items()
                                if k.startswith(prefix + "open.")})
        self.row_store.grow(mine["weight"].shape[0])
        super()._load_state(mine, state_dict, prefix)
        self.open.restore_prior(self.row_store)


def _settings(closed_init, *args, **kwargs) -> dict:
    """Every setting of the closed bag's `__init__` by name, its defaults filled in (the
    key stage reads some; the closed bag gets the rest as given)."""
    bound = inspect.signature(closed_init).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _zeros(out: torch.Tensor, start: int) -> None:
    """The store before keys arrive: a key's row gets its values on first sight."""
    out.zero_()
