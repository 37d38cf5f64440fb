"""Which embedding kernels a cache runs: torch's, or ours in Triton. Triton is imported
here only when asked, so that `import embcache` works (and stays fast) without it."""
from __future__ import annotations

import logging
import os

import torch

CHOICES = ("torch", "triton", "auto")
logger = logging.getLogger("embcache")


def resolve_kernels(choice: str, device) -> str:
    """"torch" or "triton" for rows on `device`.

    `auto` takes Triton on CUDA where it imports (one warning line where it does not:
    torch's kernels give the same results, only slower), torch's elsewhere, since off
    CUDA Triton only interprets. An explicit "triton" must be honoured or refused: on
    CUDA it needs Triton; elsewhere it also needs `TRITON_INTERPRET=1` (Triton's
    interpreter runs the kernels on CPU tensors: how they are tested without a GPU), but
    on `meta`, where each op runs as its fake implementation (how the operations a step
    issues are counted).

    Example:
        >>> resolve_kernels("auto", "cpu")
        'torch'
    """
    if choice not in CHOICES:
        raise ValueError(f"kernels must be one of {CHOICES}, got {choice!r}")
    if choice == "torch":
        return "torch"
    cuda = torch.device(device).type == "cuda"
    if choice == "auto" and not cuda:
        return "torch"
    missing = _why_triton_is_missing()
    if choice == "auto":
        if missing:
            logger.warning(f"kernels='auto': Triton is not usable ({missing}); torch's embedding kernels serve")
            return "torch"
        return "triton"
    if missing:
        raise ValueError(f"kernels='triton' needs Triton, which is not usable here ({missing})")
    on_meta = torch.device(device).type == "meta"  # the ops' fake implementations run there: no kernel does
    if not cuda and not on_meta and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"kernels='triton' on {torch.device(device).type} needs Triton's interpreter: "
                         f"set TRITON_INTERPRET=1 before Triton is imported (or use kernels='torch')")
    return "triton"


def interpreted() -> bool:
    """Whether Triton's kernels run under its interpreter (`TRITON_INTERPRET=1`, on CPU
    tensors), where every program is a Python call: kernels whose tile does not change their
    bits take wide tiles there (few programs), the tile a GPU run measured elsewhere."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _why_triton_is_missing() -> str | None:
    """None where `import triton` works, else the reason in a few words. Any error counts,
    not only ImportError: a broken install must fall back, not stop the run."""
    try:
        import triton  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    return None
