"""What a walkthrough of `dlrm train` found its summary saying wrong: the first run's one-time
compilation read as its speed, an empty validation split scored NaN without a word, small
sizes and times rounded to zero, and Triton's interpreter on the CPU timed as if it were a
speed."""
from __future__ import annotations

import contextlib
import io
import json
import os
import time

import pytest

from embcache.cli import main
from embcache.dlrm.cli import summary_rows
from embcache.units import format_bytes, format_seconds

TINY = ["--batch-size", "64", "--embedding-dim", "4", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("synthetic")
    generate_synthetic(out, rows=1200, scale=0.0005, seed=0)
    return out


def _run(capsys, argv) -> tuple[dict, str, str]:
    """(summary JSON, stdout, stderr) of a command that must succeed."""
    assert main(argv) == 0
    got = capsys.readouterr()
    return json.loads(got.out.strip().splitlines()[-1]), got.out, got.err


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith(name)).split(name, 1)[1].strip()


# ------------------------------------------------------------------------ 1: the first step apart


def test_throughput_leaves_out_a_slow_first_step_and_says_so(synthetic, capsys, monkeypatch):
    """A first step that takes 1.2 s (as numba's compiling does on a fresh checkout) is timed
    apart, the rate is over the 5 steps after it, and the line says what it covers. The
    pipelined loop reads its losses every 50 steps: its first step is read alone for this."""
    from embcache.dlrm.trainer import DLRMTrainer

    step, calls = DLRMTrainer.train_step, []

    def slow_first(self, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.2)
        return step(self, *a, **k)

    monkeypatch.setattr(DLRMTrainer, "train_step", slow_first)
    s, out, _ = _run(capsys, ["dlrm", "train", "--data", str(synthetic), "--max-steps", "6", *TINY])
    assert s["first_step_seconds"] >= 1.2 and s["steady_steps"] == 5
    assert s["steady_seconds"] < s["train_seconds"] - 1.2 and s["steady_samples_per_s"] > s["train_samples_per_s"]
    assert s["train_seconds"] >= 1.2  # every step's, as the benchmarks read it
    assert s["steady_cpu_seconds_per_sample"] > 0
    line = _row(out, "training throughput")
    assert line.startswith(f"{s['steady_samples_per_s']:,.0f} samples/s over 5 step(s) after the first (the first "
                           f"took {format_seconds(s['first_step_seconds'])}: start-up and one-time compilation)")
    assert "after the first step" in _row(out, "CPU time")


def test_a_run_of_one_step_says_its_figure_holds_the_start_up(synthetic, capsys):
    s, out, _ = _run(capsys, ["dlrm", "train", "--data", str(synthetic), "--max-steps", "1", *TINY])
    assert s["steady_steps"] == 0 and s["steady_samples_per_s"] is None and s["first_step_seconds"] > 0
    assert _row(out, "training throughput").endswith(", start-up (compilation, warm-up) included")


# ------------------------------------------------------------------------ 2: an empty validation split


@pytest.fixture(scope="module")
def three_rows(tmp_path_factory):
    """`data prepare criteo-kaggle` of a 3-row file (val and test come out empty), what it
    printed, and a 2-step run on it (module-scoped: capsys cannot serve it, so redirected here)."""
    root = tmp_path_factory.mktemp("three")
    lines = ["\t".join([str(i % 2), *(str(i + j) for j in range(13)), *(f"{(i * j) % 5:08x}" for j in range(26))])
             for i in range(3)]
    (root / "three.txt").write_text("\n".join(lines) + "\n")
    prep_out, prep_err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(prep_out), contextlib.redirect_stderr(prep_err):
        assert main(["data", "prepare", "criteo-kaggle", "--input", str(root / "three.txt"), "--out",
                     str(root / "d"), "--no-progress"]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["dlrm", "train", "--data", str(root / "d"), "--batch-size", "2", "--no-progress",
                     "--checkpoint-dir", str(root / "ck"), "--metrics-out", str(root / "m.jsonl")]) == 0
    return root, prep_err.getvalue(), out.getvalue()


def test_the_converter_says_in_one_line_which_splits_came_out_empty(three_rows):
    root, err, _ = three_rows
    said = [line for line in err.splitlines() if "came out empty" in line]
    assert said == [f"warning: {root / 'three.txt'}: the val and test splits came out empty "
                    "(train 3, val 0, test 0 rows): a "
                    "run on this data has nothing there to score; more rows fill them"]


