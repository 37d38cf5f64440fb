"""The two engines' settings (`HeatOptions`, `TorchOptions`), apart from the engines so that a
command line can show their defaults without importing numba or torch."""
from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("runs", "sample")


@dataclass(frozen=True)
class HeatOptions:
    """Kernel settings.

    Args:
        lr: SGD learning rate.
        threads: worker threads (None: all cores numba sees).
        tile: items per thread tile that negatives are drawn from (0: no tiling, draw from
            all items). 2048 rows of d=64 float32 are 512 KiB: a private L2.
        refresh: samples between two tiles of one thread.
        w_sync: samples between two applications of a thread's W gradient (SimpleX).
        kernel: "runs" (`_run_kernels`: SimpleX's user side once per run of a user's
            samples, the cheaper negatives) or "sample" (`_kernels.train_pairs`: every sample
            its own user side, in a plain shuffle; the kernel before runs, kept as the
            measured baseline).
        prefetch: the "runs" kernel asks the CPU for the user and positive rows of the
            sample this many places ahead while it trains the current one (0: it does not),
            where the user or item table is larger than `heat.PREFETCH_MIN_TABLE_BYTES`; a
            prefetch never changes a result.
        user_run: the most samples of one user in a run ("runs", SimpleX): the epoch is a
            shuffle of runs, and the history mean, its W products and their gradients cost
            once per run. 1: a plain shuffle, every sample its own run. 8, measured against
            the per-sample kernel: 2.1-2.6x its speed on MovieLens-100k at K=64, Recall@20
            within 0.5 % there and 1.3 % on the synthetic set after 3 epochs; 16 was 2.5-2.8x
            but 3 % below it on the synthetic set.
        max_redraws: with `CFConfig.negatives_from = "unseen"`, the most rounds in which a
            sample's negatives that are the user's own items are redrawn from the same tile;
            one more draw then fills what is still missing, kept whatever it is and counted
            in the epoch's "seen_negatives". A user owning a share f of a tile keeps such a
            negative with probability f ** (max_redraws + 2); one owning all of it costs no
            redraws at all, so no draw can loop for long.
    """

    lr: float = 0.1
    threads: int | None = None
    tile: int = 2048
    refresh: int = 512
    w_sync: int = 256
    kernel: str = "runs"
    user_run: int = 8
    prefetch: int = 2
    max_redraws: int = 16

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, not {self.lr}")
        if self.tile < 0:
            raise ValueError(f"tile must be >= 0 (0: no tiling), not {self.tile}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, not {self.kernel!r}")
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0 (0: none), not {self.prefetch}")
        if self.max_redraws < 0:
            raise ValueError(f"max_redraws must be >= 0, not {self.max_redraws}")
        for name in ("refresh", "w_sync", "user_run"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")


@dataclass(frozen=True)
class TorchOptions:
    """Args:
        lr: Adam learning rate. 1e-2 (the published runs use 1e-3..1e-4 over ~100 epochs):
            with it, on MovieLens-100k, torch follows HEAT's Recall@20 epoch by epoch, so
            that equal epochs compare equal accuracy.
        batch_size: training pairs per step.
        threads: torch intra-op threads (None: torch's default).
        max_redraws: the "unseen" rule's rounds of redraws (`sample_negatives`).
        device: where the parameters and Adam train ("cpu", "cuda"); the negatives are
            drawn on the CPU either way, so a GPU run draws the CPU run's negatives.
    """

    lr: float = 1e-2
    batch_size: int = 1024
    threads: int | None = None
    max_redraws: int = 16
    device: str = "cpu"

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, not {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.max_redraws < 0:
            raise ValueError(f"max_redraws must be >= 0, not {self.max_redraws}")
