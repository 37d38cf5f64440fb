"""Where `CachedEmbeddingBag` departs from `nn.EmbeddingBag`'s idioms, said in one line
rather than left to surprise: the constructor arguments it does not take, and the one
training forward a step that its update in backward needs.
"""
from __future__ import annotations

import weakref

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


class Unfinished:
    """A training forward whose backward has not run yet. Its graph holds it (the update's
    closure), so it goes with a graph dropped without a backward."""

    __slots__ = ("open", "__weakref__")

    def __init__(self):
        self.open = True


class OneForwardAStep:
    """Each training forward's backward is one optimizer step of its rows, so two forwards
    before one backward (a table shared by two towers, called twice) take two steps where
    `nn.EmbeddingBag` takes one: equal for SGD, silently other results for Adagrad and Adam.
    So a second training forward while the first one's graph awaits its backward is refused.

    Example:
        >>> guard = OneForwardAStep()
        >>> first = guard.start()
        >>> guard.start()
        Traceback (most recent call last):
        ...
        ValueError: CachedEmbeddingBag: a second training forward before the first one's backward ...
        >>> first.open = False        # its backward ran
        >>> _ = guard.start()
    """

    def __init__(self):
        self._last = None  # weakref to the last training forward's `Unfinished`

    def start(self) -> Unfinished:
        """Check that no training forward awaits its backward, then mark this one."""
        last = None if self._last is None else self._last()
        if last is not None and last.open:
            raise ValueError("CachedEmbeddingBag: a second training forward before the first one's backward "
                             "(its rows are updated once a forward, so two forwards would be two optimizer "
                             "steps): call the bag once a step with all its ids (a table shared by two "
                             "features: one call, or a collection), or drop the first output first")
        mark = Unfinished()
        self._last = weakref.ref(mark)
        return mark

    def __getstate__(self) -> dict:
        """A weakref cannot be pickled (`torch.save` of a model holding the bag), and a copy
        has no forward of its own in flight."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self._last = None
