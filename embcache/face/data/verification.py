"""Verification pair files (`lfw.bin`, `cfp_fp.bin`, `agedb_30.bin`): a pickled pair
`(list of encoded images, list of is-same flags)`, images 2i and 2i+1 forming pair i.

The file is unpickled with a restricted unpickler that accepts only plain containers, bytes,
booleans and numpy arrays, so a crafted file cannot run code."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from embcache.errors import DataFormatError

from .images import decode_image

class _SafeUnpickler(pickle.Unpickler):
    """The project's plain-data types (`embcache.safe_load.ALLOWED_TYPES`) and the byte
    arrays a verification file's images are stored in."""

    def __init__(self, file, limit: int, **kwargs):
        super().__init__(file, **kwargs)
        self.limit = limit  # the file's size: no array it builds may hold more bytes

    def find_class(self, module, name):
        from embcache.safe_load import allowed_names, bounded_reconstruct

        if f"{module}.{name}" in allowed_names() or (module, name) == ("builtins", "bytearray"):
            found = super().find_class(module, name)
            return bounded_reconstruct(found, self.limit) if name == "_reconstruct" else found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_verification_bin(path: str | os.PathLike, image_size: int = 112) -> tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor]:
    """(first images [n,3,S,S], second images, is-same [n] bool); DataFormatError naming the
    file (and image index) for a missing, malformed or undecodable file."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such verification file")
    try:
        with open(path, "rb") as f:
            bins, issame = _SafeUnpickler(f, os.fstat(f.fileno()).st_size, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, MemoryError) as err:
        raise DataFormatError(f"{path}: not a verification .bin ({type(err).__name__}: {err})") from None
    issame = np.asarray(issame, dtype=bool)
    if len(bins) != 2 * len(issame):
        raise DataFormatError(f"{path}: {len(bins)} images for {len(issame)} pairs (expected twice as many)")
    images = torch.stack([decode_image(bytes(b), f"{path}#{i}", image_size) for i, b in enumerate(bins)])
    return images[0::2], images[1::2], torch.from_numpy(issame)


def write_verification_bin(path: str | os.PathLike, images: list[bytes], issame: list[bool]) -> Path:
    """Write the format above (tests, and converting a pair list of one's own)."""
    path = Path(path)
    with open(path, "wb") as f:
        pickle.dump((list(images), list(map(bool, issame))), f, protocol=4)
    return path


# the names the run's own evaluations take in a record (synthetic identities, an image folder's held-out ones)
RESERVED_NAMES = ("synthetic", "heldout")


def val_names(paths: list[str]) -> dict[str, str]:
    """Each `--val` file's name in the epoch line, the summary, the JSON and the metrics: its
    stem (`lfw`), or where two files share one (`a/lfw.bin`, `b/lfw.bin`) or it is the name of
    the run's own evaluation (`heldout.bin`), as many of its folders before it as tell it
    apart (`a/lfw`, `b/lfw`, `mine/heldout`): both are scored, where one name overwrote the
    other's results. The same file given twice is refused, as it would only be scored twice.

    Example:
        >>> val_names(["x/lfw.bin", "y/lfw.bin", "x/cfp_fp.bin"])
        {'x/lfw.bin': 'x/lfw', 'y/lfw.bin': 'y/lfw', 'x/cfp_fp.bin': 'cfp_fp'}
    """
    full = {p: Path(p).resolve().with_suffix("").parts for p in paths}
    seen: dict[tuple, str] = {}
    for p, parts in full.items():
        if parts in seen:
            raise DataFormatError(f"{p}: given to --val twice (also as {seen[parts]})")
        seen[parts] = p
    depth = dict.fromkeys(paths, 1)
    while True:
        names = {p: "/".join(full[p][-depth[p]:]) for p in paths}
        taken = list(names.values()) + list(RESERVED_NAMES)
        clash = [p for p in paths if taken.count(names[p]) > 1 and depth[p] < len(full[p])]
        if not clash:
            return names
        for p in clash:
            depth[p] += 1


def load_val_sets(paths: list[str], sample_shape: tuple[int, ...], image_size: int,
                  min_pairs: int = 20) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every `--val` file by its name (`val_names`), loaded and checked when the run starts rather than at its first
    evaluation: a missing or unscorable file found then would cost the epoch before it,
    which no checkpoint holds yet. DataFormatError naming the file where the net embeds
    feature vectors (no image can go through it) or the file has fewer than `min_pairs`
    pairs (10-fold verification needs two a fold)."""
    out = {}
    for path, name in val_names(paths).items():
        if len(sample_shape) != 3:
            raise DataFormatError(f"{path}: a verification file holds images, and this run's net embeds "
                                  f"{tuple(sample_shape)} feature vectors (synthetic data with --image-size 0): "
                                  f"give --image-size S to train on S x S images")
        a, b, same = load_verification_bin(path, image_size)
        if len(same) < min_pairs:
            raise DataFormatError(f"{path}: {len(same)} pairs, fewer than the {min_pairs} that 10-fold "
                                  f"verification needs")
        out[name] = a, b, same
    return out
