"""`bench host` wrote host.json only at the end: a run stopped after its first cache ratios (Ctrl-C,
a job's time limit) left nothing. It now saves after every ratio, `complete` false until the end."""
from __future__ import annotations

import json

from embcache.cli import main

SMALL = ["bench", "host", "--scale", "0.002", "--batch-size", "64", "--ratios", "0.05", "0.1", "--steps", "1",
         "--warmup-steps", "0", "--threads", "1", "--shapes", "one-hot"]


def test_a_run_cut_short_keeps_the_ratios_it_finished(tmp_path, monkeypatch):
    import embcache.bench.host as host

    real, calls = host.measure, []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second ratio: the time limit strikes
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(host, "measure", measure)
    assert main([*SMALL, "--out", str(tmp_path)]) == 130
    data = json.loads((tmp_path / "host.json").read_text())
    assert data["complete"] is False
    assert [(r["shape"], r["ratio"], r["threads"]) for r in data["results"]] == [("one-hot", 0.05, 1)]
    assert [s["ratio"] for s in data["summary"]] == [0.05]


def test_a_finished_run_says_complete(tmp_path):
    assert main([*SMALL, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "host.json").read_text())
    assert data["complete"] is True and [r["ratio"] for r in data["results"]] == [0.05, 0.1]
