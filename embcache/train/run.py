"""The run skeleton the three trainers (dlrm, face, cf) stand on.

A trainer says how to train one epoch, how to evaluate, what its checkpoint holds beyond
the common part and what its summary reports; the skeleton does the rest, the same way for
all three:

- **position**: epoch, step within it, steps in all, training seconds and samples;
- **checkpoints**: one file per run, `<checkpoint_dir>/<kind>-last.pt`, written atomically
  every `checkpoint_every` steps and at every epoch's end;
- **resume**: `--resume` continues from that file and stops with one line when there is
  none (a typo in the directory must not start a fresh run over an old one); settings that
  shape the arithmetic or the data must match the checkpoint's, and a resume with others is
  refused in one line naming each (setting, value in the checkpoint, value now);
- **nothing lost**: a run without `--resume` refuses a directory that holds a checkpoint
  of its kind already, in one line naming the two ways on (`--resume`, `--overwrite`);
- **Ctrl-C** (SIGINT; SIGTERM too, as schedulers send it, outside torchrun, whose launcher
  sends SIGTERM when a peer failed): the run finishes the step it is in (cf: the epoch),
  writes its checkpoint where it keeps one and stops with `RunInterrupted`, one line
  ("interrupted at step N ...; resume with --resume"); a second signal stops it at once,
  the last checkpoint intact. Under torchrun the ranks agree on the step to stop after
  (every `log_every` steps), so that their checkpoint is one;
- **divergence guard**: a NaN or infinite loss stops the run, naming the first step whose
  loss it was, before it reaches a checkpoint, so the last checkpoint is always good to
  resume from;
- **metrics log**: JSON lines, `start`, `step` (every `log_every` steps), `epoch`, then
  `summary` (or `diverged`); a resumed run's `start` says from where, and the killed run's
  records past the checkpoint give way to the resumed run's (`metrics_log`);
- **progress**: a bar per epoch, and one line per epoch through `logging` (the command line
  prints it; a library user's logging configuration decides); at the end one warning where the
  last scores are worse than the run's best (`best_score`);
- **reading the loss**: a trainer hands each step's loss over as a float (read already)
  or as a tensor on the device. A `pipelined` trainer's tensors stay there, so that no step
  waits for the device: they are read together (one sync; under torchrun one all-reduce)
  every `log_every` steps, at an epoch's end and before every checkpoint, and the guard,
  the loss's moving average, the bar and the log then see each step's loss in turn, the
  same numbers as reading every step;
- **several processes** (torchrun): every rank runs the same loop; rank 0 alone shows
  progress, writes the metrics log and the checkpoint file; `save` and `summary` are
  collective (a trainer's state may be spread over the ranks), so every rank calls them.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

import torch

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.device import peak_memory
from embcache.distributed.world import all_sum, barrier, current
from embcache.errors import CheckpointError, RunInterrupted, TrainingDiverged
from embcache.train.best_score import below_best
from embcache.train.run_config import LOG_EVERY, RunConfig, StepRunConfig  # noqa: F401 (their home before)
# parts of the skeleton in modules of their own (checkpoint files, metrics log, Ctrl-C), named here as before
from embcache.train.metrics_log import MetricsLog
from embcache.train.run_files import (  # noqa: F401 (imported from here by the rooms and the tests)
    check_checkpoint_dir,
    checkpoint_file,
    checkpoint_in,
    checkpoint_to_evaluate,
    config_from_checkpoint,
    refuse_existing_run,
    resume_mismatches,
    upgrade_common_parts,
)
from embcache.train.step_windows import StepWindows
from embcache.train.stop_signals import StopSignals

logger = logging.getLogger(__name__)


def check_loss(loss: float, where: str) -> None:
    """Raise TrainingDiverged naming `where` (e.g. "step 120") when `loss` is not finite."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"{where}: the loss is {loss}: training diverged (try a lower learning rate); "
                               f"nothing from it was checkpointed or saved, the last checkpoint is intact")


