"""The synthetic generator day by day: day splits, drift (new values each day, old ones fading),
raw keys that are the mix64 of the ids of the same data, determinism, and labels that reward
learning the new values. With days off the output is what it always was, bit for bit."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embcache.cli import main
from embcache.data.ctr_format import day_splits, is_raw_keys, load_id_frequencies, load_key_frequencies, read_meta
from embcache.data.loader import CTRBatches
from embcache.data.synthetic import generate_synthetic, roc_auc
from embcache.keys import mix64

DAYS, DRIFT, ROWS = 4, 0.2, 10_000
ARGS = dict(rows=ROWS, scale=0.002, seed=4, days=DAYS, drift=DRIFT, chunk_rows=4096)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same days written with ids and with raw keys."""
    root = tmp_path_factory.mktemp("days")
    generate_synthetic(root / "ids", **ARGS)
    generate_synthetic(root / "raw", keys="raw", **ARGS)
    return root / "ids", root / "raw"


def day_table(d, split):
    meta = read_meta(d)
    return pa.concat_tables([pq.read_table(d / f) for f in meta["splits"][split]["files"]])


def tensor(column) -> torch.Tensor:
    return torch.from_numpy(column.to_numpy().copy())


def features_with_values(meta, least):
    return [f["name"] for f in meta["sparse"] if f["cardinality"] >= least]


def test_day_splits_and_their_rows(both):
    ids, raw = both
    meta = read_meta(ids)
    names = [f"day_{d}" for d in range(DAYS)]
    assert list(meta["splits"]) == names and day_splits(meta) == names
    assert [d["rows"] for d in meta["day_splits"]] == [ROWS] * DAYS
    assert all(meta["splits"][n]["rows"] == ROWS for n in names)
    assert meta["generator"]["days"] == DAYS and meta["generator"]["drift"] == DRIFT
    batches = list(CTRBatches(ids, "day_2", 4096))  # any split opens by name
    assert sum(len(b) for b in batches) == ROWS and [len(b) for b in batches] == [4096, 4096, 1808]
    assert not is_raw_keys(meta) and is_raw_keys(read_meta(raw))


def test_a_fraction_drift_of_each_days_values_is_new(both):
    ids, _ = both
    meta = read_meta(ids)
    seen = {name: set() for name in features_with_values(meta, 1)}
    pooled = []
    for d in range(DAYS):
        table = day_table(ids, f"day_{d}")
        new_total = distinct_total = 0
        for name, earlier in seen.items():
            values = set(np.unique(table.column(name).to_numpy()).tolist())
            new = len(values - earlier)
            if d and len(values) >= 100:  # stochastic rounding: off by less than one value
                assert abs(new / len(values) - DRIFT) < 1.0 / len(values) + 1e-9, (d, name)
            new_total, distinct_total = new_total + new, distinct_total + len(values)
            earlier |= values
        pooled.append(new_total / distinct_total)
        assert new_total == (meta["day_splits"][d]["new_values"] if d else distinct_total)
    assert pooled[0] == 1.0 and all(abs(p - DRIFT) < 0.01 for p in pooled[1:]), pooled


def test_old_values_fade(both):
    ids, _ = both
    meta = read_meta(ids)
    names = features_with_values(meta, 1000)
    assert len(names) >= 4
    day0 = {n: np.unique(day_table(ids, "day_0").column(n).to_numpy()) for n in names}
    shares, traffic = [], []
    for d in range(DAYS):
        table = day_table(ids, f"day_{d}")
        in_day0 = [np.isin(table.column(n).to_numpy(), day0[n]) for n in names]
        traffic.append(float(np.mean(in_day0)))
        shares.append(float(np.mean([np.isin(np.unique(table.column(n).to_numpy()), day0[n]).mean() for n in names])))
    # distinct day-0 values shrink about as (1 - drift)**day; their traffic shrinks too
    assert all(a > b for a, b in zip(shares, shares[1:])), shares
    assert all(abs(s - (1 - DRIFT) ** d) < 0.03 for d, s in enumerate(shares)), shares
    assert traffic[0] == 1.0 and traffic[-1] < 0.8, traffic


