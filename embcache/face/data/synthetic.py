"""Synthetic identities, generated on the fly: nothing is stored per identity, so the label
space can have millions of classes.

Identity `y` has a centre `c_y`, a random unit direction in an `id_dim`-dimensional identity
space. Its sample `k` is a noisy view: `c_y + noise * e` (`e` of unit expected norm) beside a
large per-sample nuisance vector, the two mixed by a fixed random rotation into `dim`
dimensions (and, for images, projected to 3 x S x S pixels). Cosines of raw samples are
dominated by the nuisance, so good verification needs a learned embedding. Every random
number comes from a counter-based hash of (seed, identity, sample, coordinate): any sample of
any identity is reproducible on its own, in any order.

Training identities are `0 .. num_classes-1`; held-out identities (for verification pairs and
identification) follow them and are never trained on.
"""
from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift / multiply rounds) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def _mix_int(x: int) -> int:
    """`_mix` of one value, in Python (the same bits, without a tensor op per round)."""
    for _ in range(2):
        x ^= x >> 16
        x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def hashed_normal(seed: int, a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """[m, n] standard normals, a pure function of (seed, a[i], b[i], column), in torch's
    default dtype (as the source's rotation is: float32 unless a caller, such as the
    float64 comparisons of tests/test_face_distributed.py, set another)."""
    h = _mix((a.long() & _M32) ^ _mix_int(seed & _M32))
    h = _mix(h ^ ((b.long() * 0x2545F49) & _M32))
    cols = torch.arange(2 * n, dtype=torch.long)
    u = (_mix(h[:, None] ^ ((cols[None, :] * 0x61C8864) & _M32)).double() + 0.5) / 2.0**32
    u1, u2 = u[:, :n], u[:, n:]
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(torch.get_default_dtype())


class SyntheticFaces:
    """A face-like classification task with `num_classes` identities, none stored.

    Args:
        num_classes: training identities.
        samples_per_class: samples (views) of each training identity.
        dim: size of a feature-vector sample; id_dim: dimension of the identity space.
        noise: within-identity noise (relative to the unit centre); nuisance: norm of the
            per-sample nuisance vector.
        image_size: 0 for feature vectors, else samples are 3 x S x S images.
        num_eval_classes: held-out identities for evaluation.

    Example:
        >>> task = SyntheticFaces(1_000_000, dim=32, id_dim=8)
        >>> task.load(task.sample_ids(torch.tensor([999_999]), torch.tensor([3])))[0].shape
        torch.Size([1, 32])
    """

    def __init__(self, num_classes: int, samples_per_class: int = 8, dim: int = 64, id_dim: int = 16,
                 noise: float = 0.7, nuisance: float = 3.0, image_size: int = 0, num_eval_classes: int = 500,
                 seed: int = 0):
        if num_classes < 1 or samples_per_class < 2:
            raise ValueError("the synthetic task needs at least 1 identity and 2 samples per identity")
        if not 0 < id_dim <= dim:
            raise ValueError(f"id_dim must be in (0, dim], got {id_dim} with dim {dim}")
        self.num_classes, self.samples_per_class = int(num_classes), int(samples_per_class)
        self.dim, self.id_dim, self.noise, self.nuisance = dim, id_dim, noise, nuisance
        self.image_size, self.num_eval_classes, self.seed = image_size, num_eval_classes, seed
        gen = torch.Generator().manual_seed(seed)
        self.rotation = torch.linalg.qr(torch.randn(dim, dim, generator=gen))[0]
        self.to_pixels = None
        if image_size:
            self.to_pixels = torch.randn(3 * image_size * image_size, dim, generator=gen) / math.sqrt(dim)
        self.sample_shape = (3, image_size, image_size) if image_size else (dim,)
        self.num_samples = self.num_classes * self.samples_per_class
        self.name = f"synthetic({num_classes:,} identities)"

    # -- the source interface used by the loaders ----------------------------------------
    def count_of(self, labels: torch.Tensor) -> torch.Tensor:
        return torch.full_like(labels, self.samples_per_class)

    def sample_ids(self, labels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
        return labels * self.samples_per_class + ranks

    def label_of(self, ids: torch.Tensor) -> torch.Tensor:
        return ids // self.samples_per_class

    # every identity has `samples_per_class` >= 2 samples: the identity loader keeps no table of them
    all_eligible = True

    def eligible_identities(self) -> torch.Tensor:
        """Identities with at least two samples (all of them here)."""
        return torch.arange(self.num_classes)

    def load(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(samples, ok mask); synthetic samples are never bad."""
        ids = ids.cpu().long()
        x = self.generate(ids // self.samples_per_class, ids % self.samples_per_class)
        return x, torch.ones(ids.numel(), dtype=torch.bool)

    # -- generation ----------------------------------------------------------------------
    def centres(self, labels: torch.Tensor) -> torch.Tensor:
        c = hashed_normal(self.seed, labels, torch.full_like(labels, -1), self.id_dim)
        return torch.nn.functional.normalize(c, dim=1)

    def generate(self, labels: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        labels, k = labels.long(), k.long()
        z = self.centres(labels) + self.noise * hashed_normal(self.seed + 1, labels, k, self.id_dim) / math.sqrt(
            self.id_dim)
        parts = [z]
        if self.dim > self.id_dim:
            u = hashed_normal(self.seed + 2, labels, k, self.dim - self.id_dim)
            parts.append(self.nuisance * u / math.sqrt(self.dim - self.id_dim))
        x = torch.cat(parts, 1) @ self.rotation.t()
        if self.to_pixels is not None:
            x = (x @ self.to_pixels.t()).view(-1, *self.sample_shape)
        return x

    # -- held-out evaluation sets --------------------------------------------------------
    def eval_label(self, i: torch.Tensor) -> torch.Tensor:
        return self.num_classes + i

    def verification_pairs(self, num_pairs: int = 6000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(first samples, second samples, is-same) over held-out identities, half positive,
        alternating, so that every contiguous fold is balanced."""
        gen = torch.Generator().manual_seed(self.seed + 7)
        e = self.num_eval_classes
        same = torch.arange(num_pairs) % 2 == 0
        ya = torch.randint(0, e, (num_pairs,), generator=gen)
        yb = torch.where(same, ya, (ya + torch.randint(1, e, (num_pairs,), generator=gen)) % e)
        ka = torch.randint(0, 10**6, (num_pairs,), generator=gen) * 2
        kb = ka + 1  # a different view even when the identity is the same
        a = self.generate(self.eval_label(ya), ka)
        b = self.generate(self.eval_label(yb), kb)
        return a, b, same

    def identification_set(self, probes_per_class: int = 2) -> tuple[torch.Tensor, ...]:
        """(gallery samples, gallery labels, probe samples, probe labels): one gallery sample
        and `probes_per_class` probes of each held-out identity."""
        y = torch.arange(self.num_eval_classes)
        gallery = self.generate(self.eval_label(y), torch.full_like(y, 10**7))
        py = y.repeat_interleave(probes_per_class)
        pk = 10**7 + 1 + torch.arange(probes_per_class).repeat(self.num_eval_classes)
        return gallery, y, self.generate(self.eval_label(py), pk), py
