"""Small trained runs that several test modules open, damage or plant files in (each
module keeps its own copy, so what one test does to its files reaches no other module)."""
from __future__ import annotations

from pathlib import Path

from embcache.cli import main


def trained_dlrm_run(root: Path, rows: int, steps: int) -> Path:
    """`root/data` (synthetic, 0.05 % of Kaggle's cardinalities), `root/ck` (a cached DLRM run of
    `steps` steps at batch 128, dim 4) and `root/export` (its export); returns `root`."""
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.export import export_checkpoint

    generate_synthetic(root / "data", rows=rows, scale=0.0005, seed=0)
    assert main(["dlrm", "train", "--data", str(root / "data"), "--batch-size", "128", "--embedding-dim", "4",
                 "--max-steps", str(steps), "--no-progress", "--checkpoint-dir", str(root / "ck")]) == 0
    export_checkpoint(root / "ck", root / "export")
    return root


def trained_face_run(root: Path, *flags: str) -> Path:
    """`root/data` (6 identities of 4 random 24 x 24 JPEGs, an image folder) and `root/ck` (a
    small cnn run of one epoch on them at batch 8, with `flags`); returns `root`."""
    import numpy as np

    from embcache.face.data.images import encode_jpeg

    rng = np.random.default_rng(0)
    for who in range(6):
        (root / "data" / f"p{who}").mkdir(parents=True)
        for shot in range(4):
            image = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
            (root / "data" / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(image))
    assert main(["face", "train", "--data", str(root / "data"), "--image-size", "24", "--backbone", "cnn",
                 "--batch-size", "8", "--epochs", "1", "--no-progress", "--checkpoint-dir", str(root / "ck"),
                 *flags]) == 0
    return root
