"""Collaborative filtering's room: HEAT training of SimpleX / MF-CCL (`trainer`, `config`,
`cli`: `embcache cf`), its evaluation (`evaluation`: Recall/NDCG, top-k), its readers
(`data`: LightGCN, ratings, your own CSV/TSV/Parquet interactions, embeddings files) and a
trained model's use (`model`: `CFModel`: load a model `embcache cf train --save FILE.npz`
wrote, recommend, find similar items, fold in a new user, save), and its benchmark
(`bench`, with `bench_report`: `embcache bench cf`). The kernels themselves are
`cpu_kernels`.

Example:
    >>> from embcache.cf import CFModel
    >>> CFModel.load   # doctest: +ELLIPSIS
    <bound method CFModel.load of <class '...CFModel'>>
"""
__all__ = ["CFModel"]


def __getattr__(name):
    # lazy, so that `embcache cf --help` (embcache.cf.cli) does not import numpy and the kernels
    if name == "CFModel":
        from embcache.cf.model import CFModel

        return CFModel
    raise AttributeError(f"module 'embcache.cf' has no attribute {name!r}")
