"""Serving says when it scores a value as missing because the vocabulary never saw it (a typo,
a stored id where the raw value belongs): counted per feature, or refused with strict."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from embcache.cli import main
from embcache.serve import load_export
from tests.test_dlrm_export import HASHED, raw_val_rows, run  # noqa: F401 (the export fixture)


def known_row(run) -> dict:
    """A val row with every value its vocabulary has (the others missing), dense as stored."""
    model = load_export(run["out"])
    sparse, dense = raw_val_rows(run["columns"])
    row = {}
    for f, lookup in zip(model.features, model.lookups):
        value = sparse[f][0]
        row[f] = value if value is not None and lookup.ids([value])[0] != 0 else None
    return {**row, "dense": list(dense[0])}


def test_python_predict_counts_unseen_values_and_strict_refuses_them(run, caplog):
    model = load_export(run["out"])
    row = known_row(run)
    counts = {}
    model.predict([row], dense_prepared=True, unseen=counts)
    assert counts == {}
    typo = {**row, "sparse_0": "zzzz_unknown"}
    with caplog.at_level(logging.WARNING, logger="embcache"):
        scored = model.predict([row, typo], dense_prepared=True)
    assert np.array_equal(scored[1:], model.predict([{**row, "sparse_0": None}], dense_prepared=True))
    warned = [r.getMessage() for r in caplog.records if "never saw" in r.getMessage()]
    assert len(warned) == 1 and "scored as missing: sparse_0 1 (of 2 rows" in warned[0], warned
    with pytest.raises(ValueError, match=r"^row 1: sparse_0 value 'zzzz_unknown' is not in the export's "
                                               r"vocabulary .*strict scoring refuses it"):
        model.predict([row, typo], dense_prepared=True, strict=True)
    assert np.array_equal(model.predict([row], dense_prepared=True, strict=True),
                          model.predict([row], dense_prepared=True))  # nothing unseen: strict scores alike


def test_a_row_of_stored_ids_is_reported_feature_by_feature(run):
    """docs/export.md's trap: a Criteo-prepared row holds ids, not the raw hex values; each
    id scores as missing, and now every such feature is counted (a hashed feature may give
    an id's text a bucket training filled: it cannot be told)."""
    model = load_export(run["out"])
    row = {**{f: i + 1 for i, f in enumerate(model.features)}, "dense": [0.0] * 13}
    counts = {}
    model.predict([row], unseen=counts)
    assert set(model.features) - {f"sparse_{HASHED}"} <= set(counts) and set(counts.values()) == {1}, counts


def test_dlrm_predict_reports_unseen_values_and_strict_names_the_line(run, tmp_path, capsys):
    model = load_export(run["out"])
    row = known_row(run)
    rows = [row, {**row, "sparse_3": "zzzz_unknown"}, {**row, "sparse_3": "also-new", "sparse_7": "x"}]
    columns = {f: pa.array([r[f] for r in rows], pa.string()) for f in model.features}
    columns |= {f"dense_{j}": pa.array([float(np.expm1(r["dense"][j])) for r in rows]) for j in range(13)}
    source = tmp_path / "rows.csv"
    pcsv.write_csv(pa.table(columns), source)
    out = tmp_path / "p.csv"
    assert main(["dlrm", "predict", str(run["out"]), "--input", str(source), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "values the vocabulary never saw, scored as missing: sparse_3 2, sparse_7 1 (of 3 rows" in printed, printed
    assert "--strict refuses them" in printed
    strict = tmp_path / "s.csv"
    assert main(["dlrm", "predict", str(run["out"]), "--input", str(source), "--out", str(strict), "--strict",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{source}:3: sparse_3 value 'zzzz_unknown' is not in the export's " \
                                   f"vocabulary; --strict refuses it" in err, err
    assert not strict.exists()


def test_a_value_in_a_hash_bucket_training_never_filled_is_counted(run):
    """A hashed feature (more values than --max-ids-per-feature) maps any value to a bucket;
    one whose bucket training never filled (or kept, under --min-count) takes id 0 and is
    counted; one in a kept bucket cannot be told from the values training saw there."""
    model = load_export(run["out"])
    feature = f"sparse_{HASHED}"
    lookup = model.lookups[model.features.index(feature)]
    assert lookup.hashed
    candidates = [f"new-{i}" for i in range(2000)]
    ids = lookup.ids(candidates)
    empty = [v for v, i in zip(candidates, ids) if i == 0]
    filled = [v for v, i in zip(candidates, ids) if i != 0]
    assert empty and filled
    row = {**known_row(run), feature: empty[0]}
    counts = {}
    model.predict([row, {**row, feature: filled[0]}], dense_prepared=True, unseen=counts)
    assert counts == {feature: 1}
