"""HEAT's numba kernels (`_kernels`), their checked wrapper (`heat`), the model both engines
share (`model`), the engines' settings (`options`) and the PyTorch reference engine
(`torch_reference`); nothing from embcache. The names below load on first use, so that
`model` and `options` are read without numba or torch."""

__all__ = ["CFConfig", "CFParams", "HeatEngine", "HeatOptions", "compile_kernels", "copy_bandwidth",
           "loss_gradients", "max_threads", "user_vectors"]

_LAZY = {"CFConfig": "model", "CFParams": "model", "HeatOptions": "options", "HeatEngine": "heat",
         "compile_kernels": "heat", "copy_bandwidth": "heat", "loss_gradients": "heat", "max_threads": "heat",
         "user_vectors": "heat"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"cpu_kernels.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'cpu_kernels' has no attribute {name!r}")
