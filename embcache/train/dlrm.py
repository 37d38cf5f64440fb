"""DLRM training over the embedding cache: the system's main job.

torchrec's DLRM (dense arch, interaction, over arch) takes a `CachedEmbeddingBagCollection`
as its sparse part. The dense part is trained by a torch optimizer; the sparse rows are
updated by the cache's row-wise optimizer during `loss.backward()`. While batch t trains,
the ids of batch t+1 are handed to `prefetch`, so that on CUDA their rows are copied in on
a side stream.

For comparison (`--sparse`): `device` keeps whole torchrec tables on the device and
`host` keeps them in host memory, both trained with the torch optimizer that matches the
cache's (same arithmetic), so the three runs are directly comparable.

Checkpoints are written atomically every `checkpoint_every` steps and at the end of every
epoch; `resume` continues from the last one and gives the same result as a run never
stopped (the checkpoint holds the full tables, optimizer states, cache residency and
statistics, and the position in the data).
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.models.dlrm import DLRM

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.data.loader import CTRBatches, lookahead
from embcache.device import resolve_device
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.train.diverged import check_loss
from embcache.train.metrics import MetricsLog, binary_metrics, peak_memory

SPARSE_MODES = ("cached", "device", "host")
# torchrec's DLRM trips a torch.fx deprecation warning on every run; it is not ours to fix.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
TORCH_SPARSE_OPTIMIZERS = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
                           "adam": torch.optim.SparseAdam}


@dataclass
class DLRMConfig:
    """Everything a run depends on; stored in every checkpoint."""

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
    epochs: int = 1
    max_steps: int | None = None  # stop after this many steps in all (tests, smoke runs)
    device: str | None = None
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 200
    resume: bool = False
    metrics_out: str | None = None
    progress: bool = True
    prefetch: bool = True

    def resolved_device(self) -> torch.device:
        return resolve_device(self.device)


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
        if cfg.sparse_optimizer not in TORCH_SPARSE_OPTIMIZERS:
            raise ValueError(f"--sparse {cfg.sparse} supports optimizers "
                             f"{sorted(TORCH_SPARSE_OPTIMIZERS)}, not {cfg.sparse_optimizer!r}")
        where = device if cfg.sparse == "device" else torch.device("cpu")
        ebc = EmbeddingBagCollection(tables, device=where)
        for bag in ebc.embedding_bags.values():
            bag.sparse = True
        sparse_opt = TORCH_SPARSE_OPTIMIZERS[cfg.sparse_optimizer](ebc.parameters(), lr=cfg.sparse_lr)
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


class DLRMTrainer:
    """Runs `DLRMConfig` on a prepared dataset directory (canonical CTR format)."""

    def __init__(self, cfg: DLRMConfig, data_dir: str | Path):
        from embcache.data.ctr_format import load_id_frequencies, read_meta

        self.cfg, self.data_dir = cfg, Path(data_dir)
        self.meta = read_meta(self.data_dir)
        self.device = cfg.resolved_device()
        freq = load_id_frequencies(self.data_dir) if cfg.sparse == "cached" else None
        self.model, self.sparse, self.dense_opt, self.sparse_opt = build_model(self.meta, cfg, freq)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.log = MetricsLog(cfg.metrics_out)
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.history: list[dict] = []
        self.train_seconds, self.train_samples = 0.0, 0
        if cfg.resume:
            self._resume()

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return Path(self.cfg.checkpoint_dir) / "last.pt" if self.cfg.checkpoint_dir else None

    def save(self) -> Path | None:
        if self.checkpoint_path is None:
            return None
        payload = {"config": asdict(self.cfg), "data": data_fingerprint(self.meta),
                   "data_dir": str(self.data_dir.resolve()),
                   "model": self.model.state_dict(),
                   "dense_optimizer": self.dense_opt.state_dict(),
                   "sparse_optimizer": self.sparse_opt.state_dict() if self.sparse_opt else None,
                   "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
                   "history": self.history, "train_seconds": self.train_seconds,
                   "train_samples": self.train_samples, "rng": torch.get_rng_state()}
        return save_checkpoint(payload, self.checkpoint_path, kind="dlrm")

    def _resume(self) -> None:
        path = self.checkpoint_path
        if path is None:
            raise ValueError("--resume needs --checkpoint-dir")
        if not path.exists():
            print(f"no checkpoint at {path}; starting from scratch")
            return
        ckpt = self.restore(path)
        self.epoch, self.batch_in_epoch, self.step = ckpt["epoch"], ckpt["batch_in_epoch"], ckpt["step"]
        self.history = ckpt["history"]
        self.train_seconds, self.train_samples = ckpt["train_seconds"], ckpt["train_samples"]
        torch.set_rng_state(ckpt["rng"])
        print(f"resumed from {path}: epoch {self.epoch + 1}, batch {self.batch_in_epoch}, step {self.step}")

    def restore(self, path: Path) -> dict:
        """Load the model and optimizers of checkpoint `path` after checking that it was
        written with this run's arithmetic and data; returns the checkpoint."""
        ckpt = load_checkpoint(path, kind="dlrm")
        saved = ckpt["config"]
        differ = [f"{k}={saved.get(k)!r} (this run: {getattr(self.cfg, k)!r})"
                  for k in RESUME_MUST_MATCH if saved.get(k) != getattr(self.cfg, k)]
        if "data" in ckpt and ckpt["data"] != data_fingerprint(self.meta):
            differ.append(f"data (checkpoint trained on {saved.get('data')!r}, this run reads "
                          f"{str(self.data_dir)!r}: other features, cardinalities or rows)")
        if differ:
            raise ValueError(f"{path}: the checkpoint was written with other settings: "
                             f"{'; '.join(differ)}. Resume with the same settings, or start afresh "
                             f"in another --checkpoint-dir")
        changed = [f"{k} {saved.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in CACHE_SETTINGS
                   if self.cfg.sparse == "cached" and saved.get(k) != getattr(self.cfg, k)]
        try:
            self.model.load_state_dict(ckpt["model"])
            self.dense_opt.load_state_dict(ckpt["dense_optimizer"])
            if self.sparse_opt is not None:
                self.sparse_opt.load_state_dict(ckpt["sparse_optimizer"])
        except (RuntimeError, KeyError) as err:
            # torch's message is a heading ("Error(s) in loading state_dict ...:") over the details
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
            raise ValueError(f"{path}: the checkpoint does not fit this model: {' '.join(lines[:2])}") from None
        if changed:
            print(f"cache settings changed ({', '.join(changed)}): the cache starts cold; "
                  f"parameters continue exactly")
        return ckpt

    # ------------------------------------------------------------------ training
    def _batches(self, split: str, batch_size: int, start: int = 0):
        return CTRBatches(self.data_dir, split, batch_size, shuffle_shards=split == "train",
                          seed=self.cfg.seed + self.epoch, device=self.device, start_batch=start)

    def _done(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

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

    def fit(self) -> dict:
        from tqdm import tqdm

        cfg = self.cfg
        while self.epoch < cfg.epochs and not self._done():
            batches = self._batches("train", cfg.batch_size, start=self.batch_in_epoch)
            bar = tqdm(total=len(batches) + self.batch_in_epoch, initial=self.batch_in_epoch,
                       desc=f"epoch {self.epoch + 1}/{cfg.epochs}", unit="batch",
                       disable=not cfg.progress, dynamic_ncols=True)
            ema = None
            finished = True
            # a step's time runs from the end of the previous one: reading and collating
            # its batch count, checkpoints and evaluation do not
            t_last = time.perf_counter()
            for batch, nxt in lookahead(batches):
                if self._done():
                    finished = False
                    break
                loss = self.train_step(batch, nxt)
                check_loss(loss, f"step {self.step + 1}")
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                now = time.perf_counter()
                dt, t_last = now - t_last, now
                self.train_seconds += dt
                self.train_samples += batch.labels.numel()
                self.step += 1
                self.batch_in_epoch += 1
                ema = loss if ema is None else 0.95 * ema + 0.05 * loss
                postfix = {"loss": f"{ema:.4f}", "samples/s": f"{batch.labels.numel() / dt:,.0f}"}
                if cfg.sparse == "cached":
                    postfix["hit"] = f"{self.sparse.cache_stats()['hit_rate']:.3f}"
                bar.set_postfix(postfix)
                bar.update(1)
                if self.step % 50 == 0:
                    self.log.write(event="step", step=self.step, epoch=self.epoch + 1, loss=loss,
                                   loss_ema=ema, samples_per_s=batch.labels.numel() / dt,
                                   **self._cache_fields())
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save()
                    t_last = time.perf_counter()
            bar.close()
            if finished:  # the epoch ran to its end
                result = self.evaluate("val")
                self.history.append({"epoch": self.epoch + 1, **result})
                self.log.write(event="eval", split="val", epoch=self.epoch + 1, step=self.step, **result)
                print(f"epoch {self.epoch + 1}: val AUC {result['auc']:.4f}  log loss {result['logloss']:.4f}")
                self.epoch += 1
                self.batch_in_epoch = 0
            self.save()
        return self.summary()

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

    def _cache_fields(self) -> dict:
        if self.cfg.sparse != "cached":
            return {}
        s = self.sparse.cache_stats()
        return {"hit_rate": s["hit_rate"], "bytes_h2d": s["bytes_h2d"], "bytes_d2h": s["bytes_d2h"],
                "overflow_rows": s["overflow_rows"]}

    def summary(self) -> dict:
        last = self.history[-1] if self.history else {}
        out = {"steps": self.step, "epochs_done": self.epoch,
               "val_auc": last.get("auc"), "val_logloss": last.get("logloss"),
               "train_samples_per_s": self.train_samples / self.train_seconds if self.train_seconds else 0.0,
               "sparse": self.cfg.sparse, "device": str(self.device), **self._cache_fields(),
               **peak_memory(self.device)}
        if self.cfg.sparse == "cached":
            out["cache_rows"] = self.sparse.cache_rows()
            out["table_rows"] = sum(t.num_embeddings for t in self.sparse.embedding_bag_configs())
        self.log.write(event="summary", **out)
        return out
