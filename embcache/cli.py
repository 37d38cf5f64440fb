"""The `embcache` command.

Sub-commands are registered by name and imported only when they are used, so that
`embcache --help` answers instantly (no torch import) and a capability's code lives
beside that capability, not here. Each command module exposes
``build_parser(prog) -> argparse.ArgumentParser`` whose parsed namespace has ``func``,
or is a group with a ``COMMANDS`` table of its own (dispatched the same way).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys

from embcache.bench.cli import COMMANDS as BENCHES  # names and help lines only: no torch
from embcache.errors import RunInterrupted, UserFacingError

# name -> (module that builds its parser, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dlrm": ("embcache.dlrm.cli", "train a DLRM through the embedding cache (the main job)"),
    "cf": ("embcache.cf.cli", "collaborative filtering (SimpleX, MF-CCL) on CPUs with the HEAT kernels"),
    "face": ("embcache.face.cli", "face classification with a dynamic class pool (or full FC / Partial FC)"),
    "bench": ("embcache.bench.cli", f"run a benchmark ({', '.join(BENCHES)}); JSON lands in bench/results/"),
    "cache": ("embcache.dlrm.cache_cli", "plan a cache before training: predicted hit rate and memory by cache size"),
    "data": ("embcache.data.cli", "prepare CTR data: Criteo Kaggle/Terabyte, Avazu, MovieLens-100k, synthetic"),
    "upgrade": ("embcache.upgrade", "resave checkpoints of earlier versions as plain data (no trust needed to load)"),
}


def dispatch(prog: str, description: str, commands: dict[str, tuple[str, str]], argv: list[str],
             version: str | None = None) -> int:
    """Two-stage parse: pick the sub-command by name, then let its module parse the rest.
    With `version`, `PROG --version` prints it."""
    if version and argv[:1] == ["--version"]:
        print(f"{prog} {version}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        parser = argparse.ArgumentParser(prog=prog, description=description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter,
                                         epilog=_listing(prog, commands))
        if version:
            parser.add_argument("--version", action="version", version=f"{prog} {version}")
        parser.add_argument("command", choices=sorted(commands), help="see the list below")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"{prog}: unknown command {name!r}; choose from: {', '.join(sorted(commands))}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(commands[name][0])
    if hasattr(module, "COMMANDS"):  # a group such as `embcache bench`: dispatch again
        return dispatch(f"{prog} {name}", module.__doc__ or "", module.COMMANDS, rest)
    parser = module.build_parser(f"{prog} {name}")
    args = parser.parse_args(rest)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    from embcache.safe_load import trusting

    try:
        with console_logging(), threads_kept(), trusting(getattr(args, "trust_checkpoint", False)):
            return int(args.func(args) or 0)
    except UserFacingError as err:
        label = "" if isinstance(err, RunInterrupted) else "error: "
        print(f"{prog} {name}: {label}{err}", file=sys.stderr, flush=True)
        if getattr(err, "exit_now", False):  # a broken process group: nothing left to clean up safely
            sys.stdout.flush()
            os._exit(err.exit_code)
        return err.exit_code


class _ConsoleHandler(logging.Handler):
    """The library's log lines as a command prints them: information on stdout, warnings
    on stderr, each looked up when the line is written (so a redirected stream is used)."""

    def emit(self, record: logging.LogRecord) -> None:
        warning = record.levelno >= logging.WARNING
        text = ("warning: " if warning else "") + self.format(record)
        print(text, file=sys.stderr if warning else sys.stdout, flush=True)


@contextlib.contextmanager
def console_logging():
    """While a command runs, what the library logs at INFO and above (resumed from ...,
    epoch results, warnings) reaches the user; a library caller configures logging itself."""
    log = logging.getLogger("embcache")
    handler, level, propagate = _ConsoleHandler(), log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # printed once: some dependencies give the root logger a handler of its own
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


@contextlib.contextmanager
def threads_kept():
    """A command run in-process (a test, a notebook) leaves torch's and numba's thread counts
    as it found them (`--threads` sets them for the command: `embcache.threads`)."""
    torch, numba = sys.modules.get("torch"), sys.modules.get("numba")
    saved_torch = torch.get_num_threads() if torch is not None else None
    saved_numba = numba.get_num_threads() if numba is not None else None
    try:
        yield
    finally:
        if saved_torch is not None:
            torch.set_num_threads(saved_torch)
        if saved_numba is not None:
            numba.set_num_threads(saved_numba)


def _listing(prog: str, commands: dict[str, tuple[str, str]]) -> str:
    width = max(len(n) for n in commands)
    lines = [f"  {n.ljust(width)}  {h}" for n, (_, h) in sorted(commands.items())]
    return "commands:\n" + "\n".join(lines) + f"\n\n`{prog} COMMAND --help` explains each."


def main(argv: list[str] | None = None) -> int:
    from embcache import __version__  # the package's own module: no torch

    try:
        return dispatch(
            "embcache",
            "Train models dominated by one giant table: cached embedding bags (DLRM), "
            "HEAT CPU kernels (collaborative filtering), and a dynamic class pool (face).",
            COMMANDS,
            sys.argv[1:] if argv is None else argv,
            version=__version__,
        )
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (which stops by itself): no traceback
        with contextlib.suppress(Exception):
            previous = signal.signal(signal.SIGINT, signal.SIG_DFL)  # another Ctrl-C meanwhile: just stop
            print("\nembcache: interrupted", file=sys.stderr, flush=True)
            signal.signal(signal.SIGINT, previous)
        return RunInterrupted.exit_code
    except BrokenPipeError:  # output piped into `head` and the like, which stopped reading: done
        with contextlib.suppress(OSError):  # stdout's buffer cannot be flushed at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
