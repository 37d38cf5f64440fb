"""How `n` items are split into parts, one per rank: contiguous, in rank order, as nearly
equal as can be (the first `n % size` parts one longer). The one rule for a global batch
divided among ranks (the data loaders), a table's rows sharded by rank (placement, the
class-sharded heads) and their gathers back in rank order. It is on the ground floor so
that the data loaders use it without importing `embcache.distributed`, a floor above them."""


def slice_bounds(n: int, size: int, rank: int) -> tuple[int, int]:
    """`[start, stop)` of part `rank` when `n` items are split into `size` nearly equal parts.

    Example:
        >>> [slice_bounds(10, 3, r) for r in range(3)]
        [(0, 4), (4, 7), (7, 10)]
    """
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
