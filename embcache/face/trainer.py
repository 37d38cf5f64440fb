"""Face classification training: a probe net with one of three heads.

- `dcp` (F2C): a gallery net (exponential moving average of the probe's parameters, no
  gradient) writes the features of each step's identity pairs into a `DynamicClassPool`;
  each half of a pair serves once as probe (its target is the other half's gallery feature,
  its negatives the pool) and once as gallery. The pool is updated once per step, before the
  loss. Instance-loader probes whose identity is in the pool are scored against its slot;
  those whose identity is not are pushed away from the pool (mean of top-k cosines).
- `fc`: full softmax over one weight row per class; `pfc`: Partial FC. Same batches, same
  backbone, same optimizer for the backbone.

The loop, checkpoints and resume are the run skeleton's (`embcache.train.run`). A checkpoint
holds the nets, the head (with the pool's slots and LRU keys), the optimizer and the
position in the data; the data order is a function of (seed, epoch, step), so a resumed run
is bit-identical to an uninterrupted one on CPU.

Under torchrun (docs/scaling.md) every rank takes its slice of the same global batch: the
probe net is under DDP with summed gradients (each rank's loss is its samples' share of the
global batch's mean) and its batch norms use the global batch's statistics, so N ranks train
what one process trains (`--batch-norm local`: each rank's slice alone, as arcface_torch
trains, without the batch norms' all-reduces). dcp: the gallery net is the same on every
rank, and the gallery features and labels of the whole global batch are gathered (one
all-gather, in rank order, which is the one-process batch order, that brings every rank's
batch counts too) so that every rank's pool and LRU table stay identical. Each step's loss stays a tensor until the skeleton reads it
(every `log_every` steps: one all-reduce), evaluation embeds each rank's share of the
held-out samples, and the samples a rank finds unreadable are told to the others at that
step (every rank's list of skipped samples is the whole run's). fc / pfc: the class
centres are sharded by class (`embcache.face.class_sharded`). The checkpoint is one
file in the one-process format whatever the world size. A dcp run's summary says what a
rank's steps sent, by collective (`comm_bytes_per_step`, counted by `CollectiveMeter`;
`bench scaling` sets a model of it beside).
"""
from __future__ import annotations

import copy
import logging
import math
import sys
from pathlib import Path

import torch

from embcache.face.data.loaders import PairBatch, PairBatches
from embcache.face.data.verification import load_val_sets
from embcache.distributed.data_parallel import data_parallel
from embcache.distributed.global_norm import average_running_stats, forward_apart, global_batch_norm
from embcache.distributed.world import broadcast_object, gather_objects
from embcache.nn.backbones import build_backbone
from embcache.face.evaluation import (embed_shared, format_epoch, heldout_pairs, identification, pair_hints,
                                      score_val_sets, unresolved_notes, verification)
from embcache.settings_fields import option_names
from embcache.face.config import MUST_MATCH, FaceConfig  # noqa: F401 (their home before)
from embcache.face.head_factory import build_head, pool_slots
from embcache.train import precision
from embcache.train.run import Trainer

logger = logging.getLogger(__name__)


def build_source(cfg: FaceConfig):
    """The training data named by `cfg.data`."""
    from embcache.errors import DataFormatError

    if cfg.data == "synthetic":
        from embcache.face.data.synthetic import SyntheticFaces

        return SyntheticFaces(cfg.num_classes, cfg.synthetic_samples, cfg.synthetic_dim, cfg.synthetic_id_dim,
                              cfg.synthetic_noise, image_size=cfg.image_size, num_eval_classes=cfg.eval_classes,
                              seed=cfg.seed)
    path = Path(cfg.data)
    size = cfg.image_size or 112
    if (path / "train.rec").is_file():
        from embcache.face.data.recordio import RecordIOFaces

        return RecordIOFaces(path / "train.rec", path / "train.idx", size, cfg.num_classes or None, cfg.progress)
    if path.is_dir():
        from embcache.face.data.folder import ImageFolderFaces

        source = ImageFolderFaces(path, size, holdout=cfg.holdout, seed=cfg.seed)
        if cfg.num_classes and source.num_classes > cfg.num_classes:
            raise DataFormatError(f"{path}: {source.num_classes:,} identities, more than --num-classes "
                                  f"{cfg.num_classes:,}")
        return source
    raise DataFormatError(f"{path}: not 'synthetic', an image folder, or a directory with train.rec/train.idx")


