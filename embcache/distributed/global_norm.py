"""Batch normalisation over the global batch when it is split over ranks, on any device.

Why: the face backbones normalise with BatchNorm, and a rank that normalised its slice alone
would train a different net from one process on the whole batch (N ranks would not be the
1-rank run with the same global batch). `torch.nn.SyncBatchNorm` does this on GPUs only;
`GlobalBatchNorm` does it with two autograd-aware all-reduces (the sum and count, then the sum
of squared deviations: the same two-pass arithmetic as a single-process batch norm, so the
statistics agree with one process to rounding), on gloo as on NCCL.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .world import current

# torch 2.x marks these autograd-aware collectives deprecated in favour of a private module;
# they are the public way to all-reduce / all-gather with a gradient, so keep them quiet
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional", category=FutureWarning)


class GlobalBatchNorm(_BatchNorm):
    """A BatchNorm (1d or 2d: channels on dim 1) whose training statistics are those of the
    global batch; in eval mode, or on one process, it is a plain batch norm.

    Its parameters and buffers are a BatchNorm's, under the same names, so checkpoints
    move between the two.

    Example:
        >>> bn = GlobalBatchNorm(4)
        >>> bn(torch.randn(8, 4)).shape  # one process: a plain batch norm
        torch.Size([8, 4])
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (channels on dim 1), got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and current().distributed):
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        count = x.new_full((1,), x.numel() // max(1, x.shape[1]))
        totals = _all_sum(torch.cat([x.sum(dims), count]))  # one all-reduce for sum and count
        n = totals[-1]
        mean = totals[:-1] / n
        shape = [1, -1] + [1] * (x.dim() - 2)
        centred = x - mean.view(shape)
        var = _all_sum((centred * centred).sum(dims)) / n
        if self.track_running_stats:
            self._track(mean.detach(), var.detach(), float(n.detach()))
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        """Running statistics as BatchNorm keeps them (the variance unbiased)."""
        self.num_batches_tracked.add_(1)
        m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - m).add_(mean, alpha=m)
        self.running_var.mul_(1 - m).add_(var * (n / max(n - 1.0, 1.0)), alpha=m)


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
