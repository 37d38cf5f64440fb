"""DLRM training over the embedding cache: the system's main job.

torchrec's DLRM (dense arch, interaction, over arch) takes a `CachedEmbeddingBagCollection`
as its sparse part. The dense part is trained by a torch optimizer; the sparse rows are
updated by the cache's row-wise optimizer during `loss.backward()`. While batch t trains,
the ids of batch t+1 are handed to `prefetch`, so that on CUDA their rows are copied in on
a side stream.

For comparison (`--sparse`): `device` keeps whole torchrec tables on the device and
`host` keeps them in host memory, both trained with the torch optimizer that matches the
cache's (same arithmetic), so the three runs are directly comparable.

The loop, checkpoints and resume are the run skeleton's (`embcache.train.run`). A
checkpoint holds the full tables, optimizer states, cache residency and statistics, and
the position in the data, so a resumed run equals one never stopped.
"""
from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.models.dlrm import DLRM

from embcache.cache.optimizers import TORCH_EQUIVALENTS, torch_equivalent
from embcache.data.loader import CTRBatches, lookahead
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.train.dlrm_eval import binary_metrics
from embcache.train.run import StepRunConfig, Trainer

logger = logging.getLogger(__name__)
SPARSE_MODES = ("cached", "device", "host")
# torchrec's DLRM trips a torch.fx deprecation warning on every run; it is not ours to fix.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


@dataclass
class DLRMConfig(StepRunConfig):
    """Everything a run depends on; stored in every checkpoint. The run settings (device,
    seed, epochs, max_steps, checkpoints, resume, metrics, progress) are `StepRunConfig`'s."""

    data: str = "synthetic"
    sparse: str = "cached"
    cache_ratio: float = 0.015
    eviction: str = "freq"
    warmup_ratio: float = 0.7
    sparse_optimizer: str = "adagrad"
    sparse_lr: float = 0.05
    dense_lr: float = 0.05
    embedding_dim: int = 16
    dense_arch: list[int] = field(default_factory=lambda: [64])
    over_arch: list[int] = field(default_factory=lambda: [64, 32])
    batch_size: int = 2048
    eval_batch_size: int = 8192
    prefetch: bool = True


# Settings a resumed run must share with its checkpoint: they change the arithmetic.
# The cache's own settings (ratio, eviction, warm-up, prefetch) change only which rows
# are resident, never a result, so a resume may change them: the cache then starts cold.
RESUME_MUST_MATCH = ("sparse", "sparse_optimizer", "sparse_lr", "dense_lr", "embedding_dim",
                     "dense_arch", "over_arch", "batch_size", "seed")
CACHE_SETTINGS = ("cache_ratio", "eviction", "warmup_ratio")


def data_fingerprint(meta: dict) -> dict:
    """What identifies a prepared dataset for a resume: its features, their
    cardinalities and the rows of each split (not its path: a moved copy is the same)."""
    return {"num_dense": meta["num_dense"],
            "sparse": [(f["name"], f["cardinality"]) for f in meta["sparse"]],
            "rows": {name: split.get("rows") for name, split in sorted(meta.get("splits", {}).items())}}


def _init_table(weight: torch.Tensor, seed: int, num_rows: int) -> None:
    """torchrec's default init (uniform +-sqrt(1/N)) from a generator of the table's own,
    so every sparse mode starts from the same table whatever else consumed randomness."""
    bound = math.sqrt(1.0 / num_rows)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.copy_(torch.rand(weight.shape, generator=gen) * (2 * bound) - bound)


def table_configs(meta: dict, cfg: DLRMConfig) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(name=f"t_{f['name']}", embedding_dim=cfg.embedding_dim,
                               num_embeddings=f["cardinality"], feature_names=[f["name"]],
                               init_fn=partial(_init_table, seed=cfg.seed * 1000 + i,
                                               num_rows=f["cardinality"]))
            for i, f in enumerate(meta["sparse"])]


class HostTables(nn.Module):
    """Whole tables in host memory, outputs moved to the device: the `host` baseline."""

    def __init__(self, ebc: EmbeddingBagCollection, device: torch.device):
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


