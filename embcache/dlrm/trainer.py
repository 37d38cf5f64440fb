"""DLRM training over the embedding cache: the system's main job.

DLRM (dense arch, interaction, over arch) takes a `CachedEmbeddingBagCollection` as its
sparse part. The dense part is trained by a torch optimizer; the sparse rows are updated by
the cache's row-wise optimizer during `loss.backward()`. While batch t trains, the ids of
batch t+D (`prefetch_depth`, default 1) are handed to `prefetch`, so that on CUDA their
rows are copied in on a side stream; the cache holds the rows of every pending batch until
that batch has trained, so none is evicted before it is used.

The model is torchrec's `DLRM` where torchrec imports, else the same model in plain torch
(`embcache.dlrm.arch.DLRM`: same parameter names, same arithmetic to the bit), chosen by
`arch` (auto | torchrec | torch). Checkpoints of one resume under the other.

For comparison (`--sparse`): `device` keeps whole tables (torchrec's collection, or
`TorchEmbeddingBagCollection` without torchrec) on the device and `host` keeps them in host
memory, both trained with the torch optimizer that matches the cache's (same arithmetic),
so the three runs are directly comparable.

Under torchrun the run is hybrid parallel (`embcache.distributed`): each table (or, for
one too large, each range of its rows) has one owner rank holding it in its own cache;
pooled embeddings travel by all-to-all; the dense MLPs are data-parallel under DDP. Each
rank reads its slice of every global batch (`--batch-size` is the global batch), and its
loss is its samples' share of the global batch's mean, so N ranks compute what one does.
One process is the world-size-1 case of the same code.

The loop is pipelined (`pipeline`, the default): no ordinary step waits for the device.
Each step's loss stays there and the skeleton reads them every `log_every` steps, at an
epoch's end and before every checkpoint (`embcache.train.run`); batches are read, decoded,
checked and pinned in a background thread (`CTRBatches.background`) and their dense
features and labels copied to the device non-blocking. The synchronous loop
(`pipeline=False`: read every step, batches read in the training thread) computes the same
to the bit. `compile` puts the dense part (bottom MLP, interaction, top MLP) under
`torch.compile`; the cached collection is a compile boundary, so compiling a whole model
over it (torchrec's `DLRM`, `DLRM_DCN`, `DLRM_Projection`) works as well.

The loop, checkpoints and resume are the run skeleton's (`embcache.train.run`). A cached
run's checkpoint is one logical checkpoint (`embcache.distributed.table_checkpoint`): the
tables and optimizer states in id order, cache residency and statistics per rank, and the
position in the data, so a resumed run equals one never stopped, and any world size
resumes it.
"""
from __future__ import annotations

import json
import logging
import zlib
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embcache.data.loader import Batch, CTRBatches, lookahead_window
from embcache.data.parallel import ParallelBatches, default_readers
from embcache.distributed import table_checkpoint
from embcache.distributed.world import all_sum, gather_objects
from embcache.nn.table_groups import group_tables
from embcache.settings_fields import option_names
from embcache.dlrm.captured import GraphedSteps
from embcache.dlrm.evaluation import binary_metrics
from embcache.dlrm.config import CACHE_SETTINGS, RESUME_MUST_MATCH, DLRMConfig, parse_day_range, training_split
from embcache.dlrm.raw_keys import raw_key_setup, with_key_counts
from embcache.train import precision
from embcache.train.prefetch_pipeline import PrefetchPipeline
from embcache.train.run import Trainer
from embcache.dlrm.model import build_model, dense_modules, dense_state, load_dense_state, resolve_arch

logger = logging.getLogger(__name__)
READ_AHEAD = 2  # batches the pipelined loop's reader thread makes before the trainer takes them


