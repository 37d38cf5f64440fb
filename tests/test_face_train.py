"""Face training end to end on small synthetic tasks: DCP with a pool of 10 % of the
identities is as accurate as the full FC head trained the same steps; a stopped run resumes
bit-identically (pool, LRU state, Partial FC sampler included); the command reports bad input
in one line."""
import json
import subprocess
import sys

import pytest
import torch

from embcache.face.trainer import FaceConfig, FaceTrainer


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small(**kw):
    base = dict(num_classes=1000, batch_size=64, epochs=10, pool_ratio=0.1, progress=False, eval_pairs=6000,
                eval_classes=500)
    return FaceConfig(**{**base, **kw})


def test_dcp_with_a_tenth_of_the_classes_matches_full_fc():
    fc = FaceTrainer(small(head="fc")).fit()
    dcp_trainer = FaceTrainer(small(head="dcp"))
    dcp = dcp_trainer.fit()
    assert dcp_trainer.head.pool.num_slots == 100 and dcp["steps"] == fc["steps"]
    acc_fc, acc_dcp = fc["final"]["synthetic"]["accuracy"], dcp["final"]["synthetic"]["accuracy"]
    first = dcp_trainer.history[0]["synthetic"]["accuracy"]
    assert acc_fc > 0.85, f"full FC did not learn the task: {acc_fc:.4f}"
    assert acc_dcp > first + 0.1, "DCP did not improve over training"
    assert acc_dcp >= acc_fc - 0.02, f"DCP {acc_dcp:.4f} vs full FC {acc_fc:.4f}"
    # the pool stayed at Q while every identity passed through it
    assert dcp["pool"]["admitted"] >= 1000 and dcp_trainer.head.pool.num_resident() <= 100


@pytest.mark.parametrize("head", ["dcp", "pfc"])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, head):
    kw = dict(num_classes=120, batch_size=16, epochs=2, head=head, eval_pairs=200, eval_classes=40,
              checkpoint_every=7)
    whole = FaceTrainer(small(**kw))
    whole.fit()
    first = FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path), max_steps=11))  # stops mid-epoch 1
    assert first.fit()["stopped_early"]
    resumed = FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path), resume=True))
    summary = resumed.fit()
    assert summary["steps"] == whole.step
    a, b = whole.state(), resumed.state()
    for part in ("probe", "gallery", "head"):
        if a[part] is None:
            continue
        for k, v in a[part].items():
            if torch.is_tensor(v):
                assert torch.equal(v, b[part][k]), f"{part}.{k} differs after resume"
    if head == "dcp":
        assert torch.equal(whole.head.pool.lru.keys(), resumed.head.pool.lru.keys())
        assert torch.equal(whole.head.pool.slots.slot_to_id, resumed.head.pool.slots.slot_to_id)
    else:
        assert torch.equal(whole.head.generator.get_state(), resumed.head.generator.get_state())
    # the stopped run validated where --max-steps ended it (a record of its own); the rest agree
    assert [(r["step"], r["partial"]) for r in b["history"] if r.get("partial")] == [(11, True)]
    assert [r for r in b["history"] if not r.get("partial")] == a["history"]


def test_a_resume_with_other_settings_is_refused_in_one_line_naming_them(tmp_path):
    from embcache.errors import CheckpointError

    kw = dict(num_classes=40, batch_size=16, epochs=2, eval_pairs=100, eval_classes=20, checkpoint_dir=str(tmp_path))
    assert FaceTrainer(small(**kw, max_steps=2)).fit()["stopped_early"]
    with pytest.raises(CheckpointError, match=r"face-last\.pt: cannot resume with other settings: "
                                              r"--margin 0\.3 in the checkpoint, 0\.5 now$") as err:
        FaceTrainer(small(**kw, margin=0.5, resume=True)).fit()
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match=r"--lr 0\.1 in the checkpoint, 0\.2 now; --weight-decay 0\.0005 in "
                                              r"the checkpoint, 0\.0 now; --epochs 2 in the checkpoint, 1 now "
                                              r"\(--epochs may only be raised\)"):
        FaceTrainer(small(**{**kw, "epochs": 1}, lr=0.2, weight_decay=0.0, resume=True)).fit()
    for name, value in (("scale", 16.0), ("topk", 3), ("gallery_momentum", 0.9), ("batch_size", 8)):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(CheckpointError, match=rf"{flag} .* in the checkpoint, {value!r} now"):
            FaceTrainer(small(**{**kw, name: value}, resume=True)).fit()
    more = FaceTrainer(small(**{**kw, "epochs": 3}, resume=True)).fit()  # a run may be extended
    assert more["epochs_done"] == 3


