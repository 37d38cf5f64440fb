"""DLRM training through the cache: equal to torchrec's plain tables, learns, resumes."""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from embcache.checkpoint import load_checkpoint
from embcache.train.dlrm import DLRMConfig, DLRMTrainer


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("synthetic")
    generate_synthetic(out, rows=20_000, scale=0.001, seed=0)
    return out


def small_config(**kw):
    base = DLRMConfig(batch_size=256, eval_batch_size=4096, embedding_dim=8, dense_arch=[16],
                      over_arch=[16], device="cpu", progress=False, epochs=1)
    return replace(base, **kw)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_cached_training_equals_torchrec_tables(synthetic, optimizer):
    """Same parameters after N steps. SGD: every element to 1e-5. Adagrad: its first step
    on a row is g / (|g| + eps), so a near-zero gradient whose last bit differs (the cache
    sums a row's gradients in another order than torch's coalesce) moves that element by
    more; all but 1 in 10^4 elements agree to 1e-5 and all to 1e-3."""
    cfg = small_config(max_steps=40, cache_ratio=0.01, sparse_optimizer=optimizer)
    cached = DLRMTrainer(cfg, synthetic)
    plain = DLRMTrainer(replace(cfg, sparse="device"), synthetic)
    cached.fit(), plain.fit()
    stats = cached.sparse.cache_stats()
    assert stats["evictions"] > 0, "the tiny cache must evict during training"
    got = torch.cat([cached.sparse.table_weight(t.name).flatten() for t in cached.sparse.embedding_bag_configs()])
    want = torch.cat([plain.sparse.embedding_bags[t.name].weight.detach().flatten()
                      for t in cached.sparse.embedding_bag_configs()])
    diff = (got - want).abs()
    if optimizer == "sgd":
        assert float(diff.max()) <= 1e-5
    else:
        assert float((diff > 1e-5).float().mean()) < 1e-4 and float(diff.max()) < 1e-3
    dense_a = {k: v for k, v in cached.model.state_dict().items() if not k.startswith("sparse_arch")}
    dense_b = {k: v for k, v in plain.model.state_dict().items() if not k.startswith("sparse_arch")}
    assert dense_a.keys() == dense_b.keys()
    for k in dense_a:
        torch.testing.assert_close(dense_a[k], dense_b[k], rtol=0, atol=1e-5)
    auc_a, auc_b = cached.evaluate("val")["auc"], plain.evaluate("val")["auc"]
    assert abs(auc_a - auc_b) < 1e-4


def test_synthetic_run_learns_well_above_chance(synthetic):
    meta = json.loads((Path(synthetic) / "meta.json").read_text())
    trainer = DLRMTrainer(small_config(epochs=2, cache_ratio=0.05), synthetic)
    summary = trainer.fit()
    assert summary["val_auc"] > 0.65, summary
    # the hidden model bounds what can be learnt; a short run gets a good share of it
    assert summary["val_auc"] <= meta["oracle_auc"] + 0.02
    assert 0 < summary["hit_rate"] <= 1 and summary["train_samples_per_s"] > 0


def _cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "embcache", "dlrm", "train", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_resume_after_kill_equals_uninterrupted(synthetic, tmp_path):
    common = ["--data", str(synthetic), "--batch-size", "64", "--embedding-dim", "8", "--dense-arch", "16",
              "--over-arch", "16", "--device", "cpu", "--no-progress", "--max-steps", "90",
              "--checkpoint-every", "15", "--cache-ratio", "0.01"]
    whole = _cli([*common, "--checkpoint-dir", str(tmp_path / "whole")])
    killed_dir = tmp_path / "killed"
    victim = _cli([*common, "--checkpoint-dir", str(killed_dir)])
    ckpt = killed_dir / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once a mid-run checkpoint exists
        if ckpt.exists() and load_checkpoint(ckpt, "dlrm")["step"] >= 30:
            break
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    killed_at = load_checkpoint(ckpt, "dlrm")["step"]
    assert 30 <= killed_at < 90
    resumed = _cli([*common, "--checkpoint-dir", str(killed_dir), "--resume"])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"resumed from {ckpt}" in out
    whole.communicate(timeout=300)
    a = load_checkpoint(killed_dir / "last.pt", "dlrm")
    b = load_checkpoint(tmp_path / "whole" / "last.pt", "dlrm")
    assert a["step"] == b["step"] == 90
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        if k.endswith(".stats"):
            continue  # the resumed run's extra checkpoint flushes add d2h bytes; counted separately
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_corrupt_checkpoint_is_refused_with_one_line(synthetic, tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    (ckdir / "last.pt").write_bytes(b"not a checkpoint at all")
    proc = _cli(["--data", str(synthetic), "--device", "cpu", "--no-progress", "--max-steps", "2",
                 "--checkpoint-dir", str(ckdir), "--resume"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "last.pt: corrupt or truncated checkpoint" in err
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0


def test_missing_data_directory_is_one_clear_line(tmp_path):
    proc = _cli(["--data", str(tmp_path / "nowhere"), "--no-progress"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "no meta.json here" in err and "Traceback" not in err


def test_movielens_100k_as_ctr_reaches_validation_auc_above_070(tmp_path):
    from embcache.data.movielens_ctr import prepare_ml100k_ctr

    try:
        prepare_ml100k_ctr(tmp_path / "ml")
    except Exception as err:  # the RecBole copy comes from PyPI on first use
        pytest.skip(f"MovieLens-100k not available (pip download failed): {err}")
    trainer = DLRMTrainer(small_config(batch_size=512, epochs=2, cache_ratio=0.1,
                                       sparse_optimizer="adagrad", sparse_lr=0.05), tmp_path / "ml")
    summary = trainer.fit()
    assert summary["val_auc"] > 0.70, summary


def test_a_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(synthetic, tmp_path):
    from embcache.train.diverged import TrainingDiverged

    trainer = DLRMTrainer(small_config(checkpoint_dir=str(tmp_path), checkpoint_every=5, max_steps=20), synthetic)
    step = trainer.train_step

    def poisoned(batch, nxt=None):
        if trainer.step == 7:  # the 8th step: a dense weight goes bad, the loss follows
            with torch.no_grad():
                next(trainer.model.dense_arch.parameters()).fill_(float("nan"))
        return step(batch, nxt)

    trainer.train_step = poisoned
    with pytest.raises(TrainingDiverged, match="step 8: the loss is nan"):
        trainer.fit()
    ck = load_checkpoint(tmp_path / "last.pt", "dlrm")
    assert ck["step"] == 5
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if torch.is_tensor(v) and v.is_floating_point())
