"""What a user in their second hour of `embcache face` runs into: --val files checked before
any training, `face verify` given a directory, a vector checkpoint asked to embed images,
and per-rank numbers that say they are per rank."""
import numpy as np
import pytest

from embcache.cli import main
from embcache.face.data.images import encode_jpeg
from embcache.face.data.verification import write_verification_bin

SYNTHETIC_IMAGES = ["face", "train", "--num-classes", "40", "--eval-classes", "20", "--image-size", "16",
                    "--backbone", "cnn", "--batch-size", "16", "--epochs", "1", "--no-progress"]


def _face(identity: int, shot: int, size: int = 16) -> np.ndarray:
    """A drawn face: the identity's own colour field, a little changed from shot to shot."""
    base = np.random.default_rng((identity, 0)).integers(0, 256, (size, size, 3))
    noise = np.random.default_rng((identity, shot + 1)).integers(-20, 21, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _bin(path, pairs: int = 30):
    """A verification file of `pairs` pairs, every other one genuine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    images, same = [], []
    for i in range(pairs):
        a = i % 5
        b = a if i % 2 == 0 else (a + 1) % 5
        images += [encode_jpeg(_face(a, 10 + i)), encode_jpeg(_face(b, 40 + i))]
        same.append(a == b)
    return write_verification_bin(path, images, same)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    for who in range(6):
        (root / "data" / f"p{who}").mkdir(parents=True)
        for shot in range(3):
            (root / "data" / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    return root


def test_synthetic_images_train_and_evaluate_a_val_file(tmp_path, capsys):
    """Synthetic identities and a --val file: the file is scored beside the held-out
    identities (this was a TypeError traceback after the first epoch)."""
    val = _bin(tmp_path / "mine.bin", 30)
    assert main(SYNTHETIC_IMAGES + ["--val", str(val)]) == 0
    out = capsys.readouterr().out
    assert "epoch 1 | synthetic: acc" in out and "| mine: acc" in out
    assert "mine verification" in out


@pytest.mark.parametrize("case", ["missing", "small", "vectors"])
def test_a_val_file_that_cannot_be_scored_stops_the_run_before_training(tmp_path, capsys, monkeypatch, case):
    """A --val file that is missing, holds fewer than the 20 pairs 10-fold verification needs,
    or holds images for a net that embeds vectors is one line naming it, before any step is
    trained (it was found after the first epoch, whose work was lost: no checkpoint)."""
    val = tmp_path / "v.bin"
    args = list(SYNTHETIC_IMAGES)
    if case == "small":
        _bin(val, 6)
    elif case == "vectors":
        _bin(val, 30)
        args = ["face", "train", "--num-classes", "40", "--eval-classes", "20", "--epochs", "1", "--no-progress"]
    from embcache.face.trainer import FaceTrainer

    steps, step = [], FaceTrainer.train_step
    monkeypatch.setattr(FaceTrainer, "train_step", lambda self, batch: steps.append(1) or step(self, batch))
    assert main(args + ["--val", str(val)]) != 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and str(val) in err[0], captured.err
    want = {"missing": "no such verification file", "small": "6 pairs, fewer than the 20",
            "vectors": "--image-size"}[case]
    assert want in err[0]
    assert steps == [] and "epoch 1" not in captured.out


def test_evaluate_refuses_a_val_file_too_small_in_one_line(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(SYNTHETIC_IMAGES + ["--checkpoint-dir", str(ck)]) == 0
    capsys.readouterr()
    val = _bin(tmp_path / "tiny.bin", 6)
    assert main(["face", "evaluate", str(ck), "--val", str(val)]) != 0
    err = capsys.readouterr().err
    assert f"{val}: 6 pairs, fewer than the 20" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def trained_folder(folder):
    ck = folder / "ck"
    assert main(["face", "train", "--data", str(folder / "data"), "--image-size", "16", "--backbone", "cnn",
                 "--head", "fc", "--batch-size", "8", "--epochs", "1", "--no-progress", "--checkpoint-dir",
                 str(ck)]) == 0
    return folder, ck


def test_verify_given_a_directory_is_one_line(trained_folder, capsys):
    """`face verify CK a.jpg DIR` was a ValueError traceback (the directory's images made more
    than two)."""
    root, ck = trained_folder
    a, d = root / "data" / "p0" / "0.jpg", root / "data" / "p1"
    for pair in ([a, d], [d, a]):
        assert main(["face", "verify", str(ck), *map(str, pair), "--threshold", "0.5"]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{d}: a directory" in err[0] and "two image files" in err[0]


@pytest.fixture(scope="module")
def vector_checkpoint(tmp_path_factory):
    ck = tmp_path_factory.mktemp("vectors") / "ck"
    assert main(["face", "train", "--num-classes", "40", "--eval-classes", "20", "--batch-size", "16",
                 "--epochs", "1", "--no-progress", "--checkpoint-dir", str(ck)]) == 0
    return ck


@pytest.mark.parametrize("command", ["verify", "embed", "search"])
def test_a_checkpoint_of_feature_vectors_asked_for_images_names_itself_and_says_why(vector_checkpoint, tmp_path,
                                                                                      folder, capsys, command):
    """The synthetic default trains on feature vectors; using its checkpoint on images said
    only "this checkpoint embeds (64,) vectors", naming no file and no way out."""
    ck = vector_checkpoint
    capsys.readouterr()
    image = str(folder / "data" / "p0" / "0.jpg")
    args = {"verify": [image, image, "--threshold", "0.5"], "embed": [image, "--out", str(tmp_path / "e.npy")],
            "search": ["--gallery", str(folder / "data"), "--query", image]}[command]
    assert main(["face", command, str(ck), *args]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ck) in err[0] and "--image-size" in err[0], err


@pytest.mark.parametrize("head", ["fc", "pfc", "dcp"])
def test_the_head_state_under_torchrun_says_it_is_a_rank_s(head, monkeypatch):
    """Under 2 ranks the summary's head state is rank 0's: for fc / pfc half the class table.
    It printed as the run's, in the same words as one process's and at half its figure."""
    from embcache.face.cli import summary_rows

    monkeypatch.setattr("embcache.face.cli.run_rows", lambda s: [])  # they need the timing fields
    summary = {"head": head, "num_classes": 4000, "backbone": "mlp", "head_state_bytes": 2 * 2**20,
               "skipped_samples": 0, "world_size": 2}
    state = dict(summary_rows(summary))["head state"]
    assert state.startswith("2.00 MiB a rank (") and "2 ranks" in state
    assert ("whole pool" in state) == (head == "dcp")
    one = dict(summary_rows(dict(summary, world_size=1)))["head state"]
    assert one == "2.00 MiB (parameters/pool + optimizer state)"


def test_identification_top1_says_how_many_identities_it_chose_among(trained_folder, capsys):
    """6 identities hold out 2 (the least): a top-1 of 1.0 among 2 is a coin's 0.5 beaten, not
    a face found among many. The figure printed alone; now the epoch line, the summary and
    the JSON say how many identities (and probes) it was measured on."""
    import json

    root, ck = trained_folder
    assert main(["face", "evaluate", str(ck)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    record = json.loads(out[-1])["heldout"]
    assert record["identification_gallery"] == 2 and record["identification_probes"] == 4
    assert "top-1" in out[-2] and "(2 identities)" in out[-2]
    from embcache.face.cli import summary_rows

    rows = dict(summary_rows({"head": "fc", "num_classes": 4, "backbone": "cnn", "head_state_bytes": 0,
                              "skipped_samples": 0, "final": {"heldout": record}, "epochs_done": 1, "steps": 1,
                              "peak_host_mib": 1.0, "train_samples_per_s": 1.0, "train_seconds": 1.0}))
    assert rows["heldout identification top-1"].endswith("(4 probes against 2 identities; chance 0.50)")


def test_a_run_with_nothing_to_evaluate_says_so_and_evaluate_refuses_it(folder, tmp_path, capsys):
    """--holdout 0 and no --val (as RecordIO data always holds out none): each epoch line was a
    bare `epoch 1`, and `face evaluate` printed `{}` and exited 0, a score of nothing."""
    ck = tmp_path / "ck"
    assert main(["face", "train", "--data", str(folder / "data"), "--holdout", "0", "--image-size", "16",
                 "--backbone", "cnn", "--head", "fc", "--batch-size", "8", "--epochs", "1", "--no-progress",
                 "--checkpoint-dir", str(ck)]) == 0
    captured = capsys.readouterr()
    assert "--holdout 0 holds out no identities, and no --val was given" in captured.err
    assert "epoch 1 (nothing evaluated)" in captured.out
    assert main(["face", "evaluate", str(ck)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ck) in err[0] and "nothing to evaluate" in err[0] and "--val" in err[0]
    val = _bin(tmp_path / "mine.bin", 30)
    assert main(["face", "evaluate", str(ck), "--val", str(val)]) == 0
    assert "mine: acc" in capsys.readouterr().out


def test_recordio_without_val_says_nothing_is_evaluated(tmp_path, capsys):
    from embcache.face.data.recordio import write_recordio

    write_recordio(tmp_path / "train.rec", [(who, encode_jpeg(_face(who, shot))) for who in range(6)
                                            for shot in range(3)])
    assert main(["face", "train", "--data", str(tmp_path), "--image-size", "16", "--backbone", "cnn", "--head",
                 "fc", "--batch-size", "8", "--epochs", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "RecordIO data holds out no identities, and no --val was given" in captured.err
    assert "epoch 1 (nothing evaluated)" in captured.out


def test_images_the_folder_layout_does_not_read_are_counted_and_named(folder, tmp_path, capsys):
    """An image beside the identity folders, or one folder deeper than <identity>/<image>,
    was left out of training without a word."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(folder / "data", data)
    shutil.copy(data / "p0" / "0.jpg", data / "stray.jpg")
    (data / "p1" / "session2").mkdir()
    for name in ("a.jpg", "b.png"):
        shutil.copy(data / "p1" / "0.jpg", data / "p1" / "session2" / name)
    (data / "p1" / "session2" / "notes.txt").write_text("not an image")
    assert main(["face", "train", "--data", str(data), "--image-size", "16", "--backbone", "cnn", "--head", "fc",
                 "--batch-size", "8", "--epochs", "1", "--no-progress", "--holdout", "0"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "(6 identities, 18 images; 3 images outside <identity>/<image> left out: " in line
    assert "p1/session2/a.jpg, p1/session2/b.png, stray.jpg)" in line
