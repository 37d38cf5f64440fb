"""`embcache bench vocab`: a tiny run through the command (4 days of 2,000 rows; first-day and
open, each a `dlrm train` subprocess) writes each variant's next-day AUC of day_1..day_3, the
mean over day_2..day_3 and open minus the baseline as they follow from those AUCs, open's
retired keys and key-index bytes; the data is reused from --data-cache; bad flags and a failing
variant are one line; the warm-up runs each variant on tiny data first. About 30 s (most of it
three `dlrm train` start-ups)."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from embcache.bench import vocab
from embcache.bench.vocab_cli import build_parser
from embcache.cli import main

TINY = ["--days", "4", "--rows", "2000", "--scale", "0.002", "--batch-size", "256", "--embedding-dim", "4"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the JSON written, stdout, the directories) of one tiny run of first-day and open."""
    tmp = tmp_path_factory.mktemp("vocab")
    argv = ["bench", "vocab", *TINY, "--modes", "first-day", "open", "--no-warmup", "--data-cache",
            str(tmp / "data"), "--out", str(tmp / "out"), "--name", "tiny"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    assert rc == 0, out.getvalue()
    return json.loads((tmp / "out" / "tiny.json").read_text()), out.getvalue(), tmp


def test_each_variant_is_scored_on_every_next_day_and_the_mean_leaves_out_the_first(tiny):
    payload, _, _ = tiny
    assert payload["evaluated_splits"] == ["day_1", "day_2", "day_3"]
    assert payload["mean_over"] == ["day_2", "day_3"]
    assert payload["trained_days"] == "day_0..day_2"
    assert [r["mode"] for r in payload["results"]] == ["first-day", "open"]
    for r in payload["results"]:
        auc = r["next_day_auc"]
        assert list(auc) == ["day_1", "day_2", "day_3"] and list(r["next_day_logloss"]) == list(auc)
        assert all(0.5 < v < 1 for v in auc.values()), auc  # the model learnt something, every day
        assert r["mean_auc"] == pytest.approx((auc["day_2"] + auc["day_3"]) / 2, abs=1e-12)
        assert r["mean_auc"] != pytest.approx(sum(auc.values()) / 3, abs=1e-9)  # day_1 really left out
        ll = r["next_day_logloss"]
        assert r["mean_logloss"] == pytest.approx((ll["day_2"] + ll["day_3"]) / 2, abs=1e-12)
        assert r["peak_host_mib"] > 50 and r["samples_per_s"] > 0 and r["cpu_seconds_per_sample"] > 0
        assert r["steps"] == 3 * -(-2000 // 256)  # days 0..2, 8 batches each
        assert "--threads 1" in r["command"] and "--days 0-2 --eval-next-day" in r["command"]


def test_open_minus_the_baseline_follows_from_the_aucs(tiny):
    payload, _, _ = tiny
    first, op = payload["results"]
    d = payload["open_minus"]
    assert list(d) == ["first-day"]
    assert d["first-day"]["mean_auc_points"] == pytest.approx(100 * (op["mean_auc"] - first["mean_auc"]), abs=1e-9)
    for s in ("day_1", "day_2", "day_3"):
        assert d["first-day"]["auc_points"][s] == pytest.approx(
            100 * (op["next_day_auc"][s] - first["next_day_auc"][s]), abs=1e-9)


def test_open_reports_retired_keys_and_key_bytes_under_the_first_day_bound(tiny):
    payload, _, _ = tiny
    first, op = payload["results"]
    assert "--max-rows first-day" in op["command"] and "--max-rows" not in first["command"]
    assert op["retired_keys"] > 0  # the bound is day 0's keys: day 1's new keys retired old ones
    assert op["new_keys"] == op["live_keys"] + op["retired_keys"]
    assert op["live_keys"] <= op["table_rows"]
    assert op["table_rows"] + 26 == first["table_rows"]  # the same rows, less the vocabulary's row 0 a table
    assert op["key_index_bytes_per_live_key"] == pytest.approx(op["key_index_bytes"] / op["live_keys"])
    assert 8 <= op["key_index_bytes_per_live_key"] <= 64
    assert "retired_keys" not in first and "key_index_bytes_per_live_key" not in first


def test_the_table_at_a_glance(tiny):
    payload, stdout, _ = tiny
    lines = stdout.splitlines()
    head = next(line for line in lines if line.startswith("variant"))
    assert head.split()[1:5] == ["day_1", "day_2", "day_3", "mean"] and "day_2..day_3" in head
    row = next(line for line in lines if line.startswith("open "))
    op = payload["results"][1]
    assert row.split()[1:5] == [f"{op['next_day_auc'][s]:.4f}" for s in ("day_1", "day_2", "day_3")] + [
        f"{op['mean_auc']:.4f}"]
    points = payload["open_minus"]["first-day"]["mean_auc_points"]
    assert f"open - first-day: {points:+.2f} points of mean AUC" in stdout
    assert "oracle" in stdout  # the data's hidden model beside them


def test_the_data_is_reused_from_the_cache(tiny):
    payload, _, tmp = tiny
    args = build_parser("bench vocab").parse_args([*TINY, "--data-cache", str(tmp / "data")])
    data, meta, generated = vocab.ensure_data(args)
    assert not generated and str(data) == payload["data"]["dir"]
    assert [d["split"] for d in meta["day_splits"]] == ["day_0", "day_1", "day_2", "day_3"]
    assert sorted(p.name for p in (tmp / "data").iterdir()) == [data.name]  # no temporary directory left
    other = build_parser("bench vocab").parse_args([*TINY, "--drift", "0.2", "--data-cache", str(tmp / "data")])
    assert vocab.data_dir(other) != data  # other settings, other data


def test_each_mode_gets_its_own_arguments(tmp_path):
    args = build_parser("bench vocab").parse_args([*TINY, "--max-rows", "500"])
    argv = {m: vocab.train_argv(m, tmp_path, args) for m in ("first-day", "hash", "open")}
    assert "--max-rows" not in argv["first-day"]  # the trainer refuses a bound on the day-0 vocabulary
    for m in ("hash", "open"):
        assert argv[m][argv[m].index("--max-rows") + 1] == "500"
    for m, a in argv.items():
        assert a[a.index("--raw-keys") + 1] == m and a[a.index("--days") + 1] == "0-2"
        assert [a[a.index(f) + 1] for f in ("--batch-size", "--embedding-dim", "--threads")] == ["256", "4", "1"]


def test_the_warm_up_runs_each_variant_on_tiny_data_first(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(vocab, "run_variant", lambda mode, data, args: calls.append((mode, data, args.days, args.rows)))
    args = build_parser("bench vocab").parse_args([*TINY, "--data-cache", str(tmp_path)])
    vocab.warm_up(["hash", "open"], args)
    assert [(m, d, r) for m, _, d, r in calls] == [("hash", 3, 512), ("open", 3, 512)]  # 2 batches a day
    assert calls[0][1] == calls[1][1] != vocab.data_dir(args) and (calls[0][1] / "meta.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--days", "2"], "argument --days: must be >= 3, not 2"),
    (["--modes", "open", "vocab"], "argument --modes: invalid choice: 'vocab'"),
    (["--drift", "1"], "argument --drift: must be in [0, 1), not 1"),
    (["--max-rows", "0"], "argument --max-rows: must be a positive integer, not 0"),
    (["--rows", "x"], "argument --rows: 'x' is not an integer"),
])
def test_a_bad_flag_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "vocab", *flags])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"embcache bench vocab: error: {message}")


def test_a_failing_variant_is_one_line(tiny, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, where --device cuda is refused")
    _, _, tmp = tiny
    rc = main(["bench", "vocab", *TINY, "--modes", "open", "--no-warmup", "--device", "cuda", "--data-cache",
               str(tmp / "data"), "--out", str(tmp / "bad")])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("embcache bench vocab: error: the open run (embcache dlrm train ") and "cuda" in err
    assert not (tmp / "bad").exists()  # nothing written
