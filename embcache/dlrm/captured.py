"""`dlrm train --cuda-graphs`: the training step captured once as a CUDA graph and replayed
(`train.step_graph`) where the run allows, else the step as it is, with one line saying why.

What a graph holds: the forward over a batch rebuilt from static tensors (dense features,
labels, the ids and their lengths, with the per-feature split the data fixes: one id a sample
for every feature of one-hot data, each feature's capacity for multi-hot data, so the
collection reads no count from the device), the loss, the backward with the cache's row
update in it, the dense optimizer's step and, with `prefetch_depth` >= 1, the next batch's
prefetch (below). What it does not: a batch of another shape (the epoch's last, shorter
batch runs eagerly, counted); torchrun runs (their exchanges); whole tables in host memory
(`--sparse host`); the host bookkeeper; row updates that read the step count on the host
(`step_graph.choose_graphs` says which).

Whole tables on the device (`--sparse device`): torch's sparse optimizer cannot be captured
(its `coalesce` sizes the gradient by the batch's distinct ids), so a run that captures its
step trains the same tables inside their backward (`nn.in_backward`), as torch's optimizer
would; the checkpoint keeps torch's form, so an eager run resumes it and it resumes an eager
run's.

The next batch's prefetch, in the graph: the step takes the next batch's ids as inputs
beside its own dense features and labels, and after its forward prefetches them (on the
caches' side stream, overlapping the backward), as `train_step` does one batch ahead. The
batch's own ids come with its ticket, which the step before made: a replay cannot hand a
Python object on, so the ticket's tensors live at fixed addresses (`nn.ticket_home`) that
each step reads and then rewrites with its own prefetch. The trainer's prefetch pipeline
holds that ticket for the next batch, so a step run eagerly takes it as any step takes its
ticket. A batch with no ticket from the graph (an epoch's first; the one after a batch the
graph cannot hold, whose prefetch the pipeline made) runs eagerly and prefetches the next
one into the fixed tensors: the graph takes over from there. One batch ahead at most.

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
from contextlib import nullcontext
from typing import Callable

import torch

from embcache.device import to_device_async
from embcache.dlrm.model import resolve_arch
from embcache.nn.fixed_capacity import choose_capacity, feature_counts, pad_features
from embcache.nn.in_backward import InBackwardOptimizer, train_in_backward
from embcache.nn.ticket_home import TicketHome
from embcache.nn.whole_table import WholeTableBag
from embcache.sparse_types import KeyedJaggedTensorLite
from embcache.train.step_graph import (CapturedStep, GraphChoice, choose_graphs, pending_prefetches,
                                       restore_prefetches, row_caches)

logger = logging.getLogger(__name__)

SAMPLE_BATCHES = 8  # multi-hot: the eager batches whose ids set each feature's capacity
CAPACITY_MARGIN = 1.25  # capacity = the most ids a feature had in them, times this
CAPACITY_ROUND = 64  # ... rounded up to a multiple of this


def is_multi_hot(meta: dict) -> bool:
    return any(f.get("multi_hot", False) for f in meta.get("sparse", []))


def graph_choice(trainer, setting: str) -> GraphChoice:
    """Whether `trainer`'s step is captured under `setting` ("auto" | "on" | "off"), and why not."""
    if setting == "off" or torch.device(trainer.device).type != "cuda":  # "not on CUDA" before any advice
        return choose_graphs(setting, trainer.device)
    if trainer.world.distributed:
        return GraphChoice(False, "torchrun: the ranks' exchanges are not captured")
    sparse = getattr(trainer.cfg, "sparse", "cached")
    if sparse == "host":
        return GraphChoice(False, "--sparse host pools its rows on the host: use --sparse device or cached")
    if is_multi_hot(trainer.meta) and resolve_arch(trainer.cfg.arch) == "torchrec":
        return GraphChoice(False, "a padded multi-hot batch needs the plain-torch DLRM (torchrec's SparseArch sizes "
                                  "its output by the batch): use --arch torch")
    return choose_graphs(setting, trainer.device, trainer.model)


