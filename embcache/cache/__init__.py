"""The row cache: a small device-resident working set of table rows in front of a host
store holding every row and its optimizer state.

Rooms, by what a reader comes for:
- `bookkeeping/`: the two bookkeepers (`RowCache` on the host, `DeviceRowCache` on the
  device), slots, eviction, admission, and how a batch's rows are updated;
- `stores/`: the host store, its files, and rows moved over the link;
- `open_keys/`: open tables (raw 64-bit keys given rows as they come);
- `planning/`: hit-rate curves and the planner that splits a memory budget;
- here: what every room shares (`choices`, the row-wise `optimizers`, `stats`).

The names below load on first use (torch), so that `choices` is light. Modules moved into
the rooms keep their old names (`embcache.cache.row_cache` is `embcache.cache.bookkeeping.row_cache`),
so code written against the flat layout still imports."""
import importlib
import importlib.abc
import importlib.util
import sys

from embcache.cache.choices import POLICIES

__all__ = ["SlotMap", "EvictionPolicy", "select_victims", "POLICIES"]

_LAZY = {"EvictionPolicy": "bookkeeping.eviction", "select_victims": "bookkeeping.eviction",
         "SlotMap": "bookkeeping.slot_map"}
_ROOMS = {
    "bookkeeping": ("row_cache", "row_cache_state", "row_lifecycle", "row_updates", "device_cache", "device_updates",
                    "fused_admission", "_radix", "lookup", "slot_map", "eviction", "fixed_size"),
    "stores": ("host_store", "host_link", "transfers", "unified_view", "table_files"),
    "open_keys": ("open_table", "open_table_kernels", "key_index", "key_index_kernels", "key_counts"),
    "planning": ("planner", "hit_curves"),
}
MOVED = {f"{__name__}.{m}": f"{__name__}.{room}.{m}" for room, ms in _ROOMS.items() for m in ms}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import embcache.cache.<old name>` gives the module at its new place (the same object,
    so a patch through either name reaches both)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system gives it the old name's spec next
        return module

    def exec_module(self, module):
        # already executed at its new place (the import system files it under the old name
        # too); it keeps its own spec (`reload`, tracebacks, pickling by module)
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if f"{__name__}.{name}" in MOVED:  # `from embcache.cache import row_cache`
        return importlib.import_module(MOVED[f"{__name__}.{name}"])
    raise AttributeError(f"module 'embcache.cache' has no attribute {name!r}")
