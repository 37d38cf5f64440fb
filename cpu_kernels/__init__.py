"""HEAT: collaborative filtering (SimpleX, MF-CCL) trained by tiled, multithreaded,
lock-free numba kernels on CPUs, with its data readers, metrics and a PyTorch reference."""
from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.train import HeatEngine, HeatOptions

__all__ = ["CFConfig", "CFParams", "HeatEngine", "HeatOptions"]
