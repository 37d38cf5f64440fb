"""Prepared shards as a benchmark's batches: the loader's own rate, and the GPU step fed by it.

`bench gpu` makes its batches in memory; users train from files. `--from-shards DIR` feeds
the same step from a prepared Criteo-shaped directory (13 dense features, 26 one-hot
features: `embcache data synthetic`, or Criteo Kaggle prepared) through the parallel
loader (`embcache.data.parallel`), and measures in the same run what the loader alone
delivers at each reader count. The step's id space is the 26 tables of the directory's
cardinalities end to end, as the trace's are.

What the loader is timed doing is what the step is fed: the batches of the train split,
read, decoded, checked, their ids laid out as the step takes them (`[B, 26]` in the one id
space) and pinned where CUDA takes them, all in the reader threads; the timing ends when the
last batch is taken. The page cache is warmed (and every shard's CRC-32 checked) by a pass
before the first timing. `loader_vs_step` is the loader's rows/s over the step's samples/s:
>= 1.5 means the loader is not what bounds training.

`bench loader DIR` runs the loader part alone (`embcache.bench.loader_cli`).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from embcache.data.ctr_format import is_raw_keys, read_meta, sparse_features
from embcache.data.loader import CTRBatches
from embcache.data.parallel import ParallelBatches, default_readers
from embcache.errors import UserFacingError

NUM_DENSE, NUM_SPARSE = 13, 26  # the model's Criteo shape
CHECK_BATCHES = 8  # batches compared to the bit with the one-thread loader at each reader count


def check_criteo_shaped(data_dir: str | Path) -> dict:
    """meta.json of `data_dir` where it is shaped as the benchmark's model: 13 dense and 26
    one-hot features of ids (not raw keys); else one line saying what differs."""
    meta = read_meta(data_dir)
    features = sparse_features(meta)
    multi = [f.name for f in features if f.multi_hot]
    problem = (f"has {meta['num_dense']} dense and {len(features)} sparse features, the model "
               f"{NUM_DENSE} and {NUM_SPARSE}" if (int(meta["num_dense"]), len(features)) != (NUM_DENSE, NUM_SPARSE)
               else f"has multi-hot features ({', '.join(multi[:3])}), the model one-hot ones" if multi
               else "holds raw keys, the model ids (prepare it with ids)" if is_raw_keys(meta)
               else "has no train split" if "train" not in meta["splits"] else None)
    if problem:
        raise UserFacingError(f"{data_dir}: {problem}: a Criteo-shaped directory is needed "
                              f"(`embcache data synthetic` writes one)")
    return meta


class FlatIds:
    """A loader batch as the step's inputs `((ids [B, 26],), dense, labels)`: the ids of
    feature f moved by the sizes of the tables before it, into the one id space; pinned
    when `pin` (CUDA takes them). Runs in the reader threads."""

    def __init__(self, cardinalities: list[int], pin: bool):
        self.offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
        self.pin = pin

    def __call__(self, batch) -> tuple:
        # numpy, one pass: torch's add would start an OpenMP team of its own in each reader thread
        values = batch.sparse.values().numpy().reshape(len(self.offsets), len(batch))
        ids = torch.from_numpy(np.add(values.T, self.offsets, out=np.empty((len(batch), len(self.offsets)), np.int64)))
        if self.pin:
            return (ids.pin_memory(),), batch.dense.pin_memory(), batch.labels.pin_memory()
        return (ids,), batch.dense, batch.labels


def loader_rates(data_dir, batch_size: int, batches: int, readers: list[int], pin: bool = False,
                 chunk_rows: int | None = None, repeats: int = 3) -> list[dict]:
    """Rows/s of the loader alone at each reader count over the first `batches` batches of
    the train split (a warming pass first; the best of `repeats` passes, the counts taking
    turns, so that a machine shared with other work is measured at its least disturbed), the
    process's CPU seconds a million rows (all threads: what reading costs, whatever else the
    machine runs), and whether its first batches equal the one thread's to the bit."""
    meta = check_criteo_shaped(data_dir)
    loader = CTRBatches(data_dir, "train", batch_size, drop_last=True)
    batches = min(batches, len(loader))
    if batches < 1:
        raise UserFacingError(f"{data_dir}: its train split holds fewer rows than one batch of {batch_size}")
    flat = FlatIds([f.cardinality for f in sparse_features(meta)], pin)
    options = {"transform": flat, "stop": batches, "chunk_rows": chunk_rows}
    _take(lambda: ParallelBatches(loader, max(readers), **options))  # warms the page cache, checks the CRCs
    seconds = {count: [] for count in readers}
    for _ in range(max(int(repeats), 1)):
        for count in readers:
            seconds[count].append(_take(lambda: ParallelBatches(loader, count, **options)))
    rows = batches * batch_size
    return [{"readers": count, "batches": batches, "rows": rows, "seconds": [wall for wall, _ in seconds[count]],
             "rows_per_s": rows / min(wall for wall, _ in seconds[count]),
             "cpu_s_per_million_rows": 1e6 * min(cpu for _, cpu in seconds[count]) / rows,
             "same_batches_as_one_thread": _same_as_one_thread(loader, count, chunk_rows)} for count in readers]


