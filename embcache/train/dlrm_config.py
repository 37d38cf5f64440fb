"""DLRM's settings (`DLRMConfig`) and the choices the command line offers, apart from the
trainer (`embcache.train.dlrm`) so that `embcache dlrm --help` shows them without importing
torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from embcache.train.run_config import StepRunConfig

SPARSE_MODES = ("cached", "device", "host")
ARCHS = ("auto", "torchrec", "torch")
MAX_PREFETCH_DEPTH = 4  # batches prefetched ahead at most (the cache keeps up to 8 pending: none is dropped)
TABLE_FORMATS = ("npy", "parquet")  # how `embcache dlrm export` writes the tables


@dataclass
class DLRMConfig(StepRunConfig):
    """Everything a run depends on; stored in every checkpoint. The run settings (device,
    seed, epochs, max_steps, checkpoints, resume, metrics, progress) are `StepRunConfig`'s."""

    data: str = "synthetic"
    sparse: str = "cached"
    cache_ratio: float = 0.015
    eviction: str = "freq"
    warmup_ratio: float = 0.7
    admission: bool = False
    sparse_optimizer: str = "adagrad"
    sparse_lr: float = 0.05
    dense_lr: float = 0.05
    embedding_dim: int = 16
    dense_arch: list[int] = field(default_factory=lambda: [64])
    over_arch: list[int] = field(default_factory=lambda: [64, 32])
    batch_size: int = 2048
    eval_batch_size: int = 8192
    prefetch_depth: int = 1  # batches whose rows are prefetched ahead of the one training (0: none)
    arch: str = "auto"  # the model: torchrec's DLRM (where it imports: auto) or the same in plain torch
    prefetch: bool | None = None  # earlier versions' switch: False is prefetch_depth 0 (their configs load)
    row_wise_rows: int | None = None  # under torchrun: split a table with more rows by rows (None: past a fair share)
    host_store: str = "memory"  # or "mmap:DIR": the cached tables as memory-mapped files (rank r: DIR/rank<r>)
    row_dtype: str = "float32"  # how cached rows are stored: float32 | float16 | bfloat16
    row_rounding: str = "stochastic"  # how half-precision rows are rounded on write: nearest | stochastic
    pipeline: bool = True  # losses read every log_every steps, batches read in a background thread (False: each step)
    compile: bool = False  # the dense part under torch.compile (the cached collection stays eager)

    def __post_init__(self) -> None:
        # `prefetch` folded into the depth once, so that a later `replace(cfg, prefetch_depth=2)`
        # is not undone by it
        if self.prefetch is not None:
            if not self.prefetch:
                self.prefetch_depth = 0
            self.prefetch = None
        if not 0 <= self.prefetch_depth <= MAX_PREFETCH_DEPTH:
            raise ValueError(f"prefetch_depth must be from 0 to {MAX_PREFETCH_DEPTH}, got {self.prefetch_depth}")


# Settings a resumed run must share with its checkpoint: they change the arithmetic.
# The cache's own settings (ratio, eviction, warm-up, prefetch depth) change only which rows
# are resident, never a result, so a resume may change them (the first three start the
# cache cold).
# `arch` is not one of them either: torchrec's DLRM and the plain-torch one compute the same.
RESUME_MUST_MATCH = ("sparse", "sparse_optimizer", "sparse_lr", "dense_lr", "embedding_dim",
                     "dense_arch", "over_arch", "batch_size", "seed")
CACHE_SETTINGS = ("cache_ratio", "eviction", "warmup_ratio")
