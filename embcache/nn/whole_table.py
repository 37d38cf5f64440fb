"""A table kept whole on its device and trained by a row optimizer inside its own backward:
the cache's update without the cache, so that a whole table gets the project's kernels too.

Torch trains a whole table through a sparse gradient: `coalesce` sums it (a sort and a
reduction the size of the batch's lookups times the dim), then the optimizer's `index_put`.
Here the backward hands the bag's output gradient straight to the update, as the device
bookkeeper's does: with `kernels="triton"` one fused kernel (`embcache.kernels.fused_update`)
over the lookups in sorted order, with `kernels="torch"` the cache's torch path
(`lookup_terms`, then `summed_in_torch_order` and `update_rows`), which equals
`nn.EmbeddingBag(sparse=True)` trained by the matching torch optimizer to the bit. So a
benchmark's whole-table baseline is the best whole-table step the project has, and a
whole-table step has no host sync and no data-dependent shape (what a CUDA graph needs).

Rows are float32; the table holds one spare row past its last (`num_embeddings`), where the
torch path's duplicate entries add nothing (`summed_in_torch_order` points them there), and
where a fixed-capacity batch's pad lookups go (`padded_samples`).

Its state dict is `nn.EmbeddingBag`'s (`weight`, `[N, D]`), so that a collection of these
saves and loads as one of torch's bags; the optimizer's state is saved apart, as a torch
optimizer's is (`nn.in_backward.InBackwardOptimizer` writes it in torch's own form).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embcache.cache.choices import KERNELS
from embcache.cache.bookkeeping.device_updates import lookup_bags, lookup_terms
from embcache.cache.bookkeeping.fixed_size import DeviceCount, pick, summed_in_torch_order
from embcache.cache.optimizers import RowRounding, make_optimizer, update_rows
from embcache.device import values_on_host


class WholeTableBag(nn.Module):
    """`nn.EmbeddingBag(sparse=True)` plus its optimizer, in one module (module docstring).

    Args:
        weight: the initial `[N, D]` table (copied to `device`, float32).
        optimizer: "sgd" | "adagrad" | "rowwise_adagrad" | "adam"; lr and further
            arguments by torch's names.
        mode: "sum" | "mean".
        kernels: "torch" | "triton" | "auto" (`embcache.kernels.resolve_kernels`).
        include_last_offset: `offsets` end with the number of ids, as torchrec's bags take them.

    Example:
        >>> bag = WholeTableBag(torch.zeros(10, 4), "sgd", lr=0.5, kernels="torch")
        >>> bag(torch.tensor([1, 1, 2]), torch.tensor([0, 2])).sum().backward()
        >>> bag.weight[1].tolist(), bag.weight[3].tolist()
        ([-1.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, weight: torch.Tensor, optimizer: str = "adagrad", lr: float = 0.01, mode: str = "sum",
                 kernels: str = "auto", device=None, include_last_offset: bool = False, **optimizer_kwargs):
        super().__init__()
        from embcache.kernels import resolve_kernels

        if mode not in ("sum", "mean"):
            raise ValueError(f"mode must be 'sum' or 'mean', got {mode!r}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        device = torch.device(device) if device is not None else weight.device
        n, dim = weight.shape
        self.num_embeddings, self.embedding_dim, self.mode = n, dim, mode
        self.include_last_offset = include_last_offset
        self.optimizer = make_optimizer(optimizer, lr, **optimizer_kwargs)
        table = torch.zeros(n + 1, dim, dtype=torch.float32, device=device)
        table[:n] = weight.detach().to(device, torch.float32)
        self.register_buffer("table", table, persistent=False)  # saved as `weight` (module docstring)
        for name, t in self.optimizer.init_state(n + 1, dim, device).items():
            self.register_buffer(f"optimizer_{name}", t, persistent=False)
        self.kernels = resolve_kernels(kernels, device)
        self.step = 0
        self._step_count = DeviceCount(torch.int64, device)  # Adam's, read on the device (a replay's own)
        self._rounding = RowRounding(torch.float32)

    @property
    def weight(self) -> torch.Tensor:
        """The table's rows, `[N, D]` (a view: it changes as the table trains)."""
        return self.table[: self.num_embeddings]

    def state(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, f"optimizer_{name}") for name in self.optimizer.state_widths(1)}

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
        elif tuple(state_dict[key].shape) != tuple(self.weight.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(state_dict[key].shape)}, "
                              f"the shape in the current model is {tuple(self.weight.shape)}")
        else:
            with torch.no_grad():
                self.weight.copy_(state_dict[key])
        unexpected_keys += [k for k in state_dict if k.startswith(prefix) and k != key and "." not in k[len(prefix):]]

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None, padded_samples: int = 0) -> torch.Tensor:
        """Pooled rows of `input` (1-D with `offsets`, or 2-D fixed-size bags), as
        `nn.EmbeddingBag`; in training with gradients on, the backward updates the rows.
        `padded_samples`: the last bags only pad a batch to a fixed capacity
        (`nn.fixed_capacity`): their lookups read the spare row, so that their zero terms
        sort after every real one (each row's sum is the unpadded batch's), and their pooled
        rows are left out of the result."""
        if input.dim() == 2:
            offsets = torch.arange(0, input.numel(), input.shape[1], device=input.device)
            input = input.reshape(-1)
            per_sample_weights = None if per_sample_weights is None else per_sample_weights.reshape(-1)
        elif self.include_last_offset:
            offsets = offsets[:-1]
        if padded_samples:  # on the device, no count read: positions from the first pad bag's start
            pads = torch.arange(input.numel(), device=input.device) >= offsets[-padded_samples]
            input = torch.where(pads, self.num_embeddings, input)
        if not (self.training and torch.is_grad_enabled()):
            pooled = self._pool(input, offsets, per_sample_weights)
        else:
            anchor = torch.empty(0, device=self.table.device, requires_grad=True)
            pooled = _UpdateInBackward.apply(anchor, input, offsets, per_sample_weights, self)
        return pooled[: pooled.shape[0] - padded_samples] if padded_samples else pooled

    def _pool(self, ids, offsets, weights) -> torch.Tensor:
        if self.kernels == "triton":
            from embcache.kernels import pooled_lookup

            return pooled_lookup(self.table, ids, offsets, weights, self.mode)
        return F.embedding_bag(ids, self.table, offsets, mode=self.mode, per_sample_weights=weights)

    def advance_steps(self, n: int) -> None:
        """Count `n` steps that replays of a captured step took (their Python did not run)."""
        self.step += n
        self._step_count.replayed(n)

    def update(self, grad_out: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,
               weights: torch.Tensor | None) -> None:
        """One optimizer step of the rows `ids` looked up, from the bag's output gradient.
        Adam reads the step count on the device (`Adam.step_size_of`): a replayed step
        corrects by its own step, not the capture's."""
        self.step += 1
        step = self._step_count.follow(self.step) if self.optimizer.name == "adam" else self.step
        grad_out = grad_out.to(torch.float32).contiguous()
        state = self.state()
        if self.kernels == "triton":
            from embcache.kernels.fused_update import fused_row_update, optimizer_factors, state_tensors

            # the order torch sums a row's terms in: lookup order for SGD (its terms are added
            # one by one), else coalesce's sort: stable off the CPU, the CPU's own on it (but
            # where the CPU acts as the device, `embcache.device.CPU_ACTS_AS_DEVICE`)
            stable = not self.optimizer.needs_coalesced or not values_on_host(ids)
            keys, order = ids.sort(stable=True) if stable else ids.sort()
            bags, scale = lookup_bags(ids, offsets, self.mode)
            stochastic = self._rounding.salt(self.step) if self._rounding.mode == "stochastic" else None
            fused_row_update(self.table, *state_tensors(state, self.table), keys, order, ids, bags, grad_out,
                             scale, weights, **optimizer_factors(self.optimizer, step), stochastic_salt=stochastic)
            return
        terms = lookup_terms(grad_out, ids, offsets, weights, self.mode)
        rows, distinct = ids, False
        if self.optimizer.needs_coalesced:
            keys, terms = summed_in_torch_order(ids, terms, stable=not values_on_host(ids))
            rows, distinct = pick(keys >= 0, keys, self.num_embeddings), True
        update_rows(self.optimizer, self.table, state, rows, terms, step,
                    None, self._rounding,  # float32 rows: no row ids for a rounding
                    distinct=distinct, fixed_size=True)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, "
                f"optimizer={self.optimizer.name!r}, kernels={self.kernels!r}")


class _UpdateInBackward(torch.autograd.Function):
    """The pooled lookup whose backward is the table's update (`anchor`, an empty leaf that
    requires grad, is what makes autograd call it)."""

    @staticmethod
    def forward(ctx, anchor, ids, offsets, weights, bag):
        ctx.save_for_backward(ids, offsets, weights)
        ctx.bag = bag
        return bag._pool(ids, offsets, weights)

    @staticmethod
    def backward(ctx, grad_out):
        ids, offsets, weights = ctx.saved_tensors
        ctx.bag.update(grad_out, ids, offsets, weights)
        return (None,) * 5
