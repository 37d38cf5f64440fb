"""`bench tiers --big-gib N` wrote tiers.json only after part 2 (a table larger than memory, the long
part): a run stopped there lost part 1's measured comparison. Part 1 is now saved before part 2
starts, `complete` false until the end."""
from __future__ import annotations

import json

from embcache.cli import main

TINY = ["bench", "tiers", "--rows", "3000", "--dim", "8", "--steps", "4", "--rounds", "2", "--batch-size", "16",
        "--bag-size", "2", "--cache-ratio", "0.02", "--big-gib", "0.0005", "--big-steps", "3"]


def test_a_run_stopped_in_part_two_keeps_part_one(tmp_path, monkeypatch):
    import embcache.bench.tiers as tiers

    def big_table(args, work):
        raise KeyboardInterrupt  # the time limit strikes in part 2

    monkeypatch.setattr(tiers, "big_table", big_table)
    assert main([*TINY, "--out", str(tmp_path)]) == 130
    data = json.loads((tmp_path / "tiers.json").read_text())
    assert data["complete"] is False and "larger_than_memory" not in data
    assert data["fits_in_memory"]["tables_equal"] and data["fits_in_memory"]["mmap"]["steps"] == 4
