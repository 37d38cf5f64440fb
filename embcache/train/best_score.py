"""The run skeleton's word at the end of a run whose last scores are worse than its best: the
summary, the checkpoint and any saved model hold the last model, and nothing else says that a
better one was passed on the way (an epoch line scrolled away, an epoch not evaluated).

Example:
    >>> history = [{"epoch": 1, "auc": 0.79}, {"epoch": 2, "auc": 0.76}, {"epoch": 3, "auc": 0.77}]
    >>> below_best(history, ("auc", True, "keep --epochs at the best one"))
    'auc 0.7700 after epoch 3 is below the best of the run, 0.7900 after epoch 1: keep --epochs at the best one'
"""
from __future__ import annotations

import math


def below_best(history: list[dict], headline: tuple | None) -> str:
    """The warning when the last record of `history` (the model the run ends with) scores
    worse on `headline` (score key, higher is better, advice[, advice when the best was in
    the middle of an epoch, `{step}` its step]) than the run's best record; '' when it does
    not, or when the last record has no such score. Every record counts, those before a
    resume too (the checkpoint keeps the history) and evaluations in the middle of an epoch;
    of equal bests the first is named. A run whose best was in the middle of an epoch is
    told the step to stop at: "keep --epochs at the best one" cannot end a run there, and a
    one-epoch run had no further epoch to blame."""
    if headline is None or not history:
        return ""
    key, higher_is_better, advice, *mid_epoch = headline
    scored = [r for r in history if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    last = history[-1]
    if not scored or scored[-1] is not last:
        return ""
    sign = 1.0 if higher_is_better else -1.0
    best = max(scored, key=lambda r: sign * r[key])
    if sign * last[key] >= sign * best[key]:
        return ""
    if mid_epoch and best.get("partial"):
        advice = mid_epoch[0].format(step=best["step"])
    return (f"{key} {last[key]:.4f} {_when(last)} is {'below' if higher_is_better else 'above'} the best of the "
            f"run, {best[key]:.4f} {_when(best)}: {advice}")


def _when(record: dict) -> str:
    if record.get("partial"):
        return f"at step {record['step']:,} (epoch {record['epoch']} in progress)"
    return f"after epoch {record['epoch']}"
