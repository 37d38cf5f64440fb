"""Argparse `type=` checkers shared by every command: a bad number is argparse's own
one-line usage error naming the option ("argument --lr: must be > 0, not 0", exit
status 2), never a traceback from deep inside a run; and `DefaultsHelpFormatter`, which
shows every option's default in `--help`. Light on purpose: no torch import, so `--help`
stays instant."""
from __future__ import annotations

import argparse
import copy
import math
import re


def int_in(low: int, high: int | None = None):
    """An integer in [low, high] (no upper bound when `high` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            if high is not None:
                bound = f"from {low} to {high}"
            else:
                bound = "a positive integer" if low == 1 else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, not {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(low: float | None = None, high: float | None = None, *,
             low_open: bool = False, high_open: bool = False):
    """A finite number within the given bounds (open or closed at each end)."""
    if low is not None and high is not None:
        bound = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        bound = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        bound = f"{'<' if high_open else '<='} {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {bound}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


positive_int = int_in(1)
non_negative_int = int_in(0)
positive_float = float_in(0, low_open=True)
non_negative_float = float_in(0)
finite_float = float_in()
fraction = float_in(0, 1)                                      # [0, 1]
open_fraction = float_in(0, 1, low_open=True, high_open=True)  # (0, 1)
ratio = float_in(0, 1, low_open=True)                          # (0, 1]

# a memory size's unit -> bytes: GiB & co. are powers of 1024, GB & co. of 1000, and a bare
# K/M/G/T means the power of 1024 (as `free -h` and most launchers write it)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
                 "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40, "tb": 10**12}
_MEMORY_SIZE = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*")


def memory_size(text: str) -> int:
    """A number of bytes, written `16GiB`, `16 GiB`, `512MB`, `16G` or `16e9`.

    Example:
        >>> memory_size("16 GiB"), memory_size("16e9"), memory_size("1.5k")
        (17179869184, 16000000000, 1536)
    """
    found = _MEMORY_SIZE.fullmatch(text)
    unit = found.group(2).lower() if found else None
    if unit not in _MEMORY_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 16GiB, 16 GiB, 512MB, 16e9)")
    value = float(found.group(1)) * _MEMORY_UNITS[unit]
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite memory size")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least one byte, not {text!r}")
    return int(value)


memory_size.__name__ = "memory size"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help with every option's default: "(default: X)" is added to an option's
    help (an option without help gets it too, unlike `ArgumentDefaultsHelpFormatter`),
    unless the help speaks of its default already or the option is a flag (off unless
    given), required, or positional. An option whose default is None must say in its
    help what not giving it means ("(default: ...)"): None would tell a user nothing."""

    @staticmethod
    def default_text(action: argparse.Action) -> str | None:
        """"(default: X)" for `action`, or None where none is added."""
        if (not action.option_strings or action.required or action.nargs == 0 or action.default is None
                or action.default is argparse.SUPPRESS or "default" in (action.help or "")):
            return None
        value = action.default
        if isinstance(value, (list, tuple)):
            value = " ".join(map(str, value))
        return f"(default: {value})"

    def _get_help_string(self, action: argparse.Action) -> str:
        text, extra = action.help or "", self.default_text(action)
        return f"{text} {extra.replace('%', '%%')}".strip() if extra else text

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self.default_text(action):  # argparse prints no help line for it otherwise
            action = copy.copy(action)
            action.help = self.default_text(action).replace("%", "%%")
        return super()._format_action(action)


def add_output_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """--out and --name, said alike by every benchmark's --help: where its JSON lands, so that
    a trial run can be pointed away from the checkout's bench/results/."""
    from embcache.paths import results_dir

    out = results_dir()
    p.add_argument("--out", default=str(out), help=f"results directory (default: {out})")
    p.add_argument("--name", default=name, help=f"results file stem: writes <--out>/<--name>.json (default: {name})")
