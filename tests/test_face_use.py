"""A face checkpoint used without its training data: `face embed` of image files and
`face verify` of two, the checkpoint alone rebuilding its network."""
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from embcache.cli import main
from embcache.face.data.images import decode_image, encode_jpeg
from embcache.face.evaluation import embed
from embcache.face.use import load_probe


def _face(identity: int, shot: int, size: int = 24) -> np.ndarray:
    """A drawn face: the identity's own colour field, a little changed from shot to shot."""
    rng = np.random.default_rng((identity, 0))
    base = rng.integers(0, 256, (size, size, 3))
    noise = np.random.default_rng((identity, shot + 1)).integers(-20, 21, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    for who in range(6):
        (root / "data" / f"person{who}").mkdir(parents=True)
        for shot in range(4):
            (root / "data" / f"person{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    ck = root / "ck"
    assert main(["face", "train", "--data", str(root / "data"), "--image-size", "24", "--backbone", "cnn",
                 "--head", "fc", "--batch-size", "8", "--epochs", "1", "--no-progress", "--checkpoint-dir",
                 str(ck)]) == 0
    return root, ck


def test_embed_writes_what_evaluation_computes_from_the_checkpoint_alone(trained, tmp_path):
    root, ck = trained
    moved = tmp_path / "elsewhere"  # the training folder is not needed: the images are copied away
    moved.mkdir()
    for i, src in enumerate(sorted((root / "data").rglob("*.jpg"))[:5]):
        (moved / f"{i}.jpg").write_bytes(src.read_bytes())
    out = tmp_path / "emb.parquet"
    assert main(["face", "embed", str(ck), str(moved), "--out", str(out), "--no-progress"]) == 0
    table = pq.read_table(out)
    got = np.stack(table.column("embedding").to_pylist())
    probe, spec, _ = load_probe(ck)
    paths = sorted(moved.glob("*.jpg"))
    want = embed(probe, torch.stack([decode_image(p, str(p), 24) for p in paths]), flip=True).numpy()
    assert table.column("path").to_pylist() == [str(p) for p in paths]
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    npy = tmp_path / "emb.npy"
    assert main(["face", "embed", str(ck), *map(str, paths), "--out", str(npy), "--no-progress"]) == 0
    np.testing.assert_allclose(np.load(npy), want, atol=1e-6)
    assert (tmp_path / "emb.npy.paths.txt").read_text().splitlines() == [str(p) for p in paths]


def test_verify_prints_the_cosine_and_a_verdict(trained, capsys):
    root, ck = trained
    a, b = root / "data" / "person0" / "0.jpg", root / "data" / "person0" / "1.jpg"
    assert main(["face", "verify", str(ck), str(a), str(b), "--threshold", "-2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("cosine ") and line.endswith(": same")
    assert main(["face", "verify", str(ck), str(a), str(b), "--threshold", "1.5"]) == 0
    assert capsys.readouterr().out.strip().endswith(": different")
    probe, spec, _ = load_probe(ck)
    e = embed(probe, torch.stack([decode_image(p, str(p), 24) for p in (a, b)]), flip=True)
    assert line.startswith(f"cosine {float((e[0] * e[1]).sum()):.4f}")


def test_bad_input_is_one_line(trained, tmp_path, capsys):
    root, ck = trained
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    assert main(["face", "embed", str(ck), str(tmp_path / "broken.jpg"), "--out", str(tmp_path / "e.npy")]) != 0
    assert "broken.jpg: unreadable image" in capsys.readouterr().err
    assert not (tmp_path / "e.npy").exists()
    assert main(["face", "embed", str(ck), str(tmp_path / "nothing"), "--out", str(tmp_path / "e.npy")]) != 0
    assert "no such file or directory" in capsys.readouterr().err


# ------------------------------------------------------------ a 30-identity folder, end to end

@pytest.fixture(scope="module")
def folder30(tmp_path_factory):
    """30 identities of 6 images, trained with every default but the small network: the
    default --pool-ratio (3 slots) is raised to the identities a step brings, and 3
    identities are held out and evaluated each epoch."""
    root = tmp_path_factory.mktemp("faces30")
    for who in range(30):
        (root / "data" / f"p{who:02d}").mkdir(parents=True)
        for shot in range(6):
            (root / "data" / f"p{who:02d}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    return root


@pytest.fixture(scope="module")
def trained30(folder30):
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["face", "train", "--data", str(folder30 / "data"), "--image-size", "24", "--backbone", "cnn",
                   "--epochs", "2", "--no-progress", "--checkpoint-dir", str(folder30 / "ck")])
    assert rc == 0, out.getvalue()
    return folder30, folder30 / "ck", out.getvalue()


def test_small_folder_trains_with_the_default_pool_ratio_and_evaluates_held_out_identities(trained30):
    from embcache.checkpoint import load_checkpoint

    root, ck, printed = trained30
    assert "27 identities, 162 images; 3 identities held out for evaluation" in printed
    assert "pool of 27 slots, raised from 3 (--pool-ratio 0.1)" in printed
    saved = load_checkpoint(ck / "face-last.pt", kind="face")
    assert [r["epoch"] for r in saved["history"]] == [1, 2]
    for record in saved["history"]:  # each epoch evaluated the held-out identities
        assert record["heldout"]["pairs"] >= 20 and 0 <= record["heldout"]["identification_top1"] <= 1


def test_held_out_identities_are_never_trained_on_and_the_split_is_seeded(folder30):
    from embcache.face.data.folder import ImageFolderFaces

    a = ImageFolderFaces(folder30 / "data", 24, holdout=0.1, seed=0)
    assert a.heldout_names == ImageFolderFaces(folder30 / "data", 24, holdout=0.1, seed=0).heldout_names
    assert len(a.heldout_names) == 3 and not set(a.heldout_names) & set(a.identity_names)
    assert sorted(a.identity_names + a.heldout_names) == [f"p{i:02d}" for i in range(30)]
    assert a.num_classes == 27 and not any(p.parent.name in a.heldout_names for p in a.paths)
    others = {tuple(ImageFolderFaces(folder30 / "data", 24, holdout=0.1, seed=s).heldout_names) for s in range(1, 6)}
    assert len(others | {tuple(a.heldout_names)}) > 1  # another seed, another split
    everyone = ImageFolderFaces(folder30 / "data", 24, holdout=0.0)
    assert everyone.num_classes == 30 and everyone.heldout_names == []


def test_checkpoints_from_before_the_split_evaluate_as_trained(trained30):
    from embcache.checkpoint import load_checkpoint
    from embcache.face.config import FaceConfig
    from embcache.train.run import config_from_checkpoint

    saved = load_checkpoint(trained30[1] / "face-last.pt", kind="face")["config"]
    assert config_from_checkpoint(FaceConfig, saved).holdout == 0.1
    old = {k: v for k, v in saved.items() if k != "holdout"}  # written before --holdout existed
    assert config_from_checkpoint(FaceConfig, old).holdout == 0.0


def test_embed_equals_what_face_evaluate_scores(trained30, tmp_path, capsys):
    import json

    from embcache.face.trainer import FaceTrainer
    from embcache.face.config import FaceConfig
    from embcache.face.evaluation import heldout_pairs, identification_top1, verification
    from embcache.train.run import checkpoint_to_evaluate

    root, ck, _ = trained30
    assert main(["face", "evaluate", str(ck)]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["heldout"]
    _, saved, cfg = checkpoint_to_evaluate(ck, "face", FaceConfig)
    trainer = FaceTrainer(cfg)
    _, labels, paths = trainer.source.heldout_set()
    out = tmp_path / "held.npy"
    assert main(["face", "embed", str(ck), *map(str, paths), "--out", str(out), "--no-progress"]) == 0
    emb = torch.from_numpy(np.load(out))
    a, b, same = heldout_pairs(labels, cfg.eval_pairs, cfg.seed)
    assert verification(emb[a], emb[b], same)["accuracy"] == pytest.approx(reported["accuracy"], abs=1e-12)
    first = torch.cat([torch.tensor([True]), labels[1:] != labels[:-1]])
    top1 = identification_top1(emb[first], labels[first], emb[~first], labels[~first])
    assert top1 == pytest.approx(reported["identification_top1"], abs=1e-12)


def test_search_finds_the_identity_of_images_the_gallery_lacks(trained30, tmp_path, capsys):
    import pyarrow.csv as pcsv

    root, ck, _ = trained30
    gallery, queries = tmp_path / "gallery", tmp_path / "queries"
    queries.mkdir()
    for person in sorted((root / "data").iterdir()):
        (gallery / person.name).mkdir(parents=True)
        for shot in range(6):
            src = person / f"{shot}.jpg"
            dst = gallery / person.name / src.name if shot < 3 else queries / f"{person.name}_{shot}.jpg"
            dst.write_bytes(src.read_bytes())
    out = tmp_path / "found.csv"
    assert main(["face", "search", str(ck), "--gallery", str(gallery), "--query", str(queries), "--k", "3",
                 "--out", str(out), "--no-progress"]) == 0
    table = pcsv.read_csv(out).to_pydict()
    assert len(table["query"]) == 90 * 3 and table["rank"][:3] == [1, 2, 3]
    top = {q: who for q, r, who in zip(table["query"], table["rank"], table["identity"]) if r == 1}
    right = sum(who == q.rsplit("/", 1)[1].split("_")[0] for q, who in top.items())
    assert right / len(top) >= 0.5  # chance: 1 in 30
    cos = np.array(table["cosine"]).reshape(90, 3)
    assert (np.diff(cos, axis=1) <= 1e-6).all()
    # the scores are the cosines to each identity's mean embedding, as `face embed` computes them
    probe, spec, _ = load_probe(ck)
    q0 = sorted(queries.glob("*.jpg"))[0]
    g0 = sorted((gallery / table["identity"][0]).glob("*.jpg"))
    e = embed(probe, torch.stack([decode_image(p, str(p), 24) for p in [q0, *g0]]), flip=True)
    want = float((e[0] * torch.nn.functional.normalize(e[1:].mean(0), dim=0)).sum())
    assert table["query"][0] == str(q0) and table["cosine"][0] == pytest.approx(want, abs=1e-5)
    assert main(["face", "search", str(ck), "--gallery", str(tmp_path / "none"), "--query", str(queries)]) != 0
    assert "none: no such directory" in capsys.readouterr().err


def test_onnx_export_matches_torch(trained30, tmp_path, capsys):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    root, ck, _ = trained30
    out = tmp_path / "probe.onnx"
    assert main(["face", "export", str(ck), "--onnx", str(out)]) == 0
    assert "max abs diff" in capsys.readouterr().out
    probe, spec, _ = load_probe(ck)
    images = torch.stack([decode_image(p, str(p), 24) for p in sorted((root / "data").rglob("*.jpg"))[:7]])
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    with torch.no_grad():
        want = probe(images).numpy()
    assert got.shape == want.shape == (7, spec["feat_dim"])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    meta = {p.key: p.value for p in __import__("onnx").load(str(out)).metadata_props}
    assert "(x - 127.5) / 128" in meta["embcache.input"]
    assert main(["face", "export", str(ck), "--onnx", str(tmp_path / "probe.txt")]) != 0
    assert "written as FILE.onnx" in capsys.readouterr().err


def test_a_folder_too_small_to_verify_trains_and_says_verification_was_not_scored(tmp_path, capsys):
    """4 identities of 3 images: the held-out identity gives fewer than 20 pairs, too few for
    10-fold verification; the epoch line and the summary say so, and identification is scored."""
    for who in range(4):
        (tmp_path / "data" / f"p{who}").mkdir(parents=True)
        for shot in range(3):
            (tmp_path / "data" / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
    assert main(["face", "train", "--data", str(tmp_path / "data"), "--image-size", "24", "--backbone", "cnn",
                 "--head", "fc", "--batch-size", "8", "--epochs", "1", "--no-progress", "--checkpoint-dir",
                 str(tmp_path / "ck")]) == 0
    printed = capsys.readouterr().out
    assert "heldout: no verification (" in printed and "pairs, under 20)" in printed
    assert "heldout verification" in printed and "not scored" in printed
    assert "heldout identification top-1" in printed
