"""`embcache data`: commands produce a usable directory; bad input is one line, exit 1."""
from __future__ import annotations

import json

from embcache.cli import main
from tests.test_data_converters import kaggle_text


def test_synthetic_then_info(tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(["data", "synthetic", "--out", str(out), "--rows", "3000", "--scale", "0.001",
                 "--seed", "2", "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["rows"] == 3000 and meta["generator"]["seed"] == 2
    capsys.readouterr()
    assert main(["data", "info", str(out), "--head", "2"]) == 0
    text = capsys.readouterr().out
    assert "train 3,000 rows" in text and "oracle AUC" in text
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and set(rows[0]) >= {"label", "dense_12", "sparse_25"}


def test_prepare_criteo_kaggle_reports_bad_rows(tmp_path, capsys):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    assert main(["data", "prepare", "criteo-kaggle", "--input", str(src), "--out", str(tmp_path / "o"),
                 "--min-count", "2", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "skipped 4 malformed row(s)" in captured.err and "line 3: empty line" in captured.err
    assert "train 12 rows" in captured.out and "bad rows    4 skipped" in captured.out
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["min_count"] == 2


def test_user_errors_are_one_line_exit_1(tmp_path, capsys):
    assert main(["data", "info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "meta.json: missing" in err and "Traceback" not in err
    assert main(["data", "prepare", "avazu", "--input", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o")]) == 1
    assert "none.csv: no such file" in capsys.readouterr().err
    assert main(["data", "prepare", "criteo-terabyte", "--input-dir", str(tmp_path), "--days", "3-1",
                 "--out", str(tmp_path / "o")]) == 1
    assert "runs backwards" in capsys.readouterr().err


def test_prepare_without_dataset_shows_help(capsys):
    assert main(["data", "prepare"]) == 2
    out = capsys.readouterr().out
    for name in ("criteo-kaggle", "criteo-terabyte", "avazu", "ml-100k"):
        assert name in out
