"""Triton, where it imports, for every kernel module here: each still imports without it
(the suite collects their doctests; `resolve_kernels` keeps a cache from choosing them), its
kernels then plain functions that are never launched."""
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

jit = triton.jit if triton is not None else (lambda fn: fn)
