"""What a user walkthrough of `face` and `cf` found printed wrong or too late: TAR@FAR figures
at FARs too few impostor pairs cannot resolve, output paths refused only after the work, cf
silent when its Recall falls, `cf evaluate` reading data before its checkpoint, and cf's
--help promising what dlrm's runs do."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
import torch

from embcache.cli import main
from embcache.face.data.images import encode_jpeg
from tests.test_face_use import _face  # the drawn faces of the face tests

# ------------------------------------------------------------------------ face


@pytest.fixture(scope="module")
def face_run(tmp_path_factory):
    """A 6-identity folder (2 held out: 12 genuine and 12 impostor pairs) trained 2 epochs,
    and what the training printed."""
    root = tmp_path_factory.mktemp("faces")
    for who in range(6):
        (root / "data" / f"p{who}").mkdir(parents=True)
        for shot in range(4):
            (root / "data" / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["face", "train", "--data", str(root / "data"), "--image-size", "24", "--backbone", "cnn",
                   "--head", "fc", "--batch-size", "8", "--epochs", "2", "--no-progress", "--checkpoint-dir",
                   str(root / "ck")])
    assert rc == 0, err.getvalue()
    return root, out.getvalue(), err.getvalue()


NOTE = "heldout: 12 impostor pairs resolve FAR >= 8.3e-2 only: TAR@FAR=1e-3 and 1e-4 cannot be measured"


def test_train_marks_unresolvable_tar_at_far_as_na_and_says_why_once(face_run):
    _, out, err = face_run
    assert err.count("impostor pairs resolve") == 1 and f"warning: {NOTE}" in err
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and all("TAR@FAR=1e-3 n/a," in line for line in epochs)
    row = next(line for line in out.splitlines() if "heldout TAR@FAR=1e-3 / 1e-4" in line)
    assert row.split()[-3:] == ["n/a", "/", "n/a"]
    final = json.loads(out.strip().splitlines()[-1])["final"]["heldout"]
    assert final["resolved@far=0.001"] is False and final["resolved@far=0.0001"] is False
    assert isinstance(final["tar@far=0.001"], float)  # the figure is kept, flagged


def test_evaluate_and_verify_say_the_cut_is_no_far_1e3_one(face_run, capsys):
    root, _, _ = face_run
    assert main(["face", "evaluate", str(root / "ck")]) == 0
    got = capsys.readouterr()
    assert got.err.count("impostor pairs resolve") == 1 and NOTE in got.err
    assert "TAR@FAR=1e-3 n/a," in got.out.splitlines()[0]
    assert json.loads(got.out.splitlines()[-1])["heldout"]["resolved@far=0.001"] is False
    image = str(root / "data" / "p0" / "0.jpg")
    assert main(["face", "verify", str(root / "ck"), image, image]) == 0
    line = capsys.readouterr().out.strip()
    assert ("(the checkpoint's, not a FAR 1e-3 cut: its evaluation's 12 impostor pairs resolve FAR >= 8.3e-2 only, "
            "and it is the highest of their cosines): same") in line
    assert main(["face", "search", str(root / "ck"), "--gallery", str(root / "data"), "--query", image,
                 "--no-progress"]) == 0
    assert "not a FAR 1e-3 cut: its evaluation's 12 impostor pairs" in capsys.readouterr().out.splitlines()[0]


def test_enough_impostor_pairs_resolve_the_far_and_print_the_figure():
    from embcache.face.evaluation import format_epoch, unresolved_notes, verification
    from embcache.face.use import threshold_source

    g = torch.Generator().manual_seed(0)
    n = 3000  # 1,500 impostor pairs: FAR 1e-3 resolved, 1e-4 not
    a = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=1)
    same = torch.arange(n) % 2 == 0
    b = torch.where(same[:, None], a, torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=1))
    m = verification(a, b, same)
    assert m["resolved@far=0.001"] is True and m["resolved@far=0.0001"] is False
    assert f"TAR@FAR=1e-3 {m['tar@far=0.001']:.4f}" in format_epoch({"epoch": 1, "val": m})
    said: set[str] = set()
    assert unresolved_notes({"val": m}, said) == [
        "val: 1,500 impostor pairs resolve FAR >= 6.7e-4 only: TAR@FAR=1e-4 cannot be measured on them and show as "
        "n/a (the result's figures are kept, flagged \"resolved@far=...\": false)"]
    assert unresolved_notes({"val": m}, said) == []  # once a command
    assert threshold_source({"history": [{"epoch": 1, "val": m}]}) == "the checkpoint's, at FAR 1e-3"


def test_face_embed_and_search_refuse_an_unwritable_out_before_embedding(face_run, tmp_path, capsys, monkeypatch):
    import embcache.face.use as use

    root, _, _ = face_run
    (tmp_path / "val.csv").write_text("a file, not a directory\n")

    def embedded(*args, **kwargs):
        raise AssertionError("embedded before the output path was checked")

    monkeypatch.setattr(use, "embed_readable", embedded)
    for argv, out in ((["face", "embed", str(root / "ck"), str(root / "data")], tmp_path / "val.csv" / "x.npy"),
                      (["face", "search", str(root / "ck"), "--gallery", str(root / "data"), "--query",
                        str(root / "data")], tmp_path / "val.csv" / "x.csv")):
        assert main([*argv, "--out", str(out), "--no-progress"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"{out}: cannot write: {tmp_path / 'val.csv'} is a file, not a directory")
        assert len(err.splitlines()) == 1


# ------------------------------------------------------------------------ cf
TINY = ["--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "120", "--synthetic-interactions",
        "1500", "--negatives", "4", "--engine", "torch", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def cf_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cf")
    assert main(["cf", "train", *TINY, "--epochs", "1", "--checkpoint-dir", str(root / "ck"),
                 "--save", str(root / "m.npz")]) == 0
    return root


def _no_data(monkeypatch):
    """Make reading the interactions an error: what runs before the data cannot have read it."""
    import embcache.cf.trainer as trainer

    def read(*args, **kwargs):
        raise AssertionError("the data was read first")

    monkeypatch.setattr(trainer, "load_interactions", read)


def test_cf_train_warns_when_the_run_ends_with_recall_below_its_best(monkeypatch, capsys):
    import embcache.cf.trainer as trainer

    recalls = iter([0.3616, 0.2904, 0.3000])
    monkeypatch.setattr(trainer, "evaluate_params",
                        lambda *a, **k: {"recall@20": next(recalls), "ndcg@20": 0.1, "users": 60})
    assert main(["cf", "train", *TINY, "--epochs", "3"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: recall")]
    # epoch 3 rose again, but not to epoch 1's: one line, at the end
    assert warnings == [f"warning: recall@20 0.3000 after epoch 3 is below the best of the run, 0.3616 after "
                        f"epoch 1: {trainer.FALLING_ADVICE}"]


def test_cf_save_and_recommend_out_refuse_an_unwritable_path_before_the_work(cf_run, tmp_path, capsys,
                                                                              monkeypatch):
    import embcache.cf.cli as cli

    (tmp_path / "val.csv").write_text("a file\n")
    _no_data(monkeypatch)
    save = tmp_path / "val.csv" / "m.npz"
    assert main(["cf", "train", *TINY, "--epochs", "1", "--save", str(save)]) == 1
    got = capsys.readouterr()
    assert got.err.strip() == f"embcache cf: error: {save}: cannot write: {tmp_path / 'val.csv'} is a file, " \
                              f"not a directory"
    assert "epoch" not in got.out

    def ranked(*args, **kwargs):
        raise AssertionError("recommended before the output path was checked")

    monkeypatch.setattr(cli, "recommendation_rows", ranked)
    out = tmp_path / "val.csv" / "top.csv"
    assert main(["cf", "recommend", str(cf_run / "m.npz"), "--all", "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip().endswith(f"{out}: cannot write: {tmp_path / 'val.csv'} is a file, "
                                                    f"not a directory")


def test_cf_evaluate_checks_the_checkpoint_before_reading_data(cf_run, tmp_path, capsys, monkeypatch):
    from embcache.checkpoint import save_checkpoint

    good = cf_run / "ck" / "cf-last.pt"
    truncated = tmp_path / "cf-last.pt"
    truncated.write_bytes(good.read_bytes()[:4000])
    dlrm = save_checkpoint({"config": {}}, tmp_path / "dlrm" / "dlrm-last.pt", kind="dlrm")
    (tmp_path / "empty").mkdir()  # a --checkpoint-dir without its checkpoint
    _no_data(monkeypatch)
    for path, message in ((truncated, "corrupt or truncated checkpoint"), (dlrm, "a 'dlrm' checkpoint, expected 'cf'"),
                          (tmp_path / "empty", "empty/cf-last.pt: no such checkpoint file")):
        assert main(["cf", "evaluate", str(path)]) == 1
        got = capsys.readouterr()
        assert got.out == "" and message in got.err and str(path) in got.err
    monkeypatch.undo()
    copied = tmp_path / "ck"
    shutil.copytree(cf_run / "ck", copied)
    assert main(["cf", "evaluate", str(copied)]) == 0  # a good checkpoint: the data it records, then the scores
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("synthetic-60x120") and "recall@20" in json.loads(out[-1])


def _help(kind: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([kind, "train", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_cf_train_help_promises_only_what_cf_writes(capsys):
    cf, dlrm = _help("cf", capsys), _help("dlrm", capsys)
    assert "--log-every" not in cf and "step" not in cf.split("--metrics-out FILE")[1].split("--")[0]
    assert "start, epoch and summary records" in cf and "each epoch's loss, samples/s and scores" in cf
    assert "start, step, epoch and summary records" in dlrm and "every --log-every steps" in dlrm
