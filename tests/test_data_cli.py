"""`embcache data`: commands produce a usable directory; bad input is one line, exit 1."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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


BAD_OPTIONS = [
    (["synthetic", "--rows", "0"], "--rows: must be a positive integer, not 0"),
    (["synthetic", "--rows", "ten"], "--rows: 'ten' is not an integer"),
    (["synthetic", "--scale", "0"], "--scale: must be > 0, not 0"),
    (["synthetic", "--scale", "-1"], "--scale: must be > 0, not -1"),
    (["synthetic", "--scale", "nan"], "--scale: 'nan' is not a finite number"),
    (["synthetic", "--seed", "-1"], "--seed: must be >= 0, not -1"),
    (["prepare", "criteo-kaggle", "--input", "x", "--rows-per-shard", "0"], "--rows-per-shard: must be a positive integer, not 0"),
    (["prepare", "avazu", "--input", "x", "--rows-per-shard", "-5"], "--rows-per-shard: must be a positive integer, not -5"),
    (["prepare", "avazu", "--input", "x", "--seed", "-1"], "--seed: must be from 0 to 4294967295, not -1"),
    (["prepare", "criteo-terabyte", "--input-dir", "x", "--min-count", "0"], "--min-count: must be a positive integer, not 0"),
    (["prepare", "criteo-kaggle", "--input", "x", "--max-ids-per-feature", "1"],
     "--max-ids-per-feature: must be >= 2, not 1"),
    (["prepare", "ml-100k", "--seed", "-2"], "--seed: must be >= 0, not -2"),
]


@pytest.mark.parametrize("argv,message", BAD_OPTIONS)
def test_bad_numbers_are_refused_before_any_work(tmp_path, capsys, argv, message):
    """A usage error (exit 2) with the option and the reason, never a traceback or a run that
    never ends (--rows-per-shard 0 used to open shard files forever)."""
    argv = ["data", *argv]
    if argv[1] != "info":
        argv += ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_bad_days_and_head_are_one_line(tmp_path, capsys):
    assert main(["data", "prepare", "criteo-terabyte", "--input-dir", str(tmp_path), "--days", "0,99",
                 "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "day 99 does not exist" in err
    with pytest.raises(SystemExit):
        main(["data", "info", str(tmp_path), "--head", "-1"])
    assert "--head: must be >= 0, not -1" in capsys.readouterr().err


def test_unwritable_output_is_one_line_before_reading_the_input(tmp_path, capsys, monkeypatch):
    import embcache.data.converter as converter

    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    passes = []
    monkeypatch.setattr(converter, "read_blocks", lambda *a, **k: passes.append(a) or iter(()))
    for out in (blocker / "out", blocker, "/proc/x"):
        assert main(["data", "prepare", "criteo-kaggle", "--input", str(src), "--out", str(out),
                     "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and "cannot write" in err, err
        assert str(out) in err
    assert passes == []  # refused before pass 1 read a single block
    assert main(["data", "synthetic", "--out", str(blocker / "syn"), "--rows", "10", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker) in err and "cannot write" in err


def _prepare_stderr(src, out) -> str:
    """stderr of `embcache data prepare criteo-kaggle` run as a user runs it (a process of its
    own, so Python's "Exception ignored" reports reach stderr as they would)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "embcache", "data", "prepare", "criteo-kaggle", "--input", str(src),
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, env=env, cwd=root)
    assert done.returncode == 1
    return done.stderr


def test_a_binary_or_late_non_utf8_input_is_one_line_naming_file_and_line(tmp_path):
    """A binary file is refused from its first bytes; a line that is not UTF-8 further on (past
    the first MiB, one of the wrong column count) is named by its line, without pyarrow's
    "Exception ignored ... UnicodeDecodeError" report or the line's bytes."""
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)  # a newline (byte 10) before the first non-UTF-8 byte: line 2
    err = _prepare_stderr(binary, tmp_path / "o")
    assert err.splitlines() == [f"embcache data: error: {binary}:2: not UTF-8 text (byte 0x80): is it a binary or "
                                "compressed file? (gzip is read from a .gz name)"]
    good = "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26) + "\n"
    lines = (1 << 20) // len(good) + 10
    late = tmp_path / "train.txt"
    late.write_bytes(good.encode() * lines + b"1\t2\t\xff\xfe\n" + good.encode() * 5)
    err = _prepare_stderr(late, tmp_path / "o2")
    assert err.splitlines() == [f"embcache data: error: {late}:{lines + 1}: not UTF-8 text (byte 0xff)"]


def _no_leftovers(parent):
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_an_existing_output_is_replaced_only_with_force(tmp_path, capsys):
    out = tmp_path / "syn"
    args = ["data", "synthetic", "--out", str(out), "--rows", "500", "--scale", "0.0005", "--no-progress"]
    assert main([*args, "--seed", "1"]) == 0
    capsys.readouterr()
    assert main([*args, "--seed", "2"]) == 1
    err = capsys.readouterr().err
    assert err == (f"embcache data: error: {out} already holds a prepared data set; choose another --out, or "
                   f"replace it with --force\n")
    assert json.loads((out / "meta.json").read_text())["generator"]["seed"] == 1  # untouched
    assert main([*args, "--seed", "2", "--force"]) == 0
    assert json.loads((out / "meta.json").read_text())["generator"]["seed"] == 2
    assert _no_leftovers(tmp_path) == []
    (tmp_path / "empty").mkdir()  # an empty directory is no data set to lose
    assert main([*args[:3], str(tmp_path / "empty"), *args[4:]]) == 0


def test_a_failed_prepare_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    src = tmp_path / "train.txt"
    src.write_text("not\ta\tcriteo\tline\n" * 3)
    out = tmp_path / "o"
    assert main(["data", "prepare", "criteo-kaggle", "--input", str(src), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "no usable rows" in err and ".tmp-" not in err
    assert not out.exists() and _no_leftovers(tmp_path) == []

    import embcache.data.synthetic as synthetic

    def interrupted(out_dir, **kw):  # Ctrl-C halfway through writing
        (Path(out_dir) / "train").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "generate_synthetic", interrupted)
    assert main(["data", "synthetic", "--out", str(out), "--no-progress"]) == 130
    assert capsys.readouterr().err.strip() == "embcache: interrupted"
    assert not out.exists() and _no_leftovers(tmp_path) == []


def test_force_does_not_delete_the_input(tmp_path, capsys):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    assert main(["data", "prepare", "criteo-kaggle", "--input", str(src), "--out", str(tmp_path), "--force",
                 "--no-progress"]) == 1
    assert f"{tmp_path} holds the input {src}: --force would delete it" in capsys.readouterr().err
    assert src.read_text() == kaggle_text()