def data_fingerprint(meta: dict) -> dict:
    """What identifies a prepared dataset for a resume: its features, their
    cardinalities, the rows of each split and, for data prepared with shard checksums, a
    CRC-32 of them: the content (not its path: a moved copy is the same)."""
    out = {"num_dense": meta["num_dense"],
           "sparse": [(f["name"], f["cardinality"]) for f in meta["sparse"]],
           "rows": {name: split.get("rows") for name, split in sorted(meta.get("splits", {}).items())}}
    if meta.get("shard_crc32") is not None:
        out["shards_crc32"] = zlib.crc32(json.dumps(meta["shard_crc32"], sort_keys=True).encode())
    return out


def data_differs(saved: dict, now: dict) -> bool:
    """Whether the data of fingerprint `now` is not the checkpoint's (`saved`), on what
    `saved` records (a checkpoint from before a part of the fingerprint existed is judged
    on the parts it has)."""
    return json.dumps(saved, sort_keys=True) != json.dumps({k: now.get(k) for k in saved}, sort_keys=True)


def data_difference(saved: dict, now: dict) -> str:
    """How the data of fingerprint `now` differs from the checkpoint's (`saved`), in words.

    Example:
        >>> data_difference({"num_dense": 13, "sparse": [("sparse_0", 9)], "rows": {"train": 100}},
        ...                 {"num_dense": 13, "sparse": [("sparse_0", 7)], "rows": {"train": 80}})
        "sparse_0 has 9 ids in the checkpoint's data, 7 here; train rows 100 in the checkpoint's data, 80 here"
    """
    parts = []
    if saved.get("num_dense") != now.get("num_dense"):
        parts.append(f"{saved.get('num_dense')} dense features in the checkpoint's data, {now.get('num_dense')} here")
    was, cur = dict(map(tuple, saved.get("sparse", []))), dict(map(tuple, now.get("sparse", [])))
    if list(was) != list(cur):
        parts.append(f"{len(was)} sparse features in the checkpoint's data ({_names(was)}), {len(cur)} here "
                     f"({_names(cur)})")
    else:
        other = [f for f in was if was[f] != cur[f]]
        parts += [f"{f} has {was[f]:,} ids in the checkpoint's data, {cur[f]:,} here" for f in other[:2]]
        if len(other) > 2:
            parts[-1] += f" (and {len(other) - 2} more features)"
    rows_was, rows_cur = saved.get("rows", {}), now.get("rows", {})
    for split in sorted(set(rows_was) | set(rows_cur)):
        a, b = rows_was.get(split), rows_cur.get(split)
        if a != b:
            parts.append(f"{split} rows {a if a is None else f'{a:,}'} in the checkpoint's data, "
                         f"{b if b is None else f'{b:,}'} here")
    if not parts and "shards_crc32" in saved and saved["shards_crc32"] != now.get("shards_crc32"):
        parts.append("the same features and rows, but not the same shard files (prepared again, or changed)")
    return "; ".join(parts) or "other data"


def _names(features: dict) -> str:
    names = list(features)
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} .. {names[-1]}"