class HostCounters:
    """The numbers a step keeps on the host, which a replay leaves where its capture put
    them: each device-bookkept cache's step count, eviction clock and batch count, and the
    dense optimizer's step counts held on the CPU (torch's Adagrad). `read` them around a
    step that runs its Python; `add` what one step added after each replay, so a captured
    run's checkpoint counts as an eager one's; add back the difference after a failed capture.
    Whole tables trained in their backward (`nn.in_backward`) count their steps too."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.caches = list({id(c): c for c in row_caches(model) if hasattr(c, "host_counts")}.values())
        self.model, self.optimizer = model, optimizer

    @property
    def bags(self) -> list[WholeTableBag]:
        """Whole tables trained in their backward, looked up at each use (they take a torch
        bag's place when the step is first captured)."""
        return [m for m in self.model.modules() if isinstance(m, WholeTableBag)]

    @property
    def steps(self) -> list[dict]:
        """The optimizer's per-parameter states counting on the CPU, looked up at each use
        (a resume's `load_state_dict` gives it new ones)."""
        return [st for st in self.optimizer.state.values()
                if torch.is_tensor(st.get("step")) and st["step"].device.type == "cpu"]

    def read(self) -> list[float]:
        return ([n for c in self.caches for n in c.host_counts()] + [float(b.step) for b in self.bags]
                + [float(st["step"]) for st in self.steps])

    def add(self, deltas: list[float]) -> None:
        for i, cache in enumerate(self.caches):
            cache.advance_host_counts(*(int(d) for d in deltas[3 * i: 3 * i + 3]))
        bags, rest = self.bags, deltas[3 * len(self.caches):]
        for bag, d in zip(bags, rest):
            bag.advance_steps(int(d))
        for st, d in zip(self.steps, rest[len(bags):]):
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
        self.home, self._ticket = TicketHome(trainer.device), None  # `_ticket`: the next batch's, re-homed
        self.ahead, self.step = False, None
        if self.choice.capture:
            self.capture_with(lambda step_fn: CapturedStep(step_fn, trainer.device, warmup=3))
        self.shape, self.layout, self.eager_batches, self._said_shape = None, None, 0, False
        self.counters, self.per_step = HostCounters(trainer.model, trainer.dense_opt), None
        self.multi_hot = is_multi_hot(trainer.meta)
        self.capacities: list[int] | None = None  # ids a padded batch holds per feature (multi-hot)
        self._sampled: list[list[int]] = []  # the ids per feature of the batches that set them
        self.over_capacity = 0  # multi-hot batches run eagerly for having more ids

    def capture_with(self, make_step: Callable[[Callable], object]) -> None:
        """Capture the step as `make_step(step_fn)` makes it (`CapturedStep`; a test's
        stand-in on the CPU). With prefetching the graph prefetches the next batch too.
        Whole tables move into their backward (module docstring)."""
        self.choice = GraphChoice(True)
        t = self.trainer
        if t.cfg.sparse == "device" and not isinstance(t.sparse_opt, InBackwardOptimizer):
            t.sparse_opt = train_in_backward(t.sparse, t.sparse_opt, t.cfg.kernels)
            self.say("cuda graphs: the whole tables train inside their backward, as torch's sparse optimizer "
                     "trains them (its checkpoint form kept)")
        self.ahead = self.trainer.prefetches.depth > 0
        self.step = make_step(self._step_ahead if self.ahead else self._step)

    @property
    def active(self) -> bool:
        return self.step is not None

    @property
    def depth(self) -> int:
        """Batches the run looks ahead while captured: one where the graph prefetches."""
        return 1 if self.ahead else 0

    def describe(self) -> str:
        """What the run did, for its summary: "on", or "off: <why>"."""
        if self.active:
            n = self.eager_batches
            notes = [f"{n} batch{'' if n == 1 else 'es'} eager"] if n else []
            if self.capacities is not None:
                notes.append(f"multi-hot padded to {sum(self.capacities):,} ids after {len(self._sampled)} eager "
                             f"batches, {self.over_capacity} over it eager")
            elif self._sampled:  # too short a run to set them: nothing was captured
                notes.append(f"multi-hot: all {len(self._sampled)} batches eager, fewer than the {SAMPLE_BATCHES} "
                             f"that set the padded capacities")
            return "on" + (f" ({'; '.join(notes)})" if notes else "")
        return f"off: {self.choice.reason}" if self.choice.reason else "off"

    def __call__(self, batch, upcoming=()) -> torch.Tensor:
        if self.step is None:  # its capture failed earlier in the epoch: eager from there on
            return self.trainer.train_step(batch, upcoming)
        if self.ahead:
            return self._with_prefetch(batch, upcoming)
        ids = self._graph_ids(batch.sparse, batch.dense)
        loss = None if ids is None else self._run(batch.dense, batch.labels, *ids)
        if loss is None:  # a batch the graph cannot hold (or whose capture failed): eager
            if self.shape is not None:
                self.eager_batches += 1
            return self.trainer.train_step(batch, ())
        return loss

    def _run(self, *inputs) -> torch.Tensor | None:
        """The captured step on `inputs`: a warm-up, the capture or a replay (after which
        the host's counts move as the step's Python would have moved them). None where the
        capture failed: said, the host's side set back, and the run eager from here."""
        if self.step.captured:  # a replay: the host's side of the step did not run
            loss = self.step(*inputs)
            self.counters.add(self.per_step)
            return loss
        before, pending = self.counters.read(), self._pending()
        try:
            loss = self.step(*inputs)
        except RuntimeError as err:
            self.counters.add(HostCounters.difference(before, self.counters.read()))  # as before the capture
            self._restore_pending(pending)
            self.say(f"{err}; the run goes on eagerly")
            self.step, self.choice = None, GraphChoice(False, "the capture failed")
            return None
        self.per_step = HostCounters.difference(self.counters.read(), before)
        return loss

    def _pending(self):
        """The caches' pending prefetches and the graph's ticket, as a failed capture finds
        them (its Python took the one and made another, which CUDA never ran)."""
        return pending_prefetches(self.counters.caches), self._ticket

    def _restore_pending(self, pending) -> None:
        queues, self._ticket = pending
        restore_prefetches(self.counters.caches, queues)

    # ------------------------------------------------------------------ with the prefetch
    def _with_prefetch(self, batch, upcoming) -> torch.Tensor:
        """One batch where the graph prefetches the next (module docstring): replayed when
        this batch's ticket is the graph's and the next batch fits the graph, else eager."""
        t = self.trainer
        ticket = t.prefetches.take(batch)
        following = next(iter(upcoming), None)
        ahead = None if following is None else self._graph_ids(following.sparse, following.dense)
        loss = None
        if ahead is not None and ticket is not None and ticket is self._ticket:
            loss = self._run(batch.dense, batch.labels, *ahead)
            if loss is None:  # the capture failed: this batch eager, its ticket the graph's
                ahead = None
        if loss is None:
            if self.shape is not None:
                self.eager_batches += 1
            ids_ahead = lambda: t.prefetches.ahead(upcoming)  # noqa: E731 (the pipeline's prefetch)
            if ahead is not None:  # into the home, as the graph would: on the device, as its inputs are
                ids_ahead = tuple(to_device_async(x, t.device) for x in ahead)
            features = ticket.features if ticket is not None and ticket is self._ticket else batch.sparse
            loss = self._step_of(batch.dense, batch.labels, features, ticket, ids_ahead)
        if ahead is not None:
            t.prefetches.hand(following, self._ticket)
        return loss

    def _graph_ids(self, kjt, dense):
        """The ids and lengths of a batch as the graph takes them (multi-hot: padded), or
        None where it cannot (its capacities not yet set, over them, another shape: the
        epoch's last batch, as a graph replays one shape)."""
        values, lengths = kjt.values(), kjt.lengths()
        if self.multi_hot:
            padded = self._padded(kjt)
            if padded is None:
                return None
            values, lengths = padded
        shape = (tuple(dense.shape), tuple(values.shape), kjt.stride())
        if self.shape is None:
            self.shape, self.layout = shape, (type(kjt), kjt.keys(), kjt.stride())
        if shape != self.shape:
            self._another_shape(kjt)
            return None
        return values, lengths

    def _another_shape(self, kjt) -> None:
        if not self._said_shape:
            self._said_shape = True
            self.say(f"cuda graphs: a batch of another shape ({kjt.stride()} samples, the graph's "
                     f"{self.shape[2]}) runs eagerly")

    def _step_ahead(self, dense: torch.Tensor, labels: torch.Tensor, values: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
        """The step a graph holds with the prefetch: this batch from its re-homed ticket,
        the next one's ids (`values`, `lengths`) prefetched."""
        return self._step_of(dense, labels, self._ticket.features, self._ticket, (values, lengths))

    def _step_of(self, dense, labels, features, ticket, ahead) -> torch.Tensor:
        """`DLRMTrainer.train_step` as a function of tensors: the forward of `features`
        taking `ticket`; then `ahead`, the next batch prefetched: its (ids, lengths), whose
        ticket is re-homed as the graph's, or a function that prefetches otherwise (the
        trainer's pipeline); the loss, the backward (the cached rows updated) and the dense
        optimizer's step."""
        t = self.trainer
        t.model.train()
        with t.sparse.taking(ticket) if ticket is not None else nullcontext():
            logits = t.model(dense, features).squeeze(-1)
        made = t.sparse.prefetch(self.batch_of(*ahead)) if isinstance(ahead, tuple) else ahead()
        loss = t.loss_fn(logits, labels)
        t.dense_opt.zero_grad()
        loss.backward()  # the cached rows are updated here
        t.dense_opt.step()
        if isinstance(ahead, tuple):
            for cache in self.counters.caches:
                cache.wait_for_prefetches()
            self._ticket = self.home.rehome(made)
        return loss.detach()

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
                self.say("cuda graphs: a batch the padding cannot hold (more ids than a feature's capacity, or a "
                         "feature with none) runs eagerly "
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
