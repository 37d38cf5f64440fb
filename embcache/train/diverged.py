"""One guard for every training loop: a NaN or infinite loss stops the run with one line,
before the step or epoch that produced it reaches a checkpoint or a saved file, so the
last checkpoint stays good to resume from (with a lower learning rate)."""
from __future__ import annotations

import math

from embcache.errors import TrainingDiverged


def check_loss(loss: float, where: str) -> None:
    """Raise TrainingDiverged naming `where` (e.g. "step 120") when `loss` is not finite."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"{where}: the loss is {loss}: training diverged (try a lower learning rate); "
                               f"nothing from it was checkpointed or saved, the last checkpoint is intact")
