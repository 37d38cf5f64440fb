"""Collaborative filtering after training: `CFModel` (load a model `embcache cf train --save
FILE.npz` wrote, recommend, find similar items, fold in a new user, save).

Example:
    >>> from embcache.cf import CFModel
    >>> CFModel.load   # doctest: +ELLIPSIS
    <bound method CFModel.load of <class '...CFModel'>>
"""
from embcache.train.cf_model import CFModel

__all__ = ["CFModel"]
