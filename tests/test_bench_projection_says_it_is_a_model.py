"""`bench projection` prints a table of samples/s and speed-ups at 1..32 GPUs from a CPU-only
command; nothing in its output said they are a model's. Its first line and projection.json now say
so (`measured`)."""
from __future__ import annotations

import json

from embcache.cli import main


def test_output_and_json_say_nothing_was_measured(tmp_path, capsys):
    assert main(["bench", "projection", "--gpus", "1", "2", "--rate", "1e6", "--no-best-split",
                 "--out", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("projected, nothing measured:") and "--rate" in first
    assert json.loads((tmp_path / "projection.json").read_text())["measured"] == first
