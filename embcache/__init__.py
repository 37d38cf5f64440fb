"""embcache: a small, fast, well-chosen working set in front of a huge table.

`CachedEmbeddingBag` / `CachedEmbeddingBagCollection` (the frequency-aware embedding
cache), HEAT kernels in `cpu_kernels`, and the dynamic class pool in `embcache.nn`."""

import os

# Two OpenMP thread pools work in every step: torch's and numba's (the cache's host
# bookkeeping runs over threads). With the default policy each pool's idle threads spin,
# taking the cores the other pool's threads need: measured on 2 cores, a step of the cache's
# host work with 2 threads took 20-30x its 1-thread time, and the same with a passive policy
# took about the same as 1 thread on a busy host. The OpenMP runtimes read this when they
# load, so it is set here, before torch or numba is imported (a value of the user's stays).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["CachedEmbeddingBag", "CachedEmbeddingBagCollection"]


def __getattr__(name):
    # Lazy, so that `embcache --help` and light tools do not pay torch's import time.
    if name == "CachedEmbeddingBag":
        from .nn.cached_embedding_bag import CachedEmbeddingBag

        return CachedEmbeddingBag
    if name == "CachedEmbeddingBagCollection":
        from .nn.cached_collection import CachedEmbeddingBagCollection

        return CachedEmbeddingBagCollection
    raise AttributeError(f"module 'embcache' has no attribute {name!r}")
