"""Synthetic Criteo-shaped generator: deterministic, in range, Zipf-skewed, learnable labels."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.data.ctr_format import load_id_frequencies, read_meta
from embcache.data.synthetic import generate_synthetic, roc_auc

# Criteo Kaggle's published cardinalities (the input the generator scales)
KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
          5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def read_split(d, split):
    meta = read_meta(d)
    return pa.concat_tables([pq.read_table(d / f) for f in meta["splits"][split]["files"]])


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    generate_synthetic(d, rows=40_000, scale=0.002, seed=7, chunk_rows=16_384)
    return d


def pairwise_auc(scores, labels, n=3000, seed=0):
    """AUC by direct comparison of every (positive, negative) pair on a subsample."""
    idx = np.random.default_rng(seed).permutation(len(scores))[:n]
    s, y = scores[idx], labels[idx].astype(bool)
    diff = s[y][:, None] - s[~y][None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def test_shape_cardinalities_and_ids_in_range(synth):
    meta = read_meta(synth)
    assert meta["num_dense"] == 13 and len(meta["sparse"]) == 26
    expected = [max(2, int(round(c * 0.002))) for c in KAGGLE]
    assert [f["cardinality"] for f in meta["sparse"]] == expected
    assert meta["splits"]["train"]["rows"] == 40_000
    assert meta["splits"]["val"]["rows"] == meta["splits"]["test"]["rows"] == 4_000
    t = read_split(synth, "train")
    for f, card in zip(meta["sparse"], expected):
        ids = t.column(f["name"]).to_numpy()
        assert ids.min() >= 0 and ids.max() < card, f["name"]
    dense = np.stack([t.column(f"dense_{j}").to_numpy() for j in range(13)], 1)
    assert dense.dtype == np.float32 and (dense >= 0).all() and np.isfinite(dense).all()


def test_same_seed_same_bytes_other_seed_other_data(synth, tmp_path):
    generate_synthetic(tmp_path / "a", rows=40_000, scale=0.002, seed=7, chunk_rows=16_384)
    generate_synthetic(tmp_path / "b", rows=40_000, scale=0.002, seed=8, chunk_rows=16_384)
    for split in ("train", "val", "test"):
        assert read_split(tmp_path / "a", split).equals(read_split(synth, split))
    assert not read_split(tmp_path / "b", "train").equals(read_split(synth, "train"))


def test_zipf_skew_and_hot_ids_are_scattered(synth):
    meta = read_meta(synth)
    freq = load_id_frequencies(synth)
    big = [f["name"] for f in meta["sparse"] if f["cardinality"] >= 1000]
    assert len(big) >= 4
    for name in big:
        counts = np.sort(freq[name].numpy())[::-1]
        top = counts[: len(counts) // 100].sum() / counts.sum()
        assert top > 0.3, f"{name}: top 1% of ids carry only {top:.1%} of occurrences"
        hottest = np.argsort(freq[name].numpy())[::-1][:20]
        assert not set(hottest) <= set(range(40)), f"{name}: hot ids are simply the smallest ids"


def test_labels_are_learnable_and_base_rate_is_controlled(synth):
    meta = read_meta(synth)
    assert meta["oracle_auc"] > 0.7 and meta["oracle_auc_test"] > 0.7
    train, val = read_split(synth, "train"), read_split(synth, "val")
    y_train, y_val = train.column("label").to_numpy(), val.column("label").to_numpy()
    assert 0.2 < y_train.mean() < 0.3
    # Learnability from the data alone: naive Bayes on per-id click rates counted over train.
    prior = y_train.mean()
    score = np.zeros(len(y_val))
    for f in meta["sparse"]:
        ids_t, ids_v = train.column(f["name"]).to_numpy(), val.column(f["name"]).to_numpy()
        clicks = np.bincount(ids_t, weights=y_train, minlength=f["cardinality"])
        seen = np.bincount(ids_t, minlength=f["cardinality"])
        rate = (clicks + 20 * prior) / (seen + 20)
        score += np.log(rate[ids_v] / (1 - rate[ids_v]))
    learned = pairwise_auc(score, y_val)
    assert 0.6 < learned <= meta["oracle_auc"] + 0.03


def test_roc_auc_against_pairwise_count():
    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=500), 1)  # many ties
    labels = rng.random(500) < 1 / (1 + np.exp(-2 * scores))
    s, y = scores, labels
    diff = s[y][:, None] - s[~y][None, :]
    assert roc_auc(scores, labels) == pytest.approx(((diff > 0) + 0.5 * (diff == 0)).mean())
    assert np.isnan(roc_auc(scores, np.zeros(500, bool)))


def test_default_size_generates_quickly(tmp_path):
    import time

    t0 = time.perf_counter()
    meta = generate_synthetic(tmp_path, seed=0)  # the main job's default: 200k rows, scale 0.1
    elapsed = time.perf_counter() - t0
    assert meta["splits"]["train"]["rows"] == 200_000
    assert elapsed < 30, f"default synthetic set took {elapsed:.1f}s"


def test_label_bookkeeping_does_not_grow_with_the_training_rows(tmp_path, monkeypatch):
    """Train labels are only counted; val/test keep two arrays sized once by their row count.
    Python-side memory seen at each chunk write stays flat over 256 training chunks."""
    import tracemalloc

    from embcache.data import synthetic

    seen = []
    real_write = synthetic.CTRDatasetWriter.write

    def write(self, split, label, dense, sparse):
        real_write(self, split, label, dense, sparse)
        if split == "train":
            seen.append(tracemalloc.get_traced_memory()[0])

    monkeypatch.setattr(synthetic.CTRDatasetWriter, "write", write)
    tracemalloc.start()
    try:
        meta = generate_synthetic(tmp_path, rows=262_144, scale=0.0005, seed=1, val_rows=3_000, test_rows=3_000,
                                  chunk_rows=1_024)
    finally:
        tracemalloc.stop()
    assert len(seen) == 256
    growth = max(seen[128:]) - min(seen[1:8])
    assert growth < 64_000, f"memory grew by {growth} bytes over 256 chunks of 1,024 labels"
    # what the bookkeeping reports is still right: label rates match the written labels
    for split in ("train", "val", "test"):
        labels = read_split(tmp_path, split).column("label").to_numpy()
        assert meta["label_rate"][split] == pytest.approx(labels.mean(), abs=1e-12)
    assert 0.7 < meta["oracle_auc"] < 1 and 0.7 < meta["oracle_auc_test"] < 1
