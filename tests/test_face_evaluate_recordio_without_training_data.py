"""`face evaluate CHECKPOINT` (no --val) of a run trained on RecordIO data: that data holds out no
identities, so the run's evaluation is its --val files alone, and evaluate reads nothing of the
training data (no labels scanned, no model sized by its classes) whether it is still there or not.
Only where the run did hold identities out of its data does evaluate need it, and says so."""
import json
import shutil

import pytest

from embcache.cli import main
from embcache.face.data.images import encode_jpeg
from tests.test_face_walkthrough import _bin, _face

TRAIN = ["--image-size", "16", "--backbone", "cnn", "--head", "fc", "--batch-size", "8", "--epochs", "1",
         "--no-progress"]


def _recordio(directory):
    from embcache.face.data.recordio import write_recordio

    directory.mkdir(parents=True)
    write_recordio(directory / "train.rec", [(who, encode_jpeg(_face(who, shot))) for who in range(6)
                                             for shot in range(3)])
    return directory


def _evaluate(capsys, *args) -> tuple[int, dict | None, list[str]]:
    code = main(["face", "evaluate", *map(str, args)])
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    return code, (json.loads(out[-1]) if code == 0 else None), captured.err.strip().splitlines()


@pytest.fixture
def run(tmp_path, capsys):
    """A RecordIO run with --val lfw.bin, and one without any --val."""
    data, lfw = _recordio(tmp_path / "data"), _bin(tmp_path / "lfw.bin")
    assert main(["face", "train", "--data", str(data), "--val", str(lfw), "--checkpoint-dir", str(tmp_path / "ck"),
                 *TRAIN]) == 0
    assert main(["face", "train", "--data", str(data), "--checkpoint-dir", str(tmp_path / "bare"), *TRAIN]) == 0
    capsys.readouterr()
    return tmp_path


def test_a_recordio_runs_evaluation_reads_none_of_its_training_data(run, capsys, monkeypatch):
    """Before: the data moved, `face evaluate CK` failed with "<data>: the training data recorded
    in CK, not found (it holds the run's held-out identities)", which RecordIO data never holds;
    where it was still there, every record's label was read and the head built to score the
    --val file alone. Now the --val file is scored through the checkpoint's network, the same
    scores as the run's, the data there or not."""
    from embcache.checkpoint import load_checkpoint, save_checkpoint
    from embcache.face import trainer

    ck = run / "ck"
    recorded = load_checkpoint(ck / "face-last.pt", "face")["history"][-1]["lfw"]

    def reads(*args, **kwargs):
        raise AssertionError("face evaluate read the training data")

    monkeypatch.setattr(trainer, "build_source", reads)  # the data still there: not read all the same
    code, there, err = _evaluate(capsys, ck)
    assert code == 0, err
    assert set(there) == {"lfw"} and there["lfw"] == pytest.approx(recorded)

    shutil.move(run / "data", run / "moved")
    code, moved, err = _evaluate(capsys, ck)
    assert code == 0, err
    assert moved["lfw"] == pytest.approx(recorded)
    # --heldout asks for identities RecordIO data never holds out: said, not a search for the data
    code, scores, err = _evaluate(capsys, ck, "--val", run / "lfw.bin", "--heldout")
    assert code == 0 and set(scores) == {"lfw"}, err
    said = [line for line in err if "--heldout" in line]
    assert said == ["warning: --heldout: the run held out no identities; the --val files alone are scored"], err

    # a checkpoint written before it recorded its held-out identities: its evaluations tell
    old = load_checkpoint(ck / "face-last.pt", "face")
    del old["heldout_identities"]
    save_checkpoint(old, run / "old" / "face-last.pt", "face")
    code, scores, err = _evaluate(capsys, run / "old")
    assert code == 0 and scores["lfw"] == pytest.approx(recorded), err


def test_a_recordio_run_without_val_says_nothing_to_evaluate_without_its_data(run, capsys):
    """No --val in the run or the command: one line saying nothing is evaluated and why, not the
    recorded data path as if it were needed."""
    shutil.move(run / "data", run / "moved")
    code, _, err = _evaluate(capsys, run / "bare")
    assert code != 0 and len(err) == 1, err
    assert "nothing to evaluate" in err[0] and "no --val was given" in err[0]
    assert "training data recorded" not in err[0] and "Traceback" not in err[0]
    code, scores, err = _evaluate(capsys, run / "bare", "--val", run / "lfw.bin")
    assert code == 0 and set(scores) == {"lfw"}, err
