"""Sizes and durations as a person reads them: a figure rounded to its unit must not read as
zero (`0.0 MiB` for 32,000 bytes, `over 0.0 s` for 14 ms), so each takes the largest unit it
fills."""
from __future__ import annotations


def format_bytes(n: float) -> str:
    """`3.2 GiB`, `512.0 KiB`, `12 B`.

    Example:
        >>> format_bytes(32000), format_bytes(12)
        ('31.2 KiB', '12 B')
    """
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def format_seconds(s: float) -> str:
    """`21.0 s`, `14.2 ms`, `830 µs`: under a second in milliseconds, under one of those in
    microseconds.

    Example:
        >>> format_seconds(21.04), format_seconds(0.0142), format_seconds(0.00083)
        ('21.0 s', '14.2 ms', '830 µs')
    """
    if s >= 1.0:
        return f"{s:,.1f} s"
    if s >= 1e-3:
        return f"{s * 1e3:,.1f} ms"
    return f"{s * 1e6:,.0f} µs"
