"""`dlrm train --cuda-graphs`: the training step captured once as a CUDA graph and replayed
(`train.step_graph`) where the run allows, else the step as it is, with one line saying why.

What a graph holds: the forward over a batch rebuilt from static tensors (dense features,
labels, the ids and their lengths, with the per-feature split the data fixes: one id a sample
for every feature of one-hot data, each feature's capacity for multi-hot data, so the
collection reads no count from the device), the loss, the backward with the cache's row
update in it, and the dense optimizer's step. What it
does not: prefetching (a captured cached step admits its own batch inside the graph); a
batch of another shape (the epoch's last, shorter batch runs eagerly, counted); torchrun
runs (their exchanges); whole tables trained by torch's sparse optimizer; the host
bookkeeper; row updates that read the step count on the host (`step_graph.choose_graphs`
says which).

Multi-hot data: the first `SAMPLE_BATCHES` batches run eagerly and set each feature's
capacity (its most ids in them, times `CAPACITY_MARGIN`; a feature with the same count in
every one, as a one-hot feature, keeps it); every later batch is padded to those capacities
(`nn.fixed_capacity.pad_features`: one extra sample a feature, dropped from the pooled
output), which trains as the unpadded batch. A batch over a capacity runs eagerly, counted
and said once. The padded batch is the project's own `KeyedJaggedTensorLite`, so it needs the
plain-torch DLRM (`--arch torch`): torchrec's SparseArch sizes its output by the batch.

A capture CUDA refuses is said in one line and the run goes on eagerly from the same batch
(the capture ran nothing; the counts its Python moved on the host are set back).

A replay runs none of the step's Python, so what the step counts on the host (the caches'
step counts, eviction clocks and batch counts; Adagrad's step counts) is added after each
replay (`HostCounters`): a captured run's checkpoint counts as an eager run's. The clock the
device bookkeeper stamps on the rows a batch uses is its own on the device, advanced inside
the graph (`DeviceRowCache._tick`), so a replayed step stamps, evicts and keeps the rows an
eager step would."""
from __future__ import annotations

import logging
from typing import Callable

import torch

from embcache.dlrm.model import resolve_arch
from embcache.nn.fixed_capacity import choose_capacity, feature_counts, pad_features
from embcache.sparse_types import KeyedJaggedTensorLite
from embcache.train.step_graph import CapturedStep, GraphChoice, choose_graphs, row_caches

logger = logging.getLogger(__name__)

SAMPLE_BATCHES = 8  # multi-hot: the eager batches whose ids set each feature's capacity
CAPACITY_MARGIN = 1.25  # capacity = the most ids a feature had in them, times this
CAPACITY_ROUND = 64  # ... rounded up to a multiple of this


def is_multi_hot(meta: dict) -> bool:
    return any(f.get("multi_hot", False) for f in meta.get("sparse", []))


def graph_choice(trainer, setting: str) -> GraphChoice:
    """Whether `trainer`'s step is captured under `setting` ("auto" | "on" | "off"), and why not."""
    if setting == "off":
        return choose_graphs("off", trainer.device)
    if trainer.world.distributed:
        return GraphChoice(False, "torchrun: the ranks' exchanges are not captured")
    if trainer.sparse_opt is not None:
        return GraphChoice(False, "torch's sparse optimizer is not capturable: use --sparse cached --bookkeeping device")
    if is_multi_hot(trainer.meta) and resolve_arch(trainer.cfg.arch) == "torchrec":
        return GraphChoice(False, "a padded multi-hot batch needs the plain-torch DLRM (torchrec's SparseArch sizes "
                                  "its output by the batch): use --arch torch")
    return choose_graphs(setting, trainer.device, trainer.model)


