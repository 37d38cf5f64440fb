"""The settings every trainer shares (`RunConfig`, and `StepRunConfig` for runs of steps),
apart from the run skeleton (`embcache.train.run`) so that the command line can show their
defaults without importing torch. Each field that is a flag declares it (help, type, bounds)
with `embcache.settings_fields.setting`: the command line is made from these fields."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from embcache.arg_types import non_negative_int, positive_float, positive_int
from embcache.distributed.settings import DEFAULT_TIMEOUT_S
from embcache.settings_fields import setting

if TYPE_CHECKING:
    import torch

LOG_EVERY = 50  # default steps between two `step` records of the metrics log (`log_every`)

# `--threads`'s default, as its help says it (`{cores}`: the cores this process may use)
THREADS_DEFAULT = ("(default: the cores this process may use, {cores} here, shared among torchrun's processes on "
                   "the node; outside torchrun an OMP_NUM_THREADS you set)")


@dataclass
class RunConfig:
    """Settings every trainer shares: where it runs, its seed, how long, and how the run is
    kept (checkpoints, metrics) and shown (progress). Each field's `help` says what it does
    (`--help` shows the same text; `{kind}` is the trainer's, e.g. dlrm, and the other
    placeholders are `embcache.train.run_cli.add_run_arguments`'s: a run of steps logs
    what a run of whole epochs, cf's, does not). Besides:

    - device None is CUDA when present.
    - `overwrite`: without it (or `resume`) a `checkpoint_dir` holding a run's checkpoint
      is refused, so that no run is lost to a forgotten `resume`; with it the checkpoint is
      replaced at the first checkpoint of this run.
    """

    device: str | None = setting(None, help="cpu or cuda (default: cuda if available)")
    seed: int = setting(0, type=non_negative_int, help="seeds the initial parameters and the data order")
    epochs: int = setting(1, type=positive_int, help="passes over the training data")
    checkpoint_dir: str | None = setting(
        None, metavar="DIR",
        help="keep the run's checkpoint here as {kind}-last.pt, written atomically {checkpoint_when}: a killed "
             "run loses at most the work since; created and checked before any work (default: none, no "
             "checkpoints)")
    resume: bool = setting(
        False, exclusive="start",
        help="continue from {kind}-last.pt in --checkpoint-dir, exactly where it stopped; without one there the "
             "run stops with an error (leave out --resume to start afresh); settings that change the arithmetic "
             "or the data must be the checkpoint's")
    metrics_out: str | None = setting(
        None, metavar="FILE",
        help="JSON-lines metrics log (appended): {metrics_records} records; a resumed run replaces "
             "the killed run's records past its checkpoint (default: none)")
    progress: bool = setting(True, flag="--no-progress", help="no progress bar")
    overwrite: bool = setting(
        False, exclusive="start",
        help="start afresh in a --checkpoint-dir that holds a run's {kind}-last.pt, replacing it (without "
             "--resume or --overwrite such a directory is refused: no run is lost)")
    tensorboard: str | None = setting(
        None, metavar="DIR",
        help="also write the metrics as TensorBoard scalars to DIR ({tensorboard_scalars}); watch with "
             "`tensorboard --logdir DIR` (default: none)")

    def resolved_device(self) -> torch.device:
        """`device` as a torch.device; ValueError in one line for a bad or absent one."""
        from embcache.device import resolve_device

        return resolve_device(self.device)


@dataclass
class StepRunConfig(RunConfig):
    """A run made of optimizer steps (dlrm, face), which can stop and checkpoint between
    them. (cf trains whole epochs: it checkpoints at each epoch's end.) A pipelined trainer
    reads its losses from the device every `log_every` steps."""

    max_steps: int | None = setting(
        None, type=positive_int,
        help="stop after this many steps in all, with a checkpoint (default: none, every epoch to its end)")
    checkpoint_every: int = setting(200, type=positive_int,
                                    help="steps between checkpoints (and one at every epoch's end)")
    dist_timeout: float = setting(
        DEFAULT_TIMEOUT_S, type=positive_float, metavar="SECONDS",
        help="under torchrun: how long a rank waits for the others in a collective before it stops with one "
             "line (a rank died or hung); the last checkpoint stays intact")
    log_every: int = setting(
        LOG_EVERY, type=positive_int, metavar="N",
        help="steps between two step records of the metrics log; a pipelined trainer (dlrm) reads its losses "
             "from the device and refreshes the progress bar this often")
    eval_every: int | None = setting(
        None, type=positive_int, metavar="N",
        help="also validate every N steps (default: at each epoch's end, and at --max-steps)")
