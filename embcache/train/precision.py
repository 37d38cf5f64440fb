"""The arithmetic a run's dense part computes in (`--precision`), shared by `dlrm train`,
`face train` and `bench gpu`:

- `fp32`: float32 throughout, TF32 off for the run on CUDA;
- `tf32`: float32 tensors, but CUDA's matrix products and convolutions round their inputs to
  TF32 (10-bit mantissa) on tensor cores. On the CPU there is no TF32: the same as fp32;
- `bf16`: the dense modules (DLRM's bottom MLP, interaction and top MLP; face's backbone) run
  under `torch.autocast(dtype=torch.bfloat16)` on CUDA and on the CPU alike. Their parameters
  and the optimizer stay float32 (autocast casts a copy per op); each module hands back
  float32, so the loss, its gradient at the logits and everything outside (the cache's rows,
  which keep their `row_dtype`; a class pool's features) are float32;
- `auto` (the default): tf32 on CUDA, fp32 elsewhere.

The run sets the CUDA switches (`precision_scope`) and puts back what it found when it ends:
importing embcache changes nothing, and a user's own process keeps its settings. The
resolved precision goes into the checkpoint (`record`), so that `evaluate` and `export` can
say what a model was trained with and a resume can check it (`resume_mismatch`).
torch is imported inside the functions: the configs name `PRECISIONS` and `HELP` for
`--help` without importing it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "tf32", "bf16")
HELP = ("the dense part's arithmetic: fp32; tf32 (CUDA's matrix products on TF32 tensor cores; on the CPU the same "
        "as fp32); bf16 (the dense part under bfloat16 autocast, float32 weights, optimizer and loss; embedding rows "
        "keep --row-dtype, where there are any); auto: tf32 on CUDA, fp32 elsewhere. Set for the run and put back "
        "after it; recorded in the checkpoint, and a resume must keep it")
# what a checkpoint written before precision was a setting was trained with: nothing turned TF32 on
BEFORE = "fp32"
_SAYS = {"fp32": "float32", "tf32": "float32 with TF32 matrix products (CUDA)",
         "bf16": "bfloat16 autocast over the dense part, float32 weights"}


def resolve(precision: str, device: torch.device | str) -> str:
    """`precision` as the run computes it on `device`: auto is tf32 on CUDA and fp32
    elsewhere, and tf32 off CUDA is fp32 (the CPU has no TF32), so that a checkpoint records
    what was computed.

    Example:
        >>> resolve("auto", "cpu"), resolve("auto", "cuda"), resolve("tf32", "cpu"), resolve("bf16", "cpu")
        ('fp32', 'tf32', 'fp32', 'bf16')
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    cuda = _device_type(device) == "cuda"
    if precision == "auto":
        return "tf32" if cuda else "fp32"
    return "fp32" if precision == "tf32" and not cuda else precision


def describe(precision: str | None) -> str:
    """One phrase for a recorded precision (None: a checkpoint from before it was recorded).

    Example:
        >>> describe("bf16")
        'bf16 (bfloat16 autocast over the dense part, float32 weights)'
    """
    if precision is None:
        return f"{BEFORE} ({_SAYS[BEFORE]}; recorded before precision was a setting)"
    return f"{precision} ({_SAYS.get(precision, 'unknown')})"


def _device_type(device) -> str:
    """"cuda" for "cuda", "cuda:1" or such a torch.device; "cpu", "meta", ... likewise."""
    return str(device).split(":")[0]


@contextlib.contextmanager
def precision_scope(precision: str, device: torch.device | str) -> Iterator[None]:
    """The CUDA switches of a resolved `precision` for the `with` block, and what they were
    put back afterwards (also when the block raises). tf32 turns TF32 on for matrix products
    and cuDNN's convolutions; fp32 and bf16 turn it off (bf16's float32 products outside
    autocast are then exact). Off CUDA nothing changes: the CPU has no TF32."""
    import torch

    if _device_type(device) != "cuda":
        yield
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    on = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def autocast_modules(modules: Iterable[torch.nn.Module], precision: str, device: torch.device | str) -> int:
    """Under bf16, make each module's forward run under bfloat16 autocast on `device`'s type
    and hand back float32; other precisions leave them as they are. In place, through the
    instance's `forward`: parameter names, state dicts, DDP wrappers around the module and
    `nn.Module.compile` see the same module (and a `copy.deepcopy` of it, e.g. an EMA copy,
    runs its own forward). Returns how many modules were changed."""
    if precision != "bf16":
        return 0
    import torch

    count = 0
    for module in modules:
        module.forward = functools.partial(_autocast_forward, module, _device_type(device), torch.bfloat16)
        count += 1
    return count


def _autocast_forward(module, device_type: str, dtype, *args, **kwargs):
    import torch

    with torch.autocast(device_type, dtype=dtype):
        out = type(module).forward(module, *args, **kwargs)
    return _float32(out)


def _float32(out):
    """A module's output with every lower-precision floating tensor back in float32 (the
    loss and whatever reads the output then compute in float32)."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, (tuple, list)):
        return type(out)(_float32(o) for o in out)
    return out


def record(precision: str) -> dict:
    """The checkpoint's entry: the resolved precision the run computed in."""
    return {"precision": precision}


def resume_mismatch(saved: str | None, now: str, flag: str = "--precision") -> list[str]:
    """The phrase refusing a resume (in `resume_mismatches`' wording), or none.

    bf16 against either float32 precision is refused: the dense part's arithmetic changes,
    as for any setting a resume must keep. fp32 against tf32 is allowed with a logged line:
    it follows the device (auto), and a resume may change the device, whose kernels round
    differently anyway. A checkpoint without the entry was trained in fp32.
    """
    saved = saved or BEFORE
    if saved == now:
        return []
    if "bf16" in (saved, now):
        return [f"{flag} {saved!r} in the checkpoint, {now!r} now (bf16 computes the dense part in bfloat16; "
                f"resume with --precision {saved})"]
    logger.info(f"the checkpoint was trained with precision {saved}, this run computes in {now} (it follows the "
                f"device): the parameters continue, rounded differently")
    return []
