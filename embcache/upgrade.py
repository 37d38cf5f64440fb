"""`embcache upgrade FILE... --trust-checkpoint`: resave pickled files that need more than
plain data to load (checkpoints, cache state, table checkpoints written by an earlier
version) as plain data, so that later loads need no trust (`embcache.safe_load`).

The file is loaded once with the full unpickler (hence the flag: only for a file from
someone you trust), its values turned into the plain types every version can read (a path
into its string, an enum into its value, a dataclass into a dict, a set or named tuple into
a list, a numpy scalar into a number), checked to need nothing beyond the allowed types, and
written sealed to a temporary name that is then renamed over the old file."""
from __future__ import annotations

import argparse
import dataclasses
import enum
import os
from pathlib import Path

import numpy as np

from embcache.errors import CheckpointError, first_line


def to_plain(value):
    """`value` with every path, enum, dataclass, set and numpy scalar made plain (tensors,
    numpy arrays, numbers, strings, lists, tuples and dicts are kept as they are).

    Example:
        >>> import pathlib
        >>> to_plain({"dir": pathlib.PurePosixPath("/runs/a"), "ids": {3}})
        {'dir': '/runs/a', 'ids': [3]}
    """
    if isinstance(value, dict):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_plain(v) for v in value)
    if isinstance(value, (set, frozenset)) or hasattr(value, "_fields"):  # a set, or a named tuple
        return [to_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.generic):
        return value.item()  # a numpy scalar (a 0-d array is an allowed type: kept)
    return value


def upgrade_file(path: str | os.PathLike, trust: bool = False) -> list[str]:
    """Resave `path` as plain data in place (sealed, renamed into place); returns the types
    it needed before ([] when it needed none and was left as it was). Without `trust`, a file
    that needs them is refused as any load refuses it; CheckpointError naming the file when
    a value still needs a type beyond the allowed ones."""
    from embcache.integrity import save_torch, verify_zip
    from embcache.safe_load import load_pickled, needed_types

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    verify_zip(path, "checkpoint")
    needed = needed_types(path)
    try:  # a damaged file is not "already plain"; an old one may name a class that is gone
        payload = load_pickled(path, "checkpoint", trust=trust and bool(needed), resaving=True)
    except CheckpointError:
        raise
    except Exception as err:
        what = "cannot be loaded" if needed else "corrupt or truncated"
        raise CheckpointError(f"{path}: {what} ({type(err).__name__}: {first_line(err)})") from None
    if not needed:
        return []
    payload = to_plain(payload)
    tmp = path.with_name(f".{path.name}.upgrade-{os.getpid()}")
    try:
        save_torch(payload, tmp)
        left = needed_types(tmp)
        if left:
            raise CheckpointError(f"{path}: still needs {', '.join(left)} after making it plain; not resaved")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return needed


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.safe_load import add_trust_argument

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("`", ""))
    p.add_argument("files", nargs="+", metavar="FILE", help="checkpoints (.pt) to resave as plain data")
    add_trust_argument(p)
    p.set_defaults(func=_upgrade)
    return p


def _upgrade(args) -> int:
    for name in args.files:
        needed = upgrade_file(name, trust=args.trust_checkpoint)
        print(f"{name}: resaved as plain data (it needed {', '.join(needed)})" if needed
              else f"{name}: already plain data; left as it was")
    return 0