class Trainer:
    """Base of `DLRMTrainer`, `FaceTrainer` and `CFTrainer`: the loop, checkpoints, resume,
    metrics log and divergence guard; see the module docstring.

    A subclass sets `kind` (names its checkpoints and metrics), `must_match` (config fields
    a resume may not change) and `only_raised` (fields a resume may only raise), and writes
    `train_epoch`, `evaluate_epoch`, `trainer_state` / `load_trainer_state` and
    `summary_fields`. A stepwise trainer calls `begin_epoch` before its first step and
    `after_step` after each one; `should_stop` says when `max_steps` is reached. A trainer
    whose `pipelined` is true hands `after_step` its losses as device tensors, read every
    `log_every` steps (see the module docstring).
    """

    kind: ClassVar[str] = ""
    must_match: ClassVar[tuple[str, ...]] = ()
    only_raised: ClassVar[tuple[str, ...]] = ()
    setting_names: ClassVar[dict[str, str]] = {}  # config field -> its flag, for messages
    # (score key, higher is better, advice[, advice for a best mid-epoch]): the warning of a run ending below its best
    headline: ClassVar[tuple | None] = None
    pipelined: bool = False  # losses stay on the device between reads (else read at every step)

    def __init__(self, cfg: RunConfig, device: torch.device | None = None):
        if cfg.resume and not cfg.checkpoint_dir:
            raise CheckpointError("--resume needs --checkpoint-dir")
        if cfg.resume and getattr(cfg, "overwrite", False):
            raise CheckpointError("--resume continues the run in --checkpoint-dir, --overwrite starts over there: "
                                  "choose one")
        if not cfg.resume and not getattr(cfg, "overwrite", False):
            refuse_existing_run(cfg.checkpoint_dir, self.kind)
        check_checkpoint_dir(cfg.checkpoint_dir, cfg.resume)
        if getattr(cfg, "log_every", 1) < 1:
            raise ValueError(f"log_every must be >= 1, got {cfg.log_every}")
        self.cfg = cfg
        self.world = current()
        self.device = self.world.device(device if device is not None else torch.device("cpu"))
        self.log = MetricsLog(cfg.metrics_out if self.world.is_main else None)
        self.epoch = self.step_in_epoch = self.step = 0
        self.history: list[dict] = []
        self.train_seconds, self.train_samples = 0.0, 0
        # CPU time (user + system, every thread of this process) over the same windows as
        # train_seconds, and the samples of those windows: this process's, not a checkpoint's
        self.train_cpu_seconds, self._cpu_samples, self._cpu_last = 0.0, 0, 0.0
        self.windows = StepWindows()  # this process's, its first step apart (start-up, compilation)
        self.stopped_early = False
        self._bar = None
        self._t_last = 0.0
        self._loss_ema: float | None = None
        self._unread: list = []  # losses of the steps not read yet (floats or device tensors)
        self._unread_samples = 0
        self._signals: StopSignals | None = None  # while the loop runs
        self._interrupted = False  # a stop signal was received (on some rank) and the loop stops
        self._saved_position: tuple[int, int, int] | None = None  # (epoch, step_in_epoch, step) of the checkpoint

    # ------------------------------------------------------------------ what a trainer writes
    def train_epoch(self) -> dict | None:
        """Train the rest of the current epoch. Returns fields for the epoch's record (may
        be empty), or None when the run stopped before the epoch's end (`max_steps`)."""
        raise NotImplementedError

    def evaluate_epoch(self) -> dict:
        """Evaluation fields for the record of the epoch just trained ({} to skip)."""
        return {}

    def trainer_state(self) -> dict:
        """The checkpoint's parts beyond the skeleton's: parameters, optimizer state, ..."""
        raise NotImplementedError

    def load_trainer_state(self, ck: dict, path: Path) -> None:
        """Put a checkpoint's `trainer_state` in place (settings already checked)."""
        raise NotImplementedError

    def data_fingerprint(self) -> dict | None:
        """What identifies the training data for a resume (None: nothing beyond the config)."""
        return None

    def state_mismatches(self, ck: dict) -> list[str]:
        """Phrases for what else in the checkpoint this trainer cannot take (beyond the
        config and data), in the wording of `resume_mismatches`."""
        return []

    def data_mismatch(self, saved_config: dict, saved: dict, now: dict) -> str:
        """The phrase for a resume on other data (`saved` and `now` are fingerprints,
        `saved_config` the checkpoint's settings)."""
        return "data: the checkpoint was written for other data"

    def summary_fields(self) -> dict:
        return {}

    def upgrade_checkpoint(self, ck: dict) -> dict:
        """A checkpoint written by an earlier version, in today's form (positions under
        the skeleton's names, settings added since with the value they had in effect); a
        trainer adds its own renames."""
        return upgrade_common_parts(ck, type(self.cfg))

    def format_epoch(self, record: dict) -> str:
        return f"epoch {record['epoch']}"

    def start_fields(self) -> dict:
        """Fields of the metrics log's `start` record beside the config."""
        return {}

    def epoch_log_fields(self) -> dict:
        """Fields of every `epoch` record of the metrics log beside the epoch's own."""
        return {}

    def step_log_fields(self) -> dict:
        """Fields of a `step` record of the metrics log beside loss and samples/s."""
        return {}

    def progress_fields(self) -> dict:
        """Fields of the progress bar beside the loss and samples/s."""
        return {}

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """Train from where the run stands (resumed when the config says so) to the last
        epoch or `max_steps`; returns the summary, also the metrics log's last record."""
        resumed = {}
        if self.cfg.resume:
            self.log.supersede(self.resume().get("metrics_log"))  # the killed run's records past the checkpoint
            resumed = {"resumed_from": {"epoch": self.epoch, **({"step": self.step} if self._stepwise else {})}}
            if self.epoch >= self.cfg.epochs:
                logger.info(f"the checkpoint has {self.epoch} epoch(s) already: nothing to train "
                            f"(raise --epochs to go on)")
        if self.world.is_main:
            self.log.open_tensorboard(getattr(self.cfg, "tensorboard", None),
                                      purge_step=self.step + 1 if self.cfg.resume else None)
        self.log.write(event="start", kind=self.kind, config=asdict(self.cfg), world_size=self.world.size,
                       **resumed, **self.start_fields())
        self._signals = StopSignals(self._stop_at_once, self.world.distributed, self.world.is_main,
                                    "step" if self._stepwise else "epoch")
        try:
            with self._signals:
                while self.epoch < self.cfg.epochs and not self.stopped_early:
                    stats = self.train_epoch()
                    self.read_losses()
                    self._close_bar()
                    if stats is None:
                        self.stopped_early = True
                        if not self._interrupted:  # --max-steps: the run ends with its scores
                            self.evaluate_now()
                    else:
                        self._end_epoch(stats)
                    if not (self._interrupted and self._saved_position == self._position):
                        self.save()
                    if self.stop_requested():
                        break
        except TrainingDiverged as err:
            self._close_bar()
            self.log.write(event="diverged", message=str(err))
            raise
        except RunInterrupted:  # a second signal: stopped at once
            self._close_bar()
            self.log.write(event="interrupted", epoch=self.epoch, step=self.step, at_once=True)
            raise
        finally:
            self._signals = None
            self.log.close()
        if self._interrupted and not self._finished():
            self.log.write(event="interrupted", epoch=self.epoch, step=self.step)
            raise RunInterrupted(self._interrupted_line())
        worse = below_best(self.history, self.headline)  # once, at the end: the best is not what the run keeps
        if worse:
            logger.warning(worse)
        summary = self.summary()
        self.log.write(event="summary", **summary)
        return summary

    def _end_epoch(self, stats: dict) -> None:
        scores = self._scores_at_this_step() or self.evaluate_epoch()
        record = {"epoch": self.epoch + 1, **({"step": self.step} if self._stepwise else {}), **stats, **scores}
        self.history.append(record)
        self.log.write(event="epoch", **self.epoch_log_fields(), **record)
        logger.info(self.format_epoch(record))
        self.epoch += 1
        self.step_in_epoch = 0

    def _scores_at_this_step(self) -> dict:
        """The scores of an evaluation made at this very step (`--eval-every` landing on an
        epoch's last step), taken out of the history for the epoch's record: {} if none."""
        if self.history and self.history[-1].get("partial") and self.history[-1].get("step") == self.step:
            last = self.history.pop()
            return {k: v for k, v in last.items() if k not in ("epoch", "step", "partial")}
        return {}

    def evaluate_now(self) -> None:
        """Validation in the middle of an epoch (every `eval_every` steps, and where
        `max_steps` ends a run): an `eval` record, a line, and the history's latest scores.
        Its time is not training time. Once per step: nothing when this step has scores."""
        if not self._stepwise or (self.history and self.history[-1].get("step") == self.step):
            return
        self.read_losses()
        scores = self.evaluate_epoch()
        self._restart_clocks()
        if not scores:
            return
        record = {"epoch": self.epoch + 1, "step": self.step, "partial": True, **scores}
        self.history.append(record)
        self.log.write(event="eval", **self.epoch_log_fields(), **record)
        logger.info(f"step {self.step}, {self.format_epoch(record)} (epoch in progress)")

    @property
    def _stepwise(self) -> bool:
        return isinstance(self.cfg, StepRunConfig)

    def _finished(self) -> bool:
        """The run did all it was asked: every epoch, or `max_steps`."""
        return self.epoch >= self.cfg.epochs or (self._stepwise and self.cfg.max_steps is not None
                                                 and self.step >= self.cfg.max_steps)

    def should_stop(self) -> bool:
        """`max_steps` reached, or a stop signal received: the run ends here (after a
        checkpoint)."""
        return self._interrupted or (self._stepwise and self.cfg.max_steps is not None
                                     and self.step >= self.cfg.max_steps)

    # ------------------------------------------------------------------ Ctrl-C
    def stop_requested(self) -> bool:
        """Whether a stop signal (`StopSignals`) was received: on one process, here; under
        torchrun, on any rank (collective: every rank calls it at the same point)."""
        if not self._interrupted:
            received = self._signals is not None and self._signals.received is not None
            if self.world.distributed:
                received = all_sum({"stop": int(received)})["stop"] > 0
            self._interrupted = received
        return self._interrupted

    @property
    def _position(self) -> tuple[int, int, int]:
        return self.epoch, self.step_in_epoch, self.step

    def _where(self) -> str:
        """Where the run stands: "step 37", or "epoch 3" for a run of whole epochs."""
        return f"step {self.step}" if self._stepwise else f"epoch {self.epoch}"

    def _interrupted_line(self) -> str:
        """The line of a run stopped by a signal after a whole step (checkpointed)."""
        if self.checkpoint_path is None:
            return (f"interrupted at {self._where()}; nothing was kept (no --checkpoint-dir): a run with "
                    f"--checkpoint-dir DIR can be stopped and resumed")
        return f"interrupted at {self._where()} (checkpoint in {self.cfg.checkpoint_dir}); resume with --resume"

    def _stop_at_once(self) -> None:
        """A second stop signal: raise `RunInterrupted` from where the run is."""
        if self.checkpoint_path is None or self._saved_position is None:
            kept = "nothing was checkpointed" if self.checkpoint_path is None or not self.checkpoint_path.exists() \
                else f"the checkpoint in {self.cfg.checkpoint_dir} is as it was"
        else:
            epoch, _, step = self._saved_position
            kept = (f"the checkpoint of {f'step {step}' if self._stepwise else f'epoch {epoch}'} in "
                    f"{self.cfg.checkpoint_dir} is intact: resume with --resume")
        raise RunInterrupted(f"interrupted again: stopped at once; {kept}")

    def begin_epoch(self, total: int, unit: str = "step") -> None:
        """Open the epoch's progress bar (`total` units, the done ones already counted) and
        start the step clock."""
        from tqdm import tqdm

        self._bar = tqdm(total=total, initial=self.step_in_epoch if unit == "step" else 0,
                         desc=f"epoch {self.epoch + 1}/{self.cfg.epochs}", unit=unit, unit_scale=unit != "step",
                         disable=not (self.cfg.progress and self.world.is_main), dynamic_ncols=True, leave=unit == "step")
        self._restart_clocks()

    def tick(self, done: int, **postfix) -> None:
        """Advance the progress bar by `done` units (for trainers without steps)."""
        if self._bar is not None:
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(done)

    def after_step(self, loss: float | torch.Tensor, samples: int) -> None:
        """Account for one step: position, samples, and the periodic checkpoint; then, at
        a read (every step unless `pipelined`; this process's first step alone, so that its
        start-up is timed apart: `step_windows`), the divergence guard, throughput (wall time
        since the previous read, so loading batches counts and checkpoints do not), progress
        bar and metrics log for every step since the previous read.

        `loss`: a float is the step's loss as read (under torchrun: summed over the ranks
        already); a tensor is this rank's share, left on the device until the read, which
        sums it over the ranks."""
        self._unread.append(loss.detach() if torch.is_tensor(loss) else loss)
        self._unread_samples += samples
        self.step += 1
        self.step_in_epoch += 1
        if not self.pipelined or self.step % self._log_every == 0 or not self.windows.steps:  # the first alone
            self.read_losses()
        eval_every = getattr(self.cfg, "eval_every", None)
        if eval_every and self.step % eval_every == 0:
            self.evaluate_now()
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save()
            self._restart_clocks()
        if not self.world.distributed or self.step % self._log_every == 0:
            self.stop_requested()  # collective under torchrun: the ranks agree every log_every steps

    @property
    def _log_every(self) -> int:
        return getattr(self.cfg, "log_every", LOG_EVERY)

    def read_losses(self) -> None:
        """Read the losses of the steps since the previous read (one device sync, one
        all-reduce under torchrun) and account for each in turn: divergence guard (which
        names the first step whose loss is not finite), moving average, progress bar, and a
        `step` record for every `log_every`-th. Collective under torchrun when they are
        tensors. Nothing to read: nothing happens."""
        if not self._unread:
            return
        losses, samples = self._read_unread()
        first = self.step - len(losses) + 1
        for i, loss in enumerate(losses):
            check_loss(loss, f"step {first + i}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now, cpu_now = time.perf_counter(), time.process_time()
        dt, self._t_last = now - self._t_last, now
        self.account_cpu(cpu_now - self._cpu_last, samples)
        self.windows.add(len(losses), dt, samples, cpu_now - self._cpu_last)
        self._cpu_last = cpu_now
        self.train_seconds += dt
        self.train_samples += samples
        rate = samples / dt if dt > 0 else float("inf")
        for i, loss in enumerate(losses):
            self._loss_ema = loss if self._loss_ema is None else 0.95 * self._loss_ema + 0.05 * loss
            step = first + i
            if step % self._log_every == 0:
                self.log.write(event="step", step=step, epoch=self.epoch + 1, loss=loss, loss_ema=self._loss_ema,
                               samples_per_s=rate, **self.step_log_fields())
        self.tick(len(losses), loss=f"{self._loss_ema:.4f}", **{"samples/s": f"{rate:,.0f}"},
                  **self.progress_fields())

    def _read_unread(self) -> tuple[list[float], int]:
        """The unread losses as floats (tensors summed over the ranks) and their samples;
        the window is emptied."""
        window, samples = self._unread, self._unread_samples
        self._unread, self._unread_samples = [], 0
        at = [i for i, loss in enumerate(window) if torch.is_tensor(loss)]
        if at:
            values = torch.stack([window[i].reshape(()) for i in at]).double()  # float32 -> float64: exact
            if self.world.distributed:
                import torch.distributed as dist

                from embcache.distributed.world import collective_device

                values = values.to(collective_device())
                dist.all_reduce(values)
            for i, v in zip(at, values.tolist()):
                window[i] = v
        return [float(loss) for loss in window], samples

    def _restart_clocks(self) -> None:
        """Start the wall and CPU clocks of the next training window (after a checkpoint or
        a validation, whose time is not training's)."""
        self._t_last, self._cpu_last = time.perf_counter(), time.process_time()

    def account_cpu(self, seconds: float, samples: int) -> None:
        """Count `seconds` of this process's CPU time spent training `samples` samples."""
        self.train_cpu_seconds += seconds
        self._cpu_samples += samples

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def summary(self) -> dict:
        out = {"epochs_done": self.epoch, "stopped_early": self.stopped_early,
               **({"steps": self.step} if self._stepwise else {}),
               "train_seconds": self.train_seconds,
               "train_samples_per_s": self.train_samples / self.train_seconds if self.train_seconds else 0.0,
               **self.windows.fields(), **self._cpu_fields(), "device": str(self.device), "world_size": self.world.size}
        return {**out, **self.summary_fields(), **peak_memory(self.device)}

    def _cpu_fields(self) -> dict:
        """CPU seconds of training, summed over the ranks (collective), and per sample: the
        cost of a sample whether or not the cores are shared with other jobs, so that what
        distribution costs shows where wall-clock speed-ups cannot."""
        w = self.windows
        cpu = all_sum({"cpu": self.train_cpu_seconds, "steady": w.cpu})
        return {"train_cpu_seconds": cpu["cpu"],
                "cpu_seconds_per_sample": cpu["cpu"] / self._cpu_samples if self._cpu_samples else None,
                **({"steady_cpu_seconds_per_sample": cpu["steady"] / w.samples if w.samples else None}
                   if w.first_seconds is not None else {})}

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return Path(self.cfg.checkpoint_dir) / f"{self.kind}-last.pt" if self.cfg.checkpoint_dir else None

    def save(self) -> Path | None:
        """Write the checkpoint (atomically: a reader sees the previous one or this one).
        Collective: every rank calls it; `trainer_state` may write parts of its own, and
        rank 0 writes the file that makes them the checkpoint."""
        self.read_losses()  # the guard sees every step before a checkpoint can hold it
        if self.checkpoint_path is None:
            return None
        payload = {"config": asdict(self.cfg), "data": self.data_fingerprint(), "epoch": self.epoch,
                   "step_in_epoch": self.step_in_epoch, "step": self.step, "history": self.history,
                   "train_seconds": self.train_seconds, "train_samples": self.train_samples,
                   "rng": torch.get_rng_state(), "world_size": self.world.size, "loss_ema": self._loss_ema,
                   "metrics_log": self.log.mark(), **self.trainer_state()}
        if self.world.is_main:
            save_checkpoint(payload, self.checkpoint_path, kind=self.kind)
            self.after_save(payload)
        barrier()  # no rank runs ahead of a checkpoint that is not yet in place
        self._saved_position = self._position
        return self.checkpoint_path

    def after_save(self, payload: dict) -> None:
        """Rank 0, once the checkpoint file is in place: drop what it superseded."""

    def resume_checkpoint(self) -> Path:
        """The checkpoint `--resume` continues from; CheckpointError when there is none."""
        path = checkpoint_in(self.cfg.checkpoint_dir, self.kind)
        if not path.is_file():
            raise CheckpointError(f"{self.cfg.checkpoint_dir}: no {self.kind} checkpoint ({path.name}) to resume "
                                  f"from; leave out --resume to start afresh")
        return path

    def resume(self) -> dict:
        """Continue from the checkpoint in `checkpoint_dir`: parameters and position."""
        path = self.resume_checkpoint()
        ck = self.restore(path)
        self.epoch, self.step_in_epoch, self.step = ck["epoch"], ck["step_in_epoch"], ck["step"]
        self._saved_position = self._position
        self.history = ck["history"]
        self.train_seconds, self.train_samples = ck.get("train_seconds", 0.0), ck.get("train_samples", 0)
        self._loss_ema = ck.get("loss_ema")  # older checkpoints: the average starts again
        if "rng" in ck:
            torch.set_rng_state(ck["rng"])
        where = f" and {self.step_in_epoch} step(s) of epoch {self.epoch + 1}" if self.step_in_epoch else ""
        logger.info(f"resumed from {path} after epoch {self.epoch}{where}"
                    + (f" ({self.step} steps in all)" if self._stepwise else ""))
        return ck

    def restore(self, path: str | os.PathLike) -> dict:
        """Load checkpoint `path` into this trainer after checking that it was written with
        this run's settings and data; returns the checkpoint (positions under the
        skeleton's names, whatever version wrote it)."""
        path = Path(path)
        ck = self.upgrade_checkpoint(load_checkpoint(path, kind=self.kind))
        differ = resume_mismatches(ck["config"], asdict(self.cfg), self.must_match, self.only_raised,
                                   self.setting_names)
        saved_data, data = ck.get("data"), self.data_fingerprint()
        # judged on what the checkpoint recorded (a part added to a fingerprint later is not compared)
        if saved_data is not None and data is not None and saved_data != {k: data.get(k) for k in saved_data}:
            differ.append(self.data_mismatch(ck["config"], saved_data, data))
        differ += self.state_mismatches(ck)
        if differ:
            raise CheckpointError(f"{path}: cannot resume with other settings: " + "; ".join(differ))
        try:
            self.load_trainer_state(ck, path)
        except CheckpointError:
            raise
        except (RuntimeError, KeyError, ValueError) as err:
            # torch's message is a heading ("Error(s) in loading state_dict ...:") over the details
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
            raise CheckpointError(f"{path}: the checkpoint does not fit this model: {' '.join(lines[:2])}") from None
        return ck

