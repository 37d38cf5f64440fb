"""The cf trainer's settings (`CFTrainConfig`), apart from the trainer (`embcache.cf.trainer`,
which imports numba and torch) so that `embcache cf --help` shows them without either."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from cpu_kernels.model import MODELS, NEGATIVE_RULES, CFConfig
from cpu_kernels.options import KERNELS, HeatOptions, TorchOptions
from embcache.arg_types import (
    finite_float,
    fraction,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)
from embcache.cf.data.interactions import TEST_FRACTION
from embcache.cf.data.sources import DATA_CHOICES
from embcache.settings_fields import has_flag, inherit, setting
from embcache.train.run_config import THREADS_DEFAULT, RunConfig

ENGINES = ("heat", "torch")
MODEL_SETTINGS = tuple(f.name for f in fields(CFConfig))  # the seed is the run's
ENGINE_SETTINGS = {"heat": ("lr", "tile", "refresh", "w_sync", "kernel", "user_run"), "torch": ("lr", "batch_size")}
DATA_SETTINGS = ("data", "user_col", "item_col", "time_col", "rating_col", "split", "test_fraction", "split_seed",
                 "min_rating", "synthetic_users", "synthetic_items", "synthetic_interactions", "skip_bad_lines", "ks",
                 "topk")  # what reading the data needs


def negatives_count(text: str) -> int:
    """--negatives is K, a count; the rule has its own flag, and a rule given here is told so."""
    if text in NEGATIVE_RULES:
        raise argparse.ArgumentTypeError(f"is the number K of negatives; for the rule write --negatives-from {text}")
    return positive_int(text)



@dataclass
class CFTrainConfig(RunConfig):
    """Everything a cf run depends on; stored in every checkpoint. Defaults come from
    `CFConfig` (model: model ... init_std, and `seed` seeds it too), `HeatOptions` and
    `TorchOptions` (engines); the run settings (seed, epochs, checkpoints, resume, metrics,
    progress) are `RunConfig`'s. Each field's `help` is what `embcache cf train --help`
    shows; besides:

    - `data`'s split, test_fraction, split_seed, min_rating and synthetic_* shape it (see
      `embcache.cf.data.sources.read_interactions`).
    - `lr` None is the engine's default (resolved here, so that a checkpoint records it).
    - `threads` None is the cores this process may use (`embcache.threads.default_threads`).
    - `load`: start from these saved embeddings instead of fresh rows.
    """

    device: str | None = inherit(RunConfig, "device", "cpu",
                                 help="cpu, or cuda for --engine torch (HEAT runs on the CPU); default cpu")
    seed: int = inherit(RunConfig, "seed", help="initial rows, histories, order, negatives")
    epochs: int = inherit(RunConfig, "epochs", 20, type=non_negative_int,
                          help="passes over the training pairs (0: only evaluate)")
    data: str = setting("ml-100k", help=DATA_CHOICES)
    user_col: str = setting("user_id", help="your CSV/TSV/Parquet file: the user column (any ids: strings or integers)")
    item_col: str = setting("item_id", help="your file: the item column")
    time_col: str | None = setting(None, help="your file: a time column (numbers or ISO dates): --split auto then "
                                              "holds out each user's latest interactions (default: none)")
    rating_col: str | None = setting(None, help="your file: a rating column, for --min-rating (default: none)")
    split: str = setting("auto", choices=("auto", "random", "time"),
                         help="per user, a seeded random or the latest --test-fraction (20 %%) is the test set; auto: "
                              "by time where your file has --time-col, else random")
    test_fraction: float = setting(TEST_FRACTION, type=open_fraction,
                                   help="ratings and synthetic: test share per user, strictly between 0 and 1 "
                                        "(rounded; every user keeps at least one interaction in train)")
    split_seed: int = setting(0, type=non_negative_int, help="ratings and synthetic: seed of the split and data")
    min_rating: int = setting(0, type=non_negative_int, help="ratings: keep ratings >= this (0: all)")
    synthetic_users: int = setting(30_000, type=positive_int, help="synthetic: users")
    synthetic_items: int = setting(40_000, type=positive_int, help="synthetic: items")
    synthetic_interactions: int = setting(1_000_000, type=positive_int,
                                          help="synthetic: interactions, before the split")
    skip_bad_lines: bool = setting(False, help="skip and count malformed input lines instead of stopping at the first")
    model: str = setting(CFConfig.model, choices=MODELS,
                         help="simplex: user side g*u + (1-g)*W*mean(history); mf-ccl: the user row")
    dim: int = setting(CFConfig.dim, type=positive_int, help="embedding dimension")
    negatives: int = setting(CFConfig.negatives, type=negatives_count,
                             help="K uniformly sampled negatives per training pair")
    negatives_from: str = setting(CFConfig.negatives_from, choices=NEGATIVE_RULES,
                                  help="unseen: negatives are items the user has no training pair with; all: any "
                                       "item, the rule before")
    margin: float = setting(CFConfig.margin, type=finite_float,
                            help="m: negatives with cosine above m are pushed away")
    neg_weight: float = setting(CFConfig.neg_weight, type=non_negative_float,
                                help="w: weight of the mean negative term")
    gamma: float = setting(CFConfig.gamma, type=fraction,
                           help="SimpleX: weight g of the user row against the history")
    history: int = setting(CFConfig.history, type=non_negative_int,
                           help="SimpleX: most history items per user, drawn once")
    init_std: float = CFConfig.init_std
    engine: str = setting("heat", choices=ENGINES,
                          help="heat: numba kernels (SGD); torch: batched PyTorch reference (Adam)")
    lr: float | None = setting(None, type=positive_float,
                               help=f"learning rate (default {HeatOptions.lr} for heat's SGD, {TorchOptions.lr:g} "
                                    f"for torch's Adam)")
    threads: int | None = setting(None, type=positive_int, metavar="N",
                                  help="CPU threads of the engine and the evaluation " + THREADS_DEFAULT)
    tile: int = setting(HeatOptions.tile, type=non_negative_int,
                        help="heat: items per thread tile that negatives are drawn from (sized for a private L2); "
                             "0: untiled, as --no-tiling")
    refresh: int = setting(HeatOptions.refresh, type=positive_int, help="heat: samples between two tiles of a thread")
    w_sync: int = setting(HeatOptions.w_sync, type=positive_int,
                          help="heat, SimpleX: samples between two applications of a thread's W gradient")
    kernel: str = setting(HeatOptions.kernel, choices=KERNELS,
                          help="heat: runs (SimpleX's user side once per run of a user's samples) or sample (every "
                               "sample its own user side, in a plain shuffle: the kernel before runs)")
    user_run: int = setting(HeatOptions.user_run, type=positive_int,
                            help="heat --kernel runs, SimpleX: most samples of one user in a run (1: a plain "
                                 "shuffle)")
    batch_size: int = setting(TorchOptions.batch_size, type=positive_int, help="torch: training pairs per Adam step")
    eval_every: int = setting(1, type=positive_int, help="evaluate every N epochs (and after the last)")
    ks: tuple[int, ...] = setting((20,), flag=("-k", "--k"), type=positive_int, nargs="+",
                                  help="cut-offs of Recall@k and NDCG@k")
    topk: str = setting("auto", choices=("auto", "torch", "faiss"), help="top-k back-end")
    load: str | None = setting(None, metavar="FILE",
                               help="start from saved embeddings (and their settings) (default: fresh rows drawn "
                                    "from --seed)")

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, not {self.engine!r}")
        if self.lr is None:  # resolved here, so that a checkpoint records the rate used
            self.lr = HeatOptions.lr if self.engine == "heat" else TorchOptions.lr
        self.ks = tuple(self.ks)

    @classmethod
    def for_model(cls, config: CFConfig, **settings) -> "CFTrainConfig":
        """The run of `config`'s model (its seed included) with the other `settings`; a
        model setting among them (the negative rule, say) replaces the config's."""
        return cls(**({name: getattr(config, name) for name in MODEL_SETTINGS} | settings))

    def model_config(self) -> CFConfig:
        return CFConfig(**{name: getattr(self, name) for name in MODEL_SETTINGS})

    def resolved_threads(self) -> int:
        """`threads`, or the default: the cores this process may use
        (`embcache.threads.default_threads`), at most the threads numba has."""
        from cpu_kernels.heat import max_threads  # numba
        from embcache.threads import default_threads

        return self.threads or min(default_threads(), max_threads())

    def heat_options(self) -> HeatOptions:
        return HeatOptions(lr=self.lr, threads=self.resolved_threads(), tile=self.tile, refresh=self.refresh,
                           w_sync=self.w_sync, kernel=self.kernel, user_run=self.user_run)

    def torch_options(self) -> TorchOptions:
        return TorchOptions(lr=self.lr, batch_size=self.batch_size, threads=self.resolved_threads(),
                            device=str(self.resolved_device()))


# the model's settings that are flags (the seed is the run's: `RunConfig`)
MODEL_FLAGS = tuple(f.name for f in fields(CFTrainConfig) if f.name in MODEL_SETTINGS and f.name != "seed" and has_flag(f))
