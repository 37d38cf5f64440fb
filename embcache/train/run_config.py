"""The settings every trainer shares (`RunConfig`, and `StepRunConfig` for runs of steps),
apart from the run skeleton (`embcache.train.run`) so that the command line can show their
defaults without importing torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from embcache.distributed.settings import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    import torch

LOG_EVERY = 50  # default steps between two `step` records of the metrics log (`log_every`)


@dataclass
class RunConfig:
    """Settings every trainer shares: where it runs, its seed, how long, and how the run is
    kept (checkpoints, metrics) and shown (progress).

    Args:
        device: "cpu", "cuda" or "cuda:N"; None: CUDA when present.
        seed: seeds the initial parameters and the order of the data.
        epochs: passes over the training data.
        checkpoint_dir: where `<kind>-last.pt` is written (None: no checkpoints).
        resume: continue from the checkpoint in `checkpoint_dir`.
        overwrite: start afresh even where `checkpoint_dir` holds a run's checkpoint (it is
            replaced at the first checkpoint of this run); without it such a directory is
            refused, so that no run is lost to a forgotten `resume`.
        metrics_out: JSON-lines metrics log (appended, so a resumed run continues it).
        progress: show a progress bar.
        tensorboard: also write the metrics log's numbers as TensorBoard scalars here.
    """

    device: str | None = None
    seed: int = 0
    epochs: int = 1
    checkpoint_dir: str | None = None
    resume: bool = False
    metrics_out: str | None = None
    progress: bool = True
    overwrite: bool = False
    tensorboard: str | None = None

    def resolved_device(self) -> torch.device:
        """`device` as a torch.device; ValueError in one line for a bad or absent one."""
        from embcache.device import resolve_device

        return resolve_device(self.device)


@dataclass
class StepRunConfig(RunConfig):
    """A run made of optimizer steps (dlrm, face), which can stop and checkpoint between
    them. (cf trains whole epochs: it checkpoints at each epoch's end.)

    Args:
        max_steps: stop after this many steps in all (a checkpoint is written there).
        checkpoint_every: steps between two checkpoints (and one at every epoch's end).
        log_every: steps between two `step` records of the metrics log; a pipelined
            trainer reads its losses from the device (and refreshes the bar) this often.
        dist_timeout: under torchrun, seconds a rank waits for the others in a collective
            before it stops with one line (a rank died or hung).
        eval_every: validate every this many steps as well (None: at each epoch's end and
            where `max_steps` stops the run).
    """

    max_steps: int | None = None
    checkpoint_every: int = 200
    dist_timeout: float = DEFAULT_TIMEOUT_S
    log_every: int = LOG_EVERY
    eval_every: int | None = None
