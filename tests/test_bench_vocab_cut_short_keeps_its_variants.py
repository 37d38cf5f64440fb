"""`bench vocab` wrote vocab.json only after its last variant: a run stopped during `open` (each
variant a `dlrm train` of minutes) lost the ones it had finished. It now saves after every
variant, `complete` false until the end. The variants' runs are stood in for (no subprocess)."""
from __future__ import annotations

import json

from embcache.cli import main


def test_a_run_cut_short_keeps_the_variants_it_finished(tmp_path, monkeypatch):
    import embcache.bench.vocab as vocab

    def run_variant(mode, data, args):
        if mode == "open":  # the time limit strikes during the second variant
            raise KeyboardInterrupt
        days = [{"split": s, "auc": 0.7, "logloss": 0.5} for s in vocab.evaluated_splits(args.days)]
        return {"next_day": days, "peak_host_mib": 100.0, "train_samples_per_s": 1000.0}, 1.0

    monkeypatch.setattr(vocab, "run_variant", run_variant)
    assert main(["bench", "vocab", "--days", "3", "--rows", "500", "--scale", "0.001", "--no-warmup",
                 "--modes", "first-day", "open", "--data-cache", str(tmp_path / "data"),
                 "--out", str(tmp_path / "out")]) == 130
    data = json.loads((tmp_path / "out" / "vocab.json").read_text())
    assert data["complete"] is False and [r["mode"] for r in data["results"]] == ["first-day"]
    assert data["results"][0]["mean_auc"] == 0.7 and data["open_minus"] == {}
