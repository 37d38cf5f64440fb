"""`embcache data prepare` fed the files users bring: Excel's byte-order mark (own, avazu, and
cf through the same header reader), a column named twice, a directory for --input, a write
that fails part-way (a full disk), and a prepare stopped by SIGTERM. Tiny files: seconds."""
from __future__ import annotations

import gzip
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embcache.cli import main
from embcache.data.avazu import COLUMNS as AVAZU_COLUMNS
from embcache.data.ctr_format import head_rows, read_meta

BOM = b"\xef\xbb\xbf"
HEADER = "clicked,price,user,item"
ROOT = Path(__file__).resolve().parents[1]


def rows(n: int = 40) -> list[str]:
    return [f"{i % 2},{i * 0.5:.1f},u{i % 5},\"item, {i % 7}\"" for i in range(n)]


def own(source, out, *extra: str) -> int:
    return main(["data", "prepare", "own", "--input", str(source), "--out", str(out), "--label-col", "clicked",
                 "--dense-cols", "price", "--sparse-cols", "user,item", "--no-progress", *extra])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("gz", [False, True])
def test_an_excel_csv_with_a_byte_order_mark_and_crlf_gives_the_plain_file_s_data(tmp_path, capsys, gz):
    """It said "no column 'clicked'; it has \\ufeffclicked, ..." of Excel's "CSV UTF-8"."""
    plain, excel = tmp_path / "plain.csv", tmp_path / ("excel.csv.gz" if gz else "excel.csv")
    plain.write_text(HEADER + "\n" + "\n".join(rows()) + "\n")
    data = BOM + (HEADER + "\r\n" + "\r\n".join(rows())).encode()  # no newline after the last line either
    excel.write_bytes(gzip.compress(data) if gz else data)
    assert own(plain, tmp_path / "a") == 0
    assert own(excel, tmp_path / "b") == 0, capsys.readouterr().err
    a, b = read_meta(tmp_path / "a"), read_meta(tmp_path / "b")
    assert {s: i["rows"] for s, i in a["splits"].items()} == {s: i["rows"] for s, i in b["splits"].items()}
    assert sum(i["rows"] for i in b["splits"].values()) == 40 and not b["bad_rows"][str(excel)]["count"]
    assert head_rows(tmp_path / "a", "train", 40) == head_rows(tmp_path / "b", "train", 40)


