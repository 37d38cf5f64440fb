"""The pooled embeddings' all-to-all as autograd functions (`sharded_collection`): their
gradients go back the way the values came, waited for at once (`AllToAll`) or, when the
exchange overlaps compute, started by one node of the backward (`ReceivedPooled`) and
waited for by a later one (`AwaitGradient`), so that what autograd runs in between (the
bottom MLP's backward) overlaps them."""
from __future__ import annotations

import torch
import torch.distributed as dist


class AllToAll(torch.autograd.Function):
    """`all_to_all_single` whose backward sends the gradients back the way the values came."""

    @staticmethod
    def forward(ctx, send, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = send.new_empty(sum(recv_splits))
        dist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        back = grad.new_empty(sum(send_splits))
        dist.all_to_all_single(back, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return back, None, None, None


class GradientExchange:
    """The gradients' exchange of a started batch, between `ReceivedPooled.backward`, which
    starts it, and `AwaitGradient.backward`, which waits for it."""

    work = None
    sent: torch.Tensor | None = None  # kept alive until the exchange is done


class ReceivedPooled(torch.autograd.Function):
    """The received pooled embeddings (`recv`, already exchanged) as a function of this rank's
    lookups (`pooled`): the backward starts sending the gradients to the owners and returns
    the buffer they arrive in, not yet filled; `AwaitGradient` waits before anything reads it."""

    @staticmethod
    def forward(ctx, pooled, recv, send_splits, recv_splits, group, gradient: GradientExchange, finish_prefetch):
        ctx.shape, ctx.splits, ctx.group, ctx.gradient = pooled.shape, (send_splits, recv_splits), group, gradient
        ctx.finish_prefetch = finish_prefetch
        return recv

    @staticmethod
    def backward(ctx, grad):
        ctx.finish_prefetch()  # the next batch's ids, sent by its prefetch after this forward, arrive first
        send_splits, recv_splits = ctx.splits
        back = grad.new_empty(sum(send_splits))
        ctx.gradient.sent = grad.contiguous()
        ctx.gradient.work = dist.all_to_all_single(back, ctx.gradient.sent, send_splits, recv_splits,
                                                   group=ctx.group, async_op=True)
        return back.view(ctx.shape), None, None, None, None, None, None


class AwaitGradient(torch.autograd.Function):
    """Identity whose backward waits for the gradients' exchange (`GradientExchange`) before
    passing them on to the lookups (whose backward updates the cached rows)."""

    @staticmethod
    def forward(ctx, pooled, gradient: GradientExchange):
        ctx.gradient = gradient
        return pooled.view_as(pooled)

    @staticmethod
    def backward(ctx, grad):
        ctx.gradient.work.wait()
        ctx.gradient.work = ctx.gradient.sent = None
        return grad, None
