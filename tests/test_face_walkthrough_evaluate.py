"""`face evaluate` with --val needs no training data (and says which path it needs where it
does), --val files of one name scored apart, the held-out pair hint that fits the run, and
margins no loss can train with refused up front."""
import json
import math
import shutil
from types import SimpleNamespace

import pytest

from embcache.cli import main
from embcache.face.data.images import encode_jpeg
from tests.test_face_walkthrough import _bin, _face

TRAIN = ["--image-size", "16", "--backbone", "cnn", "--head", "fc", "--batch-size", "8", "--epochs", "1",
         "--no-progress"]


def _folder(root, identities: int = 6, shots: int = 4):
    for who in range(identities):
        (root / f"p{who}").mkdir(parents=True)
        for shot in range(shots):
            (root / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """6 identities of 4 images, all that can be held out held out (--holdout 1: 4, the 2 left
    train), and a --val file named heldout.bin; two other files both named lfw.bin."""
    root = tmp_path_factory.mktemp("face_evaluate")
    _folder(root / "data")
    for name in ("a/lfw.bin", "b/lfw.bin", "c/heldout.bin"):
        _bin(root / name)
    ck = root / "ck"
    assert main(["face", "train", "--data", str(root / "data"), "--holdout", "1", "--val", str(root / "c/heldout.bin"),
                 "--checkpoint-dir", str(ck), *TRAIN]) == 0
    return root, ck



def _evaluate(capsys, *args) -> tuple[int, dict | None, list[str], str]:
    """(exit code, the JSON line's scores, stderr's lines, the epoch line)."""
    code = main(["face", "evaluate", *map(str, args)])
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    return code, (json.loads(out[-1]) if code == 0 else None), captured.err.strip().splitlines(), \
        (out[-2] if code == 0 else "")


def test_evaluate_with_val_reads_no_training_data_and_names_it_where_it_must(tmp_path, capsys):
    """The training folder moved: `face evaluate CK --val lfw.bin` failed with "<folder>: not
    'synthetic', an image folder...", a path the user never typed. --val alone now scores the
    file through the checkpoint's network, as the run scored it; what does need the folder
    (the held-out identities) says it is the checkpoint's recorded data and takes --data."""
    _folder(tmp_path / "data")
    lfw = _bin(tmp_path / "lfw.bin")
    ck = tmp_path / "ck"
    assert main(["face", "train", "--data", str(tmp_path / "data"), "--checkpoint-dir", str(ck), *TRAIN]) == 0
    capsys.readouterr()
    code, before, _, _ = _evaluate(capsys, ck, "--val", lfw, "--heldout")
    assert code == 0 and set(before) == {"heldout", "lfw"}
    shutil.move(tmp_path / "data", tmp_path / "moved")

    code, alone, err, _ = _evaluate(capsys, ck, "--val", lfw)
    assert code == 0, err
    assert set(alone) == {"lfw"} and alone["lfw"] == pytest.approx(before["lfw"])  # scored as the run scores it

    for args, flag in (([], "--val FILE"), (["--val", lfw, "--heldout"], "--heldout")):
        code, _, err, _ = _evaluate(capsys, ck, *args)
        assert code != 0 and len(err) == 1, err
        assert f"{tmp_path / 'data'}: the training data recorded in {ck / 'face-last.pt'}, not found" in err[0]
        assert "give --data DIR where it is now" in err[0] and flag in err[0] and "Traceback" not in err[0]

    code, moved, err, _ = _evaluate(capsys, ck, "--data", tmp_path / "moved", "--val", lfw, "--heldout")
    assert code == 0, err
    assert moved["heldout"] == pytest.approx(before["heldout"])  # the same held-out split, found where it moved


def test_val_files_of_one_name_are_scored_apart(run, capsys):
    """Two lfw.bin (from two folders) and a heldout.bin beside an image folder's held-out
    identities: each pair of results was one key, the later overwriting the earlier in the
    epoch line, the JSON and the metrics. Each is now named by as many of its folders as tell
    it apart; the same file given twice is refused."""
    root, ck = run
    code, scores, _, line = _evaluate(capsys, ck)  # the run's own --val c/heldout.bin and its held-out identities
    assert code == 0 and set(scores) == {"heldout", "c/heldout"}
    assert scores["heldout"]["pairs"] == 48 and scores["c/heldout"]["pairs"] == 30
    assert "| heldout: acc" in line and "| c/heldout: acc" in line
    code, scores, _, line = _evaluate(capsys, ck, "--val", root / "a/lfw.bin", root / "b/lfw.bin")
    assert code == 0 and set(scores) == {"a/lfw", "b/lfw"}
    assert "| a/lfw: acc" in line and "| b/lfw: acc" in line
    code, _, err, _ = _evaluate(capsys, ck, "--val", root / "a/lfw.bin", root / "a/../a/lfw.bin")
    assert code != 0 and len(err) == 1 and "given to --val twice" in err[0], err


def test_the_held_out_pairs_hint_fits_the_run(run, capsys):
    """At --holdout 1 every identity that can be held out is, and the line still said "a
    larger --holdout gives more pairs". It now says what would: more identities, or a --val
    file; a larger --holdout where it would hold out more; the cap where that is the limit."""
    from embcache.face.evaluation import pair_hints

    _, ck = run
    code, _, err, _ = _evaluate(capsys, ck)
    held = [line for line in err if line.startswith("warning: heldout:")]
    assert code == 0 and len(held) == 1, err
    assert "a larger --holdout gives more pairs" not in held[0]
    assert "every identity that can be held out is (4" in held[0] and "a larger --holdout cannot help" in held[0]

    record = {"heldout": {"negatives": 12}}
    partial = SimpleNamespace(heldout_paths=[["x"]] * 2, holdable=10)
    assert pair_hints(partial, 6000, record)["heldout"].startswith("a larger --holdout gives more pairs (it holds "
                                                                   "out 2 of the 10")
    capped = pair_hints(partial, 6000, {"heldout": {"negatives": 3000}})["heldout"]
    assert capped.startswith("held-out pairs are capped at 3,000 impostor pairs") and "--holdout" not in capped


@pytest.mark.parametrize("kind, margin, bound", [("arcface", "5", "[0, pi/2) radians"),
                                                 ("arcface", str(math.pi / 2), "[0, pi/2) radians"),
                                                 ("cosface", "1", "[0, 1)")])
def test_a_margin_no_loss_can_train_with_is_refused_before_training(kind, margin, bound, capsys):
    """--margin 5 (radians, arcface) was accepted without a word: from pi/2 on (1 for cosface's
    cos - m) a feature on its own class centre scores no more than an unrelated class, and
    nothing is learnt. Refused in one line before any data is built."""
    from embcache.face.config import FaceConfig

    assert main(["face", "train", "--num-classes", "40", "--eval-classes", "20", "--batch-size", "16", "--epochs",
                 "1", "--no-progress", "--margin-type", kind, "--margin", margin]) != 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"--margin {float(margin):g} with --margin-type {kind}" in err[0] and bound in err[0]
    assert "epoch" not in captured.out and "data:" not in captured.out
    with pytest.raises(ValueError, match="--margin"):
        FaceConfig(margin_type=kind, margin=float(margin))
    FaceConfig(margin_type=kind, margin=0.99)  # just under either limit: trains
