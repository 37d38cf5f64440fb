"""Shared pieces of the cache tests: Zipf traces and uncached reference training."""
import numpy as np
import torch
from torch import nn

from embcache.cache.optimizers import torch_equivalent


def zipf_batches(num_rows, steps, bags, bag_size, seed=0, a=1.2, two_d=False):
    """Batches of Zipf-distributed ids (hot ids scattered over the table)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_rows)
    out = []
    for _ in range(steps):
        if two_d:
            ids = perm[(rng.zipf(a, (bags, bag_size)) - 1) % num_rows]
            out.append((torch.from_numpy(ids), None))
        else:
            lengths = rng.integers(0, 2 * bag_size, bags)
            ids = perm[(rng.zipf(a, int(lengths.sum())) - 1) % num_rows]
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            out.append((torch.from_numpy(ids), torch.from_numpy(offsets)))
    return out


class RowWiseAdagradReference:
    """A direct, dense statement of row-wise Adagrad on the whole table."""

    def __init__(self, weight, lr, eps=1e-10):
        self.weight, self.lr, self.eps = weight, lr, eps
        self.sum = torch.zeros(weight.shape[0], 1)

    def zero_grad(self):
        self.weight.grad = None

    def step(self):
        g = self.weight.grad.coalesce()
        rows, vals = g.indices()[0], g.values()
        with torch.no_grad():
            self.sum[rows] += vals.pow(2).mean(1, keepdim=True)
            self.weight[rows] -= self.lr * (vals / (self.sum[rows].sqrt() + self.eps))


def reference_bag(weight, mode, optimizer, lr):
    ref = nn.EmbeddingBag(weight.shape[0], weight.shape[1], mode=mode, sparse=True,
                          _weight=weight.clone())
    if optimizer == "rowwise_adagrad":
        return ref, RowWiseAdagradReference(ref.weight, lr)
    return ref, torch_equivalent(optimizer, ref.parameters(), lr)


def step_alike(bags, batches, i, depth):
    """Train step `i` of `batches` ((ids, offsets) pairs) on each bag as the trainer does:
    the forward, then the prefetch of the batch `depth` ahead, then a backward of the
    outputs' squares. Returns the outputs, for the caller to compare."""
    outs = []
    for bag in bags:
        out = bag(*batches[i])
        if i + depth < len(batches):
            bag.prefetch(*batches[i + depth])
        (out * out).sum().backward()
        outs.append(out)
    return outs


def long_runs_padded(g: torch.Generator):
    """A batch of 100 bags over three rows (runs of about 100 lookups each, longer than the
    fused kernel's chunks of 64), and the same batch padded as a captured step pads it
    (`nn.fixed_capacity.pad_features`: one extra bag of about 150 lookups repeating the
    first id): `(ids, offsets, padded_ids, padded_offsets)`."""
    counts = torch.randint(1, 6, (100,), generator=g)
    ids = torch.randint(0, 3, (int(counts.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
    padded_ids = torch.cat([ids, ids[:1].expand(450 - ids.numel())])
    return ids, offsets, padded_ids, torch.cat([offsets, torch.tensor([ids.numel()])])