def test_resume_keeps_the_list_of_skipped_samples(tmp_path):
    import numpy as np

    from embcache.face.data.images import encode_jpeg
    from embcache.face.data.recordio import write_recordio

    rng = np.random.default_rng(0)
    items = [(y, encode_jpeg(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))) for y in range(12) for _ in range(3)]
    items[5] = items[20] = (items[5][0], b"garbage")
    write_recordio(tmp_path / "train.rec", items)
    kw = dict(data=str(tmp_path), num_classes=0, image_size=16, backbone="cnn", batch_size=8, epochs=2)
    whole = FaceTrainer(small(**kw))
    summary = whole.fit()
    first = FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path / "ck"), max_steps=5))
    first.fit()
    assert 0 < first.source.bad.total <= whole.source.bad.total == 2  # each bad record logged once
    resumed = FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path / "ck"), resume=True))
    assert resumed.fit()["skipped_samples"] == summary["skipped_samples"] > first.dropped  # drawn again after the stop
    assert resumed.source.unreadable == whole.source.unreadable == {5, 20}
    assert resumed.source.bad.to_json() == whole.source.bad.to_json()
    skipped = whole.source.bad.to_json()
    assert list(skipped) == [str(tmp_path / "train.rec")]  # one entry for the file, by record index
    assert set(skipped[str(tmp_path / "train.rec")]["first_lines"]) == {6, 21}


def test_fewer_than_two_classes_or_pairs_is_one_line_not_a_torch_message():
    """`--num-classes 1` reached batch norm: "Expected more than 1 value per channel"."""
    with pytest.raises(ValueError, match=r"^--num-classes 1 class: a classifier needs at least 2$"):
        FaceTrainer(small(num_classes=1))
    with pytest.raises(ValueError, match=r"^the dcp head needs two identity pairs a step, and --batch-size 4: a "
                                         r"quarter of it are pairs; 8 or more gives two \(or use --head fc\)$"):
        FaceTrainer(small(num_classes=40, batch_size=4))
    out = run_cli("train", "--num-classes", "1")
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].endswith(
        "error: argument --num-classes: must be >= 2, not 1")


