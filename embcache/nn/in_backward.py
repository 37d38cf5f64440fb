"""Whole tables that torch trains through a sparse gradient, moved to being trained inside
their own backward (`WholeTableBag`), so that a run's step can be captured as a CUDA graph.

Torch's sparse optimizers cannot be captured: `coalesce` makes a gradient the size of the
batch's distinct ids, a number only the device knows. `train_in_backward` replaces each
`nn.EmbeddingBag` of a collection (the project's `TorchEmbeddingBagCollection` or torchrec's)
by a `WholeTableBag` with the same rows, pooling and offsets, trained by the row optimizer
that equals the torch one (`cache.optimizers`; with torch's kernels to the bit, and the fused
kernel sums a row's terms in torch's order). The collection's state dict stays as it was
(`embedding_bags.<table>.weight`), and `InBackwardOptimizer` saves the optimizer's state in
the torch optimizer's own form: a checkpoint moves between an eager run (torch's optimizer)
and a captured one either way, and `dlrm evaluate` / `export` read it as before.

Memory: the tables move one at a time, each let go by the torch optimizer (its state and its
reference to the parameter) as it moves, so the peak is one table and its state more.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from embcache.cache.optimizers import TORCH_EQUIVALENTS, torch_equivalent
from embcache.nn.whole_table import WholeTableBag

# the torch optimizers' settings a row optimizer takes by the same name, and those it lacks
_SETTINGS = {"sgd": (), "adagrad": ("eps", "lr_decay", "initial_accumulator_value"), "adam": ("betas", "eps")}
_UNSUPPORTED = {"momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False, "maximize": False}


class InBackwardOptimizer:
    """The optimizer of tables trained in their backward, held where a trainer holds a torch
    one: `zero_grad` and `step` do nothing (the backward has updated the rows), and
    `state_dict` / `load_state_dict` take and give the form of `torch_equivalent(name, ...)`
    over the tables in `bags`' order.

    Example:
        >>> bag = WholeTableBag(torch.zeros(4, 2), "adagrad", lr=0.1, kernels="torch")
        >>> opt = InBackwardOptimizer([bag], "adagrad", 0.1)
        >>> bag(torch.tensor([1, 1]), torch.tensor([0])).sum().backward()
        >>> state = opt.state_dict()["state"][0]
        >>> float(state["step"]), state["sum"][1].tolist()
        (1.0, [4.0, 4.0])
    """

    def __init__(self, bags: list[WholeTableBag], name: str, lr: float, **settings):
        self.bags, self.name = list(bags), name
        probe = torch_equivalent(name, [torch.zeros(1, requires_grad=True) for _ in self.bags], lr)
        for group in probe.param_groups:
            group.update(settings)
        self._groups = probe.state_dict()["param_groups"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def step(self, closure=None) -> None:
        return None

    def state_dict(self) -> dict:
        """As the torch optimizer's: `{"state": {i: ...}, "param_groups": [...]}`, the
        tables' state as views of the bags' buffers (no copy)."""
        state = {i: s for i, bag in enumerate(self.bags) if (s := _torch_state(bag, self.name))}
        return {"state": state, "param_groups": copy.deepcopy(self._groups)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a torch optimizer's state dict (or this one's) into the bags."""
        params = [i for group in state_dict["param_groups"] for i in group["params"]]
        if len(params) != len(self.bags):
            raise ValueError(f"the optimizer's state holds {len(params)} tables, this model {len(self.bags)}")
        for i, bag in zip(params, self.bags):
            _load_torch_state(bag, self.name, state_dict["state"].get(i, {}))


def train_in_backward(collection: nn.Module, optimizer: torch.optim.Optimizer,
                      kernels: str = "auto") -> InBackwardOptimizer:
    """Replace `collection`'s `nn.EmbeddingBag`s (its `embedding_bags`, trained by the torch
    `optimizer`, which holds them in that order) by `WholeTableBag`s with their rows and
    `optimizer`'s state; returns the optimizer to hold instead of `optimizer`, which lets go
    of each table as it moves (module docstring) and is not to be stepped again."""
    names = {cls: name for name, cls in TORCH_EQUIVALENTS.items()}
    name = names.get(type(optimizer))
    if name is None:
        raise ValueError(f"tables trained by {type(optimizer).__name__} cannot move into their backward "
                         f"(it takes {', '.join(cls.__name__ for cls in names)})")
    group = optimizer.param_groups[0]
    odd = {k: group[k] for k, plain in _UNSUPPORTED.items() if k in group and group[k] != plain}
    if odd or len(optimizer.param_groups) > 1:
        raise ValueError(f"tables trained with {odd or 'several parameter groups'} cannot move into their backward")
    settings = {k: group[k] for k in _SETTINGS[name]}
    for key, old in collection.embedding_bags.items():
        if not isinstance(old, nn.EmbeddingBag) or old.padding_idx is not None or old.max_norm is not None:
            raise ValueError(f"table {key!r}: only a plain nn.EmbeddingBag (no padding_idx, no max_norm) "
                             f"moves into its backward")
    if [id(p) for p in group["params"]] != [id(old.weight) for old in collection.embedding_bags.values()]:
        raise ValueError("the optimizer does not train the collection's tables, in their order")
    bags = []
    for i, key in enumerate(list(collection.embedding_bags)):  # no list of the old bags: each freed in turn
        old = collection.embedding_bags[key]
        bag = WholeTableBag(old.weight.detach(), name, lr=group["lr"], mode=old.mode, kernels=kernels,
                            include_last_offset=old.include_last_offset, **settings)
        _load_torch_state(bag, name, optimizer.state.pop(old.weight, {}))
        group["params"][i] = bag.weight.new_empty(0)  # the torch optimizer lets go of the table
        collection.embedding_bags[key] = bag
        bags.append(bag)
        del old
    return InBackwardOptimizer(bags, name, group["lr"], **settings)


def _torch_state(bag: WholeTableBag, name: str) -> dict:
    """The state torch's optimizer keeps for the table: SGD none; Adagrad its step (a float
    tensor) and sums from the start; SparseAdam its step and moments from the first step."""
    n, state = bag.num_embeddings, bag.state()
    if name == "adagrad":
        return {"step": torch.tensor(float(bag.step)), "sum": state["sum"][:n]}
    if name == "adam" and bag.step:
        return {"step": bag.step, "exp_avg": state["exp_avg"][:n], "exp_avg_sq": state["exp_avg_sq"][:n]}
    return {}


def _load_torch_state(bag: WholeTableBag, name: str, saved: dict) -> None:
    n, state = bag.num_embeddings, bag.state()
    with torch.no_grad():
        for key, buffer in state.items():
            if key in saved:
                buffer[:n].copy_(saved[key])
            else:  # a state torch had not made yet (SparseAdam before its first step)
                buffer.fill_(bag.optimizer.initial_state_value(key))
    bag.step = int(saved.get("step", 0))
