"""Where `CachedEmbeddingBag` departs from `nn.EmbeddingBag`'s idioms, said in one line
rather than left to surprise: the constructor arguments it does not take, and the one
update of its rows a backward pass may bring (its update happens in backward).
"""
from __future__ import annotations

import torch

# nn.EmbeddingBag's arguments the bag does not take, and what to do instead: without this,
# they reach the row optimizer's arguments and are refused as a bad optimizer argument
TORCH_ONLY_ARGS = {
    "padding_idx": "no row is a padding row here (leave the id out of its bag instead)",
    "include_last_offset": "offsets are bag starts only (drop the last offset)",
    "max_norm": "rows are not renormalised", "norm_type": "rows are not renormalised",
    "scale_grad_by_freq": "gradients are not scaled by frequency",
    "sparse": "the rows' updates are always sparse, made by the cache's own optimizer",
    "_weight": "pass the initial table as weight=", "_freeze": "freeze the bag with requires_grad_(False)",
    "dtype": "rows are float32 unless row_dtype= says otherwise",
}


def refuse_torch_only_args(kwargs: dict) -> None:
    """A ValueError naming the first of `TORCH_ONLY_ARGS` in `kwargs`."""
    for name, instead in TORCH_ONLY_ARGS.items():
        if name in kwargs:
            raise ValueError(f"{name}: an nn.EmbeddingBag argument that CachedEmbeddingBag does not take; "
                             f"{instead}")


class OneUpdateABackward:
    """Each training forward's backward is one optimizer step of its rows, so two forwards
    whose gradients meet in one backward (a table shared by two towers, called twice, the
    outputs' losses added) would take two steps where `nn.EmbeddingBag` takes one: equal
    for SGD, silently other rows for Adagrad and Adam. So the second update a backward pass
    brings to the bag is refused, before it is applied. Forwards in flight, each with its
    own backward, stay as they were (a step each).

    Example:
        >>> guard = OneUpdateABackward()
        >>> guard.enter(7)              # backward pass 7's first update of the bag
        >>> guard.enter(7)
        Traceback (most recent call last):
        ...
        ValueError: CachedEmbeddingBag: two forwards of one bag met in one backward ...
        >>> guard.enter(8)              # the next backward pass
    """

    def __init__(self):
        self._task = -1  # the backward pass (autograd's graph task) of the last update

    def enter(self, task: int | None = None) -> None:
        """Refuse a second update of the bag within backward pass `task` (None: the one
        running now)."""
        if task is None:
            current = getattr(torch._C, "_current_graph_task_id", None)
            task = current() if current is not None else -1
        if task >= 0 and task == self._task:
            raise ValueError("CachedEmbeddingBag: two forwards of one bag met in one backward (its rows are "
                             "updated once a forward, so that would be two optimizer steps where "
                             "nn.EmbeddingBag takes one): call the bag once a step with all its ids (a table "
                             "shared by two features: one call, or a collection)")
        self._task = task
