"""Loading pickled files (checkpoints, cache state, table checkpoints) without running
code: every such load goes through `load_pickled`, which reads them with torch's
`weights_only` unpickler and the short list of types below, and nothing else.

A pickle can name any Python callable and call it while it loads, so a checkpoint from
someone else could run anything on the reader's machine. Its CRC seal does not help: anyone
can write a file with a valid seal. The files this project writes hold only tensors, numbers,
strings, lists, dicts and numpy arrays (CF's rows and engine state), so a load needs nothing
more. A file that needs more (written by an earlier version, or crafted) is refused in one
line naming the file and the types it needs; an explicit opt-in (`--trust-checkpoint`,
`trust=True`, or the `trusting()` context) loads it once with the full unpickler, with a
warning line saying so, and `embcache upgrade FILE --trust-checkpoint` resaves it as plain
data so later loads need no trust.

Example:
    >>> import tempfile, pathlib, torch
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = pathlib.Path(d) / "ck.pt"
    ...     torch.save({"step": 3, "w": torch.ones(2)}, path)
    ...     load_pickled(path)["step"]
    3
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import pickle
from pathlib import Path

from embcache.errors import CheckpointError, DataFormatError

# The one list of what a load may construct besides torch's own tensors and containers:
# numpy arrays and scalars (plain data; an object array's items pass the same unpickler).
# (module where the object lives, its name there, other names pickles know it by); the name
# "*DType" stands for every dtype class of that module (numpy.dtypes.Float32DType, ...).
ALLOWED_TYPES = (
    ("numpy._core.multiarray", "_reconstruct", ("numpy.core.multiarray._reconstruct",)),
    ("numpy._core.multiarray", "scalar", ("numpy.core.multiarray.scalar",)),
    ("numpy", "ndarray", ()),
    ("numpy", "dtype", ()),
    ("numpy.dtypes", "*DType", ()),
)
TRUST_FLAG = "--trust-checkpoint"
logger = logging.getLogger("embcache")
_warned: set[str] = set()
_trusted: contextvars.ContextVar[bool] = contextvars.ContextVar("embcache_trust_pickles", default=False)


class UntrustedFileError(CheckpointError):
    """A pickled file that needs types beyond `ALLOWED_TYPES` to load, loaded without trust."""


@contextlib.contextmanager
def trusting(trust: bool = True):
    """While inside, loads that are not told otherwise trust what they open (the commands'
    `--trust-checkpoint`; a library caller's way to resume or export such a file)."""
    token = _trusted.set(bool(trust))
    try:
        yield
    finally:
        _trusted.reset(token)


@functools.lru_cache(maxsize=None)
def allowed_globals() -> tuple:
    """`ALLOWED_TYPES` as `torch.serialization.safe_globals` takes them."""
    import importlib

    out = []
    for module, name, aliases in ALLOWED_TYPES:
        found = importlib.import_module(module)
        names = [n for n in dir(found) if n.endswith("DType")] if name == "*DType" else [name]
        for n in names:
            obj = getattr(found, n)
            out += [obj] + [(obj, alias) for alias in aliases]
    return tuple(out)


@functools.lru_cache(maxsize=None)
def allowed_names() -> frozenset[str]:
    """Every name `ALLOWED_TYPES` lets a pickle use."""
    out = set()
    for obj in allowed_globals():
        if isinstance(obj, tuple):
            out.add(obj[1])
        else:
            out.add(f"{obj.__module__}.{obj.__qualname__}")
    return frozenset(out | {f"{m}.{n}" for m, n, _ in ALLOWED_TYPES if n != "*DType"})


def bounded_reconstruct(reconstruct, limit: int):
    """numpy's `_reconstruct(cls, shape, dtype)`, refusing an array of more than `limit`
    bytes (the file's size). It makes an empty array of any shape the pickle names (a
    100-byte file asked for 931 GiB, before anything else in it was read); a real pickle
    makes it of shape (0,) and fills it from the file's own bytes after."""
    import numpy as np

    def checked(cls, shape, dtype):
        try:
            size = int(np.prod(shape, dtype=object)) * max(np.dtype(dtype).itemsize, 1)
        except Exception:  # a shape or dtype of another kind: nothing numpy itself pickles
            raise pickle.UnpicklingError(f"an array of shape {shape!r:.60} and dtype {dtype!r:.40}") from None
        if size > limit:
            raise pickle.UnpicklingError(f"an array of shape {tuple(shape)!r:.80}, more than the file's {limit:,} "
                                         f"bytes hold")
        return reconstruct(cls, shape, dtype)
    return checked


def _bounded_globals(limit: int) -> list:
    """`allowed_globals()` with numpy's `_reconstruct` bounded by `limit` bytes, under each
    name a pickle may use for it."""
    out = []
    for obj in allowed_globals():
        found, name = obj if isinstance(obj, tuple) else (obj, f"{obj.__module__}.{obj.__qualname__}")
        out.append((bounded_reconstruct(found, limit), name) if name.endswith("._reconstruct") else obj)
    return out


def _size(source) -> int:
    """The bytes of a file (a path or an open file) a load reads: the most any array it
    makes may hold (0 where unknown: torch's own error names a missing file)."""
    try:
        return os.fstat(source.fileno()).st_size if hasattr(source, "fileno") else Path(source).stat().st_size
    except (OSError, ValueError, AttributeError):
        return 0


def _reason(err: BaseException) -> str:
    """One line for torch's refusal (several paragraphs): the unpickler's own reason."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    mark = "WeightsUnpickler error:"  # at a line's start, or after "Please file an issue ...: "
    for k, line in enumerate(lines):
        if mark in line:
            rest = line.split(mark, 1)[1].strip() or (lines[k + 1] if k + 1 < len(lines) else "")
            return rest
    return lines[0] if lines else type(err).__name__


def needed_types(path) -> list[str]:
    """The globals a torch file's pickle names beyond `ALLOWED_TYPES`, read from its opcodes
    without running any ([] when the file cannot be read so: a damaged file). `path` may be
    an open binary file."""
    import torch

    try:
        if hasattr(path, "seek"):
            path.seek(0)
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # a damaged zip or pickle: the caller's load names the damage
        return []
    return sorted(set(names) - allowed_names())


def load_pickled(path: str | os.PathLike, what: str = "file", trust: bool | None = None, file=None,
                 resaving: bool = False, **kwargs):
    """`torch.load(path, map_location="cpu", weights_only=True, **kwargs)` with
    `ALLOWED_TYPES`. A file that needs other types: UntrustedFileError naming it and them,
    or, with `trust` (None: as `trusting()` says), the full unpickler and a warning line
    (`resaving`: `embcache upgrade`'s load, whose warning does not advise upgrading).
    Other failures (a damaged file) propagate as torch raises them. `file`: an open binary
    file to read instead of opening `path` (the handle `verify_zip` checked); `path` then
    only names it in messages."""
    import torch

    path = Path(path)
    source = path if file is None else file
    limit = _size(path if file is None else file)

    def load(weights_only: bool):
        if file is not None:
            file.seek(0)
        return torch.load(source, map_location="cpu", weights_only=weights_only, **kwargs)

    try:
        with torch.serialization.safe_globals(_bounded_globals(limit)):
            return load(True)
    except pickle.UnpicklingError as err:
        needed = needed_types(source)
        if not needed:  # damaged, or plain data torch cannot read: never the full unpickler
            raise pickle.UnpicklingError(f"not plain data: {_reason(err)}") from None
    types = ", ".join(needed)
    if not (_trusted.get() if trust is None else trust):
        raise UntrustedFileError(
            f"{path}: this {what} needs {types} to load, and loading that could run any code; embcache loads "
            f"only plain data. If it comes from someone you trust, open it once with {TRUST_FLAG} (trust=True), "
            f"and resave it with `embcache upgrade {path} {TRUST_FLAG}`") from None
    if str(path.resolve()) not in _warned:  # once per file, however many times a command reads it
        _warned.add(str(path.resolve()))
        then = "it is resaved as plain data now, so later loads need no trust" if resaving else \
            f"resave it with `embcache upgrade {path} {TRUST_FLAG}` so later loads need no trust"
        logger.warning(f"{path}: loaded with {TRUST_FLAG}: its {types} ran as Python code while it loaded, with your "
                       f"rights; {then}")
    return load(False)


def add_trust_argument(parser) -> None:
    """`--trust-checkpoint` on a command that opens checkpoints (`embcache.cli` applies it
    with `trusting()` around the command)."""
    parser.add_argument(TRUST_FLAG, dest="trust_checkpoint", action="store_true",
                        help="load a checkpoint that needs Python types beyond plain data (one written by an "
                             "earlier version), which lets it run any code: only for a file from someone you "
                             "trust (default: such a file is refused)")


def read_json_object(path: str | os.PathLike, what: str = "file") -> dict:
    """The JSON object in `path` (a meta.json, a manifest, a table header): one
    DataFormatError line naming the file for anything else. Python's parser meets a file
    from someone else with more than ValueError: nesting a few thousand levels deep is a
    RecursionError, an integer of 5,000 digits a ValueError that is no JSONDecodeError."""
    import json

    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except RecursionError:
        raise DataFormatError(f"{path}: cannot read the {what}: nested too deeply") from None
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}:{err.lineno}: not JSON: {err.msg}") from None
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataFormatError(f"{path}: cannot read the {what}: {getattr(err, 'strerror', None) or err}") from None
    if not isinstance(value, dict):
        raise DataFormatError(f"{path}: not a readable {what}: a JSON {type(value).__name__}, not an object")
    return value


def inside(name) -> bool:
    """Whether a file name a file from someone else stores (a shard in meta.json, a table
    in a manifest) stays inside the folder it is read from: a relative path without `..`.
    `../x` or `/etc/x` would read a file the user never handed over."""
    if not isinstance(name, str) or not name or "\0" in name:
        return False
    path = Path(name)
    return not (path.is_absolute() or path.drive or ".." in path.parts)
