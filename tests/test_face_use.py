"""A face checkpoint used without its training data: `face embed` of image files and
`face verify` of two, the checkpoint alone rebuilding its network."""
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from embcache.cli import main
from embcache.data.face.images import decode_image, encode_jpeg
from embcache.train.face_eval import embed
from embcache.train.face_use import load_probe


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
