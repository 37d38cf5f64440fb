"""cf's figures say what they measure: a LightGCN test user that train.txt never trained is
left out of evaluation (counted on the data line), and a run that ends below its best Recall
says so once, at the end, however often it evaluated."""
from __future__ import annotations

import json

import pytest

from embcache.cli import main
from embcache.cf.data.synthetic import power_law_interactions
from tests.test_cf_cli import write_lightgcn

RUN = ["--negatives", "4", "--engine", "torch", "--threads", "1", "--no-progress"]
TINY = ["--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "120", "--synthetic-interactions",
        "1500", *RUN]


@pytest.fixture(scope="module")
def lightgcn_pair(tmp_path_factory):
    """Two LightGCN directories of 200 users: `plain`, and `cold` = plain plus a test.txt line
    of user 999, whom train.txt never names."""
    root = tmp_path_factory.mktemp("honest")
    data = power_law_interactions(num_users=200, num_items=300, interactions=5000, communities=4, seed=1)
    plain, cold = root / "plain", root / "cold"
    plain.mkdir()
    cold.mkdir()
    write_lightgcn(plain, data)
    (cold / "train.txt").write_text((plain / "train.txt").read_text())
    (cold / "test.txt").write_text((plain / "test.txt").read_text() + "999 1 2\n")
    return plain, cold


def _train(data_dir, log, capsys, *more) -> tuple[str, list[dict]]:
    """The command's stdout and its metrics log's records."""
    assert main(["cf", "train", "--data", str(data_dir), *RUN, "--epochs", "2", "--metrics-out", str(log),
                 *map(str, more)]) == 0
    return capsys.readouterr().out, [json.loads(line) for line in log.read_text().splitlines()]


def test_a_lightgcn_test_user_train_never_named_is_left_out_and_said(lightgcn_pair, tmp_path, capsys):
    plain, cold = lightgcn_pair
    out_plain, without = _train(plain, tmp_path / "plain.jsonl", capsys)
    out_cold, with_cold = _train(cold, tmp_path / "cold.jsonl", capsys)
    assert "cold: 200 users, 300 items" in out_cold and "plain: 200 users, 300 items" in out_plain
    assert "; 1 test user(s) (2 interaction(s)) not in training, left out of evaluation" in out_cold
    assert "not in training" not in out_plain
    # the figures are those of the data without the line, to the bit: each epoch's loss, Recall,
    # NDCG and users evaluated, the summary's and its popularity baseline
    figures = ("users", "items", "train", "test", "loss", "recall@20", "ndcg@20", "popularity")
    for a, b in zip(with_cold, without, strict=True):
        assert {k: a[k] for k in figures if k in a} == {k: b[k] for k in figures if k in b}, a["event"]
    assert without[0]["users"] == 200 and without[1]["users"] == without[-1]["popularity"]["users"]
    assert [r["event"] for r in without] == ["start", "epoch", "epoch", "summary"] and "recall@20" in without[2]


def test_a_lightgcn_test_item_train_never_named_is_kept_and_said(lightgcn_pair, tmp_path, capsys):
    plain, _ = lightgcn_pair
    d = tmp_path / "item"
    d.mkdir()
    (d / "train.txt").write_text((plain / "train.txt").read_text())
    (d / "test.txt").write_text((plain / "test.txt").read_text() + "5 310\n")
    out, summary = _train(d, tmp_path / "item.jsonl", capsys, "--epochs", 1)
    # LightGCN's own evaluation keeps it: the item table grows to hold it, and the line says so
    assert "item: 200 users, 311 items" in out
    assert "; 1 test item(s) (1 interaction(s)) not in training, kept in evaluation" in out


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: recall")]


def _recalls(monkeypatch, *values):
    import embcache.cf.trainer as trainer

    recalls = iter(values)
    monkeypatch.setattr(trainer, "evaluate_params",
                        lambda *a, **k: {"recall@20": next(recalls), "ndcg@20": 0.1, "users": 60})
    return trainer.FALLING_ADVICE


def test_eval_every_two_epochs_still_warns_at_the_end(monkeypatch, capsys):
    advice = _recalls(monkeypatch, 0.36, 0.29)  # epochs 2 and 4 are evaluated
    assert main(["cf", "train", *TINY, "--epochs", "4", "--eval-every", "2"]) == 0
    assert _warnings(capsys) == [f"warning: recall@20 0.2900 after epoch 4 is below the best of the run, 0.3600 "
                                 f"after epoch 2: {advice}"]


def test_a_new_best_at_the_end_is_no_warning_even_after_a_fall(monkeypatch, capsys):
    _recalls(monkeypatch, 0.36, 0.29, 0.40)
    assert main(["cf", "train", *TINY, "--epochs", "3"]) == 0
    assert _warnings(capsys) == []


def test_the_best_before_a_resume_counts(monkeypatch, capsys, tmp_path):
    advice = _recalls(monkeypatch, 0.36, 0.30)
    ck = ["--checkpoint-dir", str(tmp_path / "ck")]
    assert main(["cf", "train", *TINY, "--epochs", "1", *ck]) == 0
    assert _warnings(capsys) == []
    assert main(["cf", "train", *TINY, "--epochs", "2", *ck, "--resume"]) == 0
    assert _warnings(capsys) == [f"warning: recall@20 0.3000 after epoch 2 is below the best of the run, 0.3600 "
                                 f"after epoch 1: {advice}"]
