"""Modules users put in models: cached embedding bags (and their torchrec-compatible
collection) and, for classification with huge label spaces, the class-pool heads."""
__all__ = ["CachedEmbeddingBag", "CachedEmbeddingBagCollection", "TorchEmbeddingBagCollection",
           "DynamicClassPool", "DCPHead", "FullFC", "PartialFC"]

# name -> submodule; loaded on first use (torch; the collections import torchrec where it is
# installed, ~3 s: `embcache.sparse_types`)
_LAZY = {
    "CachedEmbeddingBag": "cached_embedding_bag",
    "CachedEmbeddingBagCollection": "cached_collection",
    "TorchEmbeddingBagCollection": "torch_collection",
    "DynamicClassPool": "class_pool",
    "DCPHead": "heads",
    "FullFC": "heads",
    "PartialFC": "heads",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'embcache.nn' has no attribute {name!r}")
