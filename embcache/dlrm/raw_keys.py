"""How a DLRM run meets data with raw 64-bit keys (`meta.json` "keys": "raw"): each
table's size, which tables are open, and the map from keys to ids for closed ones.

`--raw-keys open` (default) makes every table open (`CachedEmbeddingBagCollection`'s
`open_tables`): a key gets a row on first sight, bounded by `--max-rows` (coldest keys
retire), `--ttl` retiring unused keys. `hash` and `first-day` keep closed tables and map
keys as batches are read (`data.key_maps`): hashing into `--max-rows` rows, or the first
training split's keys as a vocabulary (later keys share id 0). `--max-rows first-day` is,
per table, the number of distinct keys in the first training split, so that the three
ways can be compared at the same rows (`embcache bench vocab`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from embcache.data.ctr_format import is_raw_keys, load_key_frequencies
from embcache.data.key_maps import FirstDayVocabulary, HashedKeys, KeyMap

from .config import DLRMConfig


@dataclass
class RawKeySetup:
    rows: list[int]  # each table's num_embeddings (an open table's: the keys expected)
    open_tables: dict[str, dict] | None  # table name -> its settings (max_rows, retire, ttl)
    key_map: KeyMap | None  # for closed tables: keys -> ids as batches are read


def table_name(feature: str) -> str:
    return f"t_{feature}"


def raw_key_setup(meta: dict, cfg: DLRMConfig, data_dir: str | Path, first_split: str) -> RawKeySetup | None:
    """None for data of vocabulary ids (where the raw-key settings must be left alone:
    ValueError otherwise)."""
    if not is_raw_keys(meta):
        given = [flag for flag, value in (("--max-rows", cfg.max_rows), ("--ttl", cfg.ttl), ("--ttl-days", cfg.ttl_days))
                 if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} apply to data with raw keys (`data prepare --keys raw`); "
                             f"{data_dir} holds vocabulary ids")
        return None
    names = [f["name"] for f in meta["sparse"]]
    mode, bound = cfg.raw_keys, cfg.max_rows
    if mode == "hash" and bound is None:
        bound = "first-day"
    first = None
    if mode == "first-day" or bound == "first-day":
        per_split = meta.get("split_frequency_files", {})
        first = load_key_frequencies(data_dir, split=first_split if first_split in per_split else None)
    if mode == "first-day":
        if bound is not None or cfg.ttl is not None or cfg.ttl_days is not None:
            raise ValueError("--raw-keys first-day sizes each table by the first split's keys: "
                             "--max-rows and --ttl do not apply")
        vocab = FirstDayVocabulary([first[n][0].numpy() for n in names])
        return RawKeySetup(vocab.rows(), None, vocab)
    rows = [max(1, first[n][0].numel()) for n in names] if bound == "first-day" else \
        [int(bound)] * len(names) if bound is not None else None
    if mode == "hash":
        if cfg.ttl is not None or cfg.ttl_days is not None:
            raise ValueError("--ttl retires keys of open tables: it does not apply to --raw-keys hash")
        return RawKeySetup(rows, None, HashedKeys(rows))
    if cfg.sparse != "cached":
        raise ValueError(f"open tables (--raw-keys open) live in the cached sparse part, not --sparse {cfg.sparse}; "
                         f"use --raw-keys hash or first-day for it")
    expected = rows or [max(1, int(f["cardinality"])) for f in meta["sparse"]]
    ttl = cfg.ttl
    if cfg.ttl_days is not None:  # a day is the first training day's steps
        if cfg.ttl is not None or cfg.days is None:
            raise ValueError("--ttl-days counts days of --days A-B, instead of --ttl")
        ttl = cfg.ttl_days * max(1, -(-int(meta["splits"][first_split]["rows"]) // cfg.batch_size))
    open_tables = {table_name(n): {"max_rows": None if rows is None else rows[i], "retire": cfg.retire,
                                   "ttl": ttl, "seed": cfg.seed * 1000 + i}  # the model's table i, on any rank
                   for i, n in enumerate(names)}
    return RawKeySetup(expected, open_tables, None)


def with_key_counts(setup: RawKeySetup, meta: dict, data_dir: str | Path) -> RawKeySetup:
    """`setup` with each open table given its keys' counts over the counted training split
    (`load_key_frequencies`; a missing or damaged file is its one-line error): the `freq`
    policy's prior for the rows its keys take, as ids' counts are a vocabulary table's."""
    counts = load_key_frequencies(data_dir)
    return replace(setup, open_tables={table_name(n): {**setup.open_tables[table_name(n)], "key_freq": counts[n]}
                                       for n in (f["name"] for f in meta["sparse"])})
