"""Nothing lost: a checkpoint directory holding a run is refused without --resume or
--overwrite; Ctrl-C (or SIGTERM) finishes the step, checkpoints and stops in one line with
status 130, and the resumed run equals one never stopped; a second Ctrl-C stops at once."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embcache.checkpoint import load_checkpoint
from embcache.cli import main
from embcache.errors import CheckpointError, RunInterrupted
from embcache.train.run import StepRunConfig, Trainer

REPO = Path(__file__).resolve().parents[1]


class Counting(Trainer):
    """The smallest stepwise trainer: its state is the sum of the steps' numbers.
    `signals[step]` stop signals are sent to this process during that step."""

    kind = "count"

    def __init__(self, cfg, signals: dict[int, int] | None = None, sig=signal.SIGINT):
        super().__init__(cfg)
        self.total, self.signals, self.sig = 0, signals or {}, sig

    def train_epoch(self):
        self.begin_epoch(10)
        while self.step_in_epoch < 10:
            if self.should_stop():
                return None
            for _ in range(self.signals.get(self.step + 1, 0)):
                os.kill(os.getpid(), self.sig)
            self.total += self.step + 1
            self.after_step(1.0, 1)
        return {}

    def trainer_state(self):
        return {"total": self.total}

    def load_trainer_state(self, ck, path):
        self.total = ck["total"]


@pytest.fixture
def no_stray_signals():
    """Should a trainer fail to take the signals it is sent, they land here, not in pytest."""
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def config(tmp_path, **kw):
    kw = {"checkpoint_dir": str(tmp_path / "ck"), **kw}
    return StepRunConfig(progress=False, epochs=2, checkpoint_every=4, metrics_out=str(tmp_path / "m.jsonl"), **kw)


# ---------------------------------------------------------------------------- --overwrite
def test_a_directory_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path):
    Counting(config(tmp_path, max_steps=7)).fit()
    with pytest.raises(CheckpointError) as refused:
        Counting(config(tmp_path))
    assert str(refused.value) == (f"{tmp_path / 'ck'} holds a count run (step 7); continue it with --resume or "
                                  f"start over with --overwrite")
    assert load_checkpoint(tmp_path / "ck" / "count-last.pt", "count")["step"] == 7  # untouched

    assert Counting(config(tmp_path, overwrite=True, max_steps=3)).fit()["steps"] == 3  # replaced
    assert load_checkpoint(tmp_path / "ck" / "count-last.pt", "count")["step"] == 3
    assert Counting(config(tmp_path, resume=True)).fit()["steps"] == 20  # continued
    with pytest.raises(CheckpointError, match="choose one"):
        Counting(config(tmp_path, resume=True, overwrite=True))
    Counting(config(tmp_path, checkpoint_dir=str(tmp_path / "elsewhere")))  # an empty one is fine


def test_the_cli_refuses_in_one_line_before_reading_data(tmp_path, capsys):
    """cf (epochs): refused before the data is read; --overwrite and --resume are exclusive."""
    ck = tmp_path / "ck"
    args = ["cf", "train", "--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
            "--synthetic-interactions", "900", "--negatives", "4", "--threads", "1", "--no-progress",
            "--epochs", "1", "--checkpoint-dir", str(ck)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 1
    out = capsys.readouterr()
    assert out.err == (f"embcache cf: error: {ck} holds a cf run (epoch 1); continue it with --resume or start "
                       f"over with --overwrite\n")
    assert "users" not in out.out  # nothing read
    assert main([*args, "--overwrite"]) == 0
    with pytest.raises(SystemExit) as usage:
        main([*args, "--overwrite", "--resume"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_twice_continues_the_run(tmp_path):
    """`make run` resumes when runs/dlrm holds the run (a finished one then only reports)."""
    def command(*extra):
        # under `make test` this make is a sub-make: without the parent's flags, and without
        # the "Entering/Leaving directory" lines a sub-make prints
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        out = subprocess.run(["make", "--no-print-directory", "-n", "run", f"RUN_DIR={tmp_path}", *extra], cwd=REPO,
                             capture_output=True, text=True, check=True, env=env).stdout
        return [line for line in out.splitlines() if "dlrm train" in line][-1]

    assert "dlrm train" in command() and "--resume" not in command()
    (tmp_path / "dlrm-last.pt").write_bytes(b"")
    assert command().endswith("--resume")
    assert command("RUN_ARGS=--overwrite").endswith("--overwrite")


# ---------------------------------------------------------------------------- Ctrl-C in the skeleton
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_finishes_the_step_checkpoints_and_stops(tmp_path, no_stray_signals, sig):
    trainer = Counting(config(tmp_path), signals={6: 1}, sig=sig)
    with pytest.raises(RunInterrupted) as stopped:
        trainer.fit()
    assert str(stopped.value) == f"interrupted at step 6 (checkpoint in {tmp_path / 'ck'}); resume with --resume"
    assert stopped.value.exit_code == 130
    ck = load_checkpoint(tmp_path / "ck" / "count-last.pt", "count")
    assert (ck["step"], ck["total"]) == (6, sum(range(1, 7)))
    assert signal.getsignal(sig) is not trainer._stop_at_once  # the handlers are put back
    events = [json.loads(line)["event"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert events == ["start", "interrupted"]

    resumed = Counting(config(tmp_path, resume=True))
    assert resumed.fit()["steps"] == 20 and resumed.total == sum(range(1, 21))


def test_without_a_checkpoint_dir_the_line_says_nothing_was_kept(tmp_path, no_stray_signals):
    with pytest.raises(RunInterrupted, match=r"^interrupted at step 3; nothing was kept \(no --checkpoint-dir\)"):
        Counting(config(tmp_path, checkpoint_dir=None), signals={3: 1}).fit()


def test_a_signal_in_the_last_step_lets_the_run_end_as_usual(tmp_path, no_stray_signals):
    assert Counting(config(tmp_path, max_steps=5), signals={5: 1}).fit()["steps"] == 5


def test_a_second_signal_stops_at_once(tmp_path, no_stray_signals):
    """Two signals in step 10: no step after the 9th finishes; the checkpoint of step 8 stays."""
    trainer = Counting(config(tmp_path), signals={10: 2})
    with pytest.raises(RunInterrupted) as stopped:
        trainer.fit()
    assert str(stopped.value) == (f"interrupted again: stopped at once; the checkpoint of step 8 in {tmp_path / 'ck'} "
                                  f"is intact: resume with --resume")
    assert trainer.step == 9 and trainer.total == sum(range(1, 10))
    assert load_checkpoint(tmp_path / "ck" / "count-last.pt", "count")["step"] == 8
    assert json.loads((tmp_path / "m.jsonl").read_text().splitlines()[-1])["at_once"] is True


# ---------------------------------------------------------------------------- Ctrl-C from outside
def _dlrm(data, ckdir, *extra):
    args = ["--data", str(data), "--batch-size", "64", "--embedding-dim", "8", "--dense-arch", "16", "--over-arch",
            "16", "--arch", "torch", "--device", "cpu", "--no-progress", "--log-every", "5", "--checkpoint-every",
            "1000", "--cache-ratio", "0.01", "--checkpoint-dir", str(ckdir), "--metrics-out", str(ckdir / "m.jsonl")]
    return subprocess.Popen([sys.executable, "-m", "embcache", "dlrm", "train", *args, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(log: Path, step: int, proc, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and any(json.loads(line).get("step", 0) >= step
                                for line in log.read_text().splitlines() if line.endswith("}")):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step}: {proc.poll()}")


def test_ctrl_c_then_resume_equals_the_uninterrupted_run(small_synthetic, tmp_path):
    """dlrm's pipelined loop (losses read every 5 steps, a reader thread): SIGINT mid-epoch
    writes the checkpoint of the step it stopped after, and --resume from it ends with the
    parameters, cache and history of a run never stopped, to the bit."""
    from tests.test_dlrm import assert_same_checkpoint

    whole = _dlrm(small_synthetic, tmp_path / "whole")
    cut = tmp_path / "cut"
    victim = _dlrm(small_synthetic, cut)
    _wait_for_step(cut / "m.jsonl", 10, victim)
    victim.send_signal(signal.SIGINT)
    out, err = victim.communicate(timeout=120)
    assert victim.returncode == 130, err
    assert "Traceback" not in err
    stopped_at = load_checkpoint(cut / "dlrm-last.pt", "dlrm")["step"]
    assert 10 <= stopped_at < 80  # mid-run: an epoch of 94 steps
    assert err.splitlines()[-1] == (f"embcache dlrm: interrupted at step {stopped_at} (checkpoint in {cut}); "
                                    f"resume with --resume")
    resumed = _dlrm(small_synthetic, cut, "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert whole.wait(timeout=300) == 0
    a, b = load_checkpoint(cut / "dlrm-last.pt", "dlrm"), load_checkpoint(tmp_path / "whole" / "dlrm-last.pt", "dlrm")
    assert a["step"] == b["step"] == 94 and a["history"] == b["history"]
    assert_same_checkpoint(cut / "dlrm-last.pt", tmp_path / "whole" / "dlrm-last.pt", residency=True)


SLOW_COMMAND = """
import sys, time, types
from embcache import cli
from embcache.train.run import StepRunConfig
from tests.test_run_nothing_lost import Counting

