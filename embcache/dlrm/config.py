"""DLRM's settings (`DLRMConfig`) and the choices the command line offers, apart from the
trainer (`embcache.dlrm.trainer`) so that `embcache dlrm --help` shows them without importing
torch."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from embcache.arg_types import fraction, int_in, positive_float, positive_int, ratio
from embcache.cache.choices import BOOKKEEPING, KERNELS, MAX_PENDING_PREFETCHES, OPTIMIZERS, POLICIES
from embcache.settings_fields import inherit, setting
from embcache.train.precision import HELP as PRECISION_HELP, PRECISIONS
from embcache.train.run_config import StepRunConfig

SPARSE_MODES = ("cached", "device", "host")
ARCHS = ("auto", "torchrec", "torch")
# batches prefetched ahead at most: half of what the cache keeps pending, so that none is dropped
MAX_PREFETCH_DEPTH = MAX_PENDING_PREFETCHES // 2
TABLE_FORMATS = ("npy", "parquet")  # how `embcache dlrm export` writes the tables
ROW_DTYPES = ("float32", "float16", "bfloat16")
ROW_ROUNDINGS = ("nearest", "stochastic")
RAW_KEY_MODES = ("open", "hash", "first-day")  # how raw-key data meets its tables
RETIRE_POLICIES = ("lru", "lfu")


def max_rows_value(text: str) -> int | str:
    """`--max-rows`: a positive number of rows, or `first-day`."""
    return "first-day" if text == "first-day" else positive_int(text)


max_rows_value.__name__ = "rows (a positive integer or first-day)"


def day_range(text: str) -> str:
    """`--days A-B` (or one day `A`): 0 <= A <= B."""
    first, _, last = text.partition("-")
    if not (first.isdigit() and (not last or last.isdigit())) or (last and int(last) < int(first)):
        raise argparse.ArgumentTypeError(f"expected days as A-B with 0 <= A <= B (or one day A), got {text!r}")
    return text


day_range.__name__ = "days"


def parse_day_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def training_split(days: str | None, epoch: int) -> str:
    """The split epoch `epoch` trains on: `train`, or with `--days A-B` its day (the last one
    past B). The trainer and `dlrm export` both ask it, so that an export rebuilds a
    first-day key map from the very split its run trained first."""
    if days is None:
        return "train"
    order = parse_day_range(days)
    return f"day_{order[min(epoch, len(order) - 1)]}"


def cache_ratio_value(text: str) -> float | str:
    """`--cache-ratio`: a ratio in (0, 1], `auto` (sized by the cache planner once the data is
    known) or `fit` (`dlrm train`'s default: `embcache.dlrm.cache_fit`)."""
    return text if text in ("auto", "fit") else ratio(text)


cache_ratio_value.__name__ = "cache ratio"


def host_store_spec(text: str) -> str:
    """`--host-store`: "memory" or "mmap:DIR", as the host store itself checks it
    (`embcache.cache.stores.host_store.parse_host_store`: the one place the spec is read), with
    argparse's one-line error for anything else."""
    from embcache.cache.stores.host_store import parse_host_store  # torch: only once a command line is parsed

    try:
        parse_host_store(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


@dataclass
class DLRMConfig(StepRunConfig):
    """Everything a run depends on; stored in every checkpoint. The run settings (device,
    seed, epochs, max_steps, checkpoints, resume, metrics, progress) are `StepRunConfig`'s.
    Each field's `help` is what `embcache dlrm train --help` shows; besides:

    - `host_store` "mmap:DIR" keeps rank r's tables under DIR/rank<r> under torchrun.
    - `prefetch` is earlier versions' switch: False is `prefetch_depth` 0 (their configs load).
    - `pipeline` False is the synchronous loop: the loss is read at every step and the
      batches in the training thread.
    - `row_wise_rows` None splits, under torchrun, a table holding more than its fair share
      (by rows; an open table by key hash).
    """

    epochs: int = inherit(StepRunConfig, "epochs", help="passes over the training split")
    data: str = setting("synthetic", help="'synthetic' (Criteo-shaped, generated on first use), 'ml-100k' "
                                          "(MovieLens-100k as CTR), or a directory with meta.json")
    sparse: str = setting("cached", choices=SPARSE_MODES,
                          help="cached tables, whole tables on the device, or whole tables on the host")
    cache_ratio: float = setting(
        0.015, type=cache_ratio_value,
        help="fraction of all embedding rows kept on the device; 'fit' (dlrm train's default): 0.015, or more where "
             "the batches in flight (with the prefetched ones) need more rows, twice those as far as --device-memory "
             "allows (whole tables on small data); 'auto': the smallest whose predicted hit rate (`embcache cache "
             "plan`, from the id counts) is within 1 point of the largest cache that fits --device-memory. The "
             "Python DLRMConfig's default is {default}")
    eviction: str = setting("freq", choices=POLICIES,
                            help="which cached row gives way to a missed one: freq (the id's count in the training "
                                 "data plus its count so far), lfu (its count so far) or lru (the least recently "
                                 "used); ties go to the least recently used")
    warmup_ratio: float = setting(0.7, type=fraction,
                                  help="fraction of the cache filled with the hottest ids before training")
    admission: bool = setting(False, help="admission control (freq, lfu): a missed row colder than the row it would "
                                          "evict is served beside the cache for the step; results are unchanged, "
                                          "the hit rate rises most where a batch needs more rows than the cache "
                                          "holds")
    bookkeeping: str = setting("auto", choices=BOOKKEEPING,
                               help="where the cache decides which row sits where: device (beside the rows, in "
                                    "tensor ops that never make the host wait), host (a compiled pass beside the "
                                    "ids), or auto (device when the rows are on CUDA with the memory host store, "
                                    "host otherwise); the results are the same either way, the speed is not")
    kernels: str = setting("auto", choices=KERNELS,
                           help="the device bookkeeper's embedding kernels: triton (its lookup, and its backward "
                                "fused with the row optimizer, embcache.kernels), torch (torch's ops), or auto "
                                "(triton on CUDA where Triton imports, torch otherwise); the host bookkeeper "
                                "always uses torch's")
    sparse_optimizer: str = setting("adagrad", choices=OPTIMIZERS,
                                    help="the embeddings' row-wise optimizer (its state is kept with each row)")
    sparse_lr: float = setting(0.05, flag="--lr", type=positive_float, help="learning rate of the embeddings")
    dense_lr: float = setting(0.05, type=positive_float, help="learning rate of the MLPs (Adagrad)")
    embedding_dim: int = setting(16, type=positive_int, help="floats per embedding row")
    dense_arch: list[int] = setting(default_factory=lambda: [64], type=positive_int, nargs="+",
                                    help="hidden sizes of the bottom MLP (the embedding dim is appended)")
    over_arch: list[int] = setting(default_factory=lambda: [64, 32], type=positive_int, nargs="+",
                                   help="hidden sizes of the top MLP (the output 1 is appended)")
    batch_size: int = setting(2048, type=positive_int,
                              help="training samples per step (under torchrun: of all ranks together)")
    eval_batch_size: int = 8192
    prefetch_depth: int = setting(
        1, type=int_in(0, MAX_PREFETCH_DEPTH), metavar="D", exclusive="prefetch",
        help=f"batches whose rows are prefetched while the current one trains (0 to {MAX_PREFETCH_DEPTH}; 0: none)")
    arch: str = setting("auto", choices=ARCHS,
                        help="the model: torchrec's DLRM, the same model in plain torch (same parameters, same "
                             "results to the bit; no torchrec needed; either reads the other's checkpoints), or "
                             "auto: torchrec where it is installed")
    prefetch: bool | None = None
    row_wise_rows: int | None = setting(
        None, type=positive_int, metavar="N",
        help="under torchrun: split a table with more than N rows by rows over all ranks (default: a table "
             "holding more than its fair share, all rows / ranks); an open table (raw keys) past it is split "
             "by key hash instead, one shard a rank, its --max-rows divided over them")
    overlap_exchange: bool = setting(
        True, flag="--no-overlap-exchange",
        help="under torchrun: wait for the pooled embeddings' all-to-all only after the bottom MLP, which runs "
             "while they travel (default); --no-overlap-exchange waits before it. The same results to the bit")
    host_store: str = setting(
        "memory", type=host_store_spec, metavar="memory|mmap:DIR",
        help="where the full tables and optimizer state live: host memory, or files under DIR mapped into memory "
             "(the page cache is the RAM tier: tables larger than memory)")
    row_dtype: str = setting("float32", choices=ROW_DTYPES,
                             help="how embedding rows are stored (host and cache); optimizer state stays float32")
    row_rounding: str = setting("stochastic", choices=ROW_ROUNDINGS,
                                help="how float16/bfloat16 rows are rounded when an update is written")
    pipeline: bool = setting(
        True, flag="--no-pipeline",
        help="the synchronous loop: read the loss at every step and the batches in the training thread (the same "
             "results to the bit, slower; default: losses read every --log-every steps, batches read, decoded "
             "and pinned in a background thread)")
    readers: int | None = setting(
        None, type=positive_int, metavar="N",
        help="pipelined runs: threads reading, decoding and checking batches at once, taken back in order (the "
             "same batches and errors to the bit; default: half this rank's cores, 1 to 8; 1: one background "
             "thread)")
    raw_keys: str = setting(
        "open", choices=RAW_KEY_MODES,
        help="data with raw 64-bit keys (meta.json 'keys': 'raw'; `data prepare --keys raw`, `data synthetic "
             "--keys raw`): open tables (a key gets a row on first sight, the cached sparse part only), hashing "
             "into --max-rows rows a table, or a vocabulary of the first training split's keys (later keys share "
             "id 0)")
    max_rows: int | str | None = setting(
        None, type=max_rows_value, metavar="N|first-day",
        help="raw-key data: rows a table, the bound of an open table (past it its coldest keys retire; default: "
             "none) or the size of a hashed one (default first-day); first-day: each table's distinct keys in the "
             "first training split")
    retire: str = setting("lru", choices=RETIRE_POLICIES,
                          help="open tables past --max-rows: retire the least recently or the least often used keys")
    ttl: int | None = setting(None, type=positive_int, metavar="STEPS",
                              help="open tables: a key unused for more than STEPS training steps retires (default: none, keys "
                                   "retire only past --max-rows)")
    ttl_days: int | None = setting(None, type=positive_int, metavar="DAYS",
                                   help="with --days: as --ttl, in days (a day's training steps; default: none)")
    days: str | None = setting(
        None, type=day_range, metavar="A-B",
        help="data written day by day (splits day_0, day_1, ...): train on day_A .. day_B in order, one day an "
             "epoch (in place of --epochs, refused beside it unless it counts as many; default: none, the train "
             "split)")
    eval_next_day: bool = setting(
        False, help="with --days: after training on a day, evaluate on the next day's split before training on "
                    "it (Criteo Terabyte's protocol; --eval-every N scores that day every N steps too); without "
                    "it, days are trained without evaluation (and --eval-every is refused)")
    allow_test_days: bool = setting(
        False, help="with --days: train on a day the data set holds out for val/test (Terabyte's last day); "
                    "refused without it, since evaluating on that day afterwards scores rows seen in training")
    compile: bool = setting(
        False, help="the dense part (bottom MLP, interaction, top MLP) under torch.compile; the cache stays eager. "
                    "Results agree with eager to rounding, not to the bit; the first steps compile")
    precision: str = setting("auto", choices=PRECISIONS, help=PRECISION_HELP)
    cuda_graphs: str = setting("auto", choices=("auto", "on", "off"),  # train.step_graph.CUDA_GRAPHS (light here)
                               help="capture the training step as one CUDA graph and replay it (auto, on: where "
                                    "the run allows: CUDA, one process, a cached sparse part with --bookkeeping "
                                    "device or whole tables with --sparse device (moved into their backward, "
                                    "checkpoints kept in torch's form), no row update reading the step count on "
                                    "the host; multi-hot batches "
                                    "padded to fixed capacities set by the first 8 batches; "
                                    "else the step runs as it is, with one line saying why; off: never). With "
                                    "--prefetch-depth >= 1 the graph prefetches the next batch (one ahead at most)")

    # the value a setting had, in effect, in checkpoints written before it existed
    settings_added_later = {"precision": "fp32"}

    @classmethod
    def sizes_in_checkpoint(cls, ck: dict) -> dict:
        """What the tensors of checkpoint `ck` say of the settings that size the model
        (`embcache.train.run_files.refuse_unheld_sizes`)."""
        return held_sizes(ck)

    def __post_init__(self) -> None:
        # `prefetch` folded into the depth once, so that a later `replace(cfg, prefetch_depth=2)`
        # is not undone by it
        if self.prefetch is not None:
            if not self.prefetch:
                self.prefetch_depth = 0
            self.prefetch = None
        if self.days is not None:
            self.epochs = len(parse_day_range(self.days))
        if not 0 <= self.prefetch_depth <= MAX_PREFETCH_DEPTH:
            raise ValueError(f"prefetch_depth must be from 0 to {MAX_PREFETCH_DEPTH}, got {self.prefetch_depth}")


def held_sizes(ck: dict) -> dict:
    """The sizing settings a DLRM checkpoint's tensors say, read from their shapes (nothing
    built): `dense_arch` and `embedding_dim` from the bottom MLP's weights (its last layer is
    as wide as a table row), `over_arch` from the top MLP's (its last layer is the logit),
    `embedding_dim` from the tables too (the manifest of a cached run's table files, or the
    whole model's state dict), and an integer `max_rows` (raw keys) from their rows. A part a
    checkpoint lacks says nothing."""
    dense = ck.get("dense_model") if isinstance(ck.get("dense_model"), dict) else ck.get("model")
    dense = dense if isinstance(dense, dict) else {}

    def widths(prefix):  # the out features of each linear layer, in order
        return [int(v.shape[0]) for k, v in dense.items()
                if isinstance(k, str) and k.startswith(prefix) and len(getattr(v, "shape", ())) == 2]

    held, bottom, top = {}, widths("dense_arch."), widths("over_arch.")
    if bottom:
        held["dense_arch"], held["embedding_dim"] = bottom[:-1], bottom[-1]
    if top:
        held["over_arch"] = top[:-1]
    tables = ck["tables"].get("tables") if isinstance(ck.get("tables"), dict) else None
    if isinstance(tables, dict):  # a cached run's table files: their manifest
        shapes = {(t.get("rows"), t.get("dim")) for t in tables.values() if isinstance(t, dict)}
    else:
        shapes = {tuple(int(n) for n in v.shape) for k, v in dense.items()
                  if str(k).startswith("sparse_arch.") and len(getattr(v, "shape", ())) == 2}
    dims, rows = {d for _, d in shapes}, {r for r, _ in shapes}
    config = ck.get("config") if isinstance(ck.get("config"), dict) else {}
    if type(config.get("max_rows")) is int and rows:  # raw keys: every table hashed or bounded to that many rows
        held["max_rows"] = rows.pop() if len(rows) == 1 else sorted(rows, key=str)
    dims |= {held["embedding_dim"]} if "embedding_dim" in held else set()
    if dims:  # tables of several widths: no embedding_dim is theirs, and the check refuses
        held["embedding_dim"] = dims.pop() if len(dims) == 1 else sorted(dims, key=str)
    return held


# Settings a resumed run must share with its checkpoint: they change the arithmetic.
# The cache's own settings (ratio, eviction, warm-up, prefetch depth) change only which rows
# are resident, never a result, so a resume may change them (the first three start the
# cache cold).
# `arch` is not one of them either: torchrec's DLRM and the plain-torch one compute the same.
RESUME_MUST_MATCH = ("sparse", "sparse_optimizer", "sparse_lr", "dense_lr", "embedding_dim",
                     "dense_arch", "over_arch", "batch_size", "seed", "raw_keys", "max_rows", "retire", "ttl",
                     "ttl_days", "days", "allow_test_days")
CACHE_SETTINGS = ("cache_ratio", "eviction", "warmup_ratio")
