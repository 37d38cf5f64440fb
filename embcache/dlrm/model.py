"""The DLRM a run trains: one table per sparse feature (`table_configs`), the sparse part
(the cache with its rows placed on the ranks, `sharded_cache`, or the uncached baselines'
whole tables, `whole_tables`), torchrec's DLRM or the plain-torch one around it (`dlrm`),
the dense optimizer, DDP and `torch.compile` of the dense parts (`build_model`), and the dense
state under single-process names (`dense_state`). The trainer is `embcache.dlrm.trainer`."""
from __future__ import annotations

import logging
import math
from functools import partial

import torch
from torch import nn

from embcache.cache.optimizers import TORCH_EQUIVALENTS, torch_equivalent
from embcache.distributed import placement
from embcache.distributed.data_parallel import data_parallel, unwrap
from embcache.distributed.sharded_collection import (ShardedEmbeddingBagCollection, open_shard_settings,
                                                     overlap_pooled_exchange)
from embcache.distributed.world import current
from embcache.dlrm.config import ARCHS, SPARSE_MODES, DLRMConfig
from embcache.dlrm.raw_keys import RawKeySetup
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.sparse_types import HAVE_TORCHREC, TORCHREC_ERROR, EmbeddingBagConfig

logger = logging.getLogger(__name__)
DENSE_PARTS = ("dense_arch", "inter_arch", "over_arch")  # what `compile` compiles (those the model has)


def _init_table(weight: torch.Tensor, seed: int, num_rows: int) -> None:
    """torchrec's default init (uniform +-sqrt(1/N)) from a generator of the table's own,
    so every sparse mode starts from the same table whatever else consumed randomness."""
    bound = math.sqrt(1.0 / num_rows)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.copy_(torch.rand(weight.shape, generator=gen) * (2 * bound) - bound)


def table_configs(meta: dict, cfg: DLRMConfig, rows: list[int] | None = None) -> list[EmbeddingBagConfig]:
    """One table a sparse feature, of its cardinality (or `rows`: raw-key data's sizes)."""
    rows = rows or [f["cardinality"] for f in meta["sparse"]]
    return [EmbeddingBagConfig(name=f"t_{f['name']}", embedding_dim=cfg.embedding_dim,
                               num_embeddings=n, feature_names=[f["name"]],
                               init_fn=partial(_init_table, seed=cfg.seed * 1000 + i, num_rows=n))
            for i, (f, n) in enumerate(zip(meta["sparse"], rows))]