class HostCounters:
    """The numbers a step keeps on the host, which a replay leaves where its capture put
    them: each device-bookkept cache's step count, eviction clock and batch count, and the
    dense optimizer's step counts held on the CPU (torch's Adagrad). `read` them around a
    step that runs its Python; `add` what one step added after each replay, so a captured
    run's checkpoint counts as an eager one's; add back the difference after a failed capture."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.caches = list({id(c): c for c in row_caches(model) if hasattr(c, "host_counts")}.values())
        self.optimizer = optimizer

    @property
    def steps(self) -> list[dict]:
        """The optimizer's per-parameter states counting on the CPU, looked up at each use
        (a resume's `load_state_dict` gives it new ones)."""
        return [st for st in self.optimizer.state.values()
                if torch.is_tensor(st.get("step")) and st["step"].device.type == "cpu"]

    def read(self) -> list[float]:
        return [n for c in self.caches for n in c.host_counts()] + [float(st["step"]) for st in self.steps]

    def add(self, deltas: list[float]) -> None:
        for i, cache in enumerate(self.caches):
            cache.advance_host_counts(*(int(d) for d in deltas[3 * i: 3 * i + 3]))
        for st, d in zip(self.steps, deltas[3 * len(self.caches):]):
            st["step"] += d

    @staticmethod
    def difference(after: list[float], before: list[float]) -> list[float]:
        return [a - b for a, b in zip(after, before)]


class GraphedSteps:
    """The run's step function: captured where `graph_choice` allows (`active`), else None.

    Call it with a batch; returns the step's loss (a tensor of its own, on the device)."""

    def __init__(self, trainer, setting: str, say: Callable[[str], None]):
        self.trainer, self.say = trainer, say
        self.choice = graph_choice(trainer, setting)
        self.setting = setting
        if setting == "on" or trainer.device.type == "cuda":
            say(self.choice.line(setting))
        self.step = CapturedStep(self._step, trainer.device, warmup=3) if self.choice.capture else None
        self.shape, self.layout, self.eager_batches = None, None, 0
        self.counters, self.per_step = HostCounters(trainer.model, trainer.dense_opt), None
        self.multi_hot = is_multi_hot(trainer.meta)
        self.capacities: list[int] | None = None  # ids a padded batch holds per feature (multi-hot)
        self._sampled: list[list[int]] = []  # the ids per feature of the batches that set them
        self.over_capacity = 0  # multi-hot batches run eagerly for having more ids

    @property
    def active(self) -> bool:
        return self.step is not None

    def describe(self) -> str:
        """What the run did, for its summary: "on", or "off: <why>"."""
        if self.active:
            notes = [f"{self.eager_batches} batches of another shape eager"] if self.eager_batches else []
            if self.capacities is not None:
                notes.append(f"multi-hot padded to {sum(self.capacities):,} ids after {len(self._sampled)} eager "
                             f"batches, {self.over_capacity} over it eager")
            elif self._sampled:  # too short a run to set them: nothing was captured
                notes.append(f"multi-hot: all {len(self._sampled)} batches eager, fewer than the {SAMPLE_BATCHES} "
                             f"that set the padded capacities")
            return "on" + (f" ({'; '.join(notes)})" if notes else "")
        return f"off: {self.choice.reason}" if self.choice.reason else "off"

    def __call__(self, batch) -> torch.Tensor:
        if self.step is None:  # its capture failed earlier in the epoch: eager from there on
            return self.trainer.train_step(batch, ())
        kjt = batch.sparse
        values, lengths = kjt.values(), kjt.lengths()
        if self.multi_hot:
            padded = self._padded(kjt)
            if padded is None:  # a batch that sets the capacities, or one over them
                return self.trainer.train_step(batch, ())
            values, lengths = padded
        shape = (tuple(batch.dense.shape), tuple(values.shape), kjt.stride())
        if self.shape is None:
            self.shape, self.layout = shape, (type(kjt), kjt.keys(), kjt.stride())
        if shape != self.shape:  # the epoch's last batch: a graph replays one shape
            if not self.eager_batches:
                self.say(f"cuda graphs: a batch of another shape ({kjt.stride()} samples, the graph's "
                         f"{self.shape[2]}) runs eagerly")
            self.eager_batches += 1
            return self.trainer.train_step(batch, ())
        if self.step.captured:  # a replay: the host's side of the step did not run
            loss = self.step(batch.dense, batch.labels, values, lengths)
            self.counters.add(self.per_step)
            return loss
        before = self.counters.read()
        try:
            loss = self.step(batch.dense, batch.labels, values, lengths)
        except RuntimeError as err:
            self.counters.add(HostCounters.difference(before, self.counters.read()))  # as before the capture
            self.say(f"{err}; the run goes on eagerly")
            self.step, self.choice = None, GraphChoice(False, "the capture failed")
            return self.trainer.train_step(batch, ())
        self.per_step = HostCounters.difference(self.counters.read(), before)
        return loss

    def _padded(self, kjt):
        """`kjt`'s ids and lengths padded to the capacities (module docstring), or None where
        the batch runs eagerly: one of the first `SAMPLE_BATCHES`, which set them, or one over."""
        if self.capacities is None:
            self._sampled.append(feature_counts(kjt.lengths(), len(kjt.keys())))
            if len(self._sampled) < SAMPLE_BATCHES:
                return None
            self.capacities = [col[0] if len(set(col)) == 1 else
                               choose_capacity(col, quantile=1.0, margin=CAPACITY_MARGIN, round_to=CAPACITY_ROUND)
                               for col in zip(*self._sampled)]
            self.say(f"cuda graphs: multi-hot batches padded to {sum(self.capacities):,} ids (each feature's most in "
                     f"the first {SAMPLE_BATCHES} batches, which ran eagerly, x{CAPACITY_MARGIN})")
            return None
        padded = pad_features(kjt.values(), kjt.lengths(), self.capacities)
        if padded is None:
            self.over_capacity += 1
            if self.over_capacity == 1:
                self.say("cuda graphs: a batch with more ids than the padded capacity runs eagerly "
                         "(such batches are counted in the summary's cuda_graphs)")
        return padded

    def batch_of(self, values: torch.Tensor, lengths: torch.Tensor):
        """The sparse batch from static tensors, its per-feature split given (one id a
        sample; multi-hot: the capacities, with the one padding sample), so that the
        collection needs no count from the device."""
        cls, keys, stride = self.layout
        if self.capacities is not None:
            return KeyedJaggedTensorLite(keys, values, lengths=lengths, stride=stride + 1,
                                         length_per_key=self.capacities, padded_samples=1)
        return cls(keys=keys, values=values, lengths=lengths, stride=stride, length_per_key=[stride] * len(keys))

    def _step(self, dense: torch.Tensor, labels: torch.Tensor, values: torch.Tensor,
              lengths: torch.Tensor) -> torch.Tensor:
        """`DLRMTrainer.train_step` without its prefetches, as a function of tensors."""
        t = self.trainer
        t.model.train()
        logits = t.model(dense, self.batch_of(values, lengths)).squeeze(-1)
        loss = t.loss_fn(logits, labels)
        t.dense_opt.zero_grad()
        loss.backward()  # the cached rows are updated here
        t.dense_opt.step()
        return loss.detach()
