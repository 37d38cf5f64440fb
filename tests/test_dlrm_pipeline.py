"""The pipelined DLRM loop: losses read from the device every `log_every` steps, batches read
in a background thread. It computes what the synchronous loop computes, to the bit; the
guard still names the first diverged step; the reader thread never outlives the loop and
its errors reach the trainer unchanged."""
import json
import shutil
import threading
import time
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from embcache.checkpoint import load_checkpoint
from embcache.data.background import BackgroundIterator
from embcache.data.ctr_format import read_meta
from embcache.data.loader import CTRBatches
from embcache.errors import DataFormatError, TrainingDiverged
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from tests.test_dlrm import assert_same_checkpoint
from tests.shard_edit import write_shard


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("synthetic")
    generate_synthetic(out, rows=4_000, scale=0.001, seed=0)
    return out


def small_config(**kw):
    base = DLRMConfig(batch_size=256, eval_batch_size=2048, embedding_dim=8, dense_arch=[16],
                      over_arch=[16], device="cpu", progress=False, epochs=1, cache_ratio=0.01)
    return replace(base, **kw)


def recording(trainer):
    """`trainer` with its train_step's losses and its reads' window sizes recorded."""
    trainer.losses, trainer.reads = [], []
    step, read = trainer.train_step, trainer._read_unread
    trainer.train_step = lambda *a: trainer.losses.append(step(*a)) or trainer.losses[-1]

    def counted():
        losses, samples = read()
        trainer.reads.append((trainer.step, len(losses)))
        return losses, samples

    trainer._read_unread = counted
    return trainer


def step_records(path):
    """The metrics log's step records without their wall-clock rate."""
    return [{k: v for k, v in r.items() if k != "samples_per_s"}
            for r in map(json.loads, open(path)) if r["event"] == "step"]


# ------------------------------------------------------------------ same results as the synchronous loop
def test_pipelined_run_equals_the_synchronous_one(synthetic, tmp_path):
    """Two epochs (16 steps each, the last one short) with a stop at step 24, reads every 5
    steps and checkpoints every 7: the same loss at every step, the same metrics-log records,
    the same checkpoint (tables, optimizer state, residency, history) and evaluation."""
    runs = {}
    for pipeline in (True, False):
        cfg = small_config(epochs=2, max_steps=24, log_every=5, checkpoint_every=7, pipeline=pipeline,
                           checkpoint_dir=str(tmp_path / f"ck{pipeline}"),
                           metrics_out=str(tmp_path / f"metrics{pipeline}.jsonl"))
        trainer = recording(DLRMTrainer(cfg, synthetic))
        trainer.fit()
        runs[pipeline] = trainer
    piped, sync = runs[True], runs[False]
    assert len(piped.losses) == len(sync.losses) == 24
    assert all(torch.is_tensor(loss) for loss in piped.losses)  # nothing read inside the step
    assert torch.equal(torch.stack(piped.losses), torch.stack(sync.losses))
    # the synchronous loop reads each step; the pipelined one its first step alone (timed apart: it
    # carries the start-up), then at log steps, checkpoints, the epoch's end
    assert sync.reads == [(s, 1) for s in range(1, 25)]
    reads_at = [s for s, _ in piped.reads]
    assert reads_at == sorted({1} | {s for s in range(1, 25) if s % 5 == 0 or s % 7 == 0} | {16, 24})
    assert sum(n for _, n in piped.reads) == 24
    records = step_records(tmp_path / "metricsTrue.jsonl")
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    assert records == step_records(tmp_path / "metricsFalse.jsonl")
    assert_same_checkpoint(tmp_path / "ckTrue" / "dlrm-last.pt", tmp_path / "ckFalse" / "dlrm-last.pt", residency=True)
    a, b = (load_checkpoint(tmp_path / f"ck{p}" / "dlrm-last.pt", "dlrm") for p in (True, False))
    assert a["step"] == b["step"] == 24 and a["history"] == b["history"]
    # the first epoch's record, then the validation where --max-steps ended the run
    assert [(r["epoch"], r["step"], r.get("partial")) for r in a["history"]] == [(1, 16, None), (2, 24, True)]
    assert piped.train_samples == sync.train_samples == 4_000 + 8 * 256  # an epoch, then 8 steps
    assert piped._loss_ema == sync._loss_ema
    assert piped.evaluate("val") == sync.evaluate("val")


def test_a_pipelined_run_resumes_exactly(synthetic, tmp_path):
    """Stopped at step 7 (between two reads) and resumed to 14: what one run to 14 computes."""
    whole = DLRMTrainer(small_config(max_steps=14, log_every=4, checkpoint_dir=str(tmp_path / "w")), synthetic)
    whole.fit()
    DLRMTrainer(small_config(max_steps=7, log_every=4, checkpoint_dir=str(tmp_path / "p")), synthetic).fit()
    assert load_checkpoint(tmp_path / "p" / "dlrm-last.pt", "dlrm")["step"] == 7
    resumed = DLRMTrainer(small_config(max_steps=14, log_every=4, checkpoint_dir=str(tmp_path / "p"), resume=True),
                          synthetic)
    resumed.fit()
    assert_same_checkpoint(tmp_path / "w" / "dlrm-last.pt", tmp_path / "p" / "dlrm-last.pt", residency=True)


