"""`embcache cf` and `embcache bench cf`: metrics log, save/load round trip, one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from embcache.cli import main
from embcache.cf.data.embeddings_file import load
from embcache.cf.data.synthetic import power_law_interactions


@pytest.fixture(scope="module")
def lightgcn_dir(tmp_path_factory):
    """A small LightGCN-format directory (train.txt, test.txt) written from the synthetic set."""
    data = power_law_interactions(num_users=300, num_items=500, interactions=9000, communities=6, seed=2)
    return write_lightgcn(tmp_path_factory.mktemp("lightgcn"), data)


def write_lightgcn(d, data):
    """`data`'s train and test pairs as a LightGCN directory `d` (train.txt, test.txt)."""
    for name, indptr, indices in (("train.txt", data.train_indptr, data.train_indices),
                                  ("test.txt", data.test_indptr, data.test_indices)):
        lines = [" ".join(map(str, [u, *indices[indptr[u]:indptr[u + 1]]])) for u in range(data.num_users)]
        (d / name).write_text("\n".join(lines) + "\n")
    return d


def _train(args, capsys):
    rc = main(["cf", "train", "--no-progress", "--negatives", "8", "--threads", "1", *map(str, args)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_train_writes_metrics_lines_and_save_load_round_trips(lightgcn_dir, tmp_path, capsys):
    log, first = tmp_path / "m.jsonl", tmp_path / "emb.npy"
    out = _train(["--data", lightgcn_dir, "--epochs", 3, "--metrics-out", log, "--save", first], capsys)
    assert "epoch   3/3" in out and "samples/s" in out and "Recall@20" in out
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "epoch", "summary"]
    for r in records[1:4]:
        assert {"seconds", "samples_per_s", "loss", "recall@20", "ndcg@20"} <= set(r) and r["seconds"] > 0
    assert records[1]["loss"] > records[3]["loss"]
    trained = records[3]["recall@20"]
    assert trained > records[-1]["popularity"]["recall@20"]

    # load -> no training -> save again: the same rows exactly, and the same evaluation
    for second in (tmp_path / "again.npz", tmp_path / "again.parquet"):
        out = _train(["--data", lightgcn_dir, "--epochs", 0, "--load", first, "--save", second], capsys)
        assert f"Recall@20 {trained:.4f}" in out
        a, b = load(first), load(second)
        for x, y in zip(a[:3], b[:3]):
            assert x.dtype == y.dtype == np.float32 and np.array_equal(x, y)
        assert a[3] == b[3] and a[3].negatives == 8

    rc = main(["cf", "evaluate", str(tmp_path / "again.parquet"), "--data", str(lightgcn_dir)])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rc == 0 and result["recall@20"] == pytest.approx(trained, abs=1e-12)


def test_load_then_train_continues_from_the_file(lightgcn_dir, tmp_path, capsys):
    start = tmp_path / "start.npz"
    _train(["--data", lightgcn_dir, "--epochs", 1, "--save", start], capsys)
    _train(["--data", lightgcn_dir, "--epochs", 1, "--load", start, "--save", tmp_path / "next.npz",
            "--model", "simplex"], capsys)
    before, after = load(start), load(tmp_path / "next.npz")
    assert not np.array_equal(before[1], after[1])
    # settings not given come from the file: K=8 was saved, not the default
    assert after[3].negatives == 8


@pytest.mark.parametrize("args, message", [
    (["--data", "/no/such/dir"], "/no/such/dir: no such file or directory"),
    (["--data", "ml-100k", "--load", "/no/such.npy"], "/no/such.npy: no such embeddings file"),
    (["--data", "ml-100k", "--save", "out.txt", "--epochs", "0"], "embeddings are saved as"),
])
def test_bad_input_is_one_line(args, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    rc = main(["cf", "train", "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert message in err


def _refused(argv, capsys) -> str:
    """Run `embcache ...argv`, expect a one-line refusal (status 1) and return it."""
    rc = main([*map(str, argv)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("action", ["train", "evaluate"])
@pytest.mark.parametrize("args, message", [
    (["-k", "0"], "argument -k/--k: must be a positive integer, not 0"),
    (["-k", "20", "-5"], "argument -k/--k: must be a positive integer, not -5"),
    (["--test-fraction", "1.5"], "argument --test-fraction: must be in (0, 1), not 1.5"),
    (["--test-fraction", "0"], "argument --test-fraction: must be in (0, 1), not 0"),
    (["--min-rating", "-1"], "argument --min-rating: must be >= 0, not -1"),
    (["--split-seed", "x"], "argument --split-seed: 'x' is not an integer"),
    (["--synthetic-users", "0"], "argument --synthetic-users: must be a positive integer, not 0"),
    (["--threads", "0"], "argument --threads: must be a positive integer, not 0"),
])
def test_bad_numbers_are_refused_by_the_parser_naming_the_option(action, args, message, capsys):
    lead = ["cf", "train", "--no-progress"] if action == "train" else ["cf", "evaluate", "emb.npz"]
    with pytest.raises(SystemExit) as stop:
        main([*lead, *args])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"embcache cf {action}: error: {message}"


@pytest.mark.parametrize("args, message", [
    (["--epochs", "-1"], "argument --epochs: must be >= 0, not -1"),
    (["--engine", "torch", "--batch-size", "0"], "argument --batch-size: must be a positive integer, not 0"),
    (["--lr", "0"], "argument --lr: must be > 0, not 0"),
    (["--lr", "-0.1"], "argument --lr: must be > 0, not -0.1"),
    (["--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
    (["--negatives", "0"], "argument --negatives: must be a positive integer, not 0"),
    (["--dim", "0"], "argument --dim: must be a positive integer, not 0"),
    (["--history", "-3"], "argument --history: must be >= 0, not -3"),
    (["--gamma", "1.5"], "argument --gamma: must be in [0, 1], not 1.5"),
    (["--neg-weight", "-1"], "argument --neg-weight: must be >= 0, not -1"),
    (["--margin", "inf"], "argument --margin: 'inf' is not a finite number"),
    (["--tile", "-1"], "argument --tile: must be >= 0, not -1"),
    (["--refresh", "0"], "argument --refresh: must be a positive integer, not 0"),
    (["--w-sync", "0"], "argument --w-sync: must be a positive integer, not 0"),
    (["--eval-every", "0"], "argument --eval-every: must be a positive integer, not 0"),
    (["--seed", "-2"], "argument --seed: must be >= 0, not -2"),
])
def test_bad_training_numbers_are_refused_by_the_parser(args, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["cf", "train", "--no-progress", *args])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"embcache cf train: error: {message}"


def test_engine_options_refuse_what_the_kernels_cannot_run():
    # the library side of the same checks: no ZeroDivisionError deep in an epoch
    from cpu_kernels.heat import HeatOptions
    from cpu_kernels.torch_reference import TorchOptions

    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TorchOptions(batch_size=0)
    for bad, match in (({"lr": 0.0}, "lr must be > 0"), ({"refresh": 0}, "refresh must be >= 1"),
                       ({"tile": -1}, "tile must be >= 0"), ({"w_sync": 0}, "w_sync must be >= 1")):
        with pytest.raises(ValueError, match=match):
            HeatOptions(**bad)
    with pytest.raises(ValueError, match="lr must be > 0"):
        TorchOptions(lr=0.0)


def _ratings(path, users_items, rating=3):
    path.write_text("".join(f"{u}\t{i}\t{rating}\t{881250949 + k}\n" for k, (u, i) in enumerate(users_items)))
    return path


def test_min_rating_that_keeps_nothing_is_one_line(tmp_path, capsys):
    path = _ratings(tmp_path / "u.data", [(u, i) for u in range(1, 20) for i in range(1, 6)], rating=3)
    (tmp_path / "emb.npz").write_bytes(b"x")  # a file there: `cf evaluate` refuses a missing one before the data
    for action in (["train"], ["evaluate", tmp_path / "emb.npz"]):
        err = _refused(["cf", *action, "--data", path, "--min-rating", 4], capsys)
        assert f"{path}: no rating is >= 4 (--min-rating) among 95" in err


def test_a_large_test_fraction_still_leaves_every_user_a_training_pair(tmp_path, capsys):
    # every user has two ratings; --test-fraction 0.9 rounded both into test, and the run was refused with
    # "no training interactions after the split": now each user keeps one in train (tests/test_cf_walkthrough.py)
    path = _ratings(tmp_path / "u.data", [(u, i) for u in range(1, 20) for i in (1, 2)])
    out = _train(["--data", path, "--test-fraction", 0.9, "--epochs", 1], capsys)
    assert "19 users, 2 items, 19 train / 19 test interactions" in out


def test_an_empty_test_split_warns_and_reports_null_metrics(lightgcn_dir, tmp_path, capsys):
    d = tmp_path / "notest"
    d.mkdir()
    (d / "train.txt").write_text((lightgcn_dir / "train.txt").read_text())
    (d / "test.txt").write_text("")
    log, emb = tmp_path / "m.jsonl", tmp_path / "emb.npz"
    rc = main(["cf", "train", "--no-progress", "--negatives", "4", "--threads", "1", "--data", str(d),
               "--epochs", "1", "--metrics-out", str(log), "--save", str(emb)])
    out = capsys.readouterr()
    assert rc == 0 and "warning:" in out.err and "test split is empty" in out.err and "null" in out.err
    assert "Recall/NDCG not computed (no test users)" in out.out and "Recall@20 0.0000" not in out.out
    summary = json.loads(log.read_text().splitlines()[-1])
    assert summary["recall@20"] is None and summary["ndcg@20"] is None
    assert summary["popularity"]["recall@20"] is None and summary["popularity"]["users"] == 0
    rc = main(["cf", "evaluate", str(emb), "--data", str(d)])
    out = capsys.readouterr()
    result = json.loads(out.out.splitlines()[-1])
    assert rc == 0 and "test split is empty" in out.err and result["recall@20"] is None


def test_a_huge_test_id_is_a_bad_line_not_a_terabyte_table(lightgcn_dir, tmp_path, capsys):
    d = tmp_path / "huge"
    d.mkdir()
    (d / "train.txt").write_text((lightgcn_dir / "train.txt").read_text())
    lines = (lightgcn_dir / "test.txt").read_text().splitlines()
    lines[3] += " 10000000000"
    (d / "test.txt").write_text("\n".join(lines) + "\n")
    err = _refused(["cf", "train", "--no-progress", "--data", d], capsys)
    assert f"{d / 'test.txt'}:4: item id 10000000000 is far beyond the" in err
    rc = main(["cf", "train", "--no-progress", "--data", str(d), "--skip-bad-lines", "--epochs", "1",
               "--negatives", "4", "--threads", "1"])
    captured = capsys.readouterr()
    assert rc == 0 and "skipped 1 malformed" in captured.err and "500 items" in captured.out


def test_running_out_of_memory_is_one_line(lightgcn_dir, monkeypatch, capsys):
    from cpu_kernels.model import CFParams

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 4.66 TiB for an array with shape (10000000001, 64)")

    monkeypatch.setattr(CFParams, "init", no_memory)
    err = _refused(["cf", "train", "--no-progress", "--data", lightgcn_dir], capsys)
    assert "out of memory for the embedding tables of 300 users and 500 items" in err


def test_malformed_lightgcn_line_is_reported_with_file_and_line(lightgcn_dir, tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    lines = (lightgcn_dir / "train.txt").read_text().splitlines()
    lines[6] = lines[6] + " -4"
    (d / "train.txt").write_text("\n".join(lines) + "\n")
    (d / "test.txt").write_text((lightgcn_dir / "test.txt").read_text())
    rc = main(["cf", "train", "--no-progress", "--data", str(d)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and f"{d / 'train.txt'}:7: negative id -4" in err
    rc = main(["cf", "train", "--no-progress", "--data", str(d), "--skip-bad-lines", "--epochs", "1",
               "--negatives", "4"])
    captured = capsys.readouterr()
    assert rc == 0 and "skipped 1 malformed" in captured.err


def test_ratings_file_as_data(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = {(int(u), int(i)) for u, i in zip(rng.integers(1, 60, 3000), rng.integers(1, 90, 3000))}
    path = tmp_path / "u.data"
    path.write_text("".join(f"{u}\t{i}\t4\t{881250949 + k}\n" for k, (u, i) in enumerate(sorted(rows))))
    out = _train(["--data", path, "--epochs", 1, "--split", "time"], capsys)
    assert "u.data: 59 users" in out and "Recall@20" in out


def test_bench_cf_smoke(tmp_path, capsys):
    rc = main(["bench", "cf", "--datasets", "synthetic", "--synthetic-users", "300", "--synthetic-items", "500",
               "--synthetic-interactions", "9000", "--synthetic-negatives", "8", "16", "--synthetic-epochs", "2",
               "--torch-max-pairs", "100000", "--copy-mib", "16", "--out-dir", str(tmp_path), "--no-plot"])
    out = capsys.readouterr().out
    assert rc == 0 and "x torch" in out
    res = json.loads((tmp_path / "cf.json").read_text())
    assert res["hardware"]["cpu_count"] >= 1 and set(res["copy_bandwidth_bytes_per_s"]) == {str(t) for t in
                                                                                            res["threads"]}
    assert [c["negatives"] for c in res["cases"]] == [8, 16]
    for case in res["cases"]:
        rows = case["rows"]
        assert [(r["variant"], r["threads"]) for r in rows] == [(v, t) for t in res["threads"] for v in
                                                               ("torch", "heat, no tiling", "heat, tiling")]
        for r in rows:
            assert r["epoch_s"] > 0 and 0 < r["recall_at_20"] < 1 and len(r["epoch_s_all"]) == 2
            if r["variant"] != "torch":
                assert r["speedup_vs_torch"] > 1 and r["recall_vs_torch"] > 0.5
                assert r["bytes_per_epoch"]["bytes"] > case["train_pairs"] * case["negatives"] * 4 * 64
                assert r["touched_rate_vs_copy_bandwidth"] > 0 and r["dram_model_fraction_of_copy_bandwidth"] > 0
                assert r["dram_model_bytes_per_epoch"]["bytes"] <= r["bytes_per_epoch"]["bytes"]
    assert res["topk_seconds"]["synthetic"]["faster"] in ("torch", "faiss")


def test_bench_defaults_compare_accuracy_on_ml100k_at_k1000():
    from embcache.cf.bench import build_parser

    args = build_parser("bench cf").parse_args([])
    assert args.ml_negatives == [64, 1000] and len(args.ml_epochs) == 2


def test_bench_ml100k_runs_full_torch_epochs_per_k_with_a_real_tile(tmp_path, capsys):
    rc = main(["bench", "cf", "--datasets", "ml-100k", "--ml-negatives", "4", "8", "--ml-epochs", "1", "2",
               "--threads", "1", "--copy-mib", "16", "--out-dir", str(tmp_path), "--no-plot"])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "cf.json").read_text())
    assert [(c["negatives"], c["epochs"]) for c in res["cases"]] == [(4, 1), (8, 2)]
    for case in res["cases"]:
        rows = {r["variant"]: r for r in case["rows"]}
        # torch's accuracy is measured (full epochs), not projected
        assert "timed_on" not in rows["torch"] and 0 < rows["torch"]["recall_at_20"] < 1
        assert len(rows["torch"]["epoch_s_all"]) == case["epochs"]
        # the tile is a strict part of ml-100k's 1,682 items, so tiling is really exercised
        assert rows["heat, no tiling"]["tile"] == 0 and 1 < rows["heat, tiling"]["tile"] < case["items"]
    assert main(["bench", "cf", "--ml-negatives", "4", "8", "--ml-epochs", "1", "2", "3", "--no-plot",
                 "--out-dir", str(tmp_path)]) == 2


def test_dram_model_keeps_the_tiled_negative_reads_out():
    """Tiled: the K negative reads come from the thread's tile (one load per refresh); untiled:
    the model is every access, the same as the bytes touched."""
    from cpu_kernels.model import CFConfig, CFParams
    from embcache.cf.bench import epoch_bytes

    data = power_law_interactions(num_users=300, num_items=500, interactions=9000, communities=6, seed=2)
    params = CFParams.init(CFConfig(negatives=1000, dim=8), data.num_users, data.num_items, data.train_indptr,
                           data.train_indices)
    users, _ = data.train_pairs()
    n, row = len(users), 4 * 8
    untiled = epoch_bytes(params, users, active_negatives=50 * n, tile=0)
    assert untiled["model"]["bytes"] == untiled["bytes"]
    assert untiled["parts"]["negative_reads"] == n * 1000 * row
    tiled = epoch_bytes(params, users, active_negatives=50 * n, tile=100, refresh=512, threads=2)
    loads = (-(-n // 512) + 2) * 100 * row
    assert tiled["bytes"] == untiled["bytes"]  # the same accesses are touched
    assert tiled["model"]["parts"]["tile_loads"] == loads and "negative_reads" not in tiled["model"]["parts"]
    assert tiled["model"]["parts"]["tile_writebacks"] == min(50 * n * row, loads)
    assert tiled["model"]["bytes"] < tiled["bytes"] / 10


def test_bench_times_torch_on_a_subset_when_epochs_are_too_long():
    from cpu_kernels.model import CFConfig
    from embcache.cf.bench import run_variant

    data = power_law_interactions(num_users=300, num_items=500, interactions=9000, communities=6, seed=2)
    row = run_variant("torch", data, CFConfig(negatives=8), threads=1, epochs=3, torch_max_pairs=2000)
    assert row["subset_pairs"] == 2000 and "recall_at_20" not in row and "subset" in row["timed_on"]
    assert row["epoch_s"] == pytest.approx(data.num_train / row["samples_per_s"])


@pytest.mark.parametrize("engine", ["heat", "torch"])
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(engine, lightgcn_dir, tmp_path, capsys):
    common = ["--data", lightgcn_dir, "--engine", engine, "--eval-every", 2]
    _train([*common, "--epochs", 3, "--checkpoint-dir", tmp_path / "whole", "--save", tmp_path / "whole.npz"],
           capsys)
    _train([*common, "--epochs", 1, "--checkpoint-dir", tmp_path / "cut"], capsys)
    log = tmp_path / "m.jsonl"
    out = _train([*common, "--epochs", 3, "--checkpoint-dir", tmp_path / "cut", "--resume",
                  "--save", tmp_path / "cut.npz", "--metrics-out", log], capsys)
    assert f"resumed from {tmp_path / 'cut' / 'cf-last.pt'} after epoch 1" in out
    assert [json.loads(line).get("epoch") for line in log.read_text().splitlines()] == [None, 2, 3, None]
    a, b = load(tmp_path / "whole.npz"), load(tmp_path / "cut.npz")
    for x, y in zip(a[:3], b[:3]):
        assert np.array_equal(x, y)
    # the checkpoint after the last epoch equals the run's final embeddings
    ck = load_cf_checkpoint(tmp_path / "cut" / "cf-last.pt")
    assert ck["epoch"] == 3 and np.array_equal(ck["I"], b[1])


def test_resuming_a_finished_run_says_there_is_nothing_to_train(lightgcn_dir, tmp_path, capsys):
    _train(["--data", lightgcn_dir, "--epochs", 1, "--checkpoint-dir", tmp_path], capsys)
    out = _train(["--data", lightgcn_dir, "--epochs", 1, "--checkpoint-dir", tmp_path, "--resume"], capsys)
    assert "the checkpoint has 1 epoch(s) already: nothing to train (raise --epochs to go on)" in out
    assert "epoch   1/1" not in out  # no epoch was trained again


def load_cf_checkpoint(path):
    """A cf checkpoint as a dict."""
    from embcache.checkpoint import load_checkpoint
    return load_checkpoint(path, "cf")


def test_resume_refuses_a_checkpoint_of_other_settings_or_a_damaged_one(lightgcn_dir, tmp_path, capsys):
    ck = tmp_path / "ck"
    _train(["--data", lightgcn_dir, "--epochs", 1, "--checkpoint-dir", ck], capsys)

    def refused(*args):
        rc = main(["cf", "train", "--no-progress", "--data", str(lightgcn_dir), "--epochs", "2",
                   "--checkpoint-dir", str(ck), "--resume", *map(str, args)])
        err = capsys.readouterr().err.strip()
        assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        return err

    assert "resume with --threads 1" in refused("--threads", 2)
    assert "cannot resume with other settings: --margin 0.5 in the checkpoint, 0.3 now" in refused(
        "--threads", 1, "--margin", 0.3)
    assert "--engine 'heat' in the checkpoint, 'torch' now" in refused("--threads", 1, "--engine", "torch")
    assert "--lr 0.1 in the checkpoint, 0.5 now" in refused("--threads", 1, "--lr", 0.5)
    assert "other data" in refused("--threads", 1, "--data", "synthetic", "--synthetic-users", 50,
                                   "--synthetic-items", 60, "--synthetic-interactions", 700)
    assert "no cf checkpoint" in refused("--threads", 1, "--checkpoint-dir", tmp_path / "empty")
    path = ck / "cf-last.pt"
    path.write_bytes(path.read_bytes()[:200])
    assert f"{path}: corrupt or truncated checkpoint" in refused("--threads", 1)
    rc = main(["cf", "train", "--resume"])
    assert rc == 1 and "--resume needs --checkpoint-dir" in capsys.readouterr().err


def test_a_killed_run_resumes_from_its_last_epoch(tmp_path):
    """SIGKILL mid-run, resume: the same embeddings as a run never stopped (1 thread)."""
    import signal
    import subprocess
    import sys
    import time

    data = ["--data", "synthetic", "--synthetic-users", "3000", "--synthetic-items", "4000",
            "--synthetic-interactions", "100000", "--negatives", "16", "--threads", "1", "--no-progress",
            "--eval-every", "1000"]

    def cli(*args):
        return subprocess.Popen([sys.executable, "-m", "embcache", "cf", "train", *data, *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    total = 8
    whole = cli("--epochs", total, "--save", tmp_path / "whole.npz")
    victim = cli("--epochs", 1000, "--checkpoint-dir", tmp_path / "ck")
    path = tmp_path / "ck" / "cf-last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and not (path.exists() and load_cf_checkpoint(path)["epoch"] >= 2):
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    killed_at = load_cf_checkpoint(path)["epoch"]
    assert 2 <= killed_at < total, killed_at
    resumed = cli("--epochs", total, "--checkpoint-dir", tmp_path / "ck", "--resume", "--save", tmp_path / "cut.npz")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"after epoch {killed_at}" in out
    assert whole.wait(timeout=300) == 0
    a, b = load(tmp_path / "whole.npz"), load(tmp_path / "cut.npz")
    for x, y in zip(a[:3], b[:3]):
        assert np.array_equal(x, y)


def test_embeddings_with_nan_or_a_damaged_file_are_refused_in_one_line(lightgcn_dir, tmp_path, capsys):
    from embcache.integrity import save_npz

    good = tmp_path / "good.npz"
    _train(["--data", lightgcn_dir, "--epochs", 1, "--save", good], capsys)
    with np.load(good) as z:
        arrays = dict(z)
    arrays["I"][7, 3] = np.nan  # written whole (sealed): the NaN check is what refuses it
    save_npz(tmp_path / "nan.npz", arrays)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 broken")
    for path, message in ((tmp_path / "nan.npz", "1 row(s) hold NaN or infinity (first: item 7)"),
                          (tmp_path / "junk.npz", "corrupt or truncated embeddings file"),
                          (tmp_path / "junk.parquet", "not a readable embeddings file")):
        for cmd in (["cf", "evaluate", str(path)], ["cf", "train", "--load", str(path)]):
            rc = main([*cmd, "--data", str(lightgcn_dir)])
            err = capsys.readouterr().err.strip()
            assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert f"{path}: {message}" in err


def test_a_diverged_epoch_stops_the_run_before_it_is_kept(tmp_path):
    from cpu_kernels.model import CFConfig, CFParams
    from embcache.errors import TrainingDiverged
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    data = power_law_interactions(num_users=100, num_items=150, interactions=2000, communities=4, seed=1)
    params = CFParams.init(CFConfig(negatives=4), data.num_users, data.num_items, data.train_indptr,
                           data.train_indices)
    params.U[:] = np.nan
    cfg = CFTrainConfig(epochs=2, negatives=4, threads=1, progress=False, checkpoint_dir=str(tmp_path),
                        metrics_out=str(tmp_path / "m.jsonl"))
    trainer = CFTrainer(cfg, data, params)
    with pytest.raises(TrainingDiverged, match="epoch 1: the loss is nan"):
        trainer.fit()
    assert trainer.history == [] and not (tmp_path / "cf-last.pt").exists()
    events = [json.loads(line)["event"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert events == ["start", "diverged"]


def test_settings_that_run_but_are_surely_not_meant_warn_once(caplog, capsys):
    """`--negatives` above the number of items, and a torch batch larger than the training
    split, say so in one line each; `--tile 0` is untiled, as --help says."""
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    data = power_law_interactions(num_users=40, num_items=60, interactions=400, communities=2, seed=1)
    with caplog.at_level("WARNING", logger="embcache"):
        CFTrainer(CFTrainConfig(epochs=1, negatives=100, threads=1, progress=False), data).fit()
        CFTrainer(CFTrainConfig(epochs=1, engine="torch", batch_size=100_000, negatives=8, threads=1, progress=False),
                  data).fit()
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert messages == ["--negatives 100 is more than the 60 items: each pair's negatives repeat items (they are "
                        "drawn with replacement)",
                        f"--batch-size 100,000 is larger than the training split ({data.num_train:,} pairs): "
                        "an epoch is one step"]
    with pytest.raises(SystemExit):
        main(["cf", "train", "--help"])
    assert "0: untiled" in " ".join(capsys.readouterr().out.split())


def test_evaluate_reads_a_checkpoint_as_well_as_saved_embeddings(lightgcn_dir, tmp_path, capsys):
    """`cf evaluate runs/cf/cf-last.pt` (or the directory) was refused: only .npy/.npz/.parquet."""
    ck = tmp_path / "ck"
    _train(["--data", lightgcn_dir, "--epochs", 1, "--checkpoint-dir", ck, "--save", tmp_path / "emb.npz"], capsys)
    results = []
    for what in (tmp_path / "emb.npz", ck / "cf-last.pt", ck):
        assert main(["cf", "evaluate", str(what), "--data", str(lightgcn_dir)]) == 0
        results.append(json.loads(capsys.readouterr().out.splitlines()[-1]))
    assert results[0] == results[1] == results[2] and results[0]["recall@20"] > 0
    assert main(["cf", "evaluate", str(ck), "--data", "synthetic", "--synthetic-users", "50", "--synthetic-items",
                 "60", "--synthetic-interactions", "700"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{ck / 'cf-last.pt'} was trained on other data (300 users, 500 items" in err
    assert main(["cf", "evaluate", str(tmp_path / "none.pt"), "--data", str(lightgcn_dir)]) == 1
    assert "none.pt: no such checkpoint file" in capsys.readouterr().err
