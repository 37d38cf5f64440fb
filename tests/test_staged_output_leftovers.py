"""What a staged writer killed outright (SIGKILL) left beside --out: removed by the next
writer of the same --out when its process is gone, with one line saying what and how much;
left, with one line, when that cannot be proven; a writer proven alive refuses the new one."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from embcache.leftovers import process_start
from embcache.data.staging import staged_output
from embcache.errors import DataOutputError

HOUR_AGO = time.time() - 2 * 3600


def dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def leftover(parent: Path, name: str, kind: str, pid: int, size: int = 3000, age: float | None = None) -> Path:
    """`.NAME.KIND-PID` as a killed writer leaves it: a directory with a partial shard."""
    path = parent / f".{name}.{kind}-{pid}"
    (path / "train").mkdir(parents=True)
    (path / "train" / "part-00000.parquet").write_bytes(b"x" * size)
    if age is not None:
        for p in (path / "train" / "part-00000.parquet", path / "train", path):
            os.utime(p, (age, age))
    return path


def record(parent: Path, name: str, pid: int, start, host: str | None = None) -> Path:
    path = parent / f".{name}.writer-{pid}"
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "start": start, "time": 0}))
    return path


def write(out: Path, force: bool = False) -> None:
    with staged_output(out, force=force) as tmp:
        (tmp / "meta.json").write_text("{}")


def test_a_dead_writers_directory_is_removed_with_one_line(tmp_path, capsys):
    pid = dead_pid()
    old = leftover(tmp_path, "data", "tmp", pid, size=5 * 2**20, age=HOUR_AGO)
    write(tmp_path / "data")
    assert not old.exists() and (tmp_path / "data" / "meta.json").is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"removed .data.tmp-{pid} (5.0 MiB freed)" in err[0] and str(tmp_path / "data") in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # its own writer record is gone too


def test_a_recorded_dead_writer_is_removed_at_once_with_its_record(tmp_path, capsys):
    pid = dead_pid()
    old = leftover(tmp_path, "data", "tmp", pid)  # new: only the record tells it is dead
    record(tmp_path, "data", pid, "boot:123")
    write(tmp_path / "data")
    assert not old.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert f"removed .data.tmp-{pid}" in capsys.readouterr().err


def test_a_reused_pid_is_not_taken_for_the_writer(tmp_path, sleeper, capsys):
    old = leftover(tmp_path, "data", "tmp", sleeper)
    record(tmp_path, "data", sleeper, "another-boot:1")  # the PID runs, but started after the writer
    write(tmp_path / "data")
    assert not old.exists() and f"removed .data.tmp-{sleeper}" in capsys.readouterr().err


def test_a_live_writer_of_the_same_out_refuses_the_second_and_keeps_its_files(tmp_path, sleeper, capsys):
    if process_start(sleeper) is None:
        pytest.skip("no /proc to tell a process's start")
    theirs = leftover(tmp_path, "data", "tmp", sleeper)
    record(tmp_path, "data", sleeper, process_start(sleeper))
    with pytest.raises(DataOutputError, match=rf"data: another embcache process \(PID {sleeper}\) is writing it"):
        write(tmp_path / "data")
    assert (theirs / "train" / "part-00000.parquet").is_file() and not (tmp_path / "data").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([theirs.name, f".data.writer-{sleeper}"])


@pytest.mark.parametrize("case", ["running pid, no record", "dead pid, no record, recent", "another host"])
def test_what_cannot_be_proven_dead_is_left_with_one_line(tmp_path, sleeper, capsys, case):
    pid = sleeper if case == "running pid, no record" else dead_pid()
    theirs = leftover(tmp_path, "data", "tmp", pid)
    if case == "another host":
        record(tmp_path, "data", pid, "boot:1", host="elsewhere.example")
    write(tmp_path / "data")
    assert (theirs / "train" / "part-00000.parquet").is_file() and (tmp_path / "data" / "meta.json").is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"left .data.tmp-{pid} (2.9 KiB) beside {tmp_path / 'data'} alone" in err[0]
    assert {"running pid, no record": f"process {pid} is running", "dead pid, no record, recent": "within the hour",
            "another host": "host elsewhere.example"}[case] in err[0]


def test_the_previous_data_set_moved_aside_is_kept_when_out_is_missing(tmp_path, capsys):
    pid = dead_pid()
    aside = leftover(tmp_path, "data", "old", pid, age=HOUR_AGO)  # killed between its two renames
    write(tmp_path / "data")
    assert aside.is_dir() and "rename it back" in capsys.readouterr().err
    other = dead_pid()
    aside2 = leftover(tmp_path, "data", "old", other, age=HOUR_AGO)  # killed after: a superseded copy
    write(tmp_path / "data", force=True)
    assert not aside2.exists() and f"removed .data.old-{other}" in capsys.readouterr().err


def test_only_its_own_outs_leftovers_go_and_a_failed_run_leaves_nothing(tmp_path, capsys):
    pid = dead_pid()
    ours = leftover(tmp_path, "data", "tmp", pid, age=HOUR_AGO)
    other = leftover(tmp_path, "data2", "tmp", pid, age=HOUR_AGO)  # another --out's: not ours to judge
    with pytest.raises(RuntimeError), staged_output(tmp_path / "data"):
        raise RuntimeError("boom")
    assert not ours.exists() and sorted(p.name for p in tmp_path.iterdir()) == [other.name]
    err = capsys.readouterr().err
    assert f"removed .data.tmp-{pid} " in err and "data2" not in err


def test_a_sigkilled_writer_is_cleaned_by_the_next_run(tmp_path, capsys):
    """The real thing: a process writing through staged_output, killed with SIGKILL."""
    script = textwrap.dedent(f"""
        import time
        from embcache.data.staging import staged_output
        with staged_output({str(tmp_path / 'data')!r}) as tmp:
            (tmp / "part-0").write_bytes(b"x" * 4096)
            print("writing", flush=True)
            time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert child.stdout.readline().strip() == "writing"
    with pytest.raises(DataOutputError, match="is writing it now"):  # while it runs
        write(tmp_path / "data")
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert (tmp_path / f".data.tmp-{child.pid}" / "part-0").is_file()
    write(tmp_path / "data")
    assert f"removed .data.tmp-{child.pid} (4.0 KiB freed)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_dlrm_export_removes_what_a_killed_export_left(tmp_path, capsys):
    from tests.small_runs import trained_dlrm_run

    from embcache.dlrm.export import export_checkpoint

    root = trained_dlrm_run(tmp_path, rows=600, steps=2)
    pid = dead_pid()
    staged = leftover(root, "export", "export-tmp", pid, age=HOUR_AGO)
    aside = leftover(root, "export", "export-old", pid, age=HOUR_AGO)  # the export it replaced
    capsys.readouterr()
    export_checkpoint(root / "ck", root / "export", force=True)
    assert not staged.exists() and not aside.exists() and (root / "export" / "manifest.json").is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"embcache: removed .export.export-old-{pid} and .export.export-tmp-{pid} (5.9 KiB freed): "
                   f"left by process {pid}, killed before it finished writing {root / 'export'}"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_a_checkpoint_save_removes_a_killed_saves_file_and_never_refuses(tmp_path, sleeper, capsys):
    from embcache.checkpoint import load_checkpoint, save_checkpoint

    pid = dead_pid()
    killed = tmp_path / f".dlrm-last.pt.tmp-{pid}"  # a save killed half-way: a file, not a directory
    killed.write_bytes(b"x" * 2048)
    record(tmp_path, "dlrm-last.pt", pid, "boot:1")
    live = tmp_path / f".dlrm-last.pt.tmp-{sleeper}"
    live.write_bytes(b"y")
    if process_start(sleeper) is not None:
        record(tmp_path, "dlrm-last.pt", sleeper, process_start(sleeper))  # another run saving here now
    save_checkpoint({"step": 3}, tmp_path / "dlrm-last.pt", kind="dlrm")  # mid-run: a save never refuses
    assert load_checkpoint(tmp_path / "dlrm-last.pt", "dlrm")["step"] == 3
    assert not killed.exists() and live.is_file()
    err = sorted(capsys.readouterr().err.strip().splitlines())  # one line each, in the order of their PIDs
    assert len(err) == 2 and f"left .dlrm-last.pt.tmp-{sleeper} (1 B)" in err[0]
    assert f"removed .dlrm-last.pt.tmp-{pid} (2.0 KiB freed)" in err[1]