class FaceTrainer(Trainer):
    """Trains `cfg.head` on `source` (built from the config when not given).

    Example:
        >>> cfg = FaceConfig(num_classes=40, batch_size=16, epochs=1, eval_pairs=100, eval_classes=20,
        ...                  device="cpu", progress=False)
        >>> summary = FaceTrainer(cfg).fit()
        >>> summary["steps"], summary["pool"]["slots"]
        (10, 4)
    """

    kind = "face"
    must_match = MUST_MATCH
    only_raised = ("epochs",)
    setting_names = option_names(FaceConfig, MUST_MATCH + only_raised)

    def __init__(self, cfg: FaceConfig, source=None):
        super().__init__(cfg, cfg.resolved_device())
        self._far_noted: set[str] = set()  # the verification sets said to be too small for a FAR
        torch.manual_seed(cfg.seed)
        self.source = source if source is not None else build_source(cfg)
        self.num_classes = self.source.num_classes if cfg.data != "synthetic" else cfg.num_classes
        if cfg.data != "synthetic" and cfg.num_classes and cfg.num_classes > self.num_classes:
            self.num_classes = cfg.num_classes
        if self.num_classes < 2:  # one class: every softmax is 1, nothing to learn
            where = "--num-classes" if cfg.data == "synthetic" else f"{cfg.data}: the data has"
            raise ValueError(f"{where} {self.num_classes} {'class' if self.num_classes == 1 else 'classes'}: "
                             f"a classifier needs at least 2")
        # checked now, not at the first evaluation: a bad file would cost the epoch before it
        self.val_sets = load_val_sets(cfg.val, self.source.sample_shape, cfg.image_size or 112)
        self.batches = PairBatches(self.source, cfg.batch_size, cfg.seed)
        backbone = cfg.backbone
        if backbone == "auto":
            backbone = "mlp" if len(self.source.sample_shape) == 1 else "iresnet18"
        self.backbone_name = backbone
        self.probe = build_backbone(backbone, cfg.feat_dim, self.source.sample_shape).to(self.device)
        self.global_norm = self.world.distributed and cfg.batch_norm == "global"
        if self.global_norm:
            self.probe = global_batch_norm(self.probe)
        # a pool smaller than one step's identities cannot hold them: raised to fit, with a note
        step_ids = self.batches.identity.pairs
        self.pool_raised_from = pool_slots(cfg.pool_ratio, self.num_classes) if cfg.head == "dcp" else None
        if self.pool_raised_from is not None and self.pool_raised_from >= step_ids:
            self.pool_raised_from = None
        self.head = build_head(cfg.head, self.num_classes, cfg.feat_dim, pool_ratio=cfg.pool_ratio, min_pool=step_ids,
                               sample_rate=cfg.sample_rate, margin_type=cfg.margin_type, margin=cfg.margin,
                               scale=cfg.scale, topk=cfg.topk, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, seed=cfg.seed, device=self.device, world=self.world)
        self.gallery = None
        if cfg.head == "dcp":
            if self.batches.identity.pairs < 2:  # the gallery net's batch norm needs two samples
                why = ("only one identity has two samples" if self.batches.identity.count < 2
                       else f"--batch-size {cfg.batch_size}: a quarter of it are pairs; 8 or more gives two")
                raise ValueError(f"the dcp head needs two identity pairs a step, and {why} (or use --head fc)")
            self.gallery = copy.deepcopy(self.probe).requires_grad_(False)
        self.precision = precision.resolve(cfg.precision, self.device)  # bf16: the nets autocast, the head float32
        precision.autocast_modules([n for n in (self.probe, self.gallery) if n is not None], self.precision,
                                   self.device)
        # the probe itself on one process; at 2 ranks its gradients are summed by one all-gather
        self.model = data_parallel(self.probe, self.device, gather_sum=self.world.size == 2)
        # foreach: the same arithmetic as the loop over parameters, in fewer calls
        self.optimizer = torch.optim.SGD(list(self.probe.parameters()) + list(self.head.parameters()), lr=cfg.lr,
                                         momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=True)
        self.total_steps = cfg.epochs * self.batches.steps_per_epoch
        self.dropped = 0
        self.eval_data = None
        self._counts = None  # per step, under several ranks: [size, 4] (pairs, instances, dropped, newly unreadable)
        self._samples, self._fresh = 0, []  # the step's global batch size; samples found unreadable at it
        # under several ranks a step's loss is this rank's share, a tensor summed over the ranks when the
        # skeleton reads it (every log_every steps, one all-reduce) rather than an all-reduce a step
        self.pipelined = self.world.distributed
        # dcp: the bytes its steps' collectives send (the summary's comm_bytes_per_step)
        self.comm = CollectiveMeter(self.world.size) if cfg.head == "dcp" else None

    # -- one step ------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Cosine decay from `lr` to zero over the run."""
        return self.cfg.lr * 0.5 * (1.0 + math.cos(math.pi * step / max(1, self.total_steps)))

    def train_step(self, batch: PairBatch) -> float | torch.Tensor:
        """One optimizer step on this rank's part of the global batch; returns the global
        batch's mean loss (the same on every rank), or under several ranks, where the head's
        loss is this rank's share of it, that share as a tensor (the skeleton sums them)."""
        dev = self.device
        a, b, c = batch.a.to(dev), batch.b.to(dev), batch.c.to(dev)
        y, z = batch.pair_labels.to(dev), batch.instance_labels.to(dev)
        labels = torch.cat([y, y, z])
        own = self._own_counts(batch)
        if not self.world.distributed:
            self._take_counts(own, None)
        elif self.cfg.head != "dcp":  # dcp: the counts come with its gallery features' all-gather
            from embcache.distributed.gathers import gather_counts

            self._take_counts(own, gather_counts(own, self.world))
        if self.cfg.head == "dcp":
            loss = self._dcp_loss(a, b, c, y, labels, own)
        else:
            kw = {} if self._counts is None else {"counts": (2 * self._counts[:, 0] + self._counts[:, 1]).tolist()}
            loss = self.head.loss(self.model(torch.cat([a, b, c])), labels, **kw)
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.head.after_backward(lr)
        if self.gallery is not None:
            self._update_gallery()
        if self._counts is None or getattr(self.head, "global_loss", False):
            return float(loss.detach())
        return loss.detach()

    def _dcp_loss(self, a, b, c, y, labels, own: list[int]) -> torch.Tensor:
        """Pool update from the gallery features of the whole global batch (gathered in rank
        order: the one-process order, with every rank's counts `own`), then the loss of this
        rank's probes (their share of the global batch's mean)."""
        dev = self.device
        with torch.no_grad():
            # each view is a batch of its own; with global batch norm both go through the net at
            # once, one all-reduce a batch norm for the two
            ga, gb = forward_apart(self.gallery, [a, b])
        total = None
        if not self.world.distributed:
            self.head.update_pool(torch.cat([y, y]), torch.cat([ga, gb]))
            feats = self.model(torch.cat([a, b, c]))
        else:
            from embcache.distributed.gathers import gather_rows_and_counts

            # one all-gather: float64 holds the float32 features, the labels (< 2**53) and the counts
            # exactly; the probe's forward, which needs nothing from the pool, runs while it travels
            d, width = ga.shape[1], -(-self.batches.identity.pairs // self.world.size)
            gathered = gather_rows_and_counts(torch.cat([ga.double(), gb.double(), y[:, None].double()], 1),
                                              own, width, async_op=True)
            feats = self.model(torch.cat([a, b, c]))
            rows, counts = gathered()
            self._take_counts(own, counts)
            y_all = rows[:, 2 * d].long()
            ga_all, gb_all = rows[:, :d].to(ga.dtype), rows[:, d:2 * d].to(gb.dtype)
            self.head.update_pool(torch.cat([y_all, y_all]), torch.cat([ga_all, gb_all]))
            total = int(2 * self._counts[:, 0].sum() + self._counts[:, 1].sum())
        positives = torch.cat([gb, ga, torch.zeros(c.shape[0], ga.shape[1], device=dev)])
        has_positive = torch.arange(labels.numel(), device=dev) < 2 * y.numel()
        return self.head.loss(feats, labels, positives, has_positive, batch_total=total)

    @torch.no_grad()
    def _update_gallery(self) -> None:
        """The gallery's parameters move towards the probe's (`gallery_momentum`); its
        buffers (batch-norm statistics) are the probe's."""
        m = self.cfg.gallery_momentum
        gallery = list(self.gallery.parameters())
        torch._foreach_mul_(gallery, m)
        torch._foreach_add_(gallery, [p.detach() for p in self.probe.parameters()], alpha=1.0 - m)
        torch._foreach_copy_(list(self.gallery.buffers()), list(self.probe.buffers()))

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Verification (and, on synthetic data, identification) on held-out identities.
        Collective under several ranks: each rank embeds its share of the samples, rank 0
        scores them, every rank returns the scores."""
        out, scores = {}, self.world.is_main
        if self.cfg.data == "synthetic":
            if self.eval_data is None:
                self.eval_data = (self.source.verification_pairs(self.cfg.eval_pairs), self.source.identification_set())
            (a, b, same), (g, gl, p, pl) = self.eval_data
            ea, eb, eg, ep = self._embed(a), self._embed(b), self._embed(g), self._embed(p)
            if scores:
                out["synthetic"] = verification(ea, eb, same)
                out["synthetic"].update(identification(eg, gl, ep, pl))
        if getattr(self.source, "heldout_paths", None):
            out.update(self._evaluate_heldout(scores))
        out.update(score_val_sets(self.val_sets, self._embed, scores))
        return broadcast_object(out if scores else None)

    def _evaluate_heldout(self, scores: bool) -> dict:
        """An image folder's held-out identities: verification on their genuine pairs and as
        many impostor pairs, identification of each identity's later images against its
        first."""
        if not isinstance(self.eval_data, dict):
            self.eval_data = {}
        if "heldout" not in self.eval_data:
            images, labels, _ = self.source.heldout_set()
            self.eval_data["heldout"] = images, labels, heldout_pairs(labels, self.cfg.eval_pairs, self.cfg.seed)
        images, labels, (ia, ib, same) = self.eval_data["heldout"]
        emb = self._embed(images, flip=True)
        if not scores:
            return {}
        # 10-fold verification needs pairs in every fold; with fewer, identification alone is scored
        out = verification(emb[ia], emb[ib], same) if len(same) >= 20 else {"pairs": len(same)}
        first = torch.ones_like(labels, dtype=torch.bool)
        first[1:] = labels[1:] != labels[:-1]
        if (~first).any():
            out.update(identification(emb[first], labels[first], emb[~first], labels[~first]))
        return {"heldout": out} if out else {}

    def _embed(self, samples: torch.Tensor, flip: bool = False) -> torch.Tensor:
        return embed_shared(self.probe, samples, self.world, self.device, flip, self.cfg.feat_dim)

    def evaluate_epoch(self) -> dict:
        """`evaluate` (collective), after per-rank batch norm's running statistics are made
        the same on every rank, so that every rank's history, and so the checkpoint, is the
        same. A verification set with too few impostor pairs for a FAR it reports is named
        once a run (`unresolved_notes`)."""
        self._share_running_stats()
        scores = self.evaluate()
        if self.world.is_main:
            for line in unresolved_notes(scores, self._far_noted, pair_hints(self.source, self.cfg.eval_pairs, scores)):
                logger.warning(line)
        return scores

    def _share_running_stats(self) -> None:
        """Per-rank batch norm under several ranks: every rank's running statistics replaced
        by their mean over the ranks (collective; the gallery net takes them too, as it
        does after every step). Global batch norm keeps them equal by itself."""
        if self.world.distributed and not self.global_norm:
            average_running_stats(self.probe)
            if self.gallery is not None:
                with torch.no_grad():
                    for g, p in zip(self.gallery.buffers(), self.probe.buffers()):
                        g.copy_(p)

    def format_epoch(self, record: dict) -> str:
        return format_epoch(record)

    # -- checkpoints ---------------------------------------------------------------------
    def trainer_state(self) -> dict:
        """The one-process checkpoint whatever the world size (collective: a class-sharded
        head's tables and their momentum are gathered to rank 0, per-rank batch norm's
        running statistics averaged)."""
        self._share_running_stats()
        return {"probe": self.probe.state_dict(),
                # what rebuilding the probe needs, so that a checkpoint embeds with no data around
                "probe_spec": {"backbone": self.backbone_name, "feat_dim": self.cfg.feat_dim,
                               "sample_shape": list(self.source.sample_shape)},
                "gallery": self.gallery.state_dict() if self.gallery is not None else None,
                "head": self._head_state(), "optimizer": self._optimizer_state(), "dropped": self.dropped,
                "bad_samples": self.source.bad.to_json() if hasattr(self.source, "bad") else {},
                "unreadable_samples": sorted(getattr(self.source, "unreadable", ())),
                "num_slots": self.head.pool.num_slots if self.cfg.head == "dcp" else None,
                # so that `face evaluate` knows without the data whether it must read it (RecordIO: none)
                "heldout_identities": (None if self.cfg.data == "synthetic"
                                       else len(getattr(self.source, "heldout_paths", None) or ())),
                **precision.record(self.precision)}

    def state(self) -> dict:
        """The checkpoint's parts beyond the run's position (for comparing two runs)."""
        return {"history": self.history, **self.trainer_state()}

    def state_mismatches(self, ck: dict) -> list[str]:
        out = precision.resume_mismatch(ck.get("precision"), self.precision) if self.cfg.resume else []
        if self.cfg.head == "dcp" and ck.get("num_slots") not in (None, self.head.pool.num_slots):
            out.append(f"pool slots {ck['num_slots']} in the checkpoint, {self.head.pool.num_slots} now")
        return out

    def fit(self) -> dict:
        with precision.precision_scope(self.precision, self.device):  # CUDA's TF32 switches, put back after
            return super().fit()

    def load_trainer_state(self, ck: dict, path: Path) -> None:
        self.probe.load_state_dict(ck["probe"])
        if self.gallery is not None:
            self.gallery.load_state_dict(ck["gallery"])
        if self._sharded_head:
            self.head.load_gathered_state_dict(ck["head"])
        else:
            self.head.load_state_dict(ck["head"])
        self.optimizer.load_state_dict(self._optimizer_shard(ck["optimizer"]))
        self.dropped = ck["dropped"]
        if hasattr(self.source, "bad"):  # so that the skipped list agrees with the skipped count
            self.source.bad.load_json(ck.get("bad_samples", {}))
            self.source.unreadable = set(ck.get("unreadable_samples", ()))

    @property
    def _sharded_head(self) -> bool:
        return hasattr(self.head, "gathered_state_dict")

    def _head_state(self) -> dict | None:
        return self.head.gathered_state_dict() if self._sharded_head else self.head.state_dict()

    def _head_param_indices(self) -> list[int]:
        """Positions of the head's parameters in the optimizer's state dict (after the probe's)."""
        n = len(list(self.probe.parameters()))
        return list(range(n, n + len(list(self.head.parameters()))))

    def _optimizer_state(self) -> dict:
        """The optimizer's state dict with the momentum of a sharded head's table gathered
        whole (on rank 0), as one process would hold it."""
        state = self.optimizer.state_dict()
        if not self._sharded_head:
            return state
        from embcache.distributed.gathers import gather_shards_to_main

        for i in self._head_param_indices():
            if torch.is_tensor(state["state"].get(i, {}).get("momentum_buffer")):
                entry = dict(state["state"][i])
                entry["momentum_buffer"] = gather_shards_to_main(entry["momentum_buffer"], self.num_classes,
                                                                 self.world)
                state["state"] = {**state["state"], i: entry}
        return state

    def _optimizer_shard(self, state: dict) -> dict:
        """A one-process optimizer state dict cut to this rank's rows of a sharded head."""
        if not self._sharded_head:
            return state
        entries = dict(state["state"])
        for i in self._head_param_indices():
            if i in entries and torch.is_tensor(entries[i].get("momentum_buffer")):
                entries[i] = {**entries[i], "momentum_buffer": self.head.shard_rows(entries[i]["momentum_buffer"])}
        return {**state, "state": entries}

    # -- the loop ------------------------------------------------------------------------
    def train_epoch(self) -> dict | None:
        n = self.batches.steps_per_epoch
        self.begin_epoch(n)
        while self.step_in_epoch < n:
            if self.should_stop():
                return None
            batch = self.batches.get(self.epoch, self.step_in_epoch, (self.world.rank, self.world.size))
            if self.comm is None:
                loss = self.train_step(batch)
            else:
                with self.comm:
                    loss = self.train_step(batch)
            self.after_step(loss, self._samples)
        return {}

    def _own_counts(self, batch: PairBatch) -> list[int]:
        """This rank's (pairs, instances, dropped, newly unreadable) of the step; the samples
        the source found unreadable since the last step are kept for `_take_counts`."""
        self._fresh = self.source.take_fresh_unreadable() if hasattr(self.source, "take_fresh_unreadable") else []
        return [batch.a.shape[0], batch.c.shape[0], batch.dropped, len(self._fresh)]

    def _take_counts(self, own: list[int], counts: torch.Tensor | None) -> None:
        """Account for the global batch from every rank's `_own_counts` (`counts`, [size, 4]
        in rank order; None on one process): its samples (`_samples`), its unreadable ones
        added to `dropped`. Under several ranks `_counts` keeps them (the step gathers rows
        and divides by the global batch size with them), and the samples a rank found
        unreadable at this step are sent to the others, so that every rank's list of
        skipped samples (reported, checkpointed) is the run's, as one process's would be."""
        if counts is None:
            self.dropped += own[2]
            self._samples = 2 * own[0] + own[1]
            return
        self._counts = counts
        self.dropped += int(counts[:, 2].sum())
        self._samples = int(2 * counts[:, 0].sum() + counts[:, 1].sum())
        if int(counts[:, 3].sum()):  # rare: an object all-gather only at such a step
            for rank, entries in enumerate(gather_objects(self._fresh)):
                if rank != self.world.rank:
                    self.source.add_unreadable(entries)

    def step_log_fields(self) -> dict:
        return {"lr": self.lr_at(self.step)}

    def progress_fields(self) -> dict:
        post = {"lr": f"{self.lr_at(self.step):.3g}"}
        if self.cfg.head == "dcp":
            post["pool"] = f"{self.head.pool.num_resident()}/{self.head.pool.num_slots}"
        return post

    def summary_fields(self) -> dict:
        out = {"head": self.cfg.head, "backbone": self.backbone_name, "num_classes": self.num_classes,
               "precision": self.precision,
               "head_state_bytes": head_state_bytes(self.head, self.optimizer), "skipped_samples": self.dropped,
               "final": self.history[-1] if self.history else None}
        if self.cfg.head == "dcp":
            out["pool"] = {"slots": self.head.pool.num_slots, **self.head.pool.stats}
            out["comm_bytes_per_step"] = self.comm.per_step()
        return out


# the collectives of a dcp training step, by (collective, the function that calls it)
COMM_KINDS = {("all_gather", "gather_rows_and_counts"): "gallery_allgather",  # features, labels, counts
              ("all_reduce", "_AllReduce.forward"): "batch_norm_allreduce",  # GlobalBatchNorm's, forward and backward
              ("all_gather", "_gather_sum_hook"): "ddp_gradients",  # DDP's sum at 2 ranks
              ("all_reduce", "_sum_hook"): "ddp_gradients"}  # DDP's sum beyond


class CollectiveMeter:
    """Bytes this rank sends in the collectives of the steps run inside `with meter:`, by
    kind (`COMM_KINDS`; a collective from any other caller under its own name): every
    tensor handed to `torch.distributed.all_gather` or `all_reduce` meanwhile, as a rank
    sends it at world size N: an all-gather's tensor to each of the N - 1 others, an
    all-reduce's 2(N - 1)/N times its bytes (a ring's reduce-scatter and all-gather). At 2
    ranks both are the tensor's bytes. One process: nothing is counted."""

    def __init__(self, size: int):
        self.size, self.steps, self._saved = size, 0, None
        self.sent = dict.fromkeys(sorted(set(COMM_KINDS.values())), 0.0)

    def __enter__(self) -> "CollectiveMeter":
        if self.size > 1:
            import torch.distributed as dist

            self._saved = {name: getattr(dist, name) for name in ("all_gather", "all_reduce")}
            for name, fn in self._saved.items():
                setattr(dist, name, self._counted(name, fn))
        return self

    def __exit__(self, kind, value, tb) -> None:
        if self._saved is not None:
            import torch.distributed as dist

            for name, fn in self._saved.items():
                setattr(dist, name, fn)
            self._saved = None
        self.steps += kind is None

    def _counted(self, name: str, collective):
        times = self.size - 1 if name == "all_gather" else 2 * (self.size - 1) / self.size
        position = 1 if name == "all_gather" else 0  # all_gather(tensor_list, tensor), all_reduce(tensor)

        def counted(*args, **kw):
            tensor = kw["tensor"] if "tensor" in kw else args[position]
            caller = sys._getframe(1).f_code.co_qualname
            kind = COMM_KINDS.get((name, caller), f"{name} by {caller}")
            self.sent[kind] = self.sent.get(kind, 0.0) + times * tensor.numel() * tensor.element_size()
            return collective(*args, **kw)

        return counted

    def per_step(self) -> dict:
        """This rank's bytes a step, by kind (every rank sends the same in a dcp step)."""
        return {k: v / max(self.steps, 1) for k, v in self.sent.items()}


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

