"""Batch normalisation over the global batch when it is split over ranks, on any device.

Why: the face backbones normalise with BatchNorm, and a rank that normalised its slice alone
would train a different net from one process on the whole batch (N ranks would not be the
1-rank run with the same global batch). `torch.nn.SyncBatchNorm` does this on GPUs only;
`GlobalBatchNorm` does it on gloo as on NCCL with one autograd-aware all-reduce a layer in
the forward (each channel's sum, sum of squares and count, accumulated in float64, so the
statistics agree with one process to float32 rounding) and, through it, one in the
backward. A net's layers cannot share one all-reduce: each layer's statistics are of the
previous layer's normalised output. What can be shared is a layer's all-reduce between
several batches run through the net at once (`forward_apart`: the face trainer's gallery
net embeds both views of its pairs, each normalised as its own batch, with one all-reduce
a layer instead of two).

Per-rank batch norm (`--batch-norm local`, as insightface's arcface_torch trains) needs
none of this: each rank's plain BatchNorm sees its own slice; `average_running_stats`
then gives every rank the same running statistics (their mean over the ranks) before the
net is evaluated or saved.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .world import collective_device, current

# torch 2.x marks these autograd-aware collectives deprecated in favour of a private module;
# they are the public way to all-reduce / all-gather with a gradient, so keep them quiet
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional", category=FutureWarning)


class GlobalBatchNorm(_BatchNorm):
    """A BatchNorm (1d or 2d: channels on dim 1) whose training statistics are those of the
    global batch; in eval mode, or on one process, it is a plain batch norm.

    Its parameters and buffers are a BatchNorm's, under the same names, so checkpoints
    move between the two. `parts` (set by `forward_apart`) splits the batch into
    consecutive parts of those sizes, each normalised with its own statistics.

    Example:
        >>> bn = GlobalBatchNorm(4)
        >>> bn(torch.randn(8, 4)).shape  # one process: a plain batch norm
        torch.Size([8, 4])
    """

    parts: list[int] | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (channels on dim 1), got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and current().distributed):
            if self.parts is None:
                return super().forward(x)
            return torch.cat([super(GlobalBatchNorm, self).forward(p) for p in x.split(self.parts)])
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        parts = x.split(self.parts) if self.parts is not None else (x,)
        # one all-reduce for every part's sums, sums of squares and counts (float64: the
        # variance as E[x^2] - mean^2 loses nothing a float32 two-pass variance keeps)
        totals = _all_sum(torch.stack([torch.cat([p.sum(dims, dtype=torch.float64),
                                                  (p * p).sum(dims, dtype=torch.float64),
                                                  p.new_full((1,), p.numel() // max(1, c), dtype=torch.float64)])
                                       for p in parts]))
        shape = [1, -1] + [1] * (x.dim() - 2)
        outs = []
        for p, t in zip(parts, totals):
            n = t[-1]
            mean = t[:c] / n
            var = (t[c:2 * c] / n - mean * mean).clamp_min(0.0)
            if self.track_running_stats:
                self._track(mean.detach(), var.detach(), float(n.detach()))
            out = (p - mean.to(p.dtype).view(shape)) * torch.rsqrt(var + self.eps).to(p.dtype).view(shape)
            if self.affine:
                out = out * self.weight.view(shape) + self.bias.view(shape)
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        """Running statistics as BatchNorm keeps them (the variance unbiased)."""
        self.num_batches_tracked.add_(1)
        m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
        self.running_var.mul_(1 - m).add_((var * (n / max(n - 1.0, 1.0))).to(self.running_var.dtype), alpha=m)


def forward_apart(module: nn.Module, parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """`[module(p) for p in parts]`: each part a batch of its own. When `module`'s batch
    norms are all `GlobalBatchNorm`s and its other layers treat samples one by one (linear
    layers, convolutions, activations, pooling: the backbones here), in one pass, with one
    all-reduce a batch norm for all the parts together; otherwise one call a part.

    Example:
        >>> net = global_batch_norm(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)))
        >>> a, b = torch.randn(5, 3), torch.randn(5, 3) + 2
        >>> [torch.allclose(x, y, atol=1e-6) for x, y in zip(forward_apart(net, [a, b]), [net(a), net(b)])]
        [True, True]
    """
    sizes = [p.shape[0] for p in parts]
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    if not all(isinstance(m, GlobalBatchNorm) for m in norms):
        return [module(p) for p in parts]
    for m in norms:
        m.parts = sizes
    try:
        out = module(torch.cat(parts))
    finally:
        for m in norms:
            m.parts = None
    return list(out.split(sizes))


@torch.no_grad()
def average_running_stats(module: nn.Module) -> None:
    """Every batch norm's running mean and variance replaced by their mean over the ranks
    (one all-reduce; nothing on one process). For per-rank batch norm, whose statistics
    drift apart: the mean of the ranks' running means is the running mean of the global
    batch; their mean variance leaves out how far the slices' means differ."""
    if not current().distributed:
        return
    stats = [t for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
             for t in (m.running_mean, m.running_var)]
    if not stats:
        return
    flat = torch.cat([t.reshape(-1) for t in stats]).to(collective_device())
    dist.all_reduce(flat)
    flat = flat.to(stats[0].device) / current().size
    for t, v in zip(stats, flat.split([t.numel() for t in stats])):
        t.copy_(v.view_as(t))


def _all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, with the gradient summed back (every rank's loss depends on it)."""
    return dist_fn.all_reduce(t, op=dist.ReduceOp.SUM)


def global_batch_norm(module: nn.Module) -> nn.Module:
    """`module` with every BatchNorm replaced by a `GlobalBatchNorm` holding the same
    parameters and statistics (in place; returns `module`, or the replacement when
    `module` itself is a BatchNorm)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, GlobalBatchNorm):
        new = GlobalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats, device=_device_of(module))
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, global_batch_norm(child))
    return module


def _device_of(module: nn.Module) -> torch.device:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")
