"""`bench probe` on the CPU measures random rows from ordinary memory: no link and no unified view.
Its lines and its JSON used to say "through the unified view" there, a GB/s a reader would take
for the link's; they now say what was measured."""
from __future__ import annotations

import json

from embcache.cli import main


def test_cpu_rows_are_labelled_ordinary_memory(tmp_path, capsys):
    assert main(["bench", "probe", "--device", "cpu", "--table-mib", "1", "--rows", "256", "--batch-size", "4",
                 "--copy-mib", "1", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "-byte rows" in line and "random" in line]
    assert len(lines) == 3
    assert all("unified view" not in line and "from ordinary memory (CPU: no link)" in line for line in lines), lines
    measured = json.loads((tmp_path / "probe.json").read_text())["unified_view"]["measured"]
    assert measured == "from ordinary memory (CPU: no link)"