def test_an_avazu_csv_with_a_byte_order_mark_is_read(tmp_path, capsys):
    """avazu checks its header against the expected names: the mark made the first one '\\ufeffid'."""
    lines = [",".join([str(10**10 + i), str(i % 2), f"141021{i % 24:02d}", *[f"v{i % 3}"] * (len(AVAZU_COLUMNS) - 3)])
             for i in range(30)]
    path = tmp_path / "train.csv"
    path.write_bytes(BOM + (",".join(AVAZU_COLUMNS) + "\r\n" + "\r\n".join(lines) + "\r\n").encode())
    assert main(["data", "prepare", "avazu", "--input", str(path), "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert sum(i["rows"] for i in read_meta(tmp_path / "o")["splits"].values()) == 30


def test_cf_reads_a_csv_with_a_byte_order_mark_through_the_shared_header_reader(tmp_path):
    """cf refused such a file (with a `sed` to drop the mark): it reads its header as the
    converters do now."""
    from embcache.cf.data.table import read_table

    path = tmp_path / "excel.csv"
    lines = b"".join(b"u%d,i%d\r\n" % (u, i) for u in range(4) for i in range(3))
    path.write_bytes(BOM + b"user_id,item_id\r\n" + lines)
    table = read_table(path, "user_id", "item_id")
    assert table.user_ids.tolist() == ["u0", "u1", "u2", "u3"] and len(table.pairs) == 12


def test_a_column_named_twice_is_one_line_naming_the_file_and_header(tmp_path, capsys):
    """A copied spreadsheet column ended in pyarrow's KeyError traceback (`Field "user" exists 2 times`)."""
    path = tmp_path / "dup.csv"
    path.write_text("clicked,price,user,item,user\n" + "\n".join(r + ",x" for r in rows()) + "\n")
    assert own(path, tmp_path / "o") == 1
    assert one_error_line(capsys) == (f"embcache data: error: {path}:1: the header names column 'user' 2 times: "
                                      f"rename all but one, so that it is clear which is meant")
    assert not (tmp_path / "o").exists()
    ok = tmp_path / "dup_unused.csv"  # a repeated column no one asks for is no matter
    ok.write_text(HEADER + ",extra,extra\n" + "\n".join(r + ",1,2" for r in rows()) + "\n")
    assert own(ok, tmp_path / "o2") == 0


def test_a_directory_for_input_is_said_to_be_one(tmp_path, capsys):
    """It said "no such file" of a directory that is there, sending the user after a typo."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.csv").write_text(HEADER + "\n" + "\n".join(rows()) + "\n")
    assert own(tmp_path / "parts", tmp_path / "o") == 1
    assert "parts: a directory, not a file: --input takes one file" in one_error_line(capsys)
    assert main(["data", "prepare", "criteo-kaggle", "--input", str(tmp_path / "parts"), "--out",
                 str(tmp_path / "o"), "--no-progress"]) == 1
    assert "a directory, not a file" in one_error_line(capsys)


def _prepare_command(source: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "embcache", "data", "prepare", "own", "--input", str(source), "--out", str(out),
            "--label-col", "clicked", "--dense-cols", "price", "--sparse-cols", "user,item", "--no-progress"]


def _small_files_only():
    """In the child: a write past 1,200 bytes fails with EFBIG, as one on a full disk fails."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1200, 1200))


def test_a_write_that_fails_is_one_line_and_leaves_nothing(tmp_path):
    """The failing shard was one line, but the other splits' open Parquet writers each printed
    an "Exception ignored in ParquetWriter.__del__" traceback beside it."""
    source = tmp_path / "in.csv"
    source.write_text(HEADER + "\n" + "\n".join(rows()) + "\n")  # the train shard fails as it closes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(_prepare_command(source, tmp_path / "o"), capture_output=True, text=True, env=env,
                         cwd=tmp_path, preexec_fn=_small_files_only, timeout=120)
    assert run.returncode == 1
    err = run.stderr.strip()
    assert len(err.splitlines()) == 1 and "cannot write" in err and "File too large" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def test_sigterm_during_prepare_removes_the_unfinished_data_set(tmp_path):
    """SIGTERM's default action ended the process at once and left `.o.tmp-PID` behind, with
    the shards written so far (gigabytes on a real file)."""
    source = tmp_path / "in.csv"
    source.write_text(HEADER + "\n" + "\n".join(rows(20_000)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(_prepare_command(source, tmp_path / "o") + ["--rows-per-shard", "10"], env=env,
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".o.tmp-*/train/part-*")):  # pass 2 has begun: shards lie there
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "embcache: stopped by SIGTERM; the unfinished data set is removed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def test_a_quoted_newline_where_a_block_ends_keeps_its_row_whole(tmp_path):
    """A block cut at the newline inside a quoted field broke that row in two: one "wrong
    column count" row and the row's value mangled, depending only on where the block ended."""
    from embcache.data.bad_rows import BadRowLog
    from embcache.data.delimited import read_blocks

    lines = ["a,b"] + [f'{i},"x{i}"' for i in range(300)]
    text = "\n".join(lines).replace('"x200"', '"x\n200"') + "\n"
    path = tmp_path / "in.csv"
    path.write_text(text)
    at = text.index('"x\n200"')
    for block_bytes in range(at - 12, at + 12):
        log = BadRowLog()
        values = [v for block, _, _ in read_blocks(path, ["a", "b"], ",", True, log, block_bytes)
                  for v in block.column("b").to_pylist()]
        assert values == [f"x{i}" if i != 200 else "x\n200" for i in range(300)], block_bytes
        assert not log.files[str(path)].count, block_bytes


def test_names_with_spaces_after_the_commas_are_shown_with_their_spaces(tmp_path, capsys):
    """"a, b" files: it said "no column 'price'; it has clicked,  price, ...", the spaces that
    part ' price' from 'price' lost in the listing."""
    path = tmp_path / "spaced.csv"
    path.write_text(HEADER.replace(",", ", ") + "\n" + "\n".join(r.replace(",", ", ") for r in rows()) + "\n")
    assert own(path, tmp_path / "o") == 1
    err = one_error_line(capsys)
    assert f"{path}: no column 'price', 'user', 'item'; it has 'clicked', ' price', ' user', ' item': spaces" in err


def test_ml100k_files_saved_by_an_editor_with_a_byte_order_mark_and_crlf_lose_no_line(tmp_path, capsys):
    """The mark made u.data's line 1 a bad row ("1 bad rows, first at lines [1]")."""
    src = tmp_path / "ml"
    src.mkdir()
    users = [f"{u}|{20 + u}|{'MF'[u % 2]}|student|1000{u}" for u in range(1, 11)]
    items = [f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|" + "|".join(str(int(g == i % 19)) for g in range(19))
             for i in range(1, 21)]
    data = [f"{1 + k % 10}\t{1 + k % 20}\t{1 + k % 5}\t{880000000 + k}" for k in range(200)]
    (src / "u.user").write_bytes(BOM + "\r\n".join(users).encode() + b"\r\n")
    (src / "u.item").write_bytes(BOM + "\r\n".join(items).encode("latin-1") + b"\r\n")
    (src / "u.data").write_bytes(BOM + "\r\n".join(data).encode())
    assert main(["data", "prepare", "ml-100k", "--input", str(src), "--out", str(tmp_path / "o")]) == 0
    meta = read_meta(tmp_path / "o")
    assert sum(i["rows"] for i in meta["splits"].values()) == 200, capsys.readouterr().err
    assert not any(v.get("count") for v in meta["bad_rows"].values()), meta["bad_rows"]
