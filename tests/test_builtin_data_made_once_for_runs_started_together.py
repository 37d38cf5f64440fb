"""Runs started together on the built-in data (a sweep of settings) all ask for the same data set
on first use: one makes it, the others wait for that process instead of refusing ("choose
another --out", an option they never gave), and take over if it dies (`staging.shared_output`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from embcache.data.staging import shared_output

REPO = Path(__file__).resolve().parents[1]


def writer(out: Path, go: Path) -> subprocess.Popen:
    """Another run making `out`: it holds its staged directory until `go` exists, then finishes."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from embcache.data.staging import staged_output
        with staged_output({str(out)!r}, force=True) as tmp:
            (tmp / "part-0").write_bytes(b"x" * 4096)
            print("writing", flush=True)
            while not Path({str(go)!r}).exists():
                time.sleep(0.05)
            (tmp / "meta.json").write_text("{{}}")
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout.readline().strip() == "writing"
    return child


def in_thread(out: Path, made: list) -> tuple[threading.Thread, list]:
    result = []

    def make(tmp: Path) -> None:
        made.append(tmp)
        (tmp / "meta.json").write_text("{}")

    thread = threading.Thread(target=lambda: result.append(shared_output(out, make, "making", poll_s=0.02)))
    thread.start()
    return thread, result


def wait_for_line(capfd, text: str) -> str:
    seen = ""
    for _ in range(500):
        seen += capfd.readouterr().out
        if text in seen:
            return seen
        threading.Event().wait(0.02)
    raise AssertionError(f"no {text!r} in {seen!r}")


def test_a_second_run_waits_for_the_first_and_uses_its_data(tmp_path, capfd):
    out, go, made = tmp_path / "data", tmp_path / "go", []
    first = writer(out, go)
    thread, result = in_thread(out, made)
    wait_for_line(capfd, f"waiting for process {first.pid}, which is writing {out} now ...")
    assert thread.is_alive() and not made
    go.touch()  # the first run finishes
    first.wait(timeout=30)
    thread.join(timeout=30)
    assert result == [out] and not made  # its data, not made twice
    assert (out / "part-0").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["data", "go"]


def test_a_second_run_makes_the_data_when_the_first_dies_meanwhile(tmp_path, capfd):
    out, go, made = tmp_path / "data", tmp_path / "go", []
    first = writer(out, go)
    thread, result = in_thread(out, made)
    wait_for_line(capfd, f"waiting for process {first.pid}")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    first.stdout.close()
    thread.join(timeout=30)
    assert result == [out] and len(made) == 1 and (out / "meta.json").is_file() and not (out / "part-0").exists()
    assert f"removed .data.tmp-{first.pid} (4.0 KiB freed)" in capfd.readouterr().err  # the dead run's leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_data_already_there_is_taken_as_it_is(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    assert shared_output(tmp_path / "data", lambda tmp: (_ for _ in ()).throw(AssertionError("made")), "x") == \
        tmp_path / "data"
