"""The row cache: a small device-resident working set of table rows in front of a host
store holding every row and its optimizer state.
SlotMap (id <-> slot), EvictionPolicy (which slot to give up), HostStore, row-wise optimizers."""
from .eviction import POLICIES, EvictionPolicy, select_victims
from .slot_map import SlotMap

__all__ = ["SlotMap", "EvictionPolicy", "select_victims", "POLICIES"]
