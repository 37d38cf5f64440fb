"""A training step captured once as a CUDA graph and replayed for every batch, or run
eagerly where it cannot be, with one line saying why.

Why: launched from Python op by op, a step's time on a fast GPU is mostly launch overhead;
replayed from a graph, it is the kernels'. A graph replays fixed work on fixed tensors, so
the step it holds must never read a device value on the host and its shapes must not depend
on the data: the device bookkeeper (`bookkeeping="device"`) is written that way, multi-hot
batches are padded to a fixed capacity (`nn.fixed_capacity`), and batches already on the
device are checked there (`nn.input_errors`). The model does not know it is captured: the
trainer wraps its step function here (NVIDIA's DLRM keeps its capture in one such wrapper).

How: each batch is copied into static device tensors (`StagedInputs`: host batches through
pinned buffers, `copy_(non_blocking=True)`); the first `warmup` steps run eagerly on a side
stream (allocators and lazy state settle, as capture requires), the next is captured and
replayed, and every later one only replayed. Every call is one real training step, so a
captured run trains on the same batches as an eager one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

CUDA_GRAPHS = ("auto", "on", "off")


@dataclass(frozen=True)
class GraphChoice:
    """Whether the step is captured, and where not, why (one line)."""

    capture: bool
    reason: str = ""

    def line(self, setting: str) -> str:
        if self.capture:
            return "cuda graphs: the training step is captured and replayed"
        return f"cuda graphs {setting}: the step runs eagerly ({self.reason})"


def row_caches(model: nn.Module | None) -> list:
    """The row caches of `model`'s cached bags."""
    if model is None:
        return []
    return [m.cache for m in model.modules() if hasattr(m, "cache") and hasattr(m.cache, "bookkeeping")]


def pending_prefetches(caches: list) -> list[list]:
    """Each cache's pending prefetches, as a capture finds them: a capture that fails ran its
    Python (it took one prefetch and made another, which CUDA never ran), and
    `restore_prefetches` sets them back."""
    return [list(cache._prefetched) for cache in caches]


def restore_prefetches(caches: list, queues: list[list]) -> None:
    for cache, queue in zip(caches, queues):
        cache._prefetched.clear()
        cache._prefetched.extend(queue)


def bookkeepers(model: nn.Module | None) -> set[str]:
    """Where the caches of `model`'s cached bags keep their bookkeeping ("host" / "device")."""
    return {cache.bookkeeping for cache in row_caches(model)}


def step_count_readers(model: nn.Module | None) -> list[str]:
    """What in `model`'s row updates reads the optimizer's step count, which the cache
    keeps as a host number (`RowCache.step`): a replay would repeat the count it was
    captured with. Empty once nothing does (or the count moves to the device)."""
    found = set()
    for cache in row_caches(model):
        opt, rounding = cache.optimizer, getattr(cache, "rounding", None)
        if opt.name == "adam" and (cache.bookkeeping != "device" or opt.settled_step() is None):
            found.add("Adam's bias correction")  # the device bookkeeper's reads its own count (`Adam.step_size_of`)
        if getattr(opt, "lr_decay", 0.0):
            found.add("Adagrad's lr_decay")
        if rounding is not None and rounding.mode == "stochastic" and rounding.dtype != torch.float32 \
                and cache.bookkeeping != "device":  # the device bookkeeper's hash reads its own count
            found.add("stochastic rounding of half-precision rows")
        if getattr(cache.policy, "half_life", None):
            found.add("the eviction half-life's aging")
    return sorted(found)


def choose_graphs(setting: str, device: torch.device | str, model: nn.Module | None = None,
                  fixed_shapes: bool = True) -> GraphChoice:
    """`cuda_graphs` ("auto" | "on" | "off") for a step on `device` over `model`: captured
    where it can be (CUDA, every cache bookkept on the device, shapes fixed, no row update
    reading the host's step count), else eager with the reason. "on" asks for capture as "auto" does; where the step cannot be
    captured both run eagerly and say why.

    Example:
        >>> choose_graphs("auto", "cpu")
        GraphChoice(capture=False, reason='not on CUDA')
    """
    if setting not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs must be one of {CUDA_GRAPHS}, got {setting!r}")
    if setting == "off":
        return GraphChoice(False, "turned off")
    if torch.device(device).type != "cuda":
        return GraphChoice(False, "not on CUDA")
    if "host" in bookkeepers(model):
        return GraphChoice(False, "host bookkeeper syncs: use bookkeeping='device'")
    if not fixed_shapes:
        return GraphChoice(False, "batch shapes vary: pad multi-hot batches to a fixed capacity")
    readers = step_count_readers(model)
    if readers:
        return GraphChoice(False, f"{', '.join(readers)} read the step count on the host")
    return GraphChoice(True)


