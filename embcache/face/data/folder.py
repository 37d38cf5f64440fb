"""An image folder per identity: `root/<identity>/<image>.jpg|png|...`. Identities are the
sub-directories in sorted order (label = position); images are sorted by name within each."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from embcache.data.bad_rows import BadRowLog
from embcache.errors import DataFormatError

from .images import decode_image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


class IndexedFaces:
    """What the identity and instance loaders need from a labelled image collection whose
    samples are grouped by label: sample ids `offsets[y] .. offsets[y+1]-1` belong to `y`.
    Unreadable samples are skipped, logged once each in `bad` (file and index) and reported,
    not raised; `unreadable` holds their indices, so that a sample drawn again is skipped
    without another read. `read` names a sample `file#index` in its errors; `position` is
    what the index is called in the report (None: each file is one image).

    Under several ranks each rank reads its own samples: `take_fresh_unreadable` hands over
    the ones this source found unreadable since it was last asked, and `add_unreadable`
    takes another rank's, so that every rank's `bad` and `unreadable` are the whole run's."""

    def __init__(self, labels: torch.Tensor, image_size: int, name: str, position: str | None = None):
        self.labels = labels.long()
        if self.labels.numel() and bool((self.labels[1:] < self.labels[:-1]).any()):
            order = torch.argsort(self.labels, stable=True)
            self.order = order
            self.labels = self.labels[order]
        else:
            self.order = None
        self.num_classes = int(self.labels.max()) + 1 if self.labels.numel() else 0
        counts = torch.bincount(self.labels, minlength=self.num_classes)
        self.counts = counts
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        self.num_samples = int(self.labels.numel())
        self.sample_shape = (3, image_size, image_size)
        self.image_size = image_size
        self.name = name
        self.bad = BadRowLog(noun="unreadable image", position=position)
        self.unreadable: set[int] = set()
        self._fresh: list[tuple[int, str, int, str]] = []  # (raw index, file, index, reason) not yet taken

    def count_of(self, labels: torch.Tensor) -> torch.Tensor:
        return self.counts[labels]

    def sample_ids(self, labels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
        return self.offsets[labels] + ranks

    def label_of(self, ids: torch.Tensor) -> torch.Tensor:
        return self.labels[ids]

    def eligible_identities(self) -> torch.Tensor:
        return torch.nonzero(self.counts >= 2).flatten()

    def raw_index(self, sample_id: int) -> int:
        """The position of a sample in the source (file list or RecordIO index order)."""
        return int(self.order[sample_id]) if self.order is not None else int(sample_id)

    def load(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros(ids.numel(), *self.sample_shape)
        ok = torch.ones(ids.numel(), dtype=torch.bool)
        for i, sid in enumerate(ids.tolist()):
            raw = self.raw_index(sid)
            if raw in self.unreadable:  # logged when first read
                ok[i] = False
                continue
            try:
                out[i] = self.read(raw)
            except DataFormatError as err:  # "file#index: reason": logged per file, by index
                where, _, rest = str(err).partition(": ")
                file, _, index = where.rpartition("#")
                entry = (raw, file or where, int(index) if index.isdigit() else raw, rest)
                self.bad.add(*entry[1:])
                self.unreadable.add(raw)
                self._fresh.append(entry)
                ok[i] = False
        return out, ok

    def take_fresh_unreadable(self) -> list[tuple[int, str, int, str]]:
        """The samples found unreadable since the last call, as (raw index, file, index,
        reason) for `add_unreadable`; forgotten here once taken."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def add_unreadable(self, entries) -> None:
        """Samples another reader found unreadable (`take_fresh_unreadable`'s entries):
        logged and skipped from now on as if found here; the ones known already are left."""
        for raw, file, index, reason in entries:
            if raw not in self.unreadable:
                self.bad.add(file, index, reason)
                self.unreadable.add(raw)

    def read(self, index: int) -> torch.Tensor:
        raise NotImplementedError


class ImageFolderFaces(IndexedFaces):
    """Every identity sub-directory with its images, less the identities held out
    (`holdout`, a seeded fraction of those with two or more images): they are never trained
    on, and `heldout_set` gives their images for evaluation after each epoch, as the
    synthetic task's held-out identities are. Training labels are the kept identities'
    positions in sorted order.

    Example:
        >>> # ImageFolderFaces("datasets/my-faces", holdout=0.1)  # root/<identity>/*.jpg
    """

    def __init__(self, root: str | os.PathLike, image_size: int = 112, holdout: float = 0.0, seed: int = 0):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataFormatError(f"{self.root}: no such directory")
        identities = sorted(p for p in self.root.iterdir() if p.is_dir())
        # scandir: an entry says whether it is a folder without a stat of each of millions of images
        entries = [list(os.scandir(d)) for d in identities]
        files = [sorted(Path(e.path) for e in listing if not e.is_dir() and _is_image(e.name)) for listing in entries]
        left_out = _outside_layout(self.root, entries)
        if not any(files):
            raise DataFormatError(f"{self.root}: no images found (expected <root>/<identity>/<image>.jpg)")
        held = set(held_out_identities([len(f) for f in files], holdout, seed))
        # the most identities any --holdout holds out (`held_out_identities`): what a larger one can reach
        eligible = sum(len(f) >= 2 for f in files)
        self.holdable = eligible - 2 if eligible >= 4 else 0
        paths, labels, names = [], [], []
        for i, (d, imgs) in enumerate(zip(identities, files)):
            if i in held:
                continue
            paths += imgs
            labels += [len(names)] * len(imgs)
            names.append(d.name)
        self.paths = paths
        self.identity_names = names
        self.heldout_names = [identities[i].name for i in sorted(held)]
        self.heldout_paths = [files[i] for i in sorted(held)]
        kept = f"{len(names):,} identities, {len(paths):,} images"
        if left_out:
            named = ", ".join(str(p.relative_to(self.root)) for p in left_out[:3])
            kept += (f"; {len(left_out):,} images outside <identity>/<image> left out: {named}"
                     + (", ..." if len(left_out) > 3 else ""))
        if held:
            kept += f"; {len(held):,} identities held out for evaluation"
        elif holdout > 0:
            kept += "; none held out: fewer than 4 identities have two images"
        super().__init__(torch.tensor(labels), image_size, f"image folder {self.root} ({kept})")

    def read(self, index: int) -> torch.Tensor:
        return decode_image(self.paths[index], f"{self.paths[index]}#{index}", self.image_size)

    def heldout_set(self, max_images: int = 2000) -> tuple[torch.Tensor, torch.Tensor, list[Path]]:
        """(images, labels 0..H-1, paths) of the held-out identities: an equal share of
        `max_images` from each, in name order; unreadable images are left out and reported
        through `bad`, as in training."""
        per = max(2, max_images // max(1, len(self.heldout_paths)))
        images, labels, used = [], [], []
        for y, files in enumerate(self.heldout_paths):
            for path in files[:per]:
                try:
                    images.append(decode_image(path, str(path), self.image_size))
                except DataFormatError as err:
                    self.bad.add(str(path), 0, str(err).partition(": ")[2])
                    continue
                labels.append(y)
                used.append(path)
        empty = torch.zeros(0, *self.sample_shape)
        return (torch.stack(images) if images else empty), torch.tensor(labels, dtype=torch.long), used


def held_out_identities(image_counts: list[int], fraction: float, seed: int) -> list[int]:
    """The identities (positions) held out of training: `fraction` of all identities,
    rounded, at least 2 (so that impostor pairs exist), drawn by `seed` among those with two
    or more images (so that genuine pairs exist); none when fewer than 4 such identities
    exist, as then at most one would be left to train a pair loader with two.

    Example:
        >>> held_out_identities([5] * 30, 0.1, seed=0) == held_out_identities([5] * 30, 0.1, seed=0)
        True
        >>> len(held_out_identities([5] * 30, 0.1, seed=0)), held_out_identities([5, 1, 1], 0.5, seed=0)
        (3, [])
    """
    eligible = [i for i, n in enumerate(image_counts) if n >= 2]
    if fraction <= 0 or len(eligible) < 4:
        return []
    want = min(len(eligible) - 2, max(2, round(fraction * len(image_counts))))
    order = torch.randperm(len(eligible), generator=torch.Generator().manual_seed(seed))
    return sorted(eligible[i] for i in order[:want].tolist())


def _is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def _outside_layout(root: Path, entries: list[list[os.DirEntry]]) -> list[Path]:
    """Images the layout does not read, sorted: beside the identity folders, or in a folder
    inside one (`entries`: each identity folder's listing). Counted and named where the data
    is described, rather than left out of training without a word."""
    out = [p for p in root.iterdir() if _is_image(p.name) and p.is_file()]
    for listing in entries:
        for sub in (e for e in listing if e.is_dir()):
            out += [p for p in Path(sub.path).rglob("*") if _is_image(p.name) and p.is_file()]
    return sorted(out)