def resolve_arch(arch: str) -> str:
    """"torchrec" or "torch" for `arch`: auto takes torchrec where it imports; torchrec
    asked for where it does not is a ValueError saying why."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if arch == "auto":
        return "torchrec" if HAVE_TORCHREC else "torch"
    if arch == "torchrec" and not HAVE_TORCHREC:
        raise ValueError(f"--arch torchrec: torchrec does not import here ({TORCHREC_ERROR}); "
                         f"--arch torch (or auto) trains the same model without it")
    return arch


class HostTables(nn.Module):
    """Whole tables in host memory, outputs moved to the device: the `host` baseline."""

    def __init__(self, ebc: nn.Module, device: torch.device):
        super().__init__()
        self.ebc, self._device = ebc, device

    def embedding_bag_configs(self):
        return self.ebc.embedding_bag_configs()

    def is_weighted(self):
        return self.ebc.is_weighted()

    def forward(self, features):
        kt = self.ebc(features.to(torch.device("cpu")))
        return type(kt)(keys=kt.keys(), length_per_key=kt.length_per_key(),
                        values=kt.values().to(self._device, non_blocking=True))


def sharded_cache(tables, cfg: DLRMConfig, ids_freq: dict | None, device: torch.device,
                  open_tables: dict[str, dict] | None = None):
    """The cached sparse part, its rows placed on the ranks (all on this one without torchrun).
    An open table (`open_tables`) that `--row-wise-rows` (or its default) would split by
    rows is split by key hash instead, one shard a rank (its rows are not ranges of ids);
    each shard's bound is its share of the table's `max_rows`."""
    freq = ids_freq or {}
    open_tables = open_tables or {}
    loads = [placement.TableLoad(t.name, tuple(t.feature_names), t.num_embeddings,
                                 float(sum(freq[f].sum() for f in t.feature_names if f in freq)),
                                 open=t.name in open_tables)
             for t in tables]
    shards = placement.plan(loads, current().size, cfg.row_wise_rows)
    shard_freq = {s.feature_key(f): freq[f][s.row_start: s.row_stop] for s in shards for f in s.features
                  if f in freq and not s.by_key}
    by_name = {t.name: t for t in tables}
    mine_by_table = {s.table: s for s in shards if s.rank == current().rank}

    host_store = cfg.host_store
    if host_store != "memory" and current().distributed:  # one store per rank
        host_store = f"{host_store}/rank{current().rank}"

    def make_local(configs):
        mine = {c.name: open_shard_settings(open_tables[c.name], by_name[c.name], mine_by_table[c.name])
                for c in configs if c.name in open_tables}
        return CachedEmbeddingBagCollection(
            configs, cache_ratio=cfg.cache_ratio, ids_freq=shard_freq or None, device=device,
            open_tables=mine or None, key_seed=cfg.seed * 1000,
            eviction=cfg.eviction, warmup_ratio=cfg.warmup_ratio, admission=cfg.admission,
            optimizer=cfg.sparse_optimizer, lr=cfg.sparse_lr,
            host_store=host_store, row_dtype=cfg.row_dtype, rounding=cfg.row_rounding, rounding_seed=cfg.seed,
            bookkeeping=cfg.bookkeeping, kernels=cfg.kernels)

    if current().distributed:
        logger.info("placement:\n" + placement.describe(shards, current().size))
    sharded = ShardedEmbeddingBagCollection(tables, shards, make_local)
    sharded.open_tables = set(open_tables)  # the checkpoint saves their keys with their rows
    return sharded


def whole_tables(tables: list[EmbeddingBagConfig], cfg: DLRMConfig, device: torch.device, arch: str):
    """The uncached baselines' sparse part (`device`, `host`) and its torch optimizer:
    torchrec's collection under arch torchrec, else `TorchEmbeddingBagCollection` (the
    same tables, initial rows and gradients)."""
    if cfg.sparse_optimizer not in TORCH_EQUIVALENTS:
        raise ValueError(f"--sparse {cfg.sparse} supports optimizers "
                         f"{sorted(TORCH_EQUIVALENTS)}, not {cfg.sparse_optimizer!r}")
    where = device if cfg.sparse == "device" else torch.device("cpu")
    if arch == "torchrec":
        from torchrec import EmbeddingBagCollection

        ebc = EmbeddingBagCollection(tables, device=where)
        for bag in ebc.embedding_bags.values():
            bag.sparse = True
    else:
        from embcache.nn.torch_collection import TorchEmbeddingBagCollection

        ebc = TorchEmbeddingBagCollection(tables, device=where)
    sparse_opt = torch_equivalent(cfg.sparse_optimizer, ebc.parameters(), cfg.sparse_lr)
    return (ebc if cfg.sparse == "device" else HostTables(ebc, device)), sparse_opt


def dlrm(arch: str, sparse: nn.Module, meta: dict, cfg: DLRMConfig, device: torch.device) -> nn.Module:
    """The model around `sparse`, its dense layers drawn from `cfg.seed`: torchrec's DLRM or
    the plain-torch one, which make the same layers in the same order (same values)."""
    if arch == "torchrec":
        from torchrec.models.dlrm import DLRM
    else:
        from embcache.dlrm.arch import DLRM
    torch.manual_seed(cfg.seed)
    return DLRM(embedding_bag_collection=sparse, dense_in_features=meta["num_dense"],
                dense_arch_layer_sizes=[*cfg.dense_arch, cfg.embedding_dim],
                over_arch_layer_sizes=[*cfg.over_arch, 1], dense_device=device)


def build_model(meta: dict, cfg: DLRMConfig, ids_freq: dict | None, device: torch.device | None = None,
                raw: RawKeySetup | None = None):
    """DLRM with the chosen sparse part; returns (model, sparse part, dense optimizer,
    torch sparse optimizer or None). Under torchrun the dense MLPs are wrapped in DDP.
    `raw`: raw-key data's table sizes and open tables (`train.raw_keys`)."""
    device = device or cfg.resolved_device()
    arch = resolve_arch(cfg.arch)
    tables = table_configs(meta, cfg, raw.rows if raw else None)
    sparse_opt = None
    if cfg.sparse == "cached":
        sparse = sharded_cache(tables, cfg, ids_freq, device, raw.open_tables if raw else None)
    elif current().distributed:
        raise ValueError(f"--sparse {cfg.sparse} is a single-process baseline; under torchrun use --sparse cached")
    elif cfg.sparse in ("device", "host"):
        sparse, sparse_opt = whole_tables(tables, cfg, device, arch)
    else:
        raise ValueError(f"sparse must be one of {SPARSE_MODES}, got {cfg.sparse!r}")
    model = dlrm(arch, sparse, meta, cfg, device)
    if isinstance(sparse, ShardedEmbeddingBagCollection) and current().distributed and cfg.overlap_exchange:
        overlap_pooled_exchange(model, sparse)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch.")]
    dense_opt = torch.optim.Adagrad(dense_params, lr=cfg.dense_lr)
    model.dense_arch = data_parallel(model.dense_arch, device)
    model.over_arch = data_parallel(model.over_arch, device)
    if cfg.compile:
        compile_dense(model)
    return model, sparse, dense_opt, sparse_opt


def compile_dense(model: nn.Module) -> list[str]:
    """Put the dense parts of a DLRM (`DENSE_PARTS`: bottom MLP, interaction, top MLP) under
    `torch.compile`, in place (`nn.Module.compile`: parameter names and state dicts
    unchanged; inside a DDP wrapper the wrapped module). The sparse part stays eager: the
    cache's bookkeeping runs on the host. Returns the names compiled."""
    names = [name for name in DENSE_PARTS if isinstance(getattr(model, name, None), nn.Module)]
    for name in names:
        unwrap(getattr(model, name)).compile()
    return names


def dense_modules(model: nn.Module) -> list[nn.Module]:
    """The dense parts of a DLRM (`DENSE_PARTS` it has), outside any DDP wrapper: what
    `--precision bf16` autocasts (`embcache.train.precision.autocast_modules`)."""
    return [unwrap(getattr(model, name)) for name in DENSE_PARTS if isinstance(getattr(model, name, None), nn.Module)]


def dense_state(model: nn.Module) -> dict:
    """The dense part's parameters under their single-process names (no DDP wrappers)."""
    return {f"{name}.{k}": v for name, child in model.named_children() if name != "sparse_arch"
            for k, v in unwrap(child).state_dict().items()}


def load_dense_state(model: nn.Module, state: dict) -> None:
    for name, child in model.named_children():
        if name != "sparse_arch":
            part = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
            unwrap(child).load_state_dict(part)
