"""An infinite dense value (`inf` in a Criteo line, a Parquet float column's inf, `float("inf")`
given to `predict`) scored probability 0 (NaN with `dense_prepared=True`) and `dlrm predict`
wrote it without a word, where `data prepare` skips a row holding one. It is refused in one
line naming the row (the file's line) and the column; NaN and None are still missing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embcache.dlrm.predict import _scored
from embcache.errors import UserFacingError
from embcache.serve import DENSE_LOG1P, ExportedDLRM


def _export() -> ExportedDLRM:
    """An export's dense side alone (the values are refused before any table or program runs)."""
    model = ExportedDLRM.__new__(ExportedDLRM)
    model.manifest = {"num_dense": 3, "dense_transform": DENSE_LOG1P}
    model.features = []
    return model


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_predict_refuses_an_infinite_dense_value_naming_row_and_column(prepared, value):
    rows = [{"dense": [1.0, None, 2.0]}, {"dense": [0.0, 1.0, value]}]
    with pytest.raises(ValueError, match=r"^row 1: dense_2 value -?inf is not a finite number \(a missing value is "
                                         r"empty, None or NaN\)$"):
        _export().predict(rows, dense_prepared=prepared)


def test_dlrm_predict_names_the_line_of_an_infinite_value():
    dense = np.array([[1.0, np.nan, 2.0], [3.0, 4.0, 5.0], [np.inf, 0.0, 0.0]])
    lines = {0: 2, 1: 3, 2: 7}
    with pytest.raises(UserFacingError, match=r"^rows\.txt:7: dense_0 value inf is not a finite number"):
        _scored(_export(), {}, dense, Path("rows.txt"), lambda i: f"rows.txt:{lines[i]}", False, {}, {})


def test_missing_values_still_transform_as_missing():
    assert np.array_equal(_export().transform_dense([np.nan, 0.0, np.e - 1]), np.float32([0.0, 0.0, 1.0]))
