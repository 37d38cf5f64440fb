"""`face search` answers "unknown" for a query that clears the threshold for no identity, says
per result whether it clears it, and handles unreadable images: one line naming the image,
before the gallery is embedded, or with --skip-bad-images counted, named and left out."""
import numpy as np
import pyarrow.csv as pcsv
import pytest

from embcache.cli import main
from embcache.face.data.images import encode_jpeg


def _face(identity: int, shot: int, size: int = 24) -> np.ndarray:
    rng = np.random.default_rng((identity, 0))
    noise = np.random.default_rng((identity, shot + 1)).integers(-20, 21, (size, size, 3))
    return np.clip(rng.integers(0, 256, (size, size, 3)) + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A checkpoint trained on 6 identities (2 held out, so its history records a threshold),
    a gallery of their first three shots, and queries of their fourth."""
    root = tmp_path_factory.mktemp("search")
    for who in range(6):
        (root / "data" / f"p{who}").mkdir(parents=True)
        (root / "gallery" / f"p{who}").mkdir(parents=True)
        for shot in range(4):
            (root / "data" / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(_face(who, shot)))
            dst = root / "gallery" / f"p{who}" / f"{shot}.jpg" if shot < 3 else root / "queries" / f"p{who}.jpg"
            dst.parent.mkdir(exist_ok=True)
            dst.write_bytes(encode_jpeg(_face(who, shot)))
    assert main(["face", "train", "--data", str(root / "data"), "--image-size", "24", "--backbone", "cnn",
                 "--head", "fc", "--batch-size", "8", "--epochs", "1", "--no-progress", "--checkpoint-dir",
                 str(root / "ck")]) == 0
    return root


def test_each_result_says_whether_it_clears_the_threshold_and_a_query_that_clears_none_is_unknown(setup):
    from embcache.face.search import search
    from embcache.face.use import load_probe, verify_threshold

    root = setup
    recorded = verify_threshold(load_probe(root / "ck")[2])
    assert recorded is not None  # the held-out identities' evaluation recorded one
    found = search(root / "ck", root / "gallery", [str(root / "queries")], k=3)
    assert found.threshold == recorded and found.k == 3 and len(found.queries) == 6
    for q in found.queries:
        assert q.matches == [c > recorded for c in q.cosines]
        assert q.unknown == (not any(q.matches))
        assert q.identity == (q.identities[0] if q.matches[0] else None)
    strict = search(root / "ck", root / "gallery", [str(root / "queries")], k=3, threshold=1.5)
    assert strict.unknown == 6 and all(q.identity is None for q in strict.queries)
    loose = search(root / "ck", root / "gallery", [str(root / "queries")], k=3, threshold=-2)
    assert loose.unknown == 0 and [q.identity for q in loose.queries] == [q.identities[0] for q in loose.queries]


def test_the_command_prints_and_writes_the_verdicts(setup, tmp_path, capsys):
    root = setup
    args = ["face", "search", str(root / "ck"), "--gallery", str(root / "gallery"), "--query", str(root / "queries"),
            "--k", "2", "--no-progress"]
    assert main(args + ["--threshold", "1.5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "threshold 1.5000 (--threshold)" in out[0]
    assert [line.split(": ")[1] for line in out[1:7]] == ["unknown"] * 6
    assert out[-1] == "6 of 6 queries match no gallery identity (unknown)"
    assert main(args + ["--threshold", "-2", "--out", str(tmp_path / "found.csv")]) == 0
    assert "0 of 6 queries match no gallery identity" in capsys.readouterr().out
    table = pcsv.read_csv(tmp_path / "found.csv").to_pydict()
    assert table["match"] == [True] * 12 and table["rank"][:2] == [1, 2]


def test_without_a_recorded_threshold_results_come_without_a_verdict_and_say_so(setup, tmp_path, capsys,
                                                                             monkeypatch):
    import embcache.face.use as use

    root = setup
    monkeypatch.setattr(use, "verify_threshold", lambda ck, far=1e-3: None)  # a checkpoint that recorded none
    args = ["face", "search", str(root / "ck"), "--gallery", str(root / "gallery"), "--query", str(root / "queries"),
            "--k", "2", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert "no threshold (no evaluation recorded one: give --threshold)" in out[0]
    assert out[-1] == "no query is called unknown without a threshold" and "unknown" not in "".join(out[1:7])
    assert main(args + ["--out", str(tmp_path / "found.parquet")]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "found.parquet")
    assert str(table.schema.field("match").type) == "bool" and table.column("match").null_count == 12


def test_an_unreadable_query_stops_the_search_before_the_gallery_is_embedded(setup, tmp_path, capsys, monkeypatch):
    import embcache.face.data.images as images

    root = setup
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    decoded = []
    real = images.decode_image
    monkeypatch.setattr(images, "decode_image", lambda data, where, size=112: decoded.append(where) or
                        real(data, where, size))
    assert main(["face", "search", str(root / "ck"), "--gallery", str(root / "gallery"), "--query",
                 str(root / "queries" / "p0.jpg"), str(tmp_path / "broken.jpg"), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.jpg: unreadable image" in err
    assert decoded and not any("gallery" in w for w in decoded)  # the gallery was never read


def test_skip_bad_images_counts_names_and_leaves_them_out(setup, tmp_path, capsys):
    import shutil

    root = setup
    gallery = tmp_path / "gallery"
    shutil.copytree(root / "gallery", gallery)
    (gallery / "p1" / "9.jpg").write_bytes(b"truncated")
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "a.jpg").write_bytes((root / "queries" / "p2.jpg").read_bytes())
    (tmp_path / "q" / "b.jpg").write_bytes(b"")
    out = tmp_path / "found.csv"
    assert main(["face", "search", str(root / "ck"), "--gallery", str(gallery), "--query", str(tmp_path / "q"),
                 "--skip-bad-images", "--no-progress", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "skipped 2 unreadable image(s)" in captured.out
    assert "for 1 queries" in captured.out and "of 6 gallery identities" in captured.out
    named = captured.err.splitlines()
    assert any(line.startswith(f"{gallery / 'p1' / '9.jpg'}: ") for line in named)
    assert any(line.startswith(f"{tmp_path / 'q' / 'b.jpg'}: ") for line in named)
    assert set(pcsv.read_csv(out).to_pydict()["query"]) == {str(tmp_path / "q" / "a.jpg")}


def test_a_missing_checkpoint_is_named_once(tmp_path, capsys):
    missing = tmp_path / "nothere"
    assert main(["face", "embed", str(missing), str(tmp_path), "--out", str(tmp_path / "e.npy")]) != 0
    err = capsys.readouterr().err
    assert err.count(str(missing)) == 1 and "no such checkpoint file" in err
