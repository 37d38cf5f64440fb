"""State dicts of torch's and torchrec's form, which hold rows only, in and out of the cache.

A drop-in is loaded with what its users already have: `nn.EmbeddingBag.state_dict()` is
`{"weight": [N, D]}`, and torchrec's `EmbeddingBagCollection` (inside a DLRM: under
`sparse_arch.embedding_bag_collection.`) is `{"embedding_bags.<table>.weight": [N, D]}`.
Loaded into a cached bag or collection, the rows replace the table's and everything those
state dicts do not hold stays as it is: the rows' optimizer state (as loading weights into a
torch model leaves its optimizer's), the step and the statistics. The caches start empty.
The way back is `CachedEmbeddingBagCollection.torchrec_state_dict()`.

The cache's own state dicts (rows, optimizer state, residency) load exactly as before.
"""
from __future__ import annotations

import torch

from .key_stage import KeyStage

TORCHREC_KEY = "embedding_bags.{}.weight"


def size_mismatch(key: str, given: torch.Tensor, shape: tuple[int, int]) -> str:
    """torch's own wording for a tensor of another shape."""
    return (f"size mismatch for {key}: copying a param with shape {given.shape} from checkpoint, "
            f"the shape in current model is {torch.Size(shape)}.")


def load_rows_only(bag, pieces: list[tuple[int, str, torch.Tensor]], error_msgs: list[str]) -> bool:
    """Rows `(first id, key, rows)` into `bag`'s table (`RowCache.put_rows`), each converted
    to the bag's row type as `Tensor.to` rounds; what is wrong goes to `error_msgs` (as
    torch's `load_state_dict` reports it) and nothing changes. Returns whether they loaded."""
    if isinstance(bag, KeyStage):
        keys = ", ".join(key for _, key, _ in pieces)
        error_msgs.append(f"{keys}: a table of raw keys keeps its rows in the order keys came, not in id order: "
                          "it loads from the cache's own state dict only")
        return False
    dtype = bag.cache.host.weight.dtype
    start, cast = len(error_msgs), []
    for first, key, rows in pieces:
        if not torch.is_tensor(rows) or not rows.is_floating_point():
            error_msgs.append(f"{key}: not a floating-point tensor")
            continue
        rows = rows.detach().to("cpu", dtype)  # checked as stored: a float32 row past float16's range is inf there
        if not bool(torch.isfinite(rows).all()):
            error_msgs.append(f"{key}: holds NaN or inf")
        cast.append((first, rows))
    if len(error_msgs) > start:
        return False
    try:
        bag.raise_input_errors()
        bag.cache.put_rows(cast)
    except ValueError as err:
        error_msgs.append(f"{', '.join(key for _, key, _ in pieces)}: {err}")
        return False
    return True


def bag_rows_only(bag, rows: torch.Tensor, key: str, error_msgs: list[str]) -> None:
    """`nn.EmbeddingBag`'s state dict (`weight` alone) into a `CachedEmbeddingBag`."""
    shape = (bag.cache.num_rows, bag.cache.dim)
    if torch.is_tensor(rows) and tuple(rows.shape) != shape:
        error_msgs.append(size_mismatch(key, rows, shape))
        return
    load_rows_only(bag, [(0, key, rows)], error_msgs)


def torchrec_tables(collection, state_dict: dict, prefix: str) -> dict[str, str]:
    """{table name: its key} for the tables `state_dict` holds in torchrec's form under `prefix`."""
    keys = {t.name: prefix + TORCHREC_KEY.format(t.name) for t in collection.embedding_bag_configs()}
    return {name: key for name, key in keys.items() if key in state_dict}


def collection_rows_only(collection, state_dict: dict, prefix: str, given: dict[str, str],
                         missing_keys: list[str], error_msgs: list[str]) -> None:
    """torchrec's `EmbeddingBagCollection` state dict (under `prefix`; `given`: its tables,
    `torchrec_tables`) into a cached collection: every table it names checked first, then
    each group's tables loaded; the keys are taken out of `state_dict`. A table it lacks
    keeps its rows and is a missing key (an error under `strict`, as torch's are)."""
    rows = {name: state_dict.pop(key) for name, key in given.items()}
    if any(k.startswith(prefix + "bags.") for k in state_dict):
        error_msgs.append(f"{prefix or 'the state dict'}: holds tables of both torchrec's form "
                          f"({', '.join(given.values())}) and the cache's own ('bags.<i>.'): load one of them")
        return
    missing_keys.extend(prefix + TORCHREC_KEY.format(t.name) for t in collection.embedding_bag_configs()
                        if t.name not in given)
    plans, start = [], len(error_msgs)
    for bag, group in zip(collection.bags, collection.table_groups()):
        pieces = []
        for table, first in zip(group.tables, group.row_offsets):
            if table.name in rows:
                shape = (table.num_embeddings, table.embedding_dim)
                if torch.is_tensor(rows[table.name]) and tuple(rows[table.name].shape) != shape:
                    error_msgs.append(size_mismatch(given[table.name], rows[table.name], shape))
                pieces.append((first, given[table.name], rows[table.name]))
        if pieces:
            plans.append((bag, pieces))
    if len(error_msgs) > start:
        return
    for bag, pieces in plans:  # a group refused (NaN, raw keys) loads nothing; the others still load
        load_rows_only(bag, pieces, error_msgs)


def torchrec_state_dict(collection, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every table's rows, current and copied, under torchrec's names: what
    `torchrec.EmbeddingBagCollection.load_state_dict` takes."""
    groups = list(zip(collection.bags, collection.table_groups()))
    open_tables = [t.name for bag, group in groups if isinstance(bag, KeyStage) for t in group.tables]
    if open_tables:
        raise ValueError(f"table(s) {', '.join(open_tables)} take raw keys: their rows are not in id order "
                         "(table_rows(name) gives each live key's row)")
    out = {}
    for bag, group in groups:
        weight = bag.host_weight()  # made current once a group, not once a table
        for t, first in zip(group.tables, group.row_offsets):
            out[prefix + TORCHREC_KEY.format(t.name)] = weight[first: first + t.num_embeddings].clone()
    return out