def test_raw_keys_are_mix64_of_the_ids_of_the_same_data(both):
    ids, raw = both
    meta_ids, meta_raw = read_meta(ids), read_meta(raw)
    for d in range(DAYS):
        a, b = day_table(ids, f"day_{d}"), day_table(raw, f"day_{d}")
        assert a.select(["label"] + [f"dense_{j}" for j in range(13)]).equals(
            b.select(["label"] + [f"dense_{j}" for j in range(13)]))
        for f, feature in enumerate(meta_ids["sparse"]):
            expected = mix64(((f + 1) << 40) | tensor(a.column(feature["name"])))
            assert torch.equal(tensor(b.column(feature["name"])), expected), (d, f)
    keys = np.concatenate([day_table(raw, f"day_{d}").column("sparse_2").to_numpy() for d in range(DAYS)])
    assert keys.min() < -(1 << 60) and keys.max() > 1 << 60  # spread over the whole int64 range
    # ids: cardinality counts every value of every day; raw: the distinct keys counted
    assert [f["cardinality"] for f in meta_raw["sparse"]] == [
        len(np.unique(np.concatenate([day_table(ids, f"day_{d}").column(f["name"]).to_numpy() for d in range(DAYS)])))
        for f in meta_ids["sparse"]]
    assert all(fi["cardinality"] >= fr["cardinality"] for fi, fr in zip(meta_ids["sparse"], meta_raw["sparse"]))


def test_per_day_key_counts(both):
    ids, raw = both
    for d in (0, 3):
        table = day_table(raw, f"day_{d}")
        day_counts = load_key_frequencies(raw, f"day_{d}")
        for name in ("sparse_0", "sparse_11"):
            keys, counts = np.unique(table.column(name).to_numpy(), return_counts=True)
            assert day_counts[name][0].tolist() == keys.tolist() and day_counts[name][1].tolist() == counts.tolist()
        id_counts = load_key_frequencies(ids, f"day_{d}")["sparse_2"]
        values, counts = np.unique(day_table(ids, f"day_{d}").column("sparse_2").to_numpy(), return_counts=True)
        assert id_counts[0].tolist() == values.tolist() and id_counts[1].tolist() == counts.tolist()
    # the frequency file counts every day
    every = np.concatenate([day_table(ids, f"day_{d}").column("sparse_2").to_numpy() for d in range(DAYS)])
    dense = load_id_frequencies(ids)["sparse_2"]
    assert dense.tolist() == np.bincount(every, minlength=len(dense)).tolist()
    keys, counts = load_key_frequencies(raw)["sparse_2"]
    assert int(counts.sum()) == DAYS * ROWS and len(keys) == len(np.unique(every))


def test_same_seed_same_days_other_seed_other_days(both, tmp_path):
    ids, _ = both
    generate_synthetic(tmp_path / "a", **ARGS)
    generate_synthetic(tmp_path / "b", **{**ARGS, "seed": 5})
    for d in range(DAYS):
        assert day_table(tmp_path / "a", f"day_{d}").equals(day_table(ids, f"day_{d}"))
    assert not day_table(tmp_path / "b", "day_1").equals(day_table(ids, "day_1"))
    assert read_meta(tmp_path / "a")["day_splits"] == read_meta(ids)["day_splits"]


def naive_bayes_auc(train: pa.Table, test: pa.Table, names: list[str], vocabulary: dict | None = None) -> float:
    """AUC on `test` of per-value click rates counted on `train` (smoothed toward the mean);
    with `vocabulary`, a value outside it shares one row with every other such value."""
    y, y_test = train.column("label").to_numpy(), test.column("label").to_numpy()
    prior, score = y.mean(), np.zeros(len(y_test))
    for name in names:
        v, v_test = train.column(name).to_numpy(), test.column(name).to_numpy()
        if vocabulary is not None:
            v = np.where(np.isin(v, vocabulary[name]), v, -1)
            v_test = np.where(np.isin(v_test, vocabulary[name]), v_test, -1)
        keys, inverse = np.unique(np.concatenate([v, v_test]), return_inverse=True)
        clicks = np.bincount(inverse[:len(v)], weights=y, minlength=len(keys))
        seen = np.bincount(inverse[:len(v)], minlength=len(keys))
        rate = (clicks + 20 * prior) / (seen + 20)
        score += np.log(rate[inverse[len(v):]] / (1 - rate[inverse[len(v):]]))
    return roc_auc(score, y_test)


