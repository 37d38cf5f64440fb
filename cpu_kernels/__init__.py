"""HEAT's numba kernels (`_kernels`), their checked wrapper (`heat`), the model both engines
share (`model`) and the PyTorch reference engine (`torch_reference`); nothing from embcache."""
from cpu_kernels.heat import (
    HeatEngine,
    HeatOptions,
    compile_kernels,
    copy_bandwidth,
    loss_gradients,
    max_threads,
    user_vectors,
)
from cpu_kernels.model import CFConfig, CFParams

__all__ = ["CFConfig", "CFParams", "HeatEngine", "HeatOptions", "compile_kernels", "copy_bandwidth",
           "loss_gradients", "max_threads", "user_vectors"]
