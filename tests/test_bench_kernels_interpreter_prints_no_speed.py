"""`bench kernels` on the CPU runs Triton's kernels under its interpreter: their times are the
interpreter's. A row's line used to print them as shares of the copy and speed-ups ("x0.0") as on
a GPU; it now gives the agreement alone, and kernels.json says `triton_interpreted`."""
from __future__ import annotations

import json
import re

import pytest

from embcache.cli import main

pytest.importorskip("triton")


def test_interpreted_row_line_has_no_speed_and_json_is_marked(tmp_path, capsys):
    assert main(["bench", "kernels", "--scale", "0.0002", "--dim", "4", "--batch-sizes", "4", "--steps", "1",
                 "--warmup-steps", "0", "--copy-mib", "1", "--device", "cpu", "--shapes", "one-hot",
                 "--out", str(tmp_path)]) == 0
    row_lines = [line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("bench kernels: one-hot batch 4:")]
    assert len(row_lines) == 1
    line = row_lines[0]
    assert "tables agree to" in line and "Triton's interpreter: no speed measured" in line
    assert not re.search(r"\bx\d|% of the copy| ms\b", line), line
    assert json.loads((tmp_path / "kernels.json").read_text())["triton_interpreted"] is True


def test_a_compiled_row_line_keeps_its_speeds():
    """On a GPU (not interpreted) the line is unchanged: shares, speed-ups and milliseconds."""
    from embcache.bench.kernels import row_line

    path = {"forward_share_of_copy": 0.5, "backward_share_of_copy": 0.25}
    row = {"shape": "one-hot", "batch_size": 4, "max_table_diff_after_one_step": 0.0,
           "torch": path, "triton": {**path, "forward_share_by_bags_per_program": {"1": 0.5}},
           "forward_speedup": 2.0, "backward_speedup": 3.0,
           "masked_write_ms": {"torch": 1.0, "triton": 0.5}, "lookup_ms": {"torch": 1.0, "triton": 0.5}}
    line = row_line(row, interpreted=False)
    assert "x2.0" in line and "x3.0" in line and "50% of the copy" in line and "0.50 ms" in line
