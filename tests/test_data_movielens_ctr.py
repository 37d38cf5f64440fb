"""MovieLens-100k as CTR: hand-computed rows from the tiny copy, and sensible figures on the real one."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.errors import DataFormatError
from embcache.data.ctr_format import load_id_frequencies, read_meta
from embcache.data.loader import CTRBatches
from embcache.data.movielens_ctr import prepare_ml100k_ctr
from tests.offline_data import load_or_skip
from tests.test_data_movielens import write_atomic, write_standard


def table(d, split):
    meta = read_meta(d)
    return pa.concat_tables([pq.read_table(d / f) for f in meta["splits"][split]["files"]]).to_pydict()


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "src").mkdir()
    return write_standard(tmp_path / "src")


def test_time_split_of_the_tiny_copy_by_hand(tiny, tmp_path):
    meta = prepare_ml100k_ctr(tmp_path / "out", tiny, split="time", fractions=(0.6, 0.2, 0.2))
    assert [f["cardinality"] for f in meta["sparse"]] == [3, 4, 7, 2, 3, 3, 19]
    assert [f["multi_hot"] for f in meta["sparse"]] == [False] * 6 + [True]
    assert meta["num_dense"] == 2
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == {"train": 3, "val": 1, "test": 1}
    train = table(tmp_path / "out", "train")
    # ratings in time order: (user 10, item 3, 5), (2, 7, 1), (5, 3, 4) -> ids users 2,0,1 items 1,2,1
    assert train["label"] == [1, 0, 1]
    assert train["sparse_0"] == [2, 0, 1]
    assert train["sparse_1"] == [1, 2, 1]
    assert train["sparse_2"] == [1, 5, 1]          # ages 24, 53, 23
    assert train["sparse_3"] == [1, 0, 1]          # M, F, M  (F=0, M=1)
    assert train["sparse_4"] == [1, 0, 2]          # technician, other, writer (sorted names)
    assert train["sparse_5"] == [1, 2, 0]          # 857, T8H, 320 among sorted 320, 857, T8H
    assert train["sparse_6"] == [[8], [0], [8]]    # Drama, unknown, Drama
    assert train["dense_0"] == pytest.approx([0.24, 0.53, 0.23])
    assert train["dense_1"] == pytest.approx([0.94, 0.0, 0.94])
    val, test = table(tmp_path / "out", "val"), table(tmp_path / "out", "test")
    assert (val["label"], val["sparse_0"], val["sparse_1"], val["sparse_6"]) == ([0], [0], [3], [[1, 17, 18]])
    assert (test["label"], test["sparse_0"], test["sparse_1"], test["sparse_6"]) == ([0], [2], [0], [[3, 5]])
    freq = load_id_frequencies(tmp_path / "out")
    assert freq["sparse_1"].tolist() == [0, 2, 1, 0]
    assert freq["sparse_6"].tolist() == [1] + [0] * 7 + [2] + [0] * 10


def test_both_source_layouts_give_the_same_ctr_files(tiny, tmp_path):
    (tmp_path / "atomic").mkdir()
    write_atomic(tmp_path / "atomic")
    prepare_ml100k_ctr(tmp_path / "a", tiny, seed=1, fractions=(0.4, 0.4, 0.2))
    prepare_ml100k_ctr(tmp_path / "b", tmp_path / "atomic", seed=1, fractions=(0.4, 0.4, 0.2))
    for split in ("train", "val", "test"):
        assert table(tmp_path / "a", split) == table(tmp_path / "b", split)


def test_random_split_is_a_seeded_partition(tiny, tmp_path):
    def rows(d):
        return sorted((u, i) for s in ("train", "val", "test")
                      for u, i in zip(table(d, s)["sparse_0"], table(d, s)["sparse_1"]))

    prepare_ml100k_ctr(tmp_path / "a", tiny, seed=3, fractions=(0.4, 0.4, 0.2))
    prepare_ml100k_ctr(tmp_path / "b", tiny, seed=3, fractions=(0.4, 0.4, 0.2))
    assert rows(tmp_path / "a") == sorted([(2, 1), (0, 2), (1, 1), (0, 3), (2, 0)])
    assert table(tmp_path / "a", "train") == table(tmp_path / "b", "train")


def test_bad_arguments_and_bad_source(tiny, tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        prepare_ml100k_ctr(tmp_path / "o", tiny, split="weekly")
    with pytest.raises(ValueError, match="fractions"):
        prepare_ml100k_ctr(tmp_path / "o", tiny, fractions=(0.5, 0.5, 0.5))
    (tiny / "u.data").write_text("1\t2\n")
    with pytest.raises(DataFormatError, match=r"u\.data:1: 2 fields, expected 4"):
        prepare_ml100k_ctr(tmp_path / "o", tiny, skip_bad_lines=False)
    # skipped by default, as the other converters do: a file of nothing else is still refused, saying why
    with pytest.raises(DataFormatError, match=r"u\.data: no ratings in this file: all 1 line\(s\) malformed, "
                                              r"skipped \(the first, line 1: 2 fields, expected 4"):
        prepare_ml100k_ctr(tmp_path / "o", tiny)


def test_real_copy_as_ctr(tmp_path):
    meta = load_or_skip(prepare_ml100k_ctr, tmp_path)
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == \
        {"train": 80_000, "val": 10_000, "test": 10_000}
    assert [f["cardinality"] for f in meta["sparse"][:5]] == [943, 1682, 7, 2, 21]
    labels = np.concatenate([b.labels.numpy() for b in CTRBatches(tmp_path, "train", 8192)])
    assert len(labels) == 80_000
    assert 0.5 < labels.mean() < 0.6  # 55,375 of 100,000 ratings are 4 or 5
    batch = next(iter(CTRBatches(tmp_path, "val", 512)))
    genre_lengths = batch.sparse.to_dict()["sparse_6"].lengths()
    assert genre_lengths.min() >= 1 and genre_lengths.max() <= 6