class Slow(Counting):
    def after_step(self, loss, samples):
        print(f"step {self.step + 1}", flush=True)
        time.sleep(1.0)  # a long step: both signals arrive inside it
        super().after_step(loss, samples)

def train(args):
    Slow(StepRunConfig(progress=False, checkpoint_dir=sys.argv[1], checkpoint_every=2)).fit()

command = types.ModuleType("slow_command")
command.build_parser = lambda prog: types.SimpleNamespace(parse_args=lambda rest: types.SimpleNamespace(func=train))
sys.modules["slow_command"] = command
cli.COMMANDS["slow"] = ("slow_command", "a slow trainer")
sys.exit(cli.main(["slow"]))
"""


def test_a_second_ctrl_c_stops_the_command_at_once(tmp_path):
    """The command's side of the second signal: one line, no traceback, status 130, in the
    middle of a step (of one second), the checkpoint of the step before kept."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_COMMAND, str(tmp_path)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    for line in proc.stdout:
        if line.strip() == "step 3":
            break
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "step 4" not in out  # step 3 never finished
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"embcache slow: interrupted again: stopped at once; the checkpoint of step 2 "
                                    f"in {tmp_path} is intact: resume with --resume")
    assert err.splitlines()[-2] == "SIGINT: stopping after this step; Ctrl-C again stops at once"