def test_learning_the_new_values_pays(both):
    """New values have effects of their own: counting them (an open table) beats a vocabulary
    fixed on day 0, where every later value shares one row (over the features the labels
    depend on: the others only add noise at this size); the generator's oracle AUCs agree."""
    ids, _ = both
    meta = read_meta(ids)
    names = meta["generator"]["informative_features"]
    train = pa.concat_tables([day_table(ids, f"day_{d}") for d in range(DAYS - 1)])
    test = day_table(ids, f"day_{DAYS - 1}")
    day0 = day_table(ids, "day_0")
    open_auc = naive_bayes_auc(train, test, names)
    closed_auc = naive_bayes_auc(train, test, names, {n: np.unique(day0.column(n).to_numpy()) for n in names})
    assert open_auc > closed_auc + 0.01, (open_auc, closed_auc)
    for day in meta["day_splits"][1:]:
        assert day["oracle_auc"] > day["oracle_auc_new_unknown"] + 0.005
        assert day["oracle_auc_new_unknown"] >= day["oracle_auc_day0_values_only"] - 1e-12
    last = meta["day_splits"][-1]
    assert last["oracle_auc"] > last["oracle_auc_day0_values_only"] + 0.02


def content_digest(d) -> str:
    """sha256 of meta.json's bytes, every shard's columns (decoded, so no Parquet writer version
    enters) and the frequency file's arrays."""
    meta = json.loads((d / "meta.json").read_text())
    # meta.json's bytes as written before shards carried checksums (the data's bytes are hashed below)
    h = hashlib.sha256((json.dumps({k: v for k, v in meta.items() if k != "shard_crc32"}, indent=1) + "\n").encode())
    for split in sorted(meta["splits"]):
        for rel in meta["splits"][split]["files"]:
            table = pq.read_table(d / rel)
            for name in table.column_names:
                h.update(name.encode())
                h.update(np.ascontiguousarray(table.column(name).to_numpy()).tobytes())
    with np.load(d / meta["id_frequency_file"]) as z:
        for name in sorted(z.files):
            h.update(name.encode())
            h.update(z[name].tobytes())
    return h.hexdigest()


# the digest of this configuration's output as the generator wrote it before days existed
# (commit 891471b on main), so days off must keep every byte of the data and of meta.json
DAYS_OFF_DIGEST = "f89610fe53d084b8507954f5c54d704f15762c5f8914d73d756f3cf269525ac8"


def test_days_off_output_is_unchanged(tmp_path):
    generate_synthetic(tmp_path, rows=3000, scale=0.001, seed=5, chunk_rows=1024, rows_per_shard=1500)
    assert content_digest(tmp_path) == DAYS_OFF_DIGEST


def test_raw_keys_without_days(tmp_path):
    """Days off with raw keys: the default data, each id replaced by its key."""
    generate_synthetic(tmp_path / "ids", rows=2000, scale=0.001, seed=1)
    meta = generate_synthetic(tmp_path / "raw", rows=2000, scale=0.001, seed=1, keys="raw")
    assert meta["keys"] == "raw" and list(meta["splits"]) == ["train", "val", "test"]
    a, b = day_table(tmp_path / "ids", "val"), day_table(tmp_path / "raw", "val")
    assert torch.equal(tensor(b.column("sparse_5")), mix64((6 << 40) | tensor(a.column("sparse_5"))))
    assert b.column("label").equals(a.column("label"))


def test_synthetic_days_command(tmp_path, capsys):
    assert main(["data", "synthetic", "--out", str(tmp_path / "o"), "--rows", "500", "--scale", "0.001",
                 "--days", "3", "--keys", "raw", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "3 day splits, day_0..day_2; drift 0.1" in out and "raw 64-bit keys" in out
    meta = read_meta(tmp_path / "o")
    assert meta["generator"]["drift"] == 0.1 and day_splits(meta) == ["day_0", "day_1", "day_2"]
    assert meta["splits"]["day_1"]["rows"] == 500
    assert main(["data", "info", str(tmp_path / "o"), "--head", "2"]) == 0  # no train split: day_0's rows
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and rows[0]["sparse_3"] == day_table(tmp_path / "o", "day_0").column("sparse_3")[0].as_py()
