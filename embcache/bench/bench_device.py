"""A benchmark's --device as a device, or the command's one-line error: `resolve_device`
raises ValueError (cuda on a machine without a GPU, a name that is no device), which a
benchmark run from the command line printed as a traceback."""
from __future__ import annotations

from embcache.device import resolve_device
from embcache.errors import UserFacingError


def bench_device(name):
    try:
        return resolve_device(name)
    except ValueError as err:
        raise UserFacingError(f"--device: {err}") from None
