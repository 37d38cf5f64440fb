"""Watching a run: validation where `--max-steps` ends it and every `--eval-every` steps
(without changing what is trained, to the bit), TensorBoard scalars equal to the metrics
log's numbers (once each across a resume), and a warning when an epoch scores worse."""
import json
import logging
import shutil
from dataclasses import replace

import pytest

from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from tests.test_dlrm import assert_same_checkpoint

tensorboard = pytest.importorskip("tensorboard")


def small_config(tmp_path, name, **kw):
    base = DLRMConfig(batch_size=256, eval_batch_size=2048, embedding_dim=8, dense_arch=[16], over_arch=[16],
                      device="cpu", progress=False, epochs=1, cache_ratio=0.01, log_every=2,
                      checkpoint_dir=str(tmp_path / name), metrics_out=str(tmp_path / f"{name}.jsonl"))
    return replace(base, **kw)


def records(path, event):
    return [r for r in map(json.loads, open(path)) if r["event"] == event]


def test_max_steps_ends_with_validation(small_synthetic, tmp_path, one_torch_thread):
    cfg = small_config(tmp_path, "a", max_steps=5)
    summary = DLRMTrainer(cfg, small_synthetic).fit()
    evals = records(cfg.metrics_out, "eval")
    assert [(r["step"], r["partial"]) for r in evals] == [(5, True)]
    assert 0.0 < evals[0]["auc"] < 1.0 and evals[0]["samples"] > 0
    assert summary["stopped_early"] and summary["val_auc"] == evals[0]["auc"]
    # CPU time over the training windows, per sample of this process's 5 steps
    assert 0 < summary["train_cpu_seconds"]
    assert summary["cpu_seconds_per_sample"] == pytest.approx(summary["train_cpu_seconds"] / (5 * 256))


def test_eval_every_validates_without_changing_training(small_synthetic, tmp_path, one_torch_thread):
    plain = small_config(tmp_path, "plain", max_steps=9)
    watched = replace(small_config(tmp_path, "watched", max_steps=9), eval_every=4)
    DLRMTrainer(plain, small_synthetic).fit()
    DLRMTrainer(watched, small_synthetic).fit()
    assert [r["step"] for r in records(watched.metrics_out, "eval")] == [4, 8, 9]
    assert [r["step"] for r in records(plain.metrics_out, "eval")] == [9]
    # what was trained is the same to the bit, and so are the losses logged
    assert_same_checkpoint(tmp_path / "plain" / "dlrm-last.pt", tmp_path / "watched" / "dlrm-last.pt")
    losses = lambda cfg: [r["loss"] for r in records(cfg.metrics_out, "step")]  # noqa: E731
    assert losses(plain) == losses(watched)


def test_eval_every_on_the_epochs_last_step_is_not_made_twice(small_synthetic, tmp_path, one_torch_thread):
    """An evaluation at the step that ends an epoch is made once: the epoch's record takes
    its scores."""
    steps = len(DLRMTrainer(small_config(tmp_path, "count", max_steps=1), small_synthetic)._batches("train", 256))
    cfg = replace(small_config(tmp_path, "b"), eval_every=steps)
    trainer = DLRMTrainer(cfg, small_synthetic)
    calls, evaluate = [], trainer.evaluate
    trainer.evaluate = lambda *a: calls.append(trainer.step) or evaluate(*a)
    trainer.fit()
    assert calls == [steps]
    [at_step] = records(cfg.metrics_out, "eval")
    [epoch] = records(cfg.metrics_out, "epoch")
    assert epoch["step"] == at_step["step"] == steps and epoch["auc"] == at_step["auc"]
    assert [r.get("partial") for r in trainer.history] == [None]


