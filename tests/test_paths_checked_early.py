"""Paths a command writes are checked before its work, and a resumed run's metrics log has
each step once: an unwritable --checkpoint-dir stops dlrm, face and cf train before any data
is read or step trained; a checkpoint or results file that cannot be written is one line
naming it; `dlrm predict` refuses an unwritable --out before it loads or scores anything;
a run resumed after a kill replaces the killed run's records past its checkpoint, says where
it resumed from, and carries the loss's moving average on."""
from __future__ import annotations

import json
import os

import pytest

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.cli import main
from embcache.data.results_file import write_columns
from embcache.errors import CheckpointError, DataOutputError
from embcache.train.run import StepRunConfig, Trainer


class Killed(BaseException):
    """What a SIGKILL does to the loop, in one process: it stops where it is, writing nothing."""


class Falling(Trainer):
    """A stepwise trainer whose loss falls step by step (so that a moving average restarted
    at a resume shows); it is "killed" before step `kill_at`."""

    kind = "fall"

    def __init__(self, cfg, kill_at: int | None = None):
        super().__init__(cfg)
        self.kill_at, self.total = kill_at, 0

    def train_epoch(self):
        self.begin_epoch(6)
        while self.step_in_epoch < 6:
            if self.should_stop():
                return None
            if self.step + 1 == self.kill_at:
                raise Killed
            self.total += self.step + 1
            self.after_step(10.0 / (self.step + 1), 1)
        return {}

    def trainer_state(self):
        return {"total": self.total}

    def load_trainer_state(self, ck, path):
        self.total = ck["total"]


def config(tmp_path, **kw):
    kw = {"checkpoint_dir": str(tmp_path / "ck"), "metrics_out": str(tmp_path / "m.jsonl"), **kw}
    return StepRunConfig(progress=False, epochs=2, checkpoint_every=4, log_every=1, **kw)


