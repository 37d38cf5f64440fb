"""Heads: the DCP loss's gradient equals autograd of a loop-based implementation written
from the definition; margins match their formulas; Partial FC updates exactly the sampled
rows as torch's SGD would; labels out of range are refused with their index."""
import math

import pytest
import torch
import torch.nn.functional as F

from embcache.nn.heads import DCPHead, FullFC, PartialFC, apply_margin, dcp_loss


def loop_dcp_loss(probe, slots, centres, valid, kind, m, s, k, positives, has_positive):
    """One probe and one slot at a time, scalars only."""
    total = 0.0
    q = centres.shape[0]
    for i in range(probe.shape[0]):
        p = probe[i] / probe[i].norm()
        cos = [sum(p[d] * centres[j, d] for d in range(p.shape[0])) for j in range(q)]
        live = [j for j in range(q) if valid[j]]
        if slots[i] >= 0:
            t = int(slots[i])
            ct = sum(p[d] * positives[i, d] for d in range(p.shape[0])) if has_positive[i] else cos[t]
            if kind == "arcface":
                theta = torch.acos(ct.clamp(-1 + 1e-7, 1 - 1e-7))
                target = torch.cos(theta + m) if theta + m < math.pi else ct - m * math.sin(m)
            else:
                target = ct - m
            logits = [s * target if j == t else s * cos[j] for j in live]
            mx = max(float(x.detach()) for x in logits)
            lse = mx + torch.log(sum(torch.exp(x - mx) for x in logits))
            total = total + (lse - s * target)
        elif live:
            top = sorted((cos[j] for j in live), key=lambda c: float(c.detach()), reverse=True)[:min(k, len(live))]
            total = total + sum(torch.clamp(c, min=0) for c in top) / len(top)
    return total / probe.shape[0]


@pytest.mark.parametrize("kind", ["arcface", "cosface"])
def test_dcp_loss_gradient_equals_loop_reference(kind):
    gen = torch.Generator().manual_seed(3)
    b, q, d = 7, 6, 5
    probe = torch.randn(b, d, generator=gen, dtype=torch.float64)
    centres = F.normalize(torch.randn(q, d, generator=gen, dtype=torch.float64), dim=1)
    valid = torch.tensor([True, True, False, True, True, True])
    slots = torch.tensor([0, 3, -1, 5, -1, 1, 4])
    positives = F.normalize(torch.randn(b, d, generator=gen, dtype=torch.float64), dim=1)
    has_positive = torch.tensor([True, False, False, True, False, False, True])
    args = (valid, kind, 0.5, 8.0, 2)
    x1 = probe.clone().requires_grad_()
    x2 = probe.clone().requires_grad_()
    fast = dcp_loss(x1, slots, centres, *args, positives=positives, has_positive=has_positive)
    slow = loop_dcp_loss(x2, slots, centres, valid, kind, 0.5, 8.0, 2, positives, has_positive)
    fast.backward()
    slow.backward()
    assert torch.allclose(fast, slow, atol=1e-10)
    assert torch.allclose(x1.grad, x2.grad, atol=1e-8)
    assert x1.grad.abs().sum() > 0


def test_margins_follow_their_formulas():
    theta = torch.linspace(0.01, math.pi - 0.01, 50, dtype=torch.float64)
    cos = torch.cos(theta)
    arc = apply_margin(cos, "arcface", 0.5)
    inside = theta + 0.5 < math.pi
    assert torch.allclose(arc[inside], torch.cos(theta[inside] + 0.5))
    assert bool((arc[1:] < arc[:-1]).all())  # still decreasing past pi - m
    assert torch.allclose(apply_margin(cos, "cosface", 0.35), cos - 0.35)
    with pytest.raises(ValueError):
        apply_margin(cos, "sphereface", 0.5)


def test_partial_fc_updates_sampled_rows_like_torch_sgd():
    torch.manual_seed(0)
    head = PartialFC(50, 4, sample_rate=0.2, momentum=0.9, weight_decay=1e-3, seed=1)
    ref = torch.nn.Parameter(head.weight.clone())
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, weight_decay=1e-3)
    for step in range(3):
        feats = torch.randn(6, 4, requires_grad=True)
        labels = torch.randint(0, 50, (6,))
        gen_state = head.generator.get_state()
        rows, target = head.sample(labels)
        head.generator.set_state(gen_state)
        assert rows.numel() == 10 and torch.isin(labels, rows).all()
        assert torch.equal(rows[target], labels)
        before = head.weight.clone()
        head.loss(feats, labels).backward()
        head.after_backward(0.1)
        # the reference: the same loss through a dense parameter, restricted to the sampled rows
        sub = ref[rows]
        from embcache.nn.heads import margin_softmax_loss
        cos = F.normalize(feats.detach(), dim=1) @ F.normalize(sub, dim=1).t()
        loss = margin_softmax_loss(cos, target, "arcface", 0.5, 64.0).mean()
        opt.zero_grad()
        loss.backward()
        grad = ref.grad.clone()
        untouched = torch.ones(50, dtype=torch.bool)
        untouched[rows] = False
        # torch.optim.SGD would decay and move every row; Partial FC moves only the sampled ones
        with torch.no_grad():
            ref.grad = grad
            mask = untouched[:, None].expand_as(ref)
            keep = ref.detach().clone()
            state_before = opt.state[ref]["momentum_buffer"].clone() if ref in opt.state else None
            opt.step()
            ref[mask] = keep[mask]
            if state_before is not None:
                opt.state[ref]["momentum_buffer"][mask] = state_before[mask]
            else:
                opt.state[ref]["momentum_buffer"][mask] = 0
        assert torch.allclose(head.weight, ref.detach(), atol=1e-6)
        assert torch.equal(head.weight[untouched], before[untouched])


def test_heads_refuse_labels_out_of_range_with_their_index():
    for head in (FullFC(10, 4), PartialFC(10, 4), DCPHead(10, 4, num_slots=3)):
        with pytest.raises(ValueError, match=r"label 10 at batch index 2"):
            head.loss(torch.randn(3, 4), torch.tensor([1, 2, 10]))


def test_full_fc_loss_drops_when_trained():
    torch.manual_seed(123)
    head = FullFC(5, 8, margin=0.2, scale=16, seed=0)
    labels = torch.arange(20) % 5
    feats = torch.randn(5, 8)[labels] + 0.1 * torch.randn(20, 8)
    opt = torch.optim.SGD(head.parameters(), lr=1.0)
    first = float(head.loss(feats, labels).detach())
    for _ in range(50):
        opt.zero_grad()
        head.loss(feats, labels).backward()
        opt.step()
    assert float(head.loss(feats, labels).detach()) < 0.5 * first
