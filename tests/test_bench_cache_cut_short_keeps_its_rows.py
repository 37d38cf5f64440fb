"""`bench cache` wrote cache.json only at the end: a run stopped after an hour of hit rates (Ctrl-C,
a job's time limit) left nothing. It now saves after every row, `complete` false until it ends."""
from __future__ import annotations

import json

from embcache.cli import main

SMALL = ["--scale", "0.002", "--batches", "4", "--batch-size", "128", "--day-batches", "0",
         "--timing-scale", "0.002", "--timing-steps", "1", "--optimizers", "sgd", "--device", "cpu"]


def test_a_run_cut_short_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    import embcache.bench.cache as cache

    real, calls = cache.belady_hit_rate, []

    def belady(*args, **kwargs):
        calls.append(kwargs["bypass"])
        if len(calls) == 3:  # the second ratio's Belady: the time limit strikes
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "belady_hit_rate", belady)
    assert main(["bench", "cache", *SMALL, "--ratios", "0.05", "0.1", "--out", str(tmp_path)]) == 130
    data = json.loads((tmp_path / "cache.json").read_text())
    assert data["complete"] is False and data["timing"] is None
    assert [r["ratio"] for r in data["hit_rate"]["results"]] == [0.05]
    assert 0 < data["hit_rate"]["results"][0]["belady"] <= 1


def test_a_finished_run_says_complete_with_every_row(tmp_path):
    assert main(["bench", "cache", *SMALL, "--ratios", "0.05", "0.1", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "cache.json").read_text())
    assert data["complete"] is True
    assert [r["ratio"] for r in data["hit_rate"]["results"]] == [0.05, 0.1]
    assert [r["ratio"] for r in data["timing"]["results"]] == [0.05, 0.1]
