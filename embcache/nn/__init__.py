"""Modules users put in models: cached embedding bags (and their torchrec-compatible
collection) and, for classification with huge label spaces, the class-pool heads."""
from .cached_embedding_bag import CachedEmbeddingBag

__all__ = ["CachedEmbeddingBag", "CachedEmbeddingBagCollection"]


def __getattr__(name):
    # The collection imports torchrec (slow, ~3 s); load it only when asked for.
    if name == "CachedEmbeddingBagCollection":
        from .cached_collection import CachedEmbeddingBagCollection

        return CachedEmbeddingBagCollection
    raise AttributeError(f"module 'embcache.nn' has no attribute {name!r}")
