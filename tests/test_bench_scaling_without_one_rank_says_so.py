"""`bench scaling --ranks 2 4` (no 1-rank run) printed "x0.00 samples/s, x0.00 CPU-seconds a sample vs
1 rank": a speed-up of nothing read as a collapse. It now prints the samples/s and says there is no
1-rank run. And scaling.json is saved after every round (`complete` false until the end). The runs
are stood in for (no torchrun)."""
from __future__ import annotations

import json

from embcache.cli import main

ARGS = ["bench", "scaling", "--which", "dlrm", "--no-independent", "--steps", "1"]


def _stand_ins(monkeypatch, stop_in_round: int | None = None):
    import embcache.bench.scaling as scaling

    calls = []

    def dlrm_run(args, world, data):
        calls.append(world)
        if stop_in_round is not None and len(calls) > stop_in_round * len(args.ranks):
            raise KeyboardInterrupt
        return {"job": "dlrm", "ranks": world, "samples_per_s": 1000.0 * world, "cpu_seconds_per_sample": 1e-3}

    monkeypatch.setattr(scaling, "_dlrm_data", lambda args: None)
    monkeypatch.setattr(scaling, "_dlrm_run", dlrm_run)


def test_no_one_rank_run_prints_no_ratio(tmp_path, monkeypatch, capsys):
    _stand_ins(monkeypatch)
    assert main([*ARGS, "--ranks", "2", "4", "--repeats", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "x0.00" not in out
    assert "dlrm 2 rank(s): 2,000 samples/s (no 1-rank run to compare with: add 1 to --ranks)" in out
    assert json.loads((tmp_path / "scaling.json").read_text())["results"][0]["speedup_vs_1_rank"] is None


def test_with_one_rank_the_ratio_is_printed(tmp_path, monkeypatch, capsys):
    _stand_ins(monkeypatch)
    assert main([*ARGS, "--ranks", "1", "2", "--repeats", "1", "--out", str(tmp_path)]) == 0
    assert "dlrm 2 rank(s): x2.00 samples/s, x1.00 CPU-seconds a sample vs 1 rank" in capsys.readouterr().out


def test_a_run_cut_short_keeps_its_finished_rounds(tmp_path, monkeypatch):
    _stand_ins(monkeypatch, stop_in_round=1)  # the second round is stopped
    assert main([*ARGS, "--ranks", "1", "2", "--repeats", "3", "--out", str(tmp_path)]) == 130
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert data["complete"] is False and data["rounds_done"] == 1
    assert [(r["ranks"], r["speedup_vs_1_rank"]) for r in data["results"]] == [(1, 1.0), (2, 2.0)]


def test_each_run_is_said_as_it_ends(tmp_path, monkeypatch, capsys):
    """A round of torchrun runs takes minutes: a line a run, not silence until the summary."""
    _stand_ins(monkeypatch)
    assert main([*ARGS, "--ranks", "1", "2", "--repeats", "2", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    runs = [line for line in lines if line.startswith("  run ")]
    one_round = ["  run 1 of 2: dlrm 1 rank(s): 1,000 samples/s", "  run 2 of 2: dlrm 2 rank(s): 2,000 samples/s"]
    assert runs == one_round * 2
    assert lines.index(runs[0]) < lines.index("round 2 of 2")
