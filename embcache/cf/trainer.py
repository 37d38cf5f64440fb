"""Collaborative filtering (SimpleX, MF-CCL) trained by the HEAT kernels or the PyTorch
reference engine, on the run skeleton (`embcache.train.run`) like the other two trainers.

An epoch is one engine call over the shuffled training pairs (cut into chunks only for the
progress bar), so a cf run checkpoints at each epoch's end. A checkpoint holds the
parameters and the engine's own state (HEAT: each thread's random stream and tile; torch:
Adam's moments and the sampler); the SimpleX histories are not stored, they are drawn again
from the seed and the training data. Evaluation ranks all items for every test user
(training items masked) every `eval_every` epochs and after the last.
"""
from __future__ import annotations

import logging
import time
import zlib
from pathlib import Path

import numpy as np

from cpu_kernels.heat import HeatEngine, HeatOptions, compile_kernels, max_threads
from cpu_kernels.model import CFConfig, CFParams, histories
from cpu_kernels.torch_reference import TorchEngine, TorchOptions
from embcache.cf.data.interactions import Interactions
from embcache.errors import CheckpointError, DataFormatError
from embcache.settings_fields import option_names
from embcache.cf.config import ENGINE_SETTINGS, ENGINES, MODEL_SETTINGS, CFTrainConfig  # noqa: F401 (users import it here)
from embcache.cf.evaluation import evaluate_params
from embcache.train.run import Trainer, check_loss
from embcache.train.step_windows import StepWindows

logger = logging.getLogger(__name__)

# said when a run ends with a Recall below its best (`Trainer.headline`, `embcache.train.best_score`)
FALLING_ADVICE = ("the summary, --save and the checkpoint hold the last epoch's model, not the best: keep --epochs at "
                  "the best one, or lower --lr")


def load_interactions(cfg: CFTrainConfig) -> Interactions:
    """The training data `cfg` names, refused in one line when it leaves nothing to train
    on; an empty test split is allowed, with a warning (its metrics are reported as null)."""
    from embcache.cf.data.sources import read_interactions

    try:
        data = read_interactions(cfg.data, cfg.split, cfg.test_fraction, cfg.split_seed, cfg.min_rating,
                                 (cfg.synthetic_users, cfg.synthetic_items, cfg.synthetic_interactions),
                                 cfg.skip_bad_lines, {"user": cfg.user_col, "item": cfg.item_col,
                                                      "time": cfg.time_col, "rating": cfg.rating_col})
    except DataFormatError:
        raise
    except (ValueError, OSError) as err:
        raise DataFormatError(f"{cfg.data}: {err}") from None
    except MemoryError as err:
        raise DataFormatError(f"{cfg.data}: out of memory reading the data ({err}); are the ids dense, "
                              f"0..n-1?") from None
    where = cfg.data if cfg.data in ("ml-100k", "synthetic") else Path(cfg.data)
    if data.num_train == 0:
        raise DataFormatError(f"{where}: no training interactions after the split ({data.num_test:,} in test; "
                              f"--min-rating {cfg.min_rating}, --test-fraction {cfg.test_fraction:g}): "
                              f"nothing to train on")
    if data.num_test == 0:
        logger.warning(f"{where}: the test split is empty, so Recall and NDCG cannot be computed: they are "
                       f"reported as null")
    return data


def make_engine(engine: str, params: CFParams, data: Interactions, heat: HeatOptions = HeatOptions(),
                torch_opts: TorchOptions = TorchOptions()):
    """The engine that trains `params` on `data`'s training pairs."""
    users, items = data.train_pairs()
    if engine == "heat":
        return HeatEngine(params, users, items, heat)
    if engine == "torch":
        return TorchEngine(params, users, items, torch_opts)
    raise ValueError(f"engine must be one of {ENGINES}")


def data_fingerprint(data: Interactions) -> dict:
    """Sizes and a CRC of the train/test split: a resume on other data must not pass."""
    crc = 0
    for a in (data.train_indptr, data.train_indices, data.test_indptr, data.test_indices):
        crc = zlib.crc32(np.ascontiguousarray(a, dtype=np.int64).tobytes(), crc)
    return {"users": data.num_users, "items": data.num_items, "train": data.num_train,
            "test": data.num_test, "crc32": crc}


