"""Decoding and the few transforms face training needs (no torchvision): Pillow decodes
JPEG/PNG bytes to RGB, the image is resized to the crop size if it is not already, and pixels
are mapped to [-1, 1) as (x - 127.5) / 128.

An image whose header claims more pixels than Pillow's `Image.MAX_IMAGE_PIXELS` (a
decompression bomb: a few bytes that would decode to gigabytes) is refused before decoding,
as an unreadable image: Pillow only warns below twice that limit, so its warning is made an
error here."""
from __future__ import annotations

import io
import os
import warnings

import numpy as np
import torch

from embcache.errors import DataFormatError


def decode_image(data: bytes | str | os.PathLike, where: str, size: int = 112) -> torch.Tensor:
    """[3, size, size] float tensor from encoded bytes or a file path; DataFormatError naming
    `where` (file and index) if it cannot be decoded."""
    from PIL import Image, UnidentifiedImageError

    in_memory = isinstance(data, (bytes, bytearray, memoryview))
    src = io.BytesIO(data) if in_memory else data
    _bombs_are_errors(Image)
    try:
        with Image.open(src) as img:  # reads the header; a bomb raises here
            img = _eight_bit(img, Image).convert("RGB")
            if img.size != (size, size):
                img = img.resize((size, size), Image.BILINEAR)
            arr = np.array(img, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as err:
        # Pillow names an in-memory source by its repr, an address that differs between runs
        reason = str(err).replace(repr(src), "encoded bytes") if in_memory else str(err)
        if isinstance(err, (Image.DecompressionBombWarning, Image.DecompressionBombError)):
            raise DataFormatError(f"{where}: refused before decoding, a possible decompression bomb ({reason})") \
                from None
        raise DataFormatError(f"{where}: unreadable image ({type(err).__name__}: {reason})") from None
    return to_tensor(arr)


def _eight_bit(img, Image):
    """A 16-bit grayscale image (a PNG of depth 16: mode I;16, or I) as 8-bit grayscale, its
    top 8 bits: Pillow's RGB conversion clips such values at 255, and an image of 0..65535 came
    out near-white. An "I" image whose values all fit 8 bits is taken as it is."""
    if not img.mode.startswith("I"):
        return img
    values = np.asarray(img).astype(np.int64)
    if img.mode.startswith("I;16") or values.max(initial=0) > 255:
        values = values >> 8
    return Image.fromarray(values.clip(0, 255).astype(np.uint8), "L")


def _bombs_are_errors(Image) -> None:
    """Pillow's decompression-bomb warning raised as an error, for the whole process (a
    filter put first once, not a `catch_warnings` block, which is unsafe while loader threads
    decode; put back should something have reset the filters since)."""
    first = warnings.filters[0] if warnings.filters else None
    if not (first and first[0] == "error" and first[2] is Image.DecompressionBombWarning):
        warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def to_tensor(arr: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> CHW float in [-1, 1)."""
    return (torch.from_numpy(np.array(arr, dtype=np.uint8, copy=True)).permute(2, 0, 1).float() - 127.5) / 128.0


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image of a [B, 3, H, W] batch with probability 1/2."""
    flip = torch.rand(images.shape[0], generator=generator) < 0.5
    out = images.clone()
    out[flip] = images[flip].flip(-1)
    return out


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """HWC uint8 -> JPEG bytes (used to write RecordIO and test fixtures)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
