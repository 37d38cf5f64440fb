"""Face classification training: a probe net with one of three heads.

- `dcp` (F2C): a gallery net (exponential moving average of the probe's parameters, no
  gradient) writes the features of each step's identity pairs into a `DynamicClassPool`;
  each half of a pair serves once as probe (its target is the other half's gallery feature,
  its negatives the pool) and once as gallery. The pool is updated once per step, before the
  loss. Instance-loader probes whose identity is in the pool are scored against its slot;
  those whose identity is not are pushed away from the pool (mean of top-k cosines).
- `fc`: full softmax over one weight row per class; `pfc`: Partial FC. Same batches, same
  backbone, same optimizer for the backbone.

Checkpoints (atomic, one file) hold the nets, the head (with the pool's slots and LRU keys),
the optimizer and the position in the data; the data order is a function of (seed, epoch,
step), so a resumed run is bit-identical to an uninterrupted one on CPU.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from embcache.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from embcache.data.face.loaders import PairBatch, PairBatches
from embcache.device import resolve_device
from embcache.nn.backbones import build_backbone
from embcache.nn.heads import build_head
from embcache.train.diverged import check_loss
from embcache.train.face_eval import embed, identification_top1, verification
from embcache.train.metrics import MetricsLog, peak_memory

CHECKPOINT_NAME = "face-last.pt"
# settings a resumed run must share with its checkpoint: all that shape the data, the nets, the
# loss or the optimizer (epochs may be raised: see `resume_mismatches`)
_MUST_MATCH = ("data", "head", "num_classes", "pool_ratio", "sample_rate", "backbone", "feat_dim", "batch_size",
               "seed", "margin_type", "margin", "scale", "topk", "gallery_momentum", "lr", "momentum",
               "weight_decay", "image_size", "synthetic_dim", "synthetic_id_dim", "synthetic_samples",
               "synthetic_noise")


@dataclass
class FaceConfig:
    data: str = "synthetic"             # "synthetic", an image folder, or a directory with train.rec/train.idx
    head: str = "dcp"                   # dcp | fc | pfc
    num_classes: int = 2000             # synthetic: training identities; real data: checked against the labels
    pool_ratio: float = 0.1             # dcp: Q = ceil(pool_ratio * num_classes)
    sample_rate: float = 0.1            # pfc: fraction of class centres per step
    backbone: str = "auto"              # auto (mlp for vectors, iresnet18 for images) | mlp | cnn | iresnet18 | iresnet50
    feat_dim: int = 128
    margin_type: str = "arcface"        # arcface | cosface
    margin: float = 0.3
    scale: float = 32.0
    topk: int = 5                       # dcp: out-of-pool loss over the top-k cosines
    gallery_momentum: float = 0.99      # dcp: EMA momentum of the gallery net
    epochs: int = 10
    batch_size: int = 128               # images per step: a quarter pairs (x2 views), half instances
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    device: str | None = None
    max_steps: int | None = None        # stop after this many steps in all (a checkpoint is written there)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 200
    resume: bool = False
    metrics_out: str | None = None
    progress: bool = True
    eval_pairs: int = 6000              # synthetic verification pairs
    eval_classes: int = 500             # synthetic held-out identities
    val: list = field(default_factory=list)  # verification .bin files for real data
    image_size: int = 0                 # synthetic: 0 = vectors, else S x S images; real data: crop size (112)
    synthetic_dim: int = 64
    synthetic_id_dim: int = 16
    synthetic_samples: int = 8
    synthetic_noise: float = 0.7


def build_source(cfg: FaceConfig):
    """The training data named by `cfg.data`."""
    from embcache.errors import DataFormatError

    if cfg.data == "synthetic":
        from embcache.data.face.synthetic import SyntheticFaces

        return SyntheticFaces(cfg.num_classes, cfg.synthetic_samples, cfg.synthetic_dim, cfg.synthetic_id_dim,
                              cfg.synthetic_noise, image_size=cfg.image_size, num_eval_classes=cfg.eval_classes,
                              seed=cfg.seed)
    path = Path(cfg.data)
    size = cfg.image_size or 112
    if (path / "train.rec").is_file():
        from embcache.data.face.recordio import RecordIOFaces

        return RecordIOFaces(path / "train.rec", path / "train.idx", size, cfg.num_classes or None, cfg.progress)
    if path.is_dir():
        from embcache.data.face.folder import ImageFolderFaces

        source = ImageFolderFaces(path, size)
        if cfg.num_classes and source.num_classes > cfg.num_classes:
            raise DataFormatError(f"{path}: {source.num_classes:,} identities, more than --num-classes "
                                  f"{cfg.num_classes:,}")
        return source
    raise DataFormatError(f"{path}: not 'synthetic', an image folder, or a directory with train.rec/train.idx")


def resume_mismatches(saved: dict, cfg: FaceConfig) -> list[str]:
    """What stops `cfg` from resuming a checkpoint written with config `saved`, one phrase
    per setting with both values. More epochs are allowed (a run can be extended); fewer
    are not, since the checkpoint may already be past the new end."""
    out = []
    for k in _MUST_MATCH:
        was, now = saved.get(k), getattr(cfg, k)
        if k == "data" and was != now and "synthetic" not in (was, now) and None not in (was, now):
            if Path(was).resolve() == Path(now).resolve():  # the same directory, named another way
                continue
        if was != now:
            out.append(f"{k} {was!r} in the checkpoint, {now!r} now")
    if cfg.epochs < saved.get("epochs", 0):
        out.append(f"epochs {saved['epochs']!r} in the checkpoint, {cfg.epochs!r} now (epochs may only be raised)")
    return out


class FaceTrainer:
    """Trains `cfg.head` on `source` (built from the config when not given)."""

    def __init__(self, cfg: FaceConfig, source=None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.source = source if source is not None else build_source(cfg)
        self.num_classes = self.source.num_classes if cfg.data != "synthetic" else cfg.num_classes
        if cfg.data != "synthetic" and cfg.num_classes and cfg.num_classes > self.num_classes:
            self.num_classes = cfg.num_classes
        self.batches = PairBatches(self.source, cfg.batch_size, cfg.seed)
        backbone = cfg.backbone
        if backbone == "auto":
            backbone = "mlp" if len(self.source.sample_shape) == 1 else "iresnet18"
        self.backbone_name = backbone
        self.probe = build_backbone(backbone, cfg.feat_dim, self.source.sample_shape).to(self.device)
        self.head = build_head(cfg.head, self.num_classes, cfg.feat_dim, pool_ratio=cfg.pool_ratio,
                               sample_rate=cfg.sample_rate, margin_type=cfg.margin_type, margin=cfg.margin,
                               scale=cfg.scale, topk=cfg.topk, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, seed=cfg.seed, device=self.device)
        self.gallery = None
        if cfg.head == "dcp":
            if self.batches.identity.pairs > self.head.pool.num_slots:
                raise ValueError(f"the pool has {self.head.pool.num_slots} slots but a step brings "
                                 f"{self.batches.identity.pairs} identities; raise --pool-ratio or lower --batch-size")
            self.gallery = copy.deepcopy(self.probe).requires_grad_(False)
        self.optimizer = torch.optim.SGD(list(self.probe.parameters()) + list(self.head.parameters()), lr=cfg.lr,
                                         momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        self.total_steps = cfg.epochs * self.batches.steps_per_epoch
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.history: list[dict] = []
        self.dropped = 0
        self.log = MetricsLog(cfg.metrics_out)
        self.eval_data = None

    # -- one step ------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Cosine decay from `lr` to zero over the run."""
        return self.cfg.lr * 0.5 * (1.0 + math.cos(math.pi * step / max(1, self.total_steps)))

    def train_step(self, batch: PairBatch) -> float:
        dev = self.device
        a, b, c = batch.a.to(dev), batch.b.to(dev), batch.c.to(dev)
        y, z = batch.pair_labels.to(dev), batch.instance_labels.to(dev)
        labels = torch.cat([y, y, z])
        if self.cfg.head == "dcp":
            with torch.no_grad():
                ga, gb = self.gallery(a), self.gallery(b)
            self.head.update_pool(torch.cat([y, y]), torch.cat([ga, gb]))
            feats = self.probe(torch.cat([a, b, c]))
            positives = torch.cat([gb, ga, torch.zeros(c.shape[0], ga.shape[1], device=dev)])
            has_positive = torch.arange(labels.numel(), device=dev) < 2 * y.numel()
            loss = self.head.loss(feats, labels, positives, has_positive)
        else:
            loss = self.head.loss(self.probe(torch.cat([a, b, c])), labels)
        lr = self.lr_at(self.global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.head.after_backward(lr)
        if self.gallery is not None:
            self._update_gallery()
        return float(loss.detach())

    @torch.no_grad()
    def _update_gallery(self) -> None:
        m = self.cfg.gallery_momentum
        for g, p in zip(self.gallery.parameters(), self.probe.parameters()):
            g.mul_(m).add_(p.detach(), alpha=1.0 - m)
        for g, p in zip(self.gallery.buffers(), self.probe.buffers()):
            g.copy_(p)

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Verification (and, on synthetic data, identification) on held-out identities."""
        out = {}
        if self.cfg.data == "synthetic":
            if self.eval_data is None:
                self.eval_data = (self.source.verification_pairs(self.cfg.eval_pairs), self.source.identification_set())
            (a, b, same), (g, gl, p, pl) = self.eval_data
            ea, eb = embed(self.probe, a, device=self.device), embed(self.probe, b, device=self.device)
            out["synthetic"] = verification(ea, eb, same)
            out["synthetic"]["identification_top1"] = identification_top1(
                embed(self.probe, g, device=self.device), gl, embed(self.probe, p, device=self.device), pl)
        for path in self.cfg.val:
            from embcache.data.face.verification import load_verification_bin

            if self.eval_data is None:
                self.eval_data = {}
            if path not in self.eval_data:
                self.eval_data[path] = load_verification_bin(path, self.cfg.image_size or 112)
            a, b, same = self.eval_data[path]
            kw = dict(device=self.device, flip=True)
            out[Path(path).stem] = verification(embed(self.probe, a, **kw), embed(self.probe, b, **kw), same)
        return out

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict:
        return {"config": asdict(self.cfg), "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step, "probe": self.probe.state_dict(),
                "gallery": self.gallery.state_dict() if self.gallery is not None else None,
                "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                "history": self.history, "dropped": self.dropped,
                "bad_samples": self.source.bad.to_json() if hasattr(self.source, "bad") else {},
                "num_slots": self.head.pool.num_slots if self.cfg.head == "dcp" else None}

    def save(self) -> Path | None:
        if not self.cfg.checkpoint_dir:
            return None
        return save_checkpoint(self.state(), Path(self.cfg.checkpoint_dir) / CHECKPOINT_NAME, kind="face")

    def load(self, path) -> None:
        ck = load_checkpoint(path, kind="face")
        diff = resume_mismatches(ck["config"], self.cfg)
        if self.cfg.head == "dcp" and ck.get("num_slots") not in (None, self.head.pool.num_slots):
            diff.append(f"pool slots {ck['num_slots']} in the checkpoint, {self.head.pool.num_slots} now")
        if diff:
            raise CheckpointError(f"{path}: cannot resume with other settings: " + "; ".join(diff))
        self.probe.load_state_dict(ck["probe"])
        if self.gallery is not None:
            self.gallery.load_state_dict(ck["gallery"])
        self.head.load_state_dict(ck["head"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.epoch, self.step_in_epoch, self.global_step = ck["epoch"], ck["step_in_epoch"], ck["global_step"]
        self.history, self.dropped = ck["history"], ck["dropped"]
        if hasattr(self.source, "bad"):  # so that the skipped list agrees with the skipped count
            self.source.bad.load_json(ck.get("bad_samples", {}))

    # -- the loop ------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg = self.cfg
        if cfg.resume:
            if not cfg.checkpoint_dir:
                raise CheckpointError("--resume needs --checkpoint-dir")
            path = latest_checkpoint(cfg.checkpoint_dir, "face-*.pt")
            if path is None:
                raise CheckpointError(f"{cfg.checkpoint_dir}: no face checkpoint to resume from")
            self.load(path)
            if cfg.progress:
                print(f"resumed from {path} at epoch {self.epoch}, step {self.step_in_epoch}")
        from tqdm import tqdm

        start, steps_run, samples = time.perf_counter(), 0, 0
        stopped = False
        while self.epoch < cfg.epochs and not stopped:
            n = self.batches.steps_per_epoch
            bar = tqdm(total=n, initial=self.step_in_epoch, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                       disable=not cfg.progress, dynamic_ncols=True)
            while self.step_in_epoch < n:
                if cfg.max_steps is not None and self.global_step >= cfg.max_steps:
                    stopped = True
                    break
                batch = self.batches.get(self.epoch, self.step_in_epoch)
                self.dropped += batch.dropped
                loss = self.train_step(batch)
                check_loss(loss, f"step {self.global_step + 1}")
                self.step_in_epoch += 1
                self.global_step += 1
                steps_run += 1
                samples += 2 * batch.a.shape[0] + batch.c.shape[0]
                post = {"loss": f"{loss:.3f}", "lr": f"{self.lr_at(self.global_step):.3g}"}
                if cfg.head == "dcp":
                    post["pool"] = f"{self.head.pool.num_resident()}/{self.head.pool.num_slots}"
                bar.set_postfix(post, refresh=False)
                bar.update(1)
                if self.global_step % 50 == 0:
                    self.log.write(event="step", step=self.global_step, epoch=self.epoch, loss=loss,
                                   lr=self.lr_at(self.global_step))
                if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0:
                    self.save()
            bar.close()
            if stopped:
                break
            metrics = self.evaluate()
            record = {"epoch": self.epoch + 1, "step": self.global_step, **metrics}
            self.history.append(record)
            self.log.write(event="epoch", **record)
            if cfg.progress:
                print(format_epoch(record))
            self.epoch += 1
            self.step_in_epoch = 0
            self.save()
        if stopped:
            self.save()
        elapsed = time.perf_counter() - start
        if self.dropped:
            print(f"skipped {self.dropped:,} unreadable sample(s) in training batches:")
            self.source.bad.report()
        summary = {"head": cfg.head, "backbone": self.backbone_name, "num_classes": self.num_classes,
                   "steps": self.global_step, "epochs_done": self.epoch, "stopped_early": stopped,
                   "train_seconds": elapsed, "train_samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
                   "head_state_bytes": head_state_bytes(self.head, self.optimizer),
                   "skipped_samples": self.dropped, "device": str(self.device),
                   "final": self.history[-1] if self.history else None, **peak_memory(self.device)}
        if cfg.head == "dcp":
            summary["pool"] = {"slots": self.head.pool.num_slots, **self.head.pool.stats}
        self.log.write(event="summary", **summary)
        return summary


def head_state_bytes(head: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes the head keeps between steps: its parameters and buffers (the weight table, or
    the pool), the pool's table and LRU keys, and the optimizer state of its parameters."""
    total = sum(t.numel() * t.element_size() for t in list(head.parameters()) + list(head.buffers()))
    if hasattr(head, "pool"):
        pool = head.pool
        total += sum(t.numel() * t.element_size() for t in (pool.slots.slot_to_id, pool.slots._sorted_ids,
                                                             pool.slots._sorted_slots, pool.lru.slot_last,
                                                             pool.lru.slot_primary))
    if optimizer is not None:
        ids = {id(p) for p in head.parameters()}
        for p, st in optimizer.state.items():
            if id(p) in ids:
                total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return total


def format_epoch(record: dict) -> str:
    parts = [f"epoch {record['epoch']}"]
    for name, m in record.items():
        if isinstance(m, dict):
            s = f"{name}: acc {m['accuracy']:.4f}±{m['accuracy_std']:.4f}, TAR@FAR=1e-3 {m['tar@far=0.001']:.4f}"
            if "identification_top1" in m:
                s += f", top-1 {m['identification_top1']:.4f}"
            parts.append(s)
    return " | ".join(parts)