def build_model(meta: dict, cfg: DLRMConfig, ids_freq: dict | None):
    """DLRM with the chosen sparse part; returns (model, sparse part, dense optimizer,
    torch sparse optimizer or None)."""
    device = cfg.resolved_device()
    tables = table_configs(meta, cfg)
    sparse_opt = None
    if cfg.sparse == "cached":
        sparse = CachedEmbeddingBagCollection(
            tables, cache_ratio=cfg.cache_ratio, ids_freq=ids_freq, device=device,
            eviction=cfg.eviction, warmup_ratio=cfg.warmup_ratio,
            optimizer=cfg.sparse_optimizer, lr=cfg.sparse_lr)
    elif cfg.sparse in ("device", "host"):
        if cfg.sparse_optimizer not in TORCH_EQUIVALENTS:
            raise ValueError(f"--sparse {cfg.sparse} supports optimizers "
                             f"{sorted(TORCH_EQUIVALENTS)}, not {cfg.sparse_optimizer!r}")
        where = device if cfg.sparse == "device" else torch.device("cpu")
        ebc = EmbeddingBagCollection(tables, device=where)
        for bag in ebc.embedding_bags.values():
            bag.sparse = True
        sparse_opt = torch_equivalent(cfg.sparse_optimizer, ebc.parameters(), cfg.sparse_lr)
        sparse = ebc if cfg.sparse == "device" else HostTables(ebc, device)
    else:
        raise ValueError(f"sparse must be one of {SPARSE_MODES}, got {cfg.sparse!r}")
    torch.manual_seed(cfg.seed)
    model = DLRM(embedding_bag_collection=sparse, dense_in_features=meta["num_dense"],
                 dense_arch_layer_sizes=[*cfg.dense_arch, cfg.embedding_dim],
                 over_arch_layer_sizes=[*cfg.over_arch, 1], dense_device=device)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch.")]
    dense_opt = torch.optim.Adagrad(dense_params, lr=cfg.dense_lr)
    return model, sparse, dense_opt, sparse_opt


