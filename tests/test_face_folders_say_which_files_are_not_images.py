"""`face embed` / `face search` on a folder left out every file not named as an image (a
`.gif`, a `.tif`, notes) and said "wrote 4 embeddings" without a word of the others. They
are now counted in one warning naming the folder and the first; hidden files pass unremarked."""
from __future__ import annotations

import logging

from embcache.face.search import gallery_identities
from embcache.face.use import image_paths


def _folder(root):
    (root / "p0").mkdir(parents=True)
    (root / "p1").mkdir()
    for name in ("p0/a.jpg", "p0/b.PNG", "p1/c.png", "loose.jpeg"):
        (root / name).write_bytes(b"not decoded here")
    for name in ("p0/scan.tif", "p1/notes.txt", ".DS_Store", "p1/.hidden"):
        (root / name).write_bytes(b"x")
    return root


def _warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_embed_inputs_count_the_files_left_out(tmp_path, caplog):
    root = _folder(tmp_path / "photos")
    with caplog.at_level(logging.WARNING, logger="embcache"):
        paths = image_paths([str(root)])
    assert [p.relative_to(root).as_posix() for p in paths] == ["loose.jpeg", "p0/a.jpg", "p0/b.PNG", "p1/c.png"]
    [said] = _warned(caplog)
    assert said.startswith(f"{root}: left out 2 file(s) that are not images by name (.tif, .txt; "
                           f"first {root / 'p0/scan.tif'}): images are ") and "\n" not in said, said


def test_a_gallery_counts_the_files_left_out(tmp_path, caplog):
    root = _folder(tmp_path / "people")
    with caplog.at_level(logging.WARNING, logger="embcache"):
        names, files = gallery_identities(root)
    assert names == ["p0", "p1", "loose"] and [len(f) for f in files] == [2, 1, 1]
    [said] = _warned(caplog)
    assert f"{root}: left out 2 file(s) that are not images by name" in said, said


def test_a_folder_of_images_alone_warns_nothing(tmp_path, caplog):
    root = tmp_path / "only"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"")
    (root / ".DS_Store").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="embcache"):
        assert image_paths([str(root)]) == [root / "a.jpg"]
    assert _warned(caplog) == []