def other_data(saved: dict, now: dict, name: str) -> str:
    """How two data fingerprints differ, for the one-line refusals of a model or checkpoint
    meeting data it was not trained on (same sizes: the pairs differ, which the CRC tells)."""
    return (f"{saved['users']:,} users, {saved['items']:,} items, {saved['train']:,} training / "
            f"{saved.get('test', 0):,} test pairs; {name} has {now['users']:,}, {now['items']:,} and "
            f"{now['train']:,} / {now.get('test', 0):,}")


def load_cf_checkpoint(path: str | Path) -> tuple[Path, dict]:
    """(the file, the checkpoint) of a `cf train --checkpoint-dir` checkpoint (`cf-last.pt`,
    or the directory holding it), checked: CheckpointError naming the file when it is
    missing, damaged or another trainer's."""
    from embcache.checkpoint import load_checkpoint
    from embcache.train.run_files import checkpoint_file, refuse_unheld_sizes

    path = checkpoint_file(path, "cf")
    ck = load_checkpoint(path, kind="cf")
    refuse_unheld_sizes(path, ck.get("config"), held_sizes(ck))
    return path, ck


def held_sizes(ck: dict) -> dict:
    """The `dim` a cf checkpoint's rows say (U and I are that wide, W that square), read
    from their shapes: a resume and `cf evaluate` build tables of the checkpoint's `dim` for
    every user and item before its rows are copied in."""
    shapes = [tuple(int(n) for n in getattr(ck.get(name), "shape", ())) for name in ("U", "I", "W")]
    dims = {s[-1] for s in shapes if len(s) == 2} | {s[0] for s in shapes[2:] if len(s) == 2}
    return {"dim": dims.pop() if len(dims) == 1 else sorted(dims)} if dims else {}


def params_from_checkpoint(path: str | Path, data: Interactions, loaded: tuple[Path, dict] | None = None) -> CFParams:
    """The embeddings of a `cf train --checkpoint-dir` checkpoint (`cf-last.pt`, or the
    directory holding it; `loaded`: what `load_cf_checkpoint` read of it already), for
    evaluating them on `data`, which must be the data they were trained on (CheckpointError
    naming the difference otherwise). The SimpleX histories are drawn again, as a resume
    draws them."""
    path, ck = loaded if loaded is not None else load_cf_checkpoint(path)
    saved, now = ck.get("data"), data_fingerprint(data)
    if saved is not None and saved != now:
        raise CheckpointError(f"{path} was trained on other data ({other_data(saved, now, data.name)})")
    config = CFConfig(**{k: v for k, v in ck["config"].items() if k in MODEL_SETTINGS})
    U, I, W = (np.ascontiguousarray(ck[name], dtype=np.float32) for name in ("U", "I", "W"))
    if (len(U), len(I)) != (data.num_users, data.num_items):
        raise CheckpointError(f"{path}: has {len(U):,} users and {len(I):,} items, the data {data.num_users:,} "
                              f"and {data.num_items:,}")
    return CFParams(U, I, W, *histories(config, data.train_indptr, data.train_indices), config)


