"""`dlrm predict` on a CSV or Parquet file named by the export's features: a feature column the
file lacks scored every row as if that value were missing, and printed "wrote N predictions"
without a word. It is refused in one line naming the columns; an empty column still means missing."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.dlrm.predict import raw_batches
from embcache.errors import UserFacingError

# an export's names alone: reading the file needs no tables
MODEL = SimpleNamespace(manifest={"num_dense": 2}, features=["sparse_0", "sparse_1", "sparse_2"])


def test_a_csv_without_some_feature_columns_is_refused_naming_them(tmp_path):
    source = tmp_path / "rows.csv"
    source.write_text("dense_0,sparse_0,sparse_1\n1,5,6\n")
    with pytest.raises(UserFacingError) as err:
        list(raw_batches(source, MODEL, 100))
    said = str(err.value)
    assert said.startswith(f"{source}: no column 'sparse_2', 'dense_1';") and "\n" not in said, said
    assert "empty values scores them as missing" in said


def test_a_parquet_file_without_a_feature_column_is_refused(tmp_path):
    source = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"sparse_0": [1], "sparse_1": [2], "dense_0": [1.0], "dense_1": [2.0]}), source)
    with pytest.raises(UserFacingError, match=r"no column 'sparse_2';"):
        list(raw_batches(source, MODEL, 100))


def test_an_empty_column_scores_as_missing_as_before(tmp_path):
    source = tmp_path / "rows.csv"
    source.write_text("label,dense_0,dense_1,sparse_0,sparse_1,sparse_2\n1,3,,7,,\n")
    [(sparse, dense, labels, _)] = list(raw_batches(source, MODEL, 100))
    assert list(labels) == [1] and dense.shape == (1, 2) and dense[0, 0] == 3.0
    assert [sparse[f][0] for f in MODEL.features] == ["7", None, None]
