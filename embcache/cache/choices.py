"""The cache's named choices, here so that the command line can offer them (and its
`--help` show them) without importing torch: eviction policies, row optimizers, and the
cache ratios the planner tries."""

POLICIES = ("freq", "lfu", "lru")
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
# those with a torch sparse optimizer that equals them (`optimizers.TORCH_EQUIVALENTS`)
TORCH_OPTIMIZERS = ("sgd", "adagrad", "adam")
PLANNED_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.10, 0.25)
BOOKKEEPING = ("host", "device", "auto")
KERNELS = ("torch", "triton", "auto")


def resolve_bookkeeping(bookkeeping: str, device, host_store: str = "memory") -> str:
    """"host" or "device" for a cache whose rows live on `device`: "auto" is device where
    the rows are on CUDA and the host store is in memory (the device reads and writes
    pinned rows through its view of them, which a mapped file cannot give), host
    otherwise. An explicit "device" is honoured on any device (the CPU and `meta` run the
    same tensor ops: how it is tested); with a mapped store it is a ValueError.

    Example:
        >>> resolve_bookkeeping("auto", "cpu"), resolve_bookkeeping("device", "cpu")
        ('host', 'device')
    """
    if bookkeeping not in BOOKKEEPING:
        raise ValueError(f"bookkeeping must be one of {BOOKKEEPING}, got {bookkeeping!r}")
    mapped = host_store != "memory"
    if bookkeeping == "auto":
        kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
        return "device" if kind == "cuda" and not mapped else "host"
    if bookkeeping == "device" and mapped:
        raise ValueError(f"device bookkeeping needs the memory host store, not {host_store!r}: the device "
                         f"reads and writes pinned rows, which a mapped file cannot be")
    return bookkeeping

def resolve_cache_kernels(kernels: str, device, bookkeeping: str) -> str:
    """"torch" or "triton" for a cache with `bookkeeping` ("host" or "device") on `device`.
    The embedding kernels (`embcache.kernels`) serve the device bookkeeper's working table;
    the host bookkeeper's update is torch's sparse gradient, so it keeps torch's kernels:
    "auto" says torch there, an explicit "triton" is a ValueError."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if bookkeeping != "device":
        if kernels == "triton":
            raise ValueError("kernels='triton' needs the device bookkeeper (bookkeeping='device', or 'auto' on "
                             "CUDA): the host bookkeeper trains through torch's sparse gradient")
        return "torch"
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    if kernels == "torch" or (kernels == "auto" and kind != "cuda"):
        return "torch"
    from embcache.kernels import resolve_kernels

    return resolve_kernels(kernels, device)


# prefetched batches in flight at most: the cache's pending prefetches, an open table's
# lookups kept for coming batches, the collection's prepared inputs and the sharded
# collection's routed batches are all bounded by it (one number, so that no layer drops
# what another keeps); a trainer prefetches at most half of it ahead (`dlrm.config`)
MAX_PENDING_PREFETCHES = 8