def scalars_of(directory, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def test_tensorboard_holds_the_metrics_logs_numbers_once_across_a_resume(small_synthetic, tmp_path,
                                                                         one_torch_thread):
    """A run killed after logging past its last checkpoint (step 4: the run went on to step
    6) and resumed to step 10: TensorBoard and the JSON lines show each step once, the resumed
    run's values."""
    board = tmp_path / "board"
    first = replace(small_config(tmp_path, "tb", max_steps=4), tensorboard=str(board))
    DLRMTrainer(first, small_synthetic).fit()
    shutil.copytree(first.checkpoint_dir, tmp_path / "at4")
    DLRMTrainer(replace(first, max_steps=6, resume=True), small_synthetic).fit()
    shutil.rmtree(first.checkpoint_dir)  # killed: the checkpoint of step 6 never written
    shutil.copytree(tmp_path / "at4", first.checkpoint_dir)
    DLRMTrainer(replace(first, max_steps=10, resume=True), small_synthetic).fit()
    log = records(first.metrics_out, "step")
    assert [r["step"] for r in log] == [2, 4, 6, 8, 10]  # the killed run's step 6 gave way to the resumed run's
    loss = scalars_of(board, "train/loss")
    assert [s for s, _ in loss] == [2, 4, 6, 8, 10]
    assert [v for _, v in loss] == pytest.approx([r["loss"] for r in log], rel=1e-6)  # float32
    assert [s for s, _ in scalars_of(board, "train/hit_rate")] == [2, 4, 6, 8, 10]
    aucs, evals = scalars_of(board, "epoch/auc"), records(first.metrics_out, "eval")
    # the killed run's validation at step 6 is gone with it; the resumed run's at step 10 shown
    assert [r["step"] for r in evals] == [4, 10] and [s for s, _ in aucs] == [4, 10]
    assert [v for _, v in aucs] == pytest.approx([evals[0]["auc"], evals[1]["auc"]], rel=1e-6)


def test_tensorboard_directory_that_cannot_be_made_is_one_line(small_synthetic, tmp_path):
    from embcache.errors import UserFacingError

    (tmp_path / "file").write_text("not a directory")
    cfg = replace(small_config(tmp_path, "bad", max_steps=1), tensorboard=str(tmp_path / "file" / "board"))
    with pytest.raises(UserFacingError, match="--tensorboard .*cannot create the directory"):
        DLRMTrainer(cfg, small_synthetic).fit()


@pytest.mark.parametrize("aucs,said", [((0.76, 0.71), "auc 0.7100 after epoch 2 is below the best of the run, "
                                                    "0.7600 after epoch 1"),
                                       ((0.71, 0.76), None), ((0.76, 0.76), None),
                                       ((0.76, 0.70, 0.72), "auc 0.7200 after epoch 3 is below the best of the run, "
                                                          "0.7600 after epoch 1")])
def test_a_run_ending_below_its_best_is_said_once(aucs, said):
    from embcache.train.best_score import below_best

    history = [{"epoch": e, "auc": auc} for e, auc in enumerate(aucs, 1)]
    assert below_best(history, DLRMTrainer.headline) == (f"{said}: {DLRMTrainer.headline[2]}" if said else "")
    # --max-steps ends in an epoch: its scores are the last model's, named by step
    partial = [*history[:1], {"epoch": 2, "step": 1234, "partial": True, "auc": 0.70}]
    assert below_best(partial, DLRMTrainer.headline).startswith(
        f"auc 0.7000 at step 1,234 (epoch 2 in progress) is below the best of the run, {aucs[0]:.4f} after epoch 1")


def test_tensorboard_from_the_cf_and_face_commands(tmp_path, capsys, one_torch_thread):
    """The other two trainers, through their commands: cf's x axis is the epoch, face's the
    step; nested verification results are flattened."""
    from embcache.cli import main
    from embcache.cf.data.synthetic import power_law_interactions

    data = power_law_interactions(num_users=200, num_items=300, interactions=5000, communities=4, seed=1)
    for name, indptr, indices in (("train.txt", data.train_indptr, data.train_indices),
                                  ("test.txt", data.test_indptr, data.test_indices)):
        (tmp_path / name).write_text("\n".join(" ".join(map(str, [u, *indices[indptr[u]:indptr[u + 1]]]))
                                               for u in range(data.num_users)) + "\n")
    cf_log, face_log = tmp_path / "cf.jsonl", tmp_path / "face.jsonl"
    assert main(["cf", "train", "--data", str(tmp_path), "--epochs", "2", "--negatives", "4", "--threads", "1",
                 "--no-progress", "--metrics-out", str(cf_log), "--tensorboard", str(tmp_path / "cf")]) == 0
    assert main(["face", "train", "--num-classes", "40", "--batch-size", "16", "--epochs", "1", "--max-steps", "5",
                 "--eval-classes", "20", "--threads", "1", "--no-progress",
                 "--metrics-out", str(face_log), "--tensorboard", str(tmp_path / "face")]) == 0
    capsys.readouterr()
    recall = scalars_of(tmp_path / "cf", "epoch/recall@20")
    assert recall == [(r["epoch"], pytest.approx(r["recall@20"], rel=1e-6)) for r in records(cf_log, "epoch")]
    assert [s for s, _ in recall] == [1, 2]
    [face_eval] = records(face_log, "eval")
    accuracy = scalars_of(tmp_path / "face", "epoch/synthetic/accuracy")
    assert accuracy == [(5, pytest.approx(face_eval["synthetic"]["accuracy"], rel=1e-6))]
    assert [s for s, _ in scalars_of(tmp_path / "face", "train/loss")] == [r["step"] for r in records(face_log, "step")]
