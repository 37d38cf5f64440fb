"""`face embed` over a folder of thousands of photos stopped at the first unreadable one and
wrote nothing (`face search` had `--skip-bad-images`, `embed` had not). With the flag it leaves
such images out, counts and names them, and writes the rest; without it, it still stops in
one line; a run whose every image is unreadable writes nothing and says so."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from embcache.cli import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tests.small_runs import trained_face_run

    return trained_face_run(tmp_path_factory.mktemp("embed_skip"), "--holdout", "0") / "ck"


def test_skip_bad_images_writes_the_readable_ones_and_names_the_others(checkpoint, tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.zeros((30, 12), dtype=np.uint8)).save(photos / "gray.png")
    Image.fromarray(np.zeros((9, 9, 4), dtype=np.uint8)).save(photos / "rgba.png")
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    out = tmp_path / "e.parquet"
    capsys.readouterr()
    assert main(["face", "embed", str(checkpoint), str(photos), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{photos / 'broken.jpg'}: unreadable image" in err and not out.exists()
    assert main(["face", "embed", str(checkpoint), str(photos), "--out", str(out), "--no-progress",
                 "--skip-bad-images"]) == 0
    printed, err = capsys.readouterr()
    assert "skipped 1 unreadable image(s):" in printed and f"{photos / 'broken.jpg'}: unreadable image" in err
    table = pq.read_table(out)
    assert table.column("path").to_pylist() == [str(photos / "gray.png"), str(photos / "rgba.png")]
    assert np.allclose(np.linalg.norm(np.array(table.column("embedding").to_pylist()), axis=1), 1.0)


def test_nothing_readable_writes_nothing(checkpoint, tmp_path, capsys):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG broken")
    out = tmp_path / "e.npy"
    capsys.readouterr()
    assert main(["face", "embed", str(checkpoint), str(bad), "--out", str(out), "--no-progress",
                 "--skip-bad-images"]) == 1
    assert f"no readable image in {bad}; nothing written" in capsys.readouterr().err and not out.exists()