def _take(start) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) from the readers' start (`start()` makes
    them) until the last batch is taken."""
    t0, c0 = time.perf_counter(), time.process_time()
    with start() as batches:
        for _ in batches:
            pass
        return time.perf_counter() - t0, time.process_time() - c0


def _same_as_one_thread(loader: CTRBatches, readers: int, chunk_rows: int | None) -> bool:
    """The first batches through `readers` readers equal the one thread's, to the bit."""
    with ParallelBatches(loader, readers, stop=CHECK_BATCHES, chunk_rows=chunk_rows) as parallel:
        for k, want in enumerate(loader.host_batches()):
            if k == CHECK_BATCHES:
                return True
            got = next(parallel)
            same = [torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in
                    ((got.dense, want.dense), (got.labels, want.labels))]
            if not (all(same) and torch.equal(got.sparse.values(), want.sparse.values())
                    and torch.equal(got.sparse.lengths(), want.sparse.lengths())):
                return False
    return True


class ShardSteps:
    """The first `steps` batches of the train split as the step's inputs, indexed as
    `bench gpu`'s in-memory list is (`data[i]`, `len(data)`): read forward by a parallel
    loader, the last `keep` kept (a prefetch looks ahead of the step); asking for an earlier
    one starts the loader again there (each variant of a run starts at batch 0)."""

    def __init__(self, data_dir, batch_size: int, steps: int, readers: int, pin: bool, keep: int = 4):
        meta = check_criteo_shaped(data_dir)
        self.loader = CTRBatches(data_dir, "train", batch_size, drop_last=True)
        if len(self.loader) < steps:
            raise UserFacingError(f"{data_dir}: its train split holds {len(self.loader)} batches of {batch_size}, "
                                  f"the run takes {steps} (fewer --steps / --warmup-steps, or more rows)")
        self.cardinalities = [f.cardinality for f in sparse_features(meta)]
        self.num_rows = int(sum(self.cardinalities))
        self.steps, self.readers, self.keep = int(steps), int(readers), max(int(keep), 1)
        self._flat = FlatIds(self.cardinalities, pin)
        self._reader: ParallelBatches | None = None
        self._next, self._window = 0, {}

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int):
        if not 0 <= i < self.steps:
            raise IndexError(i)
        if i not in self._window:
            if self._reader is None or i < self._next:
                self.close()
                self._window.clear()
                start = self.loader.skip(i)
                self._reader = ParallelBatches(start, self.readers, transform=self._flat, stop=self.steps)
                self._next = i
            while self._next <= i:
                self._window[self._next] = next(self._reader)
                self._next += 1
            for old in [k for k in self._window if k <= self._next - 1 - self.keep]:
                del self._window[old]
            if self._next == self.steps:  # the run takes no more: the readers stop
                self.close()
        return self._window[i]

    def close(self) -> None:
        """Stop the readers (a run's last step, or one refused before any started)."""
        if getattr(self, "_reader", None) is not None:
            self._reader.close()
            self._reader = None

    def __del__(self) -> None:
        self.close()


def open_feed(args, device: torch.device) -> ShardSteps:
    """`bench gpu --from-shards`: the steps' batches from `args.from_shards`, fed by the
    largest of `args.readers`, and the loader's rows/s at each count over the same batches
    (`rates`), measured now, before any step runs."""
    counts = reader_counts(args.readers)
    pin = device.type == "cuda"
    steps = args.warmup_steps + args.steps
    feed = ShardSteps(args.from_shards, args.batch_size, steps, max(counts), pin, keep=args.prefetch_depth + 2)
    feed.rates = loader_rates(args.from_shards, args.batch_size, steps, counts, pin)
    for r in feed.rates:
        print(f"  loader from {args.from_shards}, {r['readers']} reader(s): {r['rows_per_s']:,.0f} rows/s"
              + ("" if r["same_batches_as_one_thread"] else ", BATCHES DIFFER FROM ONE THREAD'S"), flush=True)
    return feed


def add_loader_figures(payload: dict, rates: list[dict], fed_by: int) -> None:
    """`payload["loader"]` (rows/s per reader count), and on every row of `payload["rows"]`
    the loader's rows/s at the reader count that fed the step and `loader_vs_step`."""
    rate = next(r["rows_per_s"] for r in rates if r["readers"] == fed_by)
    payload["loader"] = {"readers_feeding_the_step": fed_by, "rates": rates}
    for row in payload.get("rows", []):
        row["loader_rows_per_s"] = rate
        row["loader_vs_step"] = rate / row["samples_per_s"]


def reader_counts(readers: list[int] | None) -> list[int]:
    """The reader counts asked for, or the default one alone."""
    counts = [default_readers()] if not readers else sorted(set(int(r) for r in readers))
    if counts[0] < 1:
        raise UserFacingError(f"--readers must be >= 1, got {counts[0]}")
    return counts