def test_images_with_the_cnn_backbone_train_one_epoch():
    t = FaceTrainer(small(num_classes=40, batch_size=16, epochs=1, image_size=16, backbone="cnn", eval_pairs=100,
                          eval_classes=20))
    s = t.fit()
    assert s["steps"] == 10 and 0.0 <= s["final"]["synthetic"]["accuracy"] <= 1.0


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "embcache.cli", "face", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_trains_and_reports_bad_input_in_one_line(tmp_path):
    out = run_cli("train", "--num-classes", "64", "--batch-size", "16", "--epochs", "1", "--eval-classes", "30",
                  "--checkpoint-dir", str(tmp_path), "--metrics-out", str(tmp_path / "m.jsonl"), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "verification" in out.stdout and (tmp_path / "face-last.pt").is_file()
    events = [json.loads(line)["event"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert events[-2:] == ["epoch", "summary"]

    (tmp_path / "face-last.pt").write_bytes((tmp_path / "face-last.pt").read_bytes()[:100])
    out = run_cli("train", "--num-classes", "64", "--batch-size", "16", "--checkpoint-dir", str(tmp_path), "--resume")
    assert out.returncode == 1 and "corrupt or truncated checkpoint" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1

    out = run_cli("train", "--data", str(tmp_path / "nowhere"))
    assert out.returncode == 1 and "nowhere" in out.stderr and "Traceback" not in out.stderr

    # a pool smaller than a step's identities is raised to hold them, and the data line says so
    out = run_cli("train", "--num-classes", "1000", "--pool-ratio", "0.001", "--batch-size", "64", "--max-steps", "2",
                  "--eval-classes", "30", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "pool of 16 slots, raised from 1 (--pool-ratio 0.001) to hold the 16 identities a step brings" in out.stdout


def test_bench_face_writes_rows_and_dcp_cost_follows_the_pool_not_the_classes(tmp_path):
    from embcache.face.bench_cli import build_parser

    args = build_parser("bench face").parse_args(["--classes", "10000", "20000", "--repeats", "1",
                                                   "--accuracy-classes", "0", "--out-dir", str(tmp_path)])
    assert args.func(args) == 0
    result = json.loads((tmp_path / "face.json").read_text())
    rows = {(r["head"], r["classes"]): r for r in result["rows"]}
    assert "loadavg_before" in result and (tmp_path / "face.png").is_file()
    # full FC's state doubles with the classes; a pool of fixed Q does not grow at all
    assert rows[("fc", 20000)]["state_bytes"] == 2 * rows[("fc", 10000)]["state_bytes"]
    fixed = [r for (h, c), r in rows.items() if h.startswith("dcp Q=")]
    assert fixed[0]["slots"] == fixed[1]["slots"] == 10000
    assert fixed[0]["state_bytes"] == fixed[1]["state_bytes"]
    # activations differ only by how many probes happen to be in the pool
    assert abs(fixed[0]["head_peak_bytes"] / fixed[1]["head_peak_bytes"] - 1) < 0.05
    assert rows[("dcp 1%", 20000)]["head_peak_bytes"] < rows[("fc", 20000)]["head_peak_bytes"] / 10


def test_recordio_training_with_verification_bin_and_evaluate_command(tmp_path, capsys):
    import numpy as np

    from embcache.face.data.images import encode_jpeg
    from embcache.face.data.recordio import write_recordio
    from embcache.face.data.verification import write_verification_bin
    from embcache.face.cli import build_parser

    rng = np.random.default_rng(0)
    jpeg = lambda: encode_jpeg(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
    items = [(y, jpeg()) for y in range(12) for _ in range(3)]
    items[5] = (1, b"garbage")  # one unreadable image: skipped and counted, not fatal
    write_recordio(tmp_path / "train.rec", items)
    write_verification_bin(tmp_path / "lfw.bin", [jpeg() for _ in range(40)], [i % 2 == 0 for i in range(20)])
    ck = tmp_path / "ck"
    args = build_parser("face").parse_args(
        ["train", "--data", str(tmp_path), "--image-size", "16", "--backbone", "cnn", "--batch-size", "8",
         "--epochs", "1", "--val", str(tmp_path / "lfw.bin"), "--checkpoint-dir", str(ck), "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "lfw verification" in out.out and "head" in out.out
    args = build_parser("face").parse_args(["evaluate", str(ck / "face-last.pt")])
    assert args.func(args) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= metrics["lfw"]["accuracy"] <= 1.0 and metrics["lfw"]["pairs"] == 20


def test_a_nan_loss_stops_the_run_before_the_next_checkpoint(tmp_path):
    from embcache.checkpoint import load_checkpoint
    from embcache.errors import TrainingDiverged

    trainer = FaceTrainer(small(head="dcp", epochs=1, checkpoint_dir=str(tmp_path), checkpoint_every=4))
    step = trainer.train_step

    def poisoned(batch):
        if trainer.step == 5:
            with torch.no_grad():
                next(trainer.probe.parameters()).fill_(float("nan"))
        return step(batch)

    trainer.train_step = poisoned
    with pytest.raises(TrainingDiverged, match="step 6: the loss is nan"):
        trainer.fit()
    assert load_checkpoint(tmp_path / "face-last.pt", "face")["step"] == 4
