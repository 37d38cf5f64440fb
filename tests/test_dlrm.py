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
from embcache.distributed.table_checkpoint import full_tables, saved_residency
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from tests.offline_data import load_or_skip


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


@pytest.mark.parametrize("optimizer,admission", [("sgd", False), ("adagrad", False), ("adagrad", True)])
def test_cached_training_equals_torchrec_tables(synthetic, optimizer, admission):
    """Same parameters after N steps, to the bit: the cache sums each row's gradient
    terms in the order torch does for torchrec's tables, so the dense part sees the same
    embeddings too."""
    cfg = small_config(max_steps=40, cache_ratio=0.01, sparse_optimizer=optimizer, admission=admission)
    cached = DLRMTrainer(cfg, synthetic)
    plain = DLRMTrainer(replace(cfg, sparse="device"), synthetic)
    cached.fit(), plain.fit()
    stats = cached.sparse.cache_stats()
    assert stats["evictions"] > 0, "the tiny cache must evict during training"
    assert (stats["bypassed_rows"] > 0) == admission  # --admission serves cold misses beside the cache
    got = torch.cat([cached.sparse.table_weight(t.name).flatten() for t in cached.sparse.embedding_bag_configs()])
    want = torch.cat([plain.sparse.embedding_bags[t.name].weight.detach().flatten()
                      for t in cached.sparse.embedding_bag_configs()])
    assert torch.equal(got, want), f"max difference {(got - want).abs().max().item()}"
    dense_a = {k: v for k, v in cached.model.state_dict().items() if not k.startswith("sparse_arch")}
    dense_b = {k: v for k, v in plain.model.state_dict().items() if not k.startswith("sparse_arch")}
    assert dense_a.keys() == dense_b.keys()
    for k in dense_a:
        assert torch.equal(dense_a[k], dense_b[k]), k
    assert cached.evaluate("val")["auc"] == plain.evaluate("val")["auc"]


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
    ckpt = killed_dir / "dlrm-last.pt"
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
    a = load_checkpoint(killed_dir / "dlrm-last.pt", "dlrm")
    b = load_checkpoint(tmp_path / "whole" / "dlrm-last.pt", "dlrm")
    assert a["step"] == b["step"] == 90
    assert_same_checkpoint(killed_dir / "dlrm-last.pt", tmp_path / "whole" / "dlrm-last.pt", residency=True)
    assert a["history"] == b["history"]


def assert_same_checkpoint(path_a, path_b, residency: bool = False, atol: float = 0.0):
    """Dense parameters and optimizer state, every table with its optimizer state and (with
    `residency`) rank 0's cache residency and statistics, equal (to `atol`)."""
    a, b = load_checkpoint(path_a, "dlrm"), load_checkpoint(path_b, "dlrm")
    same = (lambda x, y: torch.equal(x, y)) if atol == 0 else (lambda x, y: torch.allclose(x, y, rtol=0, atol=atol))
    assert a["dense_model"].keys() == b["dense_model"].keys()
    for k in a["dense_model"]:
        assert same(a["dense_model"][k], b["dense_model"][k]), k
    ta, tb = full_tables(path_a, a["tables"]), full_tables(path_b, b["tables"])
    assert ta.keys() == tb.keys()
    for name in ta:
        for k in ta[name]:
            assert same(ta[name][k], tb[name][k]), (name, k)
    assert a["tables"]["optimizer_steps"] == b["tables"]["optimizer_steps"]
    if residency:
        ra, rb = saved_residency(path_a, a["tables"], 0), saved_residency(path_b, b["tables"], 0)
        assert ra.keys() == rb.keys()
        for k in ra:
            assert torch.equal(ra[k], rb[k]), k


