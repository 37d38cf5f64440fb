"""The row cache: a small device-resident working set of table rows in front of a host
store holding every row and its optimizer state.
SlotMap (id <-> slot), EvictionPolicy (which slot to give up), HostStore, row-wise optimizers.
The names below load on first use (torch), so that `choices` is light."""
from .choices import POLICIES

__all__ = ["SlotMap", "EvictionPolicy", "select_victims", "POLICIES"]

_LAZY = {"EvictionPolicy": "eviction", "select_victims": "eviction", "SlotMap": "slot_map"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'embcache.cache' has no attribute {name!r}")
