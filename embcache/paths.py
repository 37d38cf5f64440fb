"""Where embcache writes: prepared data sets, fetched copies of data, benchmark results.
Nothing is ever written into the installed package.

- ``EMBCACHE_HOME`` set: everything under it, ``$EMBCACHE_HOME/datasets`` and
  ``$EMBCACHE_HOME/bench/results``.
- A source checkout (the package beside the repository's ``pyproject.toml``: a clone on
  ``PYTHONPATH`` or ``pip install -e .``): the checkout's ``datasets/`` and ``bench/results/``.
- Otherwise (an installed wheel): data sets in the user cache directory,
  ``$XDG_CACHE_HOME/embcache/datasets``, else ``~/.cache/embcache/datasets``; benchmark results
  in ``bench/results/`` under the working directory, beside the runs they come from.

`check_output_file` checks a path a command will write to, before the work.

Example:
    >>> datasets_dir().name, results_dir().parts[-2:]
    ('datasets', ('bench', 'results'))
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from embcache.errors import DataOutputError

HOME_ENV = "EMBCACHE_HOME"
_PACKAGE_DIR = Path(__file__).resolve().parent


def source_root() -> Path | None:
    """The repository root when the package runs from a source checkout, else None."""
    root = _PACKAGE_DIR.parent
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if re.search(r'^name\s*=\s*"embcache"\s*$', text, re.M) else None


def home() -> Path | None:
    """``$EMBCACHE_HOME`` as an absolute path, or None when unset or empty."""
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser().absolute() if value else None


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/embcache`` (an absolute XDG_CACHE_HOME only, as the spec says), else
    ``~/.cache/embcache``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "embcache"


def datasets_dir() -> Path:
    """Where built-in and fetched data sets are prepared (`datasets/<name>`)."""
    if (h := home()) is not None:
        return h / "datasets"
    if (root := source_root()) is not None:
        return root / "datasets"
    return user_cache_dir() / "datasets"


def results_dir() -> Path:
    """Where benchmarks write their JSON and figures by default."""
    if (h := home()) is not None:
        return h / "bench" / "results"
    if (root := source_root()) is not None:
        return root / "bench" / "results"
    return Path.cwd() / "bench" / "results"


def writable_directory(directory: str | os.PathLike, what: str, name: str | os.PathLike | None = None) -> Path:
    """Create `directory` (and its parents) and write a file in it, so that a command that
    cannot keep its `what` there (a path through a file, no permission, a read-only disk)
    stops before its work, not after it with the work lost; DataOutputError in one line
    naming `name` (the directory unless given: the file the command was asked to write).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     writable_directory(Path(f.name) / "ck", "checkpoints", name="FILE/ck")
        Traceback (most recent call last):
        ...
        embcache.errors.DataOutputError: FILE/ck: cannot write checkpoints there: Not a directory
    """
    from embcache.errors import DataOutputError

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise DataOutputError(f"{name or directory}: cannot write {what} there: {write_failure(err)}") from None
    return directory


def write_failure(err: OSError) -> str:
    """Why writing failed, in a few words: the error's own, but "Not a directory" for the
    FileExistsError of `mkdir(exist_ok=True)` over a file (a path that goes through one)."""
    from embcache.errors import first_line

    return "Not a directory" if isinstance(err, FileExistsError) else err.strerror or first_line(err)


def check_output_file(path: str | os.PathLike) -> Path:
    """`path` as a Path, once a file can be made there: a command that writes its results at
    the end checks its output this way first, so that a bad path costs a line, not the work.
    Nothing is created; the directories missing on the way are made by the writer.
    DataOutputError (one line naming the path) when the path is a directory, a file stands
    where a directory must be, or the directory that would hold it is not writable."""
    out = Path(path)
    if out.is_dir():
        raise DataOutputError(f"{out}: cannot write: it is a directory, not a file")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:  # the nearest that exists: below it all is made
        parent = parent.parent
    if not parent.is_dir():
        raise DataOutputError(f"{out}: cannot write: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataOutputError(f"{out}: cannot write: {parent} is not writable")
    return out