def records(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


@pytest.fixture
def a_file(tmp_path):
    """A regular file, for paths that go through it as if it were a directory."""
    path = tmp_path / "val.csv"
    path.write_text("x\n")
    return path


# ---------------------------------------------------------------------------- --checkpoint-dir
@pytest.mark.parametrize("command", [
    ["dlrm", "train", "--synthetic-rows", "2000", "--synthetic-scale", "0.0005", "--batch-size", "128",
     "--embedding-dim", "4", "--max-steps", "3", "--checkpoint-every", "1"],
    ["face", "train", "--max-steps", "2", "--checkpoint-every", "1"],
    ["cf", "train", "--epochs", "1"],
], ids=["dlrm", "face", "cf"])
def test_an_unwritable_checkpoint_dir_stops_train_before_the_data_is_read(command, a_file, tmp_path, capsys):
    bad = a_file / "ck"
    cache = ["--data-cache", str(tmp_path / "cache")] if command[0] == "dlrm" else []
    rc = main([*command, *cache, "--no-progress", "--checkpoint-dir", str(bad)])
    out, err = capsys.readouterr()
    assert rc == 1 and err.splitlines() == [f"embcache {command[0]}: error: {bad}: cannot write checkpoints there: "
                                            f"Not a directory"]
    assert out == "" and not (tmp_path / "cache").exists()  # no data prepared or read, no step trained


def test_a_trainer_refuses_an_unwritable_checkpoint_dir_before_its_first_step(a_file, tmp_path):
    with pytest.raises(DataOutputError) as refused:
        Falling(config(tmp_path, checkpoint_dir=str(a_file / "ck"), max_steps=3))
    assert str(refused.value) == f"{a_file / 'ck'}: cannot write checkpoints there: Not a directory"
    trainer = Falling(config(tmp_path, checkpoint_dir=str(tmp_path / "new" / "ck")))  # created, left empty
    assert (tmp_path / "new" / "ck").is_dir() and not any((tmp_path / "new" / "ck").iterdir())
    assert trainer.fit()["steps"] == 12


def test_a_resume_from_a_mistyped_directory_creates_nothing(tmp_path):
    with pytest.raises(CheckpointError, match="no fall checkpoint"):
        Falling(config(tmp_path, checkpoint_dir=str(tmp_path / "typo"), resume=True)).fit()
    assert not (tmp_path / "typo").exists()


def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
    def full_disk(obj, path):
        open(path, "wb").close()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("embcache.checkpoint.save_torch", full_disk)
    path = tmp_path / "ck" / "fall-last.pt"
    with pytest.raises(DataOutputError) as refused:
        save_checkpoint({}, path, kind="fall")
    assert str(refused.value) == f"{path}: cannot write the checkpoint: No space left on device"
    assert list((tmp_path / "ck").iterdir()) == []  # no temporary left behind


# ---------------------------------------------------------------------------- results files, dlrm predict --out
def test_dlrm_predict_refuses_an_unwritable_out_before_loading_anything(a_file, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("sparse_0\na\n")
    for out, why in [(a_file / "p.csv", f"cannot write: {a_file} is a file, not a directory"),
                     (tmp_path, "cannot write: it is a directory, not a file")]:
        if out == tmp_path:
            out = tmp_path / "d.csv"
            out.mkdir()
        # the export does not exist: refused first means nothing was loaded or scored
        rc = main(["dlrm", "predict", str(tmp_path / "no-export"), "--input", str(rows), "--out", str(out)])
        assert rc == 1 and capsys.readouterr().err.strip().splitlines() == [f"embcache dlrm: error: {out}: {why}"]


def test_results_that_cannot_be_written_are_one_line_naming_the_file(a_file, tmp_path):
    with pytest.raises(DataOutputError) as refused:
        write_columns({"score": [0.5]}, a_file / "p.csv")
    assert str(refused.value) == f"{a_file / 'p.csv'}: cannot write: Not a directory"
    (tmp_path / "d.parquet").mkdir()
    with pytest.raises(DataOutputError, match=r"d\.parquet: cannot write: Is a directory$"):
        write_columns({"score": [0.5]}, tmp_path / "d.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet", "val.csv"]  # no temporary left


# ---------------------------------------------------------------------------- --metrics-out after a kill
def test_a_run_resumed_after_a_kill_logs_each_step_once_with_the_same_average(tmp_path):
    whole = Falling(config(tmp_path / "whole"))
    whole.fit()
    with pytest.raises(Killed):  # steps 1-5 logged, the checkpoint of step 4 kept
        Falling(config(tmp_path / "killed"), kill_at=6).fit()
    log = tmp_path / "killed" / "m.jsonl"
    assert [r["step"] for r in records(log) if r["event"] == "step"] == [1, 2, 3, 4, 5]
    with open(log, "a") as f:
        f.write('{"event": "step", "step": 6, "lo')  # a line the kill cut short
    resumed = Falling(config(tmp_path / "killed", resume=True))
    assert resumed.fit() and resumed.total == whole.total

    got, want = records(log), records(tmp_path / "whole" / "m.jsonl")
    starts = [r for r in got if r["event"] == "start"]
    assert "resumed_from" not in starts[0] and starts[1]["resumed_from"] == {"epoch": 0, "step": 4}

    def progress(rs):
        return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in rs if r["event"] in ("step", "epoch")]
    assert progress(got) == progress(want)  # steps 1..12 once each, loss_ema as if never killed
    assert [r["event"] for r in got] == ["start", *["step"] * 4, "start", *["step"] * 2, "epoch",
                                         *["step"] * 6, "epoch", "summary"]


def test_records_after_the_checkpoint_that_are_not_progress_stay(tmp_path):
    """An `interrupted` (or `diverged`) record the killed run wrote after its checkpoint
    stays: the resumed run writes no other in its place."""
    Falling(config(tmp_path, max_steps=4)).fit()  # checkpoint of step 4, then its summary
    Falling(config(tmp_path, resume=True, max_steps=5)).fit()
    events = [(r["event"], r.get("step", r.get("steps"))) for r in records(tmp_path / "m.jsonl")]
    assert events == [("start", None), ("step", 1), ("step", 2), ("step", 3), ("step", 4), ("summary", 4),
                      ("start", None), ("step", 5), ("summary", 5)]


def test_a_checkpoint_without_the_average_or_the_log_mark_still_resumes(tmp_path):
    """Checkpoints written before the average and the log's length were kept: the average
    starts again at the resume and the log is only appended to, as before."""
    with pytest.raises(Killed):
        Falling(config(tmp_path), kill_at=6).fit()
    path = tmp_path / "ck" / "fall-last.pt"
    ck = load_checkpoint(path, "fall")
    old = {k: v for k, v in ck.items() if k not in ("loss_ema", "metrics_log", "embcache_checkpoint", "kind")}
    save_checkpoint(old, path, kind="fall")
    Falling(config(tmp_path, resume=True, max_steps=5)).fit()
    steps = [r for r in records(tmp_path / "m.jsonl") if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 5]  # appended, as before
    assert steps[-1]["loss_ema"] == steps[-1]["loss"] == 10.0 / 5  # the average started again


def test_a_log_replaced_since_the_checkpoint_is_only_appended_to(tmp_path):
    with pytest.raises(Killed):
        Falling(config(tmp_path), kill_at=6).fit()
    os.replace(tmp_path / "m.jsonl", tmp_path / "old.jsonl")
    (tmp_path / "m.jsonl").write_text('{"event": "note"}\n')  # shorter than the checkpoint's mark
    Falling(config(tmp_path, resume=True, max_steps=5)).fit()
    assert [r["event"] for r in records(tmp_path / "m.jsonl")] == ["note", "start", "step", "summary"]
