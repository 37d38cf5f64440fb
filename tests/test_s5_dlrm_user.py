"""What a user meets in their second hour with DLRM: their own file in the formats `data
prepare own` takes, scored by `dlrm predict`; data written day by day, trained with the
default cache size and evaluated day by day; an empty batch given to `embcache.serve`."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow.csv as pcsv
import pytest

from embcache.cli import main

ROWS = 600


def write_clicks(path, delimiter: str = ",") -> None:
    """ROWS rows of a click log with a header: user and item (categorical), price (dense), clicked."""
    rng = np.random.default_rng(0)
    lines = [delimiter.join(["user", "item", "price", "clicked"])]
    lines += [delimiter.join([f"u{rng.integers(0, 30)}", f"i{rng.integers(0, 20)}", f"{rng.random() * 50:.2f}",
                              str(int(rng.random() < 0.3))]) for _ in range(ROWS)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def own_export(tmp_path_factory):
    """A CSV prepared with `data prepare own`, trained 2 steps and exported: (dir, the CSV)."""
    root = tmp_path_factory.mktemp("own")
    source = root / "clicks.csv"
    write_clicks(source)
    assert main(["data", "prepare", "own", "--input", str(source), "--out", str(root / "data"), "--label-col",
                 "clicked", "--dense-cols", "price", "--sparse-cols", "user,item", "--no-progress"]) == 0
    assert main(["dlrm", "train", "--data", str(root / "data"), "--max-steps", "2", "--batch-size", "128",
                 "--embedding-dim", "4", "--dense-arch", "8", "--over-arch", "8", "--device", "cpu",
                 "--checkpoint-dir", str(root / "ck"), "--no-progress"]) == 0
    assert main(["dlrm", "export", str(root / "ck"), "--out", str(root / "export")]) == 0
    return root, source


def predicted(export, source, out) -> list[float]:
    assert main(["dlrm", "predict", str(export), "--input", str(source), "--out", str(out), "--no-progress"]) == 0
    return pcsv.read_csv(out).column("probability").to_pylist()


@pytest.mark.parametrize("name", ["clicks.csv.gz", "clicks.tsv", "clicks.txt", "clicks.tsv.gz"])
def test_predict_reads_every_text_file_data_prepare_own_reads(own_export, tmp_path, name, capsys):
    """The file a model was prepared from scores as it is: `data prepare own` takes a .gz CSV
    and tab-separated .tsv / .txt, and `dlrm predict` took them for Criteo text and refused them."""
    root, source = own_export
    want = predicted(root / "export", source, tmp_path / "csv.csv")
    path = tmp_path / name
    write_clicks(path.with_suffix("") if name.endswith(".gz") else path, "," if ".csv" in name else "\t")
    if name.endswith(".gz"):
        plain = path.with_suffix("")
        path.write_bytes(gzip.compress(plain.read_bytes()))
    capsys.readouterr()
    assert predicted(root / "export", path, tmp_path / "got.csv") == want
    assert len(want) == ROWS