class CFTrainer(Trainer):
    """Trains `cfg`'s model on `data` (read from `cfg.data` when not given), starting from
    `params` when given (else `cfg.load`'s file, else fresh seeded rows).

    Example:
        >>> from embcache.cf.data.synthetic import power_law_interactions
        >>> data = power_law_interactions(100, 150, 2000, communities=4, seed=1)
        >>> trainer = CFTrainer(CFTrainConfig(epochs=2, negatives=4, threads=1, progress=False), data)
        >>> summary = trainer.fit()
        >>> [r["epoch"] for r in trainer.history], summary["epochs_done"], summary["recall@20"] > 0
        ([1, 2], 2, True)
    """

    kind = "cf"

    def __init__(self, cfg: CFTrainConfig, data: Interactions | None = None, params: CFParams | None = None):
        device = cfg.resolved_device()
        if device.type != "cpu" and cfg.engine != "torch":
            raise ValueError(f"device {cfg.device!r}: the HEAT engine runs on the CPU (--engine torch can use "
                             f"{device.type})")
        if cfg.threads is not None and not 1 <= cfg.threads <= max_threads():
            raise ValueError(f"--threads must be in 1..{max_threads()} on this machine")
        super().__init__(cfg, device)
        # the run skeleton's warning when the run ends below its best Recall, as dlrm's AUC
        self.headline = (f"recall@{cfg.ks[0]}", True, FALLING_ADVICE)
        self.data = data if data is not None else load_interactions(cfg)
        self.config = cfg.model_config()
        if params is None and cfg.load:
            from embcache.cf.data.embeddings_file import load_params

            params = load_params(cfg.load, self.data.num_items, self.data.train_indptr, self.data.train_indices,
                                 self.config)
        if params is None:
            params = CFParams.init(self.config, self.data.num_users, self.data.num_items, self.data.train_indptr,
                                   self.data.train_indices)
        self.params = params
        self.engine = make_engine(cfg.engine, self.params, self.data, cfg.heat_options(), cfg.torch_options())
        self.threads = cfg.resolved_threads()
        # this process's epochs, its first apart: it carries the warm-up (threads started, pages
        # touched), which in a short run would pass for the speed (`epoch_fields`)
        self.epoch_windows = StepWindows()
        self.compile_seconds: float | None = None  # HEAT's kernels, compiled before the first epoch

    setting_names = option_names(CFTrainConfig, (*MODEL_SETTINGS, "engine",
                                                 *{n for e in ENGINE_SETTINGS.values() for n in e}))

    @property
    def must_match(self) -> tuple[str, ...]:
        return (*MODEL_SETTINGS, "engine", *ENGINE_SETTINGS[self.cfg.engine])

    def fit(self) -> dict:
        self._warn_of_settings()
        if self.cfg.engine == "heat" and self.cfg.epochs > 0:
            seconds = self.compile_seconds = compile_kernels()
            if seconds > 1.0:
                logger.info(f"compiled the HEAT kernels in {seconds:.1f} s (numba caches them for later runs)")
        return super().fit()

    def _warn_of_settings(self) -> None:
        """Settings that run but are surely not what was meant: one line each."""
        from embcache.cf.evaluation import warn_of_large_k

        items, pairs = self.data.num_items, self.data.num_train
        warn_of_large_k(self.cfg.ks, items)
        if self.cfg.negatives > items:
            logger.warning(f"--negatives {self.cfg.negatives:,} is more than the {items:,} items: each pair's "
                           f"negatives repeat items (they are drawn with replacement)")
        if self.cfg.engine == "torch" and self.cfg.batch_size > pairs:
            logger.warning(f"--batch-size {self.cfg.batch_size:,} is larger than the training split ({pairs:,} "
                           f"pairs): an epoch is one step")

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self) -> dict:
        n = self.data.num_train
        self.begin_epoch(n, unit="pair")
        progress = self.cfg.progress
        t0, cpu0 = time.perf_counter(), time.process_time()
        # in chunks even without a bar (the same arithmetic): a second Ctrl-C stops at the next one
        stats = self.engine.epoch(self.epoch, chunks=20,
                                  progress=(lambda done, loss: self.tick(done, loss=f"{loss:.4f}")) if progress
                                  else None)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        self.account_cpu(cpu, n)
        self.epoch_windows.add(1, seconds, n, cpu)
        check_loss(stats["loss"], f"epoch {self.epoch + 1}")
        self.train_seconds += seconds
        self.train_samples += n
        record = {"seconds": seconds, "samples_per_s": n / seconds, "loss": stats["loss"]}
        for key in ("active_negatives", "redraws", "seen_negatives"):
            if key in stats:
                record[key] = stats[key]
        return record

    def evaluate_epoch(self) -> dict:
        done = self.epoch + 1
        if done % self.cfg.eval_every and done != self.cfg.epochs:
            return {}
        t0 = time.perf_counter()
        result = evaluate_params(self.params, self.data, self.cfg.ks, self.cfg.topk)
        return {**result, "eval_seconds": time.perf_counter() - t0}

    def format_epoch(self, record: dict) -> str:
        from embcache.cf.evaluation import format_metrics

        s = (f"epoch {record['epoch']:>3}/{self.cfg.epochs}  {record['seconds']:7.2f} s  "
             f"{record['samples_per_s']:>12,.0f} samples/s  loss {record['loss']:.4f}")
        if f"recall@{self.cfg.ks[0]}" in record:
            s += "  " + format_metrics(record, self.cfg.ks)
        return s

    # ------------------------------------------------------------------ checkpoints
    def data_fingerprint(self) -> dict:
        return data_fingerprint(self.data)

    def data_mismatch(self, saved_config: dict, saved: dict, now: dict) -> str:
        return f"other data ({other_data(saved, now, 'the data now')})"

    def trainer_state(self) -> dict:
        return {"U": self.params.U, "I": self.params.I, "W": self.params.W, "engine_state": self.engine.state_dict()}

    def load_trainer_state(self, ck: dict, path: Path) -> None:
        for name in ("U", "I", "W"):
            saved, live = ck[name], getattr(self.params, name)
            if saved.shape != live.shape or saved.dtype != live.dtype:
                raise CheckpointError(f"{path}: {name} has shape {saved.shape}, expected {live.shape}")
            live[...] = saved
        try:
            self.engine.load_state_dict(ck["engine_state"])
        except (ValueError, KeyError) as err:
            raise CheckpointError(f"{path}: {err}") from None

    def upgrade_checkpoint(self, ck: dict) -> dict:
        """Checkpoints written before the shared skeleton kept the engine and its options
        beside the model settings; those written before the runs kernel or before the
        "unseen" negatives were trained by the per-sample kernel and with negatives from
        all items, and resume that way."""
        ck = super().upgrade_checkpoint(ck)
        if "options" in ck:
            ck["config"] = {**ck["config"], "engine": ck.pop("engine"), **ck.pop("options")}
        if "negatives_from" not in ck["config"]:
            # written before issue 23: negatives were drawn from all items
            ck["config"] = {**ck["config"], "negatives_from": "all"}
        if ck["config"].get("engine") == "heat" and "kernel" not in ck["config"]:
            # written before the runs kernel: by the per-sample one, in a plain shuffle
            ck["config"] = {**ck["config"], "kernel": "sample", "user_run": 1}
        return ck

    # ------------------------------------------------------------------ reporting
    def _run_info(self) -> dict:
        return {"data": self.data.name, "engine": self.cfg.engine, "model": self.config.model,
                "threads": self.threads}

    def start_fields(self) -> dict:
        d = self.data
        return {**self._run_info(), "users": d.num_users, "items": d.num_items, "train": d.num_train,
                "test": d.num_test}

    def epoch_log_fields(self) -> dict:
        return self._run_info()

    def final_metrics(self) -> dict:
        """Recall@k / NDCG@k of the parameters as they stand (the last epoch's when it was
        evaluated)."""
        last = self.history[-1] if self.history else {}
        if f"recall@{self.cfg.ks[0]}" in last:
            return {k: v for k, v in last.items() if "@" in k}
        return evaluate_params(self.params, self.data, self.cfg.ks, self.cfg.topk)

    def epoch_fields(self) -> dict:
        """The summary's figures with this process's first epoch apart: `first_epoch_seconds`,
        and `steady_*` over the epochs after it (None where there are none);
        `compile_seconds` the HEAT kernels' compiling, before the first epoch and in no figure.
        `train_seconds` and `train_samples_per_s` keep covering every epoch."""
        w = self.epoch_windows
        if w.first_seconds is None:
            return {"compile_seconds": self.compile_seconds}
        after = w.steps - w.first_steps
        return {"compile_seconds": self.compile_seconds, "first_epoch_seconds": w.first_seconds,
                "first_epoch_samples_per_s": w.first_samples / w.first_seconds if w.first_seconds > 0 else None,
                "steady_epochs": after, "steady_seconds": w.seconds,
                "steady_samples_per_s": w.samples / w.seconds if after and w.seconds > 0 else None,
                "steady_cpu_seconds_per_sample": w.cpu / w.samples if w.samples else None}

    def summary_fields(self) -> dict:
        from embcache.cf.evaluation import popularity

        return {**self._run_info(), **self.epoch_fields(), **self.final_metrics(),
                "popularity": popularity(self.data, self.cfg.ks, self.cfg.topk)}