class StagedInputs:
    """Static device tensors a captured step reads, filled batch by batch: device batches
    by a device copy, host batches through two pinned buffers taken in turn (a buffer is
    rewritten only once its previous copy has run, which is long done: one step ago)."""

    def __init__(self, examples: Sequence[torch.Tensor | None], device: torch.device):
        self.device = torch.device(device)
        self.static = [None if x is None else torch.empty_like(x, device=self.device) for x in examples]
        self._pinned = [[None if x is None else torch.empty_like(x, device="cpu").pin_memory()
                         for x in examples] for _ in range(2)]
        self._copied = [torch.cuda.Event(), torch.cuda.Event()]
        self._turn = 0

    def fill(self, batch: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Copy `batch` into the static tensors (same shapes and dtypes); returns them."""
        turn, self._turn = self._turn, 1 - self._turn
        self._copied[turn].synchronize()  # the copy from this buffer two fills ago
        for static, pinned, x in zip(self.static, self._pinned[turn], batch):
            if (static is None) != (x is None) or (x is not None and (x.shape, x.dtype) != (static.shape, static.dtype)):
                raise ValueError("a batch for a captured step must have the shapes and dtypes of the first")
            if x is None:
                continue
            if x.device.type == "cpu":
                pinned.copy_(x)
                x = pinned
            static.copy_(x, non_blocking=True)
        self._copied[turn].record()
        return self.static


class CapturedStep:
    """`step_fn(*inputs)` (one training step: forward, backward, optimizer steps; returns
    tensors such as the loss) captured as a CUDA graph and replayed per batch.

    Args:
        step_fn: the step, written as for an eager run, reading only its inputs and the
            model; it must not read device values on the host, nor change shapes.
        device: the CUDA device.
        warmup: eager steps on a side stream before the capture (at least 1).

    Example (on CUDA):
        step = CapturedStep(lambda ids, offsets, labels: train_step(ids, offsets, labels), "cuda")
        for batch in batches:
            loss = step(*batch)    # a copy of the static loss: safe to keep
    """

    def __init__(self, step_fn: Callable, device: torch.device | str = "cuda", warmup: int = 3):
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 (capture needs a settled step), got {warmup}")
        self.step_fn, self.device, self.warmup = step_fn, torch.device(device), int(warmup)
        self.staged: StagedInputs | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self._outputs = None
        self.steps = 0

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *batch):
        if self.staged is None:
            self.staged = StagedInputs(batch, self.device)
        inputs = self.staged.fill(batch)
        self.steps += 1
        if self.steps <= self.warmup:
            outputs = self._on_side_stream(inputs)
        else:
            if self.graph is None:
                self._capture(inputs)
            self.graph.replay()
            outputs = self._outputs
        return _copies(outputs)

    def _on_side_stream(self, inputs):
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            outputs = self.step_fn(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        return outputs

    def _capture(self, inputs) -> None:
        """Record the step. A capture that fails (an operation CUDA cannot record) ends the
        run with one line naming CUDA's reason and the way round it: its batch was not
        trained (the capture runs nothing), and the host's side of the step may have moved."""
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the loader's reader threads pin host memory meanwhile, which the
            # default ("global") mode counts against this capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._outputs = self.step_fn(*inputs)
        except RuntimeError as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise RuntimeError(f"cuda graphs: the training step could not be captured ({reason}); "
                               "run it eagerly with cuda_graphs='off' (--cuda-graphs off)") from e
        self.graph = graph


def _copies(outputs):
    """The step's outputs as tensors of their own (a replay rewrites the static ones)."""
    if torch.is_tensor(outputs):
        return outputs.detach().clone()
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(_copies(o) for o in outputs)
    return outputs


def make_step(step_fn: Callable, setting: str, device: torch.device | str, model: nn.Module | None = None,
              fixed_shapes: bool = True, warmup: int = 3, say: Callable[[str], None] = print):
    """The step to call per batch: `CapturedStep(step_fn)` where `choose_graphs` captures,
    else `step_fn` itself; says the choice in one line. Returns (step, choice)."""
    choice = choose_graphs(setting, device, model, fixed_shapes)
    say(choice.line(setting))
    return (CapturedStep(step_fn, device, warmup) if choice.capture else step_fn), choice