class DLRMTrainer(Trainer):
    """Runs `DLRMConfig` on a prepared dataset directory (canonical CTR format).

    Example:
        >>> from embcache.data.synthetic import generate_synthetic
        >>> data = getfixture("tmp_path") / "syn"
        >>> meta = generate_synthetic(data, rows=2000, scale=0.0005)
        >>> cfg = DLRMConfig(batch_size=256, embedding_dim=4, dense_arch=[8], over_arch=[8],
        ...                  max_steps=3, device="cpu", progress=False)
        >>> DLRMTrainer(cfg, data).fit()["steps"]
        3
    """

    kind = "dlrm"
    must_match = RESUME_MUST_MATCH
    setting_names = option_names(DLRMConfig, RESUME_MUST_MATCH + CACHE_SETTINGS)
    # the run skeleton's warning when the run ends below its best AUC (`embcache.train.best_score`)
    headline = ("auc", True, "the summary and the checkpoint hold the last model, not the best; a further epoch "
                             "over the same data often overfits a CTR model (one epoch is usual): keep --epochs "
                             "(or --max-steps) at the best one, or lower --lr",
                "the summary and the checkpoint hold the last model, not the best, which was in the middle of an "
                "epoch: end the run there with --max-steps {step}, or lower --lr")

    def __init__(self, cfg: DLRMConfig, data_dir: str | Path):
        from embcache.data.ctr_format import held_out_days, load_id_frequencies, read_meta

        super().__init__(cfg, cfg.resolved_device())
        self.data_dir = Path(data_dir)
        self.meta = read_meta(self.data_dir)
        self.days = parse_day_range(cfg.days) if cfg.days is not None else None
        if self.days is not None:
            missing = [f"day_{d}" for d in self.days if f"day_{d}" not in self.meta["splits"]]
            if missing:
                terabyte = str(self.meta.get("source", "")).startswith("Criteo Terabyte")
                how = ("prepare it with `data prepare criteo-terabyte ... --day-splits` to list each day as a split"
                       if terabyte else "`data synthetic --days N` and Terabyte's `--day-splits` write day splits")
                raise ValueError(f"--days {cfg.days}: {self.data_dir} has no split {', '.join(missing)} (it has "
                                 f"{', '.join(self.meta['splits'])}; {how})")
            held = [f"day_{d}" for d in self.days if f"day_{d}" in held_out_days(self.meta)]
            if held and not cfg.allow_test_days:
                raise ValueError(f"--days {cfg.days}: {', '.join(held)} is the day {self.data_dir} holds out for "
                                 f"val/test; training on it makes `dlrm evaluate` score rows seen in training "
                                 f"(--allow-test-days trains on it anyway)")
            self.headline = None  # days differ: a lower AUC on the next day is no sign of overfitting
        elif cfg.eval_next_day:
            raise ValueError("--eval-next-day needs --days A-B")
        self.raw = raw_key_setup(self.meta, cfg, self.data_dir, self.train_split(0))
        if self.raw is not None and self.raw.open_tables and cfg.eviction == "freq":  # freq's prior, per key
            self.raw = with_key_counts(self.raw, self.meta, self.data_dir)
        freq = load_id_frequencies(self.data_dir) if cfg.sparse == "cached" and self.raw is None else None
        self.model, self.sparse, self.dense_opt, self.sparse_opt = build_model(self.meta, cfg, freq, self.device,
                                                                               self.raw)
        self.precision = precision.resolve(cfg.precision, self.device)  # what the run computes in, recorded
        precision.autocast_modules(dense_modules(self.model), self.precision, self.device)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.prefetches = PrefetchPipeline(self.sparse, cfg.prefetch_depth if cfg.sparse == "cached" else 0)
        self._resumed_ahead = 0  # batches a resumed cache prefetched already (the epoch's first ones)
        self.pipelined = cfg.pipeline
        self.graphs = GraphedSteps(self, cfg.cuda_graphs, logger.info)  # `--cuda-graphs`: captured where it can be
        self.kernels = kernels_in(self.model)
        if self.kernels == "triton" and self.device.type != "cuda" and self.world.is_main:
            logger.warning(f"--kernels triton on {self.device.type} runs under Triton's interpreter: a check of the "
                           f"kernels' results, not a speed (--kernels torch is the fast path off CUDA)")

    def train_split(self, epoch: int) -> str:
        """The split epoch `epoch` trains on: `train`, or with --days its day."""
        return training_split(self.cfg.days, epoch)

    def fit(self) -> dict:
        rows = self.meta["splits"][self.train_split(self.epoch)]["rows"]
        if self.cfg.batch_size > rows and self.world.is_main:
            logger.warning(f"--batch-size {self.cfg.batch_size:,} is larger than the training split ({rows:,} rows): "
                           f"an epoch is one step")
        with precision.precision_scope(self.precision, self.device):  # CUDA's TF32 switches, put back after
            return super().fit()

    # ------------------------------------------------------------------ checkpoints
    def data_fingerprint(self) -> dict:
        return data_fingerprint(self.meta)

    def state_mismatches(self, ck: dict) -> list[str]:
        """A resume keeps the checkpoint's precision (`precision.resume_mismatch`); evaluating
        or exporting a checkpoint may compute in another."""
        return precision.resume_mismatch(ck.get("precision"), self.precision) if self.cfg.resume else []

    def data_mismatch(self, saved_config: dict, saved: dict, now: dict) -> str:
        return (f"data (checkpoint trained on {saved_config.get('data')!r}, this run reads {str(self.data_dir)!r}: "
                f"{data_difference(saved, now)})")

    def trainer_state(self) -> dict:
        """Collective. The dense part from rank 0's copy (identical on every rank); a cached
        sparse part as one logical checkpoint: each rank writes its own shards."""
        state = {"data_dir": str(self.data_dir.resolve()), "dense_optimizer": self.dense_opt.state_dict(),
                 **precision.record(self.precision)}
        if self.raw is not None and self.raw.key_map is not None:  # for `dlrm export` to check its rebuilt map
            state["key_map"] = self.raw.key_map.record()
        if self.cfg.sparse != "cached":
            return {**state, "model": self.model.state_dict(), "sparse_optimizer": self.sparse_opt.state_dict()}
        manifest = table_checkpoint.write_tables(self.cfg.checkpoint_dir, self.kind, self.step, self.sparse)
        return {**state, "dense_model": dense_state(self.model), "tables": manifest}

    def after_save(self, payload: dict) -> None:
        if "tables" in payload:
            table_checkpoint.remove_stale(self.cfg.checkpoint_dir, self.kind, keep=payload["tables"]["dir"])

    def load_trainer_state(self, ck: dict, path: Path) -> None:
        saved = ck["config"]
        if "tables" in ck:  # the logical checkpoint, from any world size
            load_dense_state(self.model, ck["dense_model"])
            ahead = gather_objects(table_checkpoint.read_tables(path, ck["tables"], self.sparse))
        else:  # one process's checkpoint of earlier versions: the whole model in one state dict
            ahead = [self._load_single_process_state(ck)]
        cold = None in ahead
        self._resumed_ahead = 0 if cold or self.cfg.sparse != "cached" else max(ahead)
        self.dense_opt.load_state_dict(ck["dense_optimizer"])
        if self.sparse_opt is not None:
            self.sparse_opt.load_state_dict(ck["sparse_optimizer"])
        changed = [f"{k} {saved.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in CACHE_SETTINGS
                   if self.cfg.sparse == "cached" and saved.get(k) != getattr(self.cfg, k)]
        if changed:
            logger.info(f"cache settings changed ({', '.join(changed)}): the cache starts cold; "
                        f"parameters continue exactly")
        elif cold and self.cfg.sparse == "cached":
            logger.info(f"checkpoint written by {ck.get('world_size', 1)} process(es), resumed on {self.world.size}: "
                        f"the caches start cold; parameters continue exactly")

    def _load_single_process_state(self, ck: dict) -> int | None:
        """Load a checkpoint holding the whole model's state dict; returns the prefetches
        its restored cache holds, or None where the cache starts cold (its rows are spread
        over other ranks now)."""
        model = ck["model"]
        load_dense_state(self.model, {k: v for k, v in model.items() if not k.startswith("sparse_arch.")})
        if self.cfg.sparse != "cached":
            self.model.sparse_arch.load_state_dict({k[len("sparse_arch."):]: v for k, v in model.items()
                                                    if k.startswith("sparse_arch.")})
            return 0
        prefix = "sparse_arch.embedding_bag_collection."
        sparse = {k[len(prefix):]: v for k, v in model.items() if k.startswith(prefix)}
        if not self.world.distributed:  # one rank holds the whole collection: residency included
            self.sparse.local.load_state_dict(sparse)
            return self.sparse.local.pending_prefetches()
        rows, steps, stats = table_checkpoint.legacy_rows(sparse, group_tables(self.sparse.embedding_bag_configs()))
        if self.sparse.local is not None:
            mine = {s.name: {k: v[s.row_start: s.row_stop] for k, v in rows[s.table].items()}
                    for s in self.sparse.shards if s.rank == self.world.rank}
            self.sparse.local.restore_tables(mine, steps)
            self.sparse.local.load_stats(stats if self.world.is_main else {})
        return None

    # ------------------------------------------------------------------ training
    def _batches(self, split: str, batch_size: int, start: int = 0, map_keys: bool = True):
        """A split's batches: dense features and labels on the device; ids on the host for
        a cached or host-memory sparse part (the cache's bookkeeping runs there and only
        rows cross), on the device for whole tables there (on the host where a captured
        step pads multi-hot batches: the padding reads each feature's count). `map_keys` False: a hashed or
        first-day run's raw keys as the data holds them (`dlrm export`'s check maps them
        both ways)."""
        padded_on_host = self.graphs.active and self.graphs.multi_hot  # a captured step's padding reads counts
        ids_on = self.device if self.cfg.sparse == "device" and not padded_on_host else torch.device("cpu")
        return CTRBatches(self.data_dir, split, batch_size, shuffle_shards=split == "train",
                          seed=self.cfg.seed + self.epoch, device=self.device, start_batch=start,
                          part=(self.world.rank, self.world.size), sparse_device=ids_on,
                          key_map=self.raw.key_map if self.raw and map_keys else None)

    def _loss(self, logits: torch.Tensor, batch) -> torch.Tensor:
        """One process: the batch mean. Several: this rank's share of the global batch's
        mean (summed gradients then equal one process's)."""
        if not self.world.distributed:
            return self.loss_fn(logits, batch.labels)
        return F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="sum") / batch.global_size

    def _stream(self, batches: CTRBatches):
        """`batches` to iterate in a `with` block: from the background reader(s) when
        pipelined (`readers`: `data.parallel`, the same batches), else as they are (read in
        this thread)."""
        if not self.pipelined:
            return nullcontext(batches)
        readers = default_readers() if self.cfg.readers is None else self.cfg.readers
        return batches.background(READ_AHEAD) if readers == 1 else ParallelBatches(batches, readers, READ_AHEAD)

    def train_step(self, batch, upcoming=()) -> torch.Tensor:
        """One optimizer step on `batch`; returns its loss (this rank's share under
        torchrun), detached, where it was computed: nothing here waits for the device.
        `upcoming`: the batches after it, up to `prefetch_depth` of them (or one batch, or
        None): a cached run prefetches those not prefetched yet, whose copies overlap this
        step's backward; `batch`'s forward takes its own prefetch's ticket (`prefetches`)."""
        self.model.train()
        ticket = self.prefetches.take(batch)
        with self.sparse.taking(ticket) if ticket is not None else nullcontext():
            logits = self.model(batch.dense, batch.sparse).squeeze(-1)
        upcoming = () if upcoming is None else (upcoming,) if isinstance(upcoming, Batch) else upcoming
        self.prefetches.ahead(upcoming)  # after the forward: its own prefetch is consumed
        loss = self._loss(logits, batch)
        self.dense_opt.zero_grad()
        if self.sparse_opt is not None:
            self.sparse_opt.zero_grad()
        loss.backward()  # the cached rows are updated here
        self.dense_opt.step()
        if self.sparse_opt is not None:
            self.sparse_opt.step()
        return loss.detach()

    def train_epoch(self) -> dict | None:
        batches = self._batches(self.train_split(self.epoch), self.cfg.batch_size, start=self.step_in_epoch)
        self.begin_epoch(len(batches) + self.step_in_epoch)
        self.prefetches.resume_with(self._resumed_ahead)  # none at an epoch's start, but after a resume
        self._resumed_ahead = 0
        captured = self.graphs.active  # a captured step prefetches in its graph, one batch ahead at most
        with self._stream(batches) as stream:  # the reader thread stops however the loop ends
            for batch, upcoming in lookahead_window(stream, self.graphs.depth if captured else self.prefetches.depth):
                if self.should_stop():
                    return None
                loss = self.graphs(batch, upcoming) if captured else self.train_step(batch, upcoming)
                self.after_step(loss, batch.global_size or batch.labels.numel())
        return {}

    def evaluate_epoch(self) -> dict:
        if self.days is None:
            return {"split": "val", **self.evaluate("val")}
        day = self.days[min(self.epoch, len(self.days) - 1)]
        following = f"day_{day + 1}"
        if not self.cfg.eval_next_day or following not in self.meta["splits"]:
            return {"day": day}
        return {"day": day, "split": following, **self.evaluate(following)}

    def format_epoch(self, record: dict) -> str:
        if "day" in record:
            if "auc" not in record:
                return f"day {record['day']}: trained (no next day evaluated)"
            return f"day {record['day']}: next day ({record['split']}) {scores_text(record)}"
        return f"epoch {record['epoch']}: val {scores_text(record)}"

    @torch.no_grad()
    def evaluate(self, split: str = "val") -> dict:
        """AUC and log loss on a split (every rank its slice; the scores gathered in the
        order one process sees them). Its lookups read through the cache without changing
        it (`evaluation`: nothing admitted or evicted) and are counted apart (as
        `cache_hit_rate` of the result): the run's working set, hit rate and bytes moved
        are training's."""
        self.model.eval()
        logits, labels = [], []
        cached = self.cfg.sparse == "cached" and self.sparse.local is not None
        training_comm = dict(getattr(self.sparse, "comm_bytes", {}))  # count training's traffic only
        with self.sparse.evaluation() if cached else nullcontext() as eval_stats:
            with self._stream(self._batches(split, self.cfg.eval_batch_size)) as batches:
                for batch in batches:
                    logits.append(self.model(batch.dense, batch.sparse).squeeze(-1).cpu())
                    labels.append(batch.labels.cpu())
        stats = eval_stats() if cached else {}
        if training_comm:
            self.sparse.comm_bytes.update(training_comm)
        if self.world.distributed:  # batch by batch, rank by rank: one process's order
            per_rank = gather_objects((logits, labels))
            logits = [part for i in range(len(logits)) for lg, _ in per_rank for part in [lg[i]]]
            labels = [part for i in range(len(labels)) for _, lb in per_rank for part in [lb[i]]]
        if not logits:  # no score, and why, where NaN would read as a broken model
            return {"auc": None, "logloss": None, "samples": 0, "not_scored": f"the {split} split has no rows"}
        result = binary_metrics(torch.cat(logits), torch.cat(labels))
        if self.cfg.sparse == "cached":
            total = all_sum({k: stats.get(k, 0) for k in ("hits", "misses")})
            lookups = total["hits"] + total["misses"]
            result["cache_hit_rate"] = total["hits"] / lookups if lookups else 0.0
        return result

    # ------------------------------------------------------------------ reporting
    def _cache_fields(self) -> dict:
        """Cache statistics summed over the ranks (collective)."""
        if self.cfg.sparse != "cached":
            return {}
        keys = ("hits", "misses", "bytes_h2d", "bytes_d2h", "overflow_rows", "bypassed_rows")
        local = self.sparse.cache_stats()
        s = all_sum({k: local.get(k, 0) for k in keys})
        lookups = s["hits"] + s["misses"]
        return {"hit_rate": s["hits"] / lookups if lookups else 0.0, "bytes_h2d": s["bytes_h2d"],
                "bytes_d2h": s["bytes_d2h"], "overflow_rows": s["overflow_rows"], "bypassed_rows": s["bypassed_rows"]}

    def _open_fields(self) -> dict:
        """Open tables' keys summed over tables and ranks (collective): live, made, retired,
        and the key indexes' bytes."""
        if self.raw is None or self.raw.open_tables is None:
            return {}
        local = self.sparse.local.open_stats() if self.sparse.local is not None else {}
        tables = [v for k, v in local.items() if not k.startswith("index")]
        indexes = [v for k, v in local.items() if k.startswith("index")]
        return all_sum({**{k: sum(t[k] for t in tables) for k in ("live_keys", "new_keys", "retired_keys")},
                        "key_index_bytes": sum(i["key_index_bytes"] for i in indexes)})

    def step_log_fields(self) -> dict:
        return {**self._cache_fields(), **self._open_fields()}

    def progress_fields(self) -> dict:
        if self.cfg.sparse != "cached" or self.sparse.local is None:
            return {}
        return {"hit": f"{self.sparse.cache_stats()['hit_rate']:.3f}"}

    def summary_fields(self) -> dict:
        last = self.history[-1] if self.history else {}
        out = {"val_auc": last.get("auc"), "val_logloss": last.get("logloss"),
               **({"val_not_scored": last["not_scored"]} if "not_scored" in last else {}), "sparse": self.cfg.sparse,
               "arch": resolve_arch(self.cfg.arch), "precision": self.precision, "kernels": self.kernels,
               "kernels_interpreted": self.kernels == "triton" and self.device.type != "cuda",
               "cuda_graphs": self.graphs.describe(), **self._cache_fields(),
               **self._open_fields()}
        if self.days is not None:
            out["next_day"] = [{k: r[k] for k in ("day", "split", "auc", "logloss", "not_scored") if k in r}
                               for r in self.history if not r.get("partial")]
        if self.cfg.sparse == "cached":
            out["cache_ratio"] = self.cfg.cache_ratio  # as given, or as `--cache-ratio auto` chose it
            out["cache_rows"] = all_sum({"rows": self.sparse.cache_rows()})["rows"]
            out["table_rows"] = sum(t.num_embeddings for t in self.sparse.embedding_bag_configs())
            if self.world.distributed:
                out["comm_bytes_per_step"] = self.comm_per_step()
        return out

    def comm_per_step(self) -> dict:
        """Bytes this run sent between ranks per training step, summed over ranks:
        ids and pooled embeddings (forward; the gradients go back the same size), and the
        dense gradients DDP all-reduces."""
        from embcache.distributed.data_parallel import gradient_bytes

        sent = all_sum(dict(self.sparse.comm_bytes))
        steps = max(self.step, 1)
        dense = gradient_bytes(self.model.dense_arch) + gradient_bytes(self.model.over_arch)
        return {"ids": sent["ids"] / steps, "pooled": sent["pooled"] / steps, "pooled_grad": sent["pooled"] / steps,
                "dense_allreduce": dense}


def scores_text(result: dict) -> str:
    """`AUC 0.7312  log loss 0.4821`, or `AUC n/a (the val split has no rows)` for a split
    with nothing to score (`DLRMTrainer.evaluate`'s `not_scored`)."""
    why = f" ({result.get('not_scored', 'not evaluated')})"
    auc = "n/a" if result.get("auc") is None else f"{result['auc']:.4f}"
    logloss = "n/a" if result.get("logloss") is None else f"{result['logloss']:.4f}"
    return f"AUC {auc}  log loss {logloss}" + (why if result.get("auc") is None else "")


def kernels_in(model: torch.nn.Module) -> str:
    """The embedding kernels the model's tables run, as their caches or whole tables resolved
    `--kernels`: "triton" where any runs ours, else "torch" (torchrec's tables included)."""
    found = {k for m in model.modules()
             for k in (getattr(m, "kernels", None), getattr(getattr(m, "cache", None), "kernels", None))}
    return "triton" if "triton" in found else "torch"