def test_ctrl_c_under_torchrun_stops_every_rank_after_one_step(small_synthetic, tmp_path):
    """The terminal's Ctrl-C reaches the launcher and both ranks (and the launcher passes it
    on again): the ranks agree on the step to stop after (a multiple of --log-every), write
    one checkpoint of it and each says so; the launcher (`embcache.torchrun`) adds one line,
    no traceback, and exits 130; any world size resumes it."""
    import torch

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed not built")
    from tests.torchrun_helpers import rank_env, torchrun_command

    ck = tmp_path / "ck"
    args = ["dlrm", "train", "--data", str(small_synthetic), "--batch-size", "64", "--embedding-dim", "8",
            "--dense-arch", "16", "--over-arch", "16", "--arch", "torch", "--device", "cpu", "--no-progress",
            "--log-every", "5", "--checkpoint-every", "1000", "--cache-ratio", "0.01", "--dist-timeout", "60",
            "--checkpoint-dir", str(ck), "--metrics-out", str(ck / "m.jsonl")]
    # through `python -m embcache.torchrun`: torchrun's launcher with the same arguments, one line on Ctrl-C
    launcher = [sys.executable, "-m", "embcache.torchrun", *torchrun_command(2, *args)[3:]]
    proc = subprocess.Popen(launcher, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=rank_env(), start_new_session=True)
    _wait_for_step(ck / "m.jsonl", 10, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    saved = load_checkpoint(ck / "dlrm-last.pt", "dlrm")
    step = saved["step"]
    assert saved["world_size"] == 2 and 10 <= step < 94 and step % 5 == 0
    for rank in (0, 1):
        assert f"embcache dlrm: rank {rank}: interrupted at step {step} (checkpoint in {ck})" in err, err[-3000:]
    assert err.count("SIGINT: stopping after this step") == 1  # rank 0 speaks; the launcher's copy is no second
    assert "Traceback" not in err and proc.returncode == 130
    assert err.splitlines()[-1] == "torchrun: stopped by SIGINT; the workers' last lines say what was kept"
    resumed = subprocess.run([sys.executable, "-m", "embcache", *args, "--resume", "--max-steps", str(step + 5)],
                             capture_output=True, text=True, cwd=REPO, env=rank_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {ck / 'dlrm-last.pt'}" in resumed.stdout
    assert load_checkpoint(ck / "dlrm-last.pt", "dlrm")["step"] == step + 5
