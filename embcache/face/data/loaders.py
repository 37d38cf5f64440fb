"""The two loaders of F2C training and the pair batch they make together.

- `IdentityLoader`: per epoch a shuffled order of the identities with at least two samples;
  each step takes the next `pairs` identities and two different samples of each. Every
  identity is seen once per epoch, so every identity enters the class pool.
- `InstanceLoader`: ordinary shuffled samples, a new permutation each pass over the data.

Both are pure functions of (seed, epoch, step): a resumed run sees exactly the batches an
uninterrupted run would, with no loader state to save. Under several processes each rank
loads only its part of the same global batch (`PairBatches.get(..., part=(rank, size))`), so
N ranks together see exactly the batches one process sees.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from embcache.partition import slice_bounds


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for p in parts:
        seed = (seed * 1_000_003 + int(p) + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


class IdentityLoader:
    def __init__(self, source, pairs: int, seed: int = 0):
        self.source, self.pairs, self.seed = source, int(pairs), seed
        # a source whose every identity has pairs (synthetic) needs no table of them: 8 bytes a class
        # were held from the start (`face evaluate` too, which draws no batch), 8 GB at 10^9 classes
        self.identities = None if getattr(source, "all_eligible", False) else source.eligible_identities()
        self.count = source.num_classes if self.identities is None else self.identities.numel()
        if self.count == 0:
            raise ValueError(f"{source.name}: no identity has two samples; the identity loader needs pairs")
        self.pairs = min(self.pairs, self.count)
        self.steps_per_epoch = self.count // self.pairs
        self._perm_epoch, self._perm = None, None

    def batch(self, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sample ids of first views, of second views, labels) of step `step` of `epoch`."""
        if self._perm_epoch != epoch:
            self._perm = torch.randperm(self.count, generator=_generator(self.seed, 1, epoch))
            self._perm_epoch = epoch
        labels = self._perm[step * self.pairs:(step + 1) * self.pairs]
        if self.identities is not None:
            labels = self.identities[labels]
        gen = _generator(self.seed, 2, epoch, step)
        count = self.source.count_of(labels)
        r1 = (torch.rand(labels.numel(), generator=gen, dtype=torch.float64) * count).long()
        r2 = (r1 + 1 + (torch.rand(labels.numel(), generator=gen, dtype=torch.float64) * (count - 1)).long()) % count
        return self.source.sample_ids(labels, r1), self.source.sample_ids(labels, r2), labels


class InstanceLoader:
    def __init__(self, source, batch_size: int, seed: int = 0):
        self.source, self.batch_size, self.seed = source, int(batch_size), seed
        self.n = source.num_samples
        self._cycle, self._perm = None, None

    def _permutation(self, cycle: int) -> torch.Tensor:
        if self._cycle != cycle:
            self._perm = torch.randperm(self.n, generator=_generator(self.seed, 3, cycle))
            self._cycle = cycle
        return self._perm

    def batch(self, global_step: int) -> torch.Tensor:
        """Sample ids of the `global_step`-th batch of the endless shuffled stream."""
        if self.batch_size == 0:
            return torch.empty(0, dtype=torch.long)
        start, parts = global_step * self.batch_size, []
        while sum(p.numel() for p in parts) < self.batch_size:
            cycle, pos = divmod(start, self.n)
            take = min(self.batch_size - sum(p.numel() for p in parts), self.n - pos)
            parts.append(self._permutation(cycle)[pos:pos + take])
            start += take
        return torch.cat(parts)


@dataclass
class PairBatch:
    """One training step's samples: `pairs` identities with two views each (`a`, `b`) and
    `instances` shuffled samples (`c`), with their labels. `dropped` counts unreadable samples
    left out (their rows are removed; they are also logged by the source)."""

    a: torch.Tensor
    b: torch.Tensor
    pair_labels: torch.Tensor
    c: torch.Tensor
    instance_labels: torch.Tensor
    dropped: int = 0


class PairBatches:
    """Combines the identity loader (`batch_size // 4` pairs, i.e. half of the images) and the
    instance loader (the other half) into one `PairBatch` per step.

    A step holds at most as many images as the data has (`size`): instances fill the batch
    only up to the source's sample count. A step's memory is what the backbone saves for
    backward a sample (about 45 MiB for IResNet-18 at 112 x 112) times its images, so a batch
    of 128 drawn from 48 images (each more than twice, in one step) held 5,684 MiB where the
    data's 48 need 2,166 MiB.

    Args:
        source: a face source (synthetic, image folder, RecordIO).
        batch_size: images per step (>= 4).
        flip: random horizontal flips for image samples.
    """

    def __init__(self, source, batch_size: int, seed: int = 0, flip: bool = True):
        if batch_size < 4:
            raise ValueError(f"batch size must be at least 4 (pairs + instances), got {batch_size}")
        self.source, self.seed = source, seed
        self.identity = IdentityLoader(source, batch_size // 4, seed)
        pair_images = 2 * self.identity.pairs
        self.instance = InstanceLoader(source, min(batch_size - pair_images, source.num_samples - pair_images), seed)
        self.size = pair_images + self.instance.batch_size
        self.flip = flip and len(source.sample_shape) == 3
        self.steps_per_epoch = self.identity.steps_per_epoch

    def get(self, epoch: int, step: int, part: tuple[int, int] = (0, 1)) -> PairBatch:
        """Step `step` of `epoch`; with `part=(rank, size)` only that rank's share of it: its
        slice of the pairs (both views stay together) and its slice of the instances, with
        the flips the whole batch would have had (the draws are made for the whole batch)."""
        global_step = epoch * self.steps_per_epoch + step
        ia, ib, y = self.identity.batch(epoch, step)
        ic = self.instance.batch(global_step)
        flips = None
        if self.flip:
            gen = _generator(self.seed, 4, global_step)
            flips = [torch.rand(n, generator=gen) < 0.5 for n in (ia.numel(), ib.numel(), ic.numel())]
        p0, p1 = slice_bounds(ia.numel(), part[1], part[0])
        c0, c1 = slice_bounds(ic.numel(), part[1], part[0])
        ia, ib, y, ic = ia[p0:p1], ib[p0:p1], y[p0:p1], ic[c0:c1]
        # one load for the three (a source's cost per call is not small beside its cost per sample)
        x, ok = self.source.load(torch.cat([ia, ib, ic]))
        sizes = [ia.numel(), ib.numel(), ic.numel()]
        (xa, xb, xc), (oka, okb, okc) = x.split(sizes), ok.split(sizes)
        pair_ok = oka & okb
        if flips is not None:
            xa, xb = _flip(xa, flips[0][p0:p1]), _flip(xb, flips[1][p0:p1])
            xc = _flip(xc, flips[2][c0:c1])
        dropped = int((~oka).sum() + (~okb).sum() + (~okc).sum())
        return PairBatch(xa[pair_ok], xb[pair_ok], y[pair_ok], xc[okc], self.source.label_of(ic)[okc], dropped)


def _flip(images: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror the images of a [B, 3, H, W] batch where `flip` is set."""
    out = images.clone()
    out[flip] = images[flip].flip(-1)
    return out
