"""embcache: a small, fast, well-chosen working set in front of a huge table.

`CachedEmbeddingBag` / `CachedEmbeddingBagCollection` (the frequency-aware embedding
cache), HEAT kernels in `cpu_kernels`, and the dynamic class pool in `embcache.nn`."""

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