def test_corrupt_checkpoint_is_refused_with_one_line(synthetic, tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    (ckdir / "dlrm-last.pt").write_bytes(b"not a checkpoint at all")
    proc = _cli(["--data", str(synthetic), "--device", "cpu", "--no-progress", "--max-steps", "2",
                 "--checkpoint-dir", str(ckdir), "--resume"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "last.pt: corrupt or truncated checkpoint" in err
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0


def test_resume_without_a_checkpoint_stops_with_one_line(synthetic, tmp_path):
    """The policy of every trainer: a --resume that finds nothing to resume from stops
    (a mistyped directory must not start a fresh run that overwrites nothing it meant to)."""
    proc = _cli(["--data", str(synthetic), "--device", "cpu", "--no-progress", "--max-steps", "2",
                 "--checkpoint-dir", str(tmp_path / "empty"), "--resume"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err and err.strip().count("\n") == 0
    assert "no dlrm checkpoint (dlrm-last.pt) to resume from; leave out --resume to start afresh" in err
    assert not (tmp_path / "empty" / "dlrm-last.pt").exists()


def test_a_checkpoint_of_an_earlier_version_named_last_pt_resumes_exactly(synthetic, tmp_path):
    """Checkpoints were `last.pt` before every trainer named them `<kind>-last.pt`."""
    whole = DLRMTrainer(small_config(max_steps=8, checkpoint_dir=str(tmp_path / "w")), synthetic)
    whole.fit()
    old = DLRMTrainer(small_config(max_steps=4, checkpoint_dir=str(tmp_path / "old")), synthetic)
    old.fit()
    write_single_file_checkpoint(old, tmp_path / "old" / "last.pt")
    (tmp_path / "old" / "dlrm-last.pt").unlink()
    resumed = DLRMTrainer(small_config(max_steps=8, checkpoint_dir=str(tmp_path / "old"), resume=True), synthetic)
    assert resumed.fit()["steps"] == 8
    for t in whole.sparse.embedding_bag_configs():
        assert torch.equal(whole.sparse.table_weight(t.name), resumed.sparse.table_weight(t.name))
    assert load_checkpoint(tmp_path / "old" / "dlrm-last.pt", "dlrm")["step"] == 8


def write_single_file_checkpoint(trainer, path):
    """`trainer`'s last checkpoint as versions before the sharded format wrote it: one file
    whose "model" holds the whole model's state dict, tables and residency included."""
    from embcache.checkpoint import save_checkpoint

    ck = load_checkpoint(Path(trainer.cfg.checkpoint_dir) / "dlrm-last.pt", "dlrm")
    for k in ("tables", "dense_model", "world_size"):
        ck.pop(k)
    ck["model"] = {k.replace("embedding_bag_collection.local.", "embedding_bag_collection."): v
                   for k, v in trainer.model.state_dict().items()}
    save_checkpoint({k: v for k, v in ck.items() if k not in ("embcache_checkpoint", "kind")}, path, "dlrm")


def test_missing_data_directory_is_one_clear_line(tmp_path):
    proc = _cli(["--data", str(tmp_path / "nowhere"), "--no-progress"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "no meta.json here" in err and "Traceback" not in err


def test_movielens_100k_as_ctr_reaches_validation_auc_above_070(tmp_path):
    from embcache.data.movielens_ctr import prepare_ml100k_ctr

    load_or_skip(prepare_ml100k_ctr, tmp_path / "ml")  # the RecBole copy comes from PyPI on first use
    trainer = DLRMTrainer(small_config(batch_size=512, epochs=2, cache_ratio=0.1,
                                       sparse_optimizer="adagrad", sparse_lr=0.05), tmp_path / "ml")
    summary = trainer.fit()
    assert summary["val_auc"] > 0.70, summary


def test_a_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(synthetic, tmp_path):
    from embcache.errors import TrainingDiverged

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
    ck = load_checkpoint(tmp_path / "dlrm-last.pt", "dlrm")
    assert ck["step"] == 5
    assert all(torch.isfinite(v).all() for v in ck["dense_model"].values() if v.is_floating_point())
    tables = full_tables(tmp_path / "dlrm-last.pt", ck["tables"])
    assert all(torch.isfinite(v).all() for rows in tables.values() for v in rows.values())


def _resume_args(synthetic, ckdir, *extra):
    return ["--data", str(synthetic), "--batch-size", "64", "--embedding-dim", "8", "--dense-arch", "16",
            "--over-arch", "16", "--device", "cpu", "--no-progress", "--max-steps", "6",
            "--checkpoint-dir", str(ckdir), "--cache-ratio", "0.01", *extra]


def test_resume_with_other_settings_is_refused_in_one_line(synthetic, tmp_path):
    first = _cli(_resume_args(synthetic, tmp_path, "--max-steps", "3"))
    assert first.wait(timeout=300) == 0
    proc = _cli(_resume_args(synthetic, tmp_path, "--resume", "--lr", "0.5", "--dense-arch", "32"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.strip().count("\n") == 0
    # the flags typed, not the config's fields (sparse_lr, dense_arch)
    assert "--lr 0.05 in the checkpoint, 0.5 now" in err and "--dense-arch [16] in the checkpoint, [32] now" in err


def test_resume_on_other_data_is_refused(synthetic, tmp_path):
    from embcache.data.synthetic import generate_synthetic

    other = tmp_path / "other"
    generate_synthetic(other, rows=5_000, scale=0.001, seed=0)  # same features, other rows
    assert _cli(_resume_args(synthetic, tmp_path / "ck", "--max-steps", "3")).wait(timeout=300) == 0
    proc = _cli(_resume_args(other, tmp_path / "ck", "--resume"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "data (checkpoint trained on" in err


def test_resume_with_another_cache_ratio_continues_exactly(synthetic, tmp_path):
    """The cache's size changes which rows are resident, never a result."""
    whole = DLRMTrainer(small_config(max_steps=12, cache_ratio=0.01, checkpoint_dir=str(tmp_path / "w"),
                                     checkpoint_every=100), synthetic)
    whole.fit()
    part = DLRMTrainer(small_config(max_steps=5, cache_ratio=0.01, checkpoint_dir=str(tmp_path / "p"),
                                    checkpoint_every=100), synthetic)
    part.fit()
    resumed = DLRMTrainer(small_config(max_steps=12, cache_ratio=0.2, checkpoint_dir=str(tmp_path / "p"),
                                       resume=True, checkpoint_every=100), synthetic)
    resumed.fit()
    for t in whole.sparse.embedding_bag_configs():
        assert torch.equal(whole.sparse.table_weight(t.name), resumed.sparse.table_weight(t.name))
    dense = lambda m: {k: v for k, v in m.state_dict().items() if not k.startswith("sparse_arch")}  # noqa: E731
    for k, v in dense(whole.model).items():
        assert torch.equal(v, dense(resumed.model)[k]), k


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda:0"], "no CUDA device is available"),
    (["--device", "tpu"], "is not a device"),
])
def test_bad_device_is_one_line(synthetic, args, message):
    if torch.cuda.is_available() and "cuda" in args[1]:
        pytest.skip("this machine has CUDA")
    proc = _cli(["--data", str(synthetic), "--no-progress", "--max-steps", "1", *args])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("option, value", [("--batch-size", "0"), ("--cache-ratio", "1.5"),
                                           ("--cache-ratio", "0"), ("--synthetic-rows", "-3"),
                                           ("--lr", "nan"), ("--warmup-ratio", "2"), ("--log-every", "0")])
def test_bad_numbers_are_usage_errors(option, value):
    proc = _cli([option, value])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and option in err and "Traceback" not in err


def test_validation_lookups_are_counted_apart_from_training(synthetic):
    trainer = DLRMTrainer(small_config(max_steps=10, cache_ratio=0.01), synthetic)
    trainer.fit()
    before = trainer.sparse.cache_stats()
    result = trainer.evaluate("val")
    assert trainer.sparse.cache_stats() == before
    assert 0 < result["cache_hit_rate"] <= 1


def test_evaluate_a_checkpoint_on_the_test_split(synthetic, tmp_path):
    trainer = DLRMTrainer(small_config(max_steps=8, checkpoint_dir=str(tmp_path), checkpoint_every=8), synthetic)
    trainer.fit()
    want = trainer.evaluate("test")
    proc = subprocess.run([sys.executable, "-m", "embcache", "dlrm", "evaluate", str(tmp_path), "--split", "test",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["split"] == "test" and got["step"] == 8
    assert got["auc"] == want["auc"] and got["samples"] == want["samples"]
    missing = subprocess.run([sys.executable, "-m", "embcache", "dlrm", "evaluate", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no such checkpoint file" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("sparse", ["device", "host"])
def test_whole_table_runs_print_no_torch_warning(small_synthetic, tmp_path, sparse):
    """`--sparse device/host` train with torch's sparse Adagrad, which made torch 2.13 warn
    "Sparse invariant checks are implicitly disabled" at the first step. A process of its
    own with UserWarnings as errors (pytest.ini filters that warning for the reference
    tests, and torch warns once per process)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-m", "embcache", "dlrm", "train", "--data", str(small_synthetic),
         "--sparse", sparse, "--max-steps", "2", "--batch-size", "64", "--embedding-dim", "4", "--no-progress"],
        capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Warning" not in done.stderr


def test_a_batch_larger_than_the_training_split_warns(small_synthetic, caplog):
    """One step an epoch (AUC near chance) with no word of why: now one line."""
    rows = json.loads((Path(small_synthetic) / "meta.json").read_text())["splits"]["train"]["rows"]
    with caplog.at_level("WARNING", logger="embcache"):
        DLRMTrainer(small_config(batch_size=rows + 1, max_steps=1, cache_ratio=0.5), small_synthetic).fit()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"--batch-size {rows + 1:,} is larger than the training split ({rows:,} rows): an epoch is one step"]


def test_evaluate_on_other_data_names_the_difference_not_a_resume(small_synthetic, tmp_path, capsys):
    """`dlrm evaluate --data OTHER` said "cannot resume with other settings"."""
    from embcache.cli import main
    from embcache.data.synthetic import generate_synthetic

    other = tmp_path / "other"
    generate_synthetic(other, rows=3_000, scale=0.0005, seed=0)  # same features, other rows
    DLRMTrainer(small_config(max_steps=2, batch_size=64, cache_ratio=0.5, checkpoint_dir=str(tmp_path / "ck")),
                small_synthetic).fit()
    assert main(["dlrm", "evaluate", str(tmp_path / "ck"), "--data", str(other), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume" not in err
    assert (f"{tmp_path / 'ck' / 'dlrm-last.pt'} was trained on other data than {other} (test rows 600 in the "
            f"checkpoint's data, 300 here; train rows 6,000 in the checkpoint's data, 3,000 here; val rows 600 in "
            "the checkpoint's data, 300 here); evaluate it on its own data (leave out --data) or a copy of it") in err