# ------------------------------------------------------------------ the divergence guard
@pytest.mark.parametrize("bad_steps", [[7], [7, 9]])
def test_the_guard_names_the_first_diverged_step_of_a_window(synthetic, tmp_path, bad_steps):
    """The loss of step 7 (and 9) is infinite; the losses are read at 1 (the first step is
    timed apart), 5 and 10 only. The run stops naming step 7, and nothing after step 5
    reaches a checkpoint or the log."""
    metrics = tmp_path / "metrics.jsonl"
    trainer = DLRMTrainer(small_config(max_steps=14, log_every=5, checkpoint_every=5, checkpoint_dir=str(tmp_path),
                                       metrics_out=str(metrics)), synthetic)
    step = trainer.train_step
    reads = []
    read = trainer._read_unread
    trainer._read_unread = lambda: reads.append(trainer.step) or read()

    def poisoned(*args):
        loss = step(*args)
        return loss + float("inf") if trainer.step + 1 in bad_steps else loss

    trainer.train_step = poisoned
    with pytest.raises(TrainingDiverged, match="^step 7: the loss is inf"):
        trainer.fit()
    assert reads == [1, 5, 10]  # found at the read after it, not at the step
    assert load_checkpoint(tmp_path / "dlrm-last.pt", "dlrm")["step"] == 5
    records = [json.loads(line) for line in open(metrics)]
    assert [r["step"] for r in records if r["event"] == "step"] == [5]
    assert records[-1]["event"] == "diverged" and "step 7" in records[-1]["message"]


# ------------------------------------------------------------------ the reader thread
def test_no_reader_thread_outlives_a_run_stopped_early_or_failed(synthetic):
    before = threading.active_count()
    DLRMTrainer(small_config(max_steps=5), synthetic).fit()  # an early stop (max_steps)
    DLRMTrainer(small_config(), synthetic).evaluate("val")
    assert threading.active_count() == before
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        trainer = DLRMTrainer(small_config(max_steps=20), synthetic)
        step = trainer.train_step

        def failing(*args, error=error):
            if trainer.step == 3:
                raise error
            return step(*args)

        trainer.train_step = failing
        with pytest.raises(type(error)):
            trainer.fit()
        assert threading.active_count() == before, type(error)


def _with_a_bad_id(synthetic, out, row):
    """A copy of `synthetic` whose first training shard has an id out of range at `row`."""
    shutil.copytree(synthetic, out)
    meta = read_meta(out)
    feature = meta["sparse"][0]
    path = out / meta["splits"]["train"]["files"][0]
    table = pq.read_table(path)
    ids = table.column(feature["name"]).to_numpy().copy()
    ids[row] = feature["cardinality"] + 5
    table = table.set_column(table.schema.get_field_index(feature["name"]), feature["name"],
                             __import__("pyarrow").array(ids, type=table.schema.field(feature["name"]).type))
    write_shard(table, path)
    return out, path


def test_a_bad_row_read_in_the_background_raises_what_the_synchronous_loop_raises(synthetic, tmp_path):
    data, path = _with_a_bad_id(synthetic, tmp_path / "bad", row=700)
    before = threading.active_count()
    errors = {}
    for pipeline in (True, False):
        with pytest.raises(DataFormatError) as err:
            DLRMTrainer(small_config(pipeline=pipeline), data).fit()
        errors[pipeline] = err.value
        assert threading.active_count() == before
    assert type(errors[True]) is type(errors[False])
    assert str(errors[True]) == str(errors[False])
    assert f"{path}: row 700: " in str(errors[True]) and "outside [0, " in str(errors[True])


def test_background_iterator_yields_in_order_then_raises_the_readers_error():
    def items():
        yield from range(5)
        raise ValueError("row 5 is bad")

    got = []
    with pytest.raises(ValueError, match="^row 5 is bad$"):
        with BackgroundIterator(items(), ahead=2) as it:
            for x in it:
                got.append(x)
    assert got == [0, 1, 2, 3, 4]


def test_background_iterator_reads_at_most_ahead_and_stops_on_break():
    made = []

    def items():
        for i in range(1000):
            made.append(i)
            yield i

    before = threading.active_count()
    with BackgroundIterator(items(), ahead=3) as it:
        assert next(it) == 0
        time.sleep(0.3)  # time enough for the reader to run as far ahead as it may
        assert len(made) <= 1 + 3 + 1  # the one taken, the queue's three, the one waiting to be put
    assert threading.active_count() == before
    assert len(made) < 10
    with pytest.raises(ValueError, match="ahead must be >= 1"):
        BackgroundIterator([], ahead=0)


def test_background_batches_equal_the_batches_read_in_line(synthetic):
    plain = list(CTRBatches(synthetic, "train", 1000, shuffle_shards=True, seed=3, start_batch=2))
    with CTRBatches(synthetic, "train", 1000, shuffle_shards=True, seed=3, start_batch=2).background() as it:
        background = list(it)
    assert len(plain) == len(background) == 2
    for a, b in zip(plain, background):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse.values(), b.sparse.values())
        assert torch.equal(a.sparse.lengths(), b.sparse.lengths()) and a.sparse.keys() == b.sparse.keys()
    assert np.array_equal(np.array([len(b) for b in background]), np.full(2, 1000))