class DLRMTrainer(Trainer):
    """Runs `DLRMConfig` on a prepared dataset directory (canonical CTR format).

    Example:
        >>> from embcache.data.synthetic import generate_synthetic
        >>> data = getfixture("tmp_path") / "syn"
        >>> meta = generate_synthetic(data, rows=2000, scale=0.0005)
        >>> cfg = DLRMConfig(batch_size=256, embedding_dim=4, dense_arch=[8], over_arch=[8],
        ...                  max_steps=3, device="cpu", progress=False)
        >>> DLRMTrainer(cfg, data).fit()["steps"]
        3
    """

    kind = "dlrm"
    must_match = RESUME_MUST_MATCH

    def __init__(self, cfg: DLRMConfig, data_dir: str | Path):
        from embcache.data.ctr_format import load_id_frequencies, read_meta

        super().__init__(cfg, cfg.resolved_device())
        self.data_dir = Path(data_dir)
        self.meta = read_meta(self.data_dir)
        freq = load_id_frequencies(self.data_dir) if cfg.sparse == "cached" else None
        self.model, self.sparse, self.dense_opt, self.sparse_opt = build_model(self.meta, cfg, freq)
        self.loss_fn = nn.BCEWithLogitsLoss()

    # ------------------------------------------------------------------ checkpoints
    def data_fingerprint(self) -> dict:
        return data_fingerprint(self.meta)

    def data_mismatch(self, saved_config: dict, saved: dict, now: dict) -> str:
        return (f"data (checkpoint trained on {saved_config.get('data')!r}, this run reads {str(self.data_dir)!r}: "
                f"other features, cardinalities or rows)")

    def trainer_state(self) -> dict:
        return {"data_dir": str(self.data_dir.resolve()), "model": self.model.state_dict(),
                "dense_optimizer": self.dense_opt.state_dict(),
                "sparse_optimizer": self.sparse_opt.state_dict() if self.sparse_opt else None}

    def load_trainer_state(self, ck: dict, path: Path) -> None:
        saved = ck["config"]
        self.model.load_state_dict(ck["model"])
        self.dense_opt.load_state_dict(ck["dense_optimizer"])
        if self.sparse_opt is not None:
            self.sparse_opt.load_state_dict(ck["sparse_optimizer"])
        changed = [f"{k} {saved.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in CACHE_SETTINGS
                   if self.cfg.sparse == "cached" and saved.get(k) != getattr(self.cfg, k)]
        if changed:
            logger.info(f"cache settings changed ({', '.join(changed)}): the cache starts cold; "
                        f"parameters continue exactly")

    # ------------------------------------------------------------------ training
    def _batches(self, split: str, batch_size: int, start: int = 0):
        return CTRBatches(self.data_dir, split, batch_size, shuffle_shards=split == "train",
                          seed=self.cfg.seed + self.epoch, device=self.device, start_batch=start)

    def train_step(self, batch, next_batch=None) -> float:
        self.model.train()
        logits = self.model(batch.dense, batch.sparse).squeeze(-1)
        if next_batch is not None and self.cfg.prefetch and self.cfg.sparse == "cached":
            self.sparse.prefetch(next_batch.sparse)  # copies overlap this step's backward
        loss = self.loss_fn(logits, batch.labels)
        self.dense_opt.zero_grad()
        if self.sparse_opt is not None:
            self.sparse_opt.zero_grad()
        loss.backward()  # the cached rows are updated here
        self.dense_opt.step()
        if self.sparse_opt is not None:
            self.sparse_opt.step()
        return loss.item()

    def train_epoch(self) -> dict | None:
        batches = self._batches("train", self.cfg.batch_size, start=self.step_in_epoch)
        self.begin_epoch(len(batches) + self.step_in_epoch)
        for batch, nxt in lookahead(batches):
            if self.should_stop():
                return None
            self.after_step(self.train_step(batch, nxt), batch.labels.numel())
        return {}

    def evaluate_epoch(self) -> dict:
        return {"split": "val", **self.evaluate("val")}

    def format_epoch(self, record: dict) -> str:
        return f"epoch {record['epoch']}: val AUC {record['auc']:.4f}  log loss {record['logloss']:.4f}"

    @torch.no_grad()
    def evaluate(self, split: str = "val") -> dict:
        """AUC and log loss on a split. Its lookups go through the cache but are counted
        apart (as `cache_hit_rate` of the result): the run's hit rate and bytes moved
        are training's."""
        self.model.eval()
        logits, labels = [], []
        cached = self.cfg.sparse == "cached"
        with self.sparse.separate_stats() if cached else nullcontext() as eval_stats:
            for batch in self._batches(split, self.cfg.eval_batch_size):
                logits.append(self.model(batch.dense, batch.sparse).squeeze(-1).cpu())
                labels.append(batch.labels.cpu())
        if not logits:
            return {"auc": float("nan"), "logloss": float("nan"), "samples": 0}
        result = binary_metrics(torch.cat(logits), torch.cat(labels))
        if cached:
            result["cache_hit_rate"] = eval_stats()["hit_rate"]
        return result

    # ------------------------------------------------------------------ reporting
    def _cache_fields(self) -> dict:
        if self.cfg.sparse != "cached":
            return {}
        s = self.sparse.cache_stats()
        return {"hit_rate": s["hit_rate"], "bytes_h2d": s["bytes_h2d"], "bytes_d2h": s["bytes_d2h"],
                "overflow_rows": s["overflow_rows"]}

    def step_log_fields(self) -> dict:
        return self._cache_fields()

    def progress_fields(self) -> dict:
        if self.cfg.sparse != "cached":
            return {}
        return {"hit": f"{self.sparse.cache_stats()['hit_rate']:.3f}"}

    def summary_fields(self) -> dict:
        last = self.history[-1] if self.history else {}
        out = {"val_auc": last.get("auc"), "val_logloss": last.get("logloss"), "sparse": self.cfg.sparse,
               **self._cache_fields()}
        if self.cfg.sparse == "cached":
            out["cache_rows"] = self.sparse.cache_rows()
            out["table_rows"] = sum(t.num_embeddings for t in self.sparse.embedding_bag_configs())
        return out
