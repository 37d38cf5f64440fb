"""Damaged variants of a file's bytes, seeded: what the integrity and damaged-input tests feed
the real readers."""
import random

from embcache.integrity import TRAILER_BYTES


def damaged_variants(data: bytes, seed: int = 0, flips: int = 24):
    """(name, bytes): single-byte flips at seeded positions over the whole file (entries,
    headers, central directory, seal), 16 bytes flipped in a row, truncations, zero length
    and two foreign files."""
    rng = random.Random(seed)
    for pos in sorted(rng.sample(range(len(data)), flips)) + [len(data) - 1, len(data) - TRAILER_BYTES - 2]:
        b = bytearray(data)
        b[pos] ^= 1 << rng.randrange(8)
        yield f"flip@{pos}", bytes(b)
    at = rng.randrange(len(data) - 16)
    yield f"flip16@{at}", data[:at] + bytes(x ^ 0xFF for x in data[at:at + 16]) + data[at + 16:]
    for cut in (len(data) // 2, len(data) - 1, 10):
        yield f"cut@{cut}", data[:cut]
    yield "empty", b""
    yield "text", b"step,loss\n1,0.5\n" * 10
    yield "garbage", bytes(rng.randrange(256) for _ in range(4096))