def test_an_empty_validation_split_scores_n_a_with_its_reason_not_nan(three_rows):
    root, _, out = three_rows
    assert "epoch 1: val AUC n/a  log loss n/a (the val split has no rows)" in out.splitlines()
    assert _row(out, "validation AUC") == "n/a (the val split has no rows)"
    assert not [line for line in out.splitlines()[:-1] if ("AUC" in line or "log loss" in line) and "nan" in line]
    s = json.loads(out.strip().splitlines()[-1])
    assert s["val_auc"] is None and s["val_logloss"] is None and s["val_not_scored"] == "the val split has no rows"
    epoch = [json.loads(line) for line in (root / "m.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "epoch"]
    assert epoch[0]["auc"] is None and epoch[0]["not_scored"] == "the val split has no rows"


def test_evaluate_on_an_empty_split_says_n_a_and_why(three_rows, capsys):
    root, _, _ = three_rows
    assert main(["dlrm", "evaluate", str(root / "ck"), "--split", "val"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("val: AUC n/a  log loss n/a (the val split has no rows)  (0 samples")
    result = json.loads(out[-1])
    assert result["auc"] is None and result["not_scored"] == "the val split has no rows"


def test_a_split_of_one_label_scores_auc_n_a_with_its_log_loss(tmp_path, capsys):
    """AUC ranks positives against negatives: a val/test split whose rows all carry one label
    has none (torchmetrics gives 0.0 and a warning, which read as a model ranking every pair
    wrong); the log loss is still the split's."""
    labels = [1 if i >= 36 else i % 2 for i in range(40)]
    rows = ["clicked,price,user,item"] + [f"{labels[i]},{i / 40:.3f},u{i % 6},i{i % 8}" for i in range(40)]
    (tmp_path / "clicks.csv").write_text("\n".join(rows) + "\n")
    assert main(["data", "prepare", "own", "--input", str(tmp_path / "clicks.csv"), "--out", str(tmp_path / "d"),
                 "--label-col", "clicked", "--dense-cols", "price", "--sparse-cols", "user,item", "--split", "tail",
                 "--held-out", "0.1"]) == 0  # the file's last 4 rows, all labelled 1, are val and test
    s, out, err = _run(capsys, ["dlrm", "train", "--data", str(tmp_path / "d"), "--checkpoint-dir",
                                str(tmp_path / "ck"), *TINY])
    why = "AUC needs both labels: its 2 rows are all 1"
    assert s["val_auc"] is None and s["val_not_scored"] == why and s["val_logloss"] > 0
    assert f"epoch 1: val AUC n/a  log loss {s['val_logloss']:.4f} ({why})" in out.splitlines()
    assert _row(out, "validation AUC") == f"n/a ({why})"
    assert _row(out, "validation log loss") == f"{s['val_logloss']:.4f}"
    assert "AUC 0.0000" not in out and "samples in targets" not in err  # torchmetrics' 0.0 and its warning
    assert main(["dlrm", "evaluate", str(tmp_path / "ck"), "--split", "test"]) == 0
    got = capsys.readouterr()
    result = json.loads(got.out.splitlines()[-1])
    assert result["auc"] is None and result["not_scored"] == why and result["logloss"] > 0
    assert got.out.startswith(f"test: AUC n/a  log loss {result['logloss']:.4f} ({why})")


# ------------------------------------------------------------------------ 3: small numbers


def test_small_sizes_and_times_do_not_round_to_zero():
    assert format_bytes(32000) == "31.2 KiB" and format_bytes(256) == "256 B" and format_bytes(3 * 2**20) == "3.0 MiB"
    assert format_seconds(0.014) == "14.0 ms" and format_seconds(21.04) == "21.0 s"
    s = {"val_auc": 0.7, "val_logloss": 0.5, "sparse": "cached", "device": "cpu", "cache_rows": 10, "table_rows": 20,
         "hit_rate": 0.5, "bytes_h2d": 32000, "bytes_d2h": 0, "overflow_rows": 0, "epochs_done": 1, "steps": 1,
         "train_seconds": 0.014, "train_samples_per_s": 9807.0, "peak_host_mib": 100.0}
    rows = dict(summary_rows(s))
    assert rows["bytes host->device"] == "31.2 KiB" and rows["bytes device->host"] == "0 B"
    assert rows["training throughput"] == "9,807 samples/s over 14.0 ms"


# ------------------------------------------------------------------------ 4: which kernels ran


def test_the_summary_names_the_kernels_torch_by_default(three_rows):
    _, _, out = three_rows
    assert _row(out, "embedding kernels") == "torch"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off (a GPU is here)")
def test_triton_on_the_cpu_is_said_to_be_its_interpreter_not_a_speed(synthetic, capsys):
    s, out, err = _run(capsys, ["dlrm", "train", "--data", str(synthetic), "--max-steps", "2", "--device", "cpu",
                                "--bookkeeping", "device", "--kernels", "triton", *TINY])
    assert s["kernels"] == "triton" and s["kernels_interpreted"] is True
    assert _row(out, "embedding kernels") == "triton under Triton's interpreter: a check of the results, not a speed"
    assert err.count("runs under Triton's interpreter") == 1
