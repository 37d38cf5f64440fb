"""This process's training time with its first step set apart. The first step carries the
run's start-up (numba compiling its kernels on a fresh checkout, torch warming up, the
first batch read): tens of seconds where a step takes milliseconds, so a rate over every
step of a short run measures the start-up, not the speed. The summary's `steady_*` fields
cover the steps after the first (`first_step_seconds` the first); `train_seconds` and
`train_samples_per_s` keep covering every step, as the benchmarks read them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepWindows:
    """The read windows of this process (`Trainer.read_losses`): the first one (one step,
    since the trainer reads its first step alone) and the sum of the others."""

    steps: int = 0  # every step read so far, the first included
    first_steps: int = 0
    first_seconds: float | None = None
    first_samples: int = 0
    first_cpu: float = 0.0
    seconds: float = 0.0  # of the windows after the first
    samples: int = 0
    cpu: float = 0.0

    def add(self, steps: int, seconds: float, samples: int, cpu: float) -> None:
        """Count a window of `steps` steps (wall `seconds`, this process's `cpu` seconds)."""
        if self.first_seconds is None:
            self.first_steps, self.first_seconds, self.first_samples, self.first_cpu = steps, seconds, samples, cpu
        else:
            self.seconds, self.samples, self.cpu = self.seconds + seconds, self.samples + samples, self.cpu + cpu
        self.steps += steps

    def fields(self) -> dict:
        """The summary's fields: the first step's seconds and the rate over the steps after
        it (None where there are none); none at all where no step was read (cf's epochs)."""
        if self.first_seconds is None:
            return {}
        after = self.steps - self.first_steps
        return {"first_step_seconds": self.first_seconds, "steady_steps": after, "steady_seconds": self.seconds,
                "steady_samples_per_s": self.samples / self.seconds if after and self.seconds > 0 else None}
