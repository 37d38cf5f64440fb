"""Canonical CTR format and its batch loader: every row once per epoch, right KJT layout,
exact resume, deterministic shard order, bounded memory, clear errors for bad shards."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embcache.errors import DataFormatError
from embcache.data.ctr_format import (
    CTRDatasetWriter,
    SparseFeature,
    is_raw_keys,
    load_id_frequencies,
    load_key_frequencies,
    multi_hot,
    read_meta,
)
from embcache.data.loader import CTRBatches, lookahead
from tests.shard_edit import write_shard

N = 23  # rows of train: not a multiple of the shard, row-group or batch sizes below
FEATURES = [SparseFeature("sparse_0", 5), SparseFeature("sparse_1", 7), SparseFeature("sparse_2", 4, multi_hot=True)]


def row_lists(n, start=0):
    """Row r (global index g=start+r) holds g in dense_0 and ids derived from g, so that
    every value in a batch says which row it came from."""
    g = np.arange(start, start + n)
    lists = [[(g_ + k) % 4 for k in range(g_ % 3)] for g_ in g]  # 0, 1 or 2 genres
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    values = np.array([v for x in lists for v in x], dtype=np.int64)
    return g, (g % 2), np.stack([g, -g], 1).astype(np.float32), [g % 5, (3 * g) % 7, multi_hot(offsets, values)], lists


@pytest.fixture
def data(tmp_path):
    w = CTRDatasetWriter(tmp_path, 2, FEATURES, source="test", rows_per_shard=7, row_group_rows=3)
    for start, n in ((0, 10), (10, 13)):  # two chunks: a shard spans a chunk boundary
        _, label, dense, sparse, _ = row_lists(n, start)
        w.write("train", label, dense, sparse)
    _, label, dense, sparse, _ = row_lists(4, 100)
    w.write("val", label, dense, sparse)
    w.finish(bad_rows={"x.txt": {"count": 0}}, note="hello")
    return tmp_path


def rows_of(batches):
    return np.concatenate([b.dense[:, 0].numpy() for b in batches]).astype(np.int64)


def test_meta_describes_what_was_written(data):
    meta = json.loads((data / "meta.json").read_text())
    assert meta["format"] == "embcache-ctr" and meta["version"] == 1 and meta["num_dense"] == 2
    assert meta["sparse"] == [{"name": "sparse_0", "cardinality": 5, "multi_hot": False},
                              {"name": "sparse_1", "cardinality": 7, "multi_hot": False},
                              {"name": "sparse_2", "cardinality": 4, "multi_hot": True}]
    # 23 rows at 7 per shard -> 7, 7, 7, 2
    assert meta["splits"]["train"] == {"files": [f"train/part-0000{k}.parquet" for k in range(4)], "rows": 23}
    assert meta["splits"]["val"] == {"files": ["val/part-00000.parquet"], "rows": 4}
    assert meta["splits"]["test"] == {"files": [], "rows": 0}
    assert meta["id_frequency_file"] == "id_freq.npz" and meta["note"] == "hello"
    assert [pq.ParquetFile(data / f).metadata.num_rows for f in meta["splits"]["train"]["files"]] == [7, 7, 7, 2]
    table = pq.read_table(data / "train/part-00000.parquet")
    assert table.schema.field("label").type == pa.int8()
    assert table.schema.field("dense_1").type == pa.float32()
    assert table.schema.field("sparse_0").type == pa.int64()
    assert table.schema.field("sparse_2").type == pa.list_(pa.int64())
    assert table.column("sparse_2").to_pylist()[:4] == [[], [1], [2, 3], []]


def test_id_frequencies_count_the_train_split_only(data):
    freq = load_id_frequencies(data)
    g = np.arange(N)
    assert freq["sparse_0"].dtype == torch.int64
    assert freq["sparse_0"].tolist() == [int((g % 5 == k).sum()) for k in range(5)]
    assert freq["sparse_1"].tolist() == [int(((3 * g) % 7 == k).sum()) for k in range(7)]
    genres = [(x + k) % 4 for x in g for k in range(x % 3)]
    assert freq["sparse_2"].tolist() == [genres.count(k) for k in range(4)]


def test_every_row_exactly_once_and_kjt_layout(data):
    batches = CTRBatches(data, "train", batch_size=4)
    assert len(batches) == 6  # 23 rows -> 5 full batches and one of 3
    seen = list(batches)
    assert [len(b) for b in seen] == [4, 4, 4, 4, 4, 3]
    assert rows_of(seen).tolist() == list(range(N))
    _, label, dense, _, lists = row_lists(N)
    b = seen[1]  # rows 4..7
    assert b.dense.dtype == torch.float32 and b.dense.shape == (4, 2)
    assert b.labels.dtype == torch.float32 and b.labels.tolist() == label[4:8].tolist()
    kjt = b.sparse
    assert kjt.keys() == ["sparse_0", "sparse_1", "sparse_2"] and kjt.stride() == 4
    by_key = kjt.to_dict()
    assert by_key["sparse_0"].lengths().tolist() == [1, 1, 1, 1]
    assert by_key["sparse_0"].values().tolist() == [4, 0, 1, 2]
    assert by_key["sparse_1"].values().tolist() == [(3 * r) % 7 for r in range(4, 8)]
    assert by_key["sparse_2"].lengths().tolist() == [len(lists[r]) for r in range(4, 8)]
    assert by_key["sparse_2"].values().tolist() == [v for r in range(4, 8) for v in lists[r]]


def test_drop_last_and_batch_larger_than_split(data):
    assert [len(b) for b in CTRBatches(data, "train", 4, drop_last=True)] == [4] * 5
    assert len(CTRBatches(data, "train", 4, drop_last=True)) == 5
    big = list(CTRBatches(data, "train", 100))
    assert len(big) == 1 and rows_of(big).tolist() == list(range(N))
    assert list(CTRBatches(data, "train", 100, drop_last=True)) == []
    assert list(CTRBatches(data, "test", 4)) == [] and len(CTRBatches(data, "test", 4)) == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_gives_the_same_remaining_batches(data, shuffle):
    full = list(CTRBatches(data, "train", 4, shuffle_shards=shuffle, seed=3))
    for start in range(len(full) + 2):
        rest = CTRBatches(data, "train", 4, shuffle_shards=shuffle, seed=3, start_batch=start)
        assert len(rest) == max(len(full) - start, 0)
        got = list(rest)
        assert len(got) == len(rest)
        for a, b in zip(got, full[start:]):
            assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
            assert torch.equal(a.sparse.values(), b.sparse.values())
            assert torch.equal(a.sparse.lengths(), b.sparse.lengths())
    skipped = CTRBatches(data, "train", 4, shuffle_shards=shuffle, seed=3).skip(2).skip(1)
    assert rows_of(skipped).tolist() == rows_of(full[3:]).tolist()


def test_shard_shuffle_is_a_seeded_permutation(data):
    orders = {seed: tuple(rows_of(CTRBatches(data, "train", 5, shuffle_shards=True, seed=seed)))
              for seed in range(8)}
    for order in orders.values():
        assert sorted(order) == list(range(N))
    assert len(set(orders.values())) > 1  # the seed matters (4 shards: 24 possible orders)
    again = tuple(rows_of(CTRBatches(data, "train", 5, shuffle_shards=True, seed=5)))
    assert again == orders[5]
    # rows within a shard stay together and in order
    first = orders[5]
    assert list(first[:7]) == list(range(first[0], first[0] + 7)) or first[0] == 21


def test_lookahead_pairs_each_batch_with_the_next(data):
    batches = CTRBatches(data, "train", 4)
    pairs = list(batches.with_next())
    assert len(pairs) == 6 and pairs[-1][1] is None
    for (a, nxt), (b, _) in zip(pairs, pairs[1:]):
        assert torch.equal(nxt.dense, b.dense)
    assert list(lookahead([])) == [] and list(lookahead([1])) == [(1, None)]


def test_memory_is_bounded_by_read_size_not_file_size(tmp_path):
    n = 300_000
    w = CTRDatasetWriter(tmp_path, 2, [SparseFeature("sparse_0", 1000)], source="t", row_group_rows=8192)
    rng = np.random.default_rng(0)
    w.write("train", rng.integers(0, 2, n), rng.random((n, 2)), [rng.integers(0, 1000, n)])
    w.finish()
    decoded = n * (1 + 2 * 4 + 8)
    before, peak, rows = pa.total_allocated_bytes(), 0, 0
    for batch in CTRBatches(tmp_path, "train", 1000, read_rows=4096):
        peak = max(peak, pa.total_allocated_bytes() - before)
        rows += len(batch)
    assert rows == n
    assert peak < decoded / 5, f"arrow held {peak} bytes while reading a {decoded}-byte split"


def _write_raw(path, **columns):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(pa.table(columns), path)


def test_out_of_range_id_names_file_and_row(data):
    meta = read_meta(data)
    bad = data / meta["splits"]["val"]["files"][0]
    _write_raw(bad, label=pa.array([0, 1, 0], pa.int8()), dense_0=pa.array([0, 0, 0], pa.float32()),
               dense_1=pa.array([0, 0, 0], pa.float32()), sparse_0=pa.array([1, 2, 3]),
               sparse_1=pa.array([0, 9, 0]), sparse_2=pa.array([[], [], []], pa.list_(pa.int64())))
    with pytest.raises(DataFormatError, match=r"val/part-00000\.parquet: row 1: sparse_1 id 9 outside \[0, 7\)"):
        list(CTRBatches(data, "val", 2))
    _write_raw(bad, label=pa.array([0, 1], pa.int8()), dense_0=pa.array([0, 0], pa.float32()),
               dense_1=pa.array([0, 0], pa.float32()), sparse_0=pa.array([1, 2]),
               sparse_1=pa.array([0, 1]), sparse_2=pa.array([[0], [1, -1]], pa.list_(pa.int64())))
    with pytest.raises(DataFormatError, match=r"row 1: sparse_2 id -1 outside \[0, 4\)"):
        list(CTRBatches(data, "val", 2))
    _write_raw(bad, label=pa.array([0, 1], pa.int8()))
    with pytest.raises(DataFormatError, match=r"val/part-00000\.parquet: lacks column\(s\) dense_0"):
        list(CTRBatches(data, "val", 2))


def test_read_meta_refuses_bad_directories(tmp_path, data):
    with pytest.raises(DataFormatError, match="meta.json: missing"):
        read_meta(tmp_path / "nothing")
    (data / "train/part-00002.parquet").unlink()
    with pytest.raises(DataFormatError, match=r"lists train/part-00002\.parquet .* missing"):
        read_meta(data)
    (data / "meta.json").write_text('{"format": "something-else"}')
    with pytest.raises(DataFormatError, match="not an embcache-ctr meta.json"):
        read_meta(data)
    (data / "meta.json").write_text('{"format": ')
    with pytest.raises(DataFormatError, match="not JSON"):
        read_meta(data)
    with pytest.raises(DataFormatError, match="not JSON"):
        CTRBatches(data, "train", 4)


def test_writer_rejects_out_of_range_ids(tmp_path):
    w = CTRDatasetWriter(tmp_path, 0, [SparseFeature("sparse_0", 3)], source="t")
    with pytest.raises(ValueError, match=r"sparse_0: ids in \[0, 3\] outside \[0, 3\)"):
        w.write("train", [0, 1], np.zeros((2, 0)), [np.array([0, 3])])
    assert not (tmp_path / "meta.json").exists()  # nothing looks complete


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_writer_refuses_shard_and_row_group_sizes_below_one(tmp_path, bad):
    with pytest.raises(ValueError, match=r"rows_per_shard must be a whole number >= 1"):
        CTRDatasetWriter(tmp_path, 1, FEATURES[:1], source="t", rows_per_shard=bad)
    with pytest.raises(ValueError, match=r"row_group_rows must be a whole number >= 1"):
        CTRDatasetWriter(tmp_path, 1, FEATURES[:1], source="t", row_group_rows=bad)


@pytest.mark.parametrize("codec", ["lz4", "zstd", "none"])
def test_shards_are_written_with_the_asked_codec_and_read_alike(tmp_path, data, codec):
    """lz4 by default (decoding bounds the loader: `bench/shard_codecs.py`); every codec
    gives the loader the same batches, and a codec Parquet lacks is refused up front."""
    out = tmp_path / codec
    w = CTRDatasetWriter(out, 2, FEATURES, source="t", rows_per_shard=7, row_group_rows=3,
                         **({} if codec == "lz4" else {"compression": codec}))
    for start, n in ((0, 10), (10, 13)):
        _, label, dense, sparse, _ = row_lists(n, start)
        w.write("train", label, dense, sparse)
    meta = w.finish()
    chunk = pq.ParquetFile(out / meta["splits"]["train"]["files"][0]).metadata.row_group(0).column(3)
    assert chunk.compression == {"lz4": "LZ4", "zstd": "ZSTD", "none": "UNCOMPRESSED"}[codec]
    for got, want in zip(CTRBatches(out, "train", 4), CTRBatches(data, "train", 4), strict=True):
        assert torch.equal(got.dense, want.dense) and torch.equal(got.labels, want.labels)
        assert torch.equal(got.sparse.values(), want.sparse.values())
        assert torch.equal(got.sparse.lengths(), want.sparse.lengths())
    with pytest.raises(ValueError, match=r"compression must be one of \('lz4', 'zstd', 'snappy', 'none'\), got 'gz9'"):
        CTRDatasetWriter(tmp_path / "bad", 2, FEATURES, source="t", compression="gz9")


def test_interleaved_splits_fill_their_own_shards(tmp_path):
    """Writes alternate between splits (as a random split does): each split's shards still
    hold rows_per_shard rows, in the order that split's rows were written."""
    w = CTRDatasetWriter(tmp_path, 1, FEATURES[:1], source="t", rows_per_shard=5)
    sent = {"train": [], "val": []}
    for k in range(12):  # train 3 rows, val 1 row, train 3, val 1, ...
        split, n = ("train", 3) if k % 2 == 0 else ("val", 1)
        g = np.arange(100 * k, 100 * k + n)
        w.write(split, g % 2, g[:, None].astype(np.float32), [g % 5])
        sent[split] += g.tolist()
    meta = w.finish()
    for split, rows in sent.items():
        files = meta["splits"][split]["files"]
        sizes = [pq.ParquetFile(tmp_path / f).metadata.num_rows for f in files]
        assert sizes == [5] * (len(rows) // 5) + ([len(rows) % 5] if len(rows) % 5 else []), split
        got = pa.concat_tables([pq.read_table(tmp_path / f) for f in files])
        assert got.column("dense_0").to_pylist() == rows
        assert rows_of(CTRBatches(tmp_path, split, 4)).tolist() == rows


def test_damaged_shard_is_one_line_naming_it(data):
    """A shard whose footer is intact but whose data pages are damaged fails while reading
    rows, not when opened: still one line naming the shard."""
    meta = read_meta(data)
    path = data / meta["splits"]["train"]["files"][1]
    n = 4000
    rng = np.random.default_rng(0)
    _write_raw(path, label=pa.array(rng.integers(0, 2, n).astype(np.int8)),
               dense_0=pa.array(rng.random(n).astype(np.float32)), dense_1=pa.array(rng.random(n).astype(np.float32)),
               sparse_0=pa.array(rng.integers(0, 5, n)), sparse_1=pa.array(rng.integers(0, 7, n)),
               sparse_2=pa.array([[1]] * n, pa.list_(pa.int64())))
    column = pq.ParquetFile(path).metadata.row_group(0).column(1)  # dense_0
    raw = bytearray(path.read_bytes())
    start = column.data_page_offset + 20
    raw[start: column.data_page_offset + column.total_compressed_size - 4] = \
        bytes(column.total_compressed_size - 24)
    path.write_bytes(bytes(raw))
    pq.ParquetFile(path)  # still opens
    with pytest.raises(DataFormatError, match=r"train/part-00001\.parquet: corrupt Parquet shard, row group 0"):
        list(CTRBatches(data, "train", 4))  # the file's CRC-32, on opening
    meta = json.loads((data / "meta.json").read_text())
    del meta["shard_crc32"]  # data prepared before the checksums: the damage is met while reading
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"train/part-00001\.parquet: cannot read Parquet shard") as err:
        list(CTRBatches(data, "train", 4))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("column,values,kind", [
    ("sparse_1", pa.array([0.0, 6.9], pa.float64()), "double"),
    ("sparse_1", pa.array(["0", "6"]), "string"),
    ("sparse_2", pa.array([[0.5], []], pa.list_(pa.float32())), "list<element: float>"),
    ("label", pa.array(["0", "1"]), "string"),
    ("dense_0", pa.array([1, 2], pa.int64()), "int64"),
])
def test_shard_column_types_are_checked(data, column, values, kind):
    """Float ids would be truncated to ints and string ids fail deep in numpy: the type is
    checked when the shard is opened, and the error names the file and the column."""
    meta = read_meta(data)
    bad = data / meta["splits"]["val"]["files"][0]
    columns = dict(label=pa.array([0, 1], pa.int8()), dense_0=pa.array([0, 0], pa.float32()),
                   dense_1=pa.array([0, 0], pa.float32()), sparse_0=pa.array([1, 2]),
                   sparse_1=pa.array([0, 6]), sparse_2=pa.array([[0], [1]], pa.list_(pa.int64())))
    columns[column] = values
    _write_raw(bad, **columns)
    with pytest.raises(DataFormatError, match=rf"val/part-00000\.parquet: column {column} is ") as err:
        list(CTRBatches(data, "val", 2))
    assert kind in str(err.value) and "\n" not in str(err.value)


def test_shard_types_that_are_accepted(data):
    """bool labels, float64 dense values and int32 ids are fine and read as usual."""
    meta = read_meta(data)
    path = data / meta["splits"]["val"]["files"][0]
    _write_raw(path, label=pa.array([False, True]), dense_0=pa.array([3.0, 4.0]), dense_1=pa.array([0.0, 0.0]),
               sparse_0=pa.array([1, 2], pa.int32()), sparse_1=pa.array([0, 6], pa.int16()),
               sparse_2=pa.array([[0], [1, 3]], pa.list_(pa.int32())))
    meta["splits"]["val"]["rows"] = 2
    meta["shard_crc32"] = read_meta(data)["shard_crc32"]  # the rewritten shard's, as _write_raw recorded it
    (data / "meta.json").write_text(json.dumps(meta))
    (batch,) = list(CTRBatches(data, "val", 2))
    assert batch.labels.tolist() == [0.0, 1.0] and batch.dense[:, 0].tolist() == [3.0, 4.0]
    assert batch.sparse.to_dict()["sparse_1"].values().tolist() == [0, 6]
    assert batch.sparse.to_dict()["sparse_2"].values().tolist() == [0, 1, 3]


# ------------------------------------------------------------------ raw keys
EXTREME = np.array([-(1 << 63), (1 << 63) - 1, 0, -1, 1 << 40, 7], dtype=np.int64)


@pytest.fixture
def raw_data(tmp_path):
    """Raw-key data: keys far outside any cardinality, multi-hot too, a train and a day split
    sharing files."""
    w = CTRDatasetWriter(tmp_path, 1, FEATURES, source="raw", keys="raw", rows_per_shard=4, row_group_rows=3,
                         splits=("train", "val"))
    n = len(EXTREME)
    lists = [EXTREME[: k % 3] for k in range(n)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    sparse = [EXTREME, EXTREME[::-1].copy(), multi_hot(offsets, np.concatenate(lists))]
    w.write("train", np.arange(n) % 2, np.arange(n, dtype=np.float32)[:, None], sparse)
    w.cut()
    w.write("val", [1], [[9.0]], [EXTREME[:1], EXTREME[1:2], multi_hot([0, 1], EXTREME[2:3])])
    w.add_view("day_0", w.splits["train"]["files"], n)
    w.finish()
    return tmp_path, lists


def test_raw_keys_outside_any_cardinality_load(raw_data):
    data, lists = raw_data
    meta = read_meta(data)
    assert is_raw_keys(meta) and meta["keys"] == "raw" and meta["id_frequency_file"] == "key_freq.npz"
    # the cardinality is the distinct keys counted over train (informational)
    assert [f["cardinality"] for f in meta["sparse"]] == [6, 6, 2]
    for split in ("train", "day_0"):
        batches = list(CTRBatches(data, split, 4))
        kjt = [b.sparse.to_dict() for b in batches]
        assert torch.cat([k["sparse_0"].values() for k in kjt]).tolist() == EXTREME.tolist()
        assert torch.cat([k["sparse_1"].values() for k in kjt]).tolist() == EXTREME[::-1].tolist()
        assert torch.cat([k["sparse_2"].values() for k in kjt]).tolist() == np.concatenate(lists).tolist()
    keys, counts = load_key_frequencies(data)["sparse_2"]
    assert keys.tolist() == [-(1 << 63), (1 << 63) - 1] and counts.tolist() == [4, 2]
    keys, counts = load_key_frequencies(data)["sparse_0"]
    assert keys.tolist() == sorted(EXTREME.tolist()) and counts.tolist() == [1] * 6  # train only
    # the same shard declared as ids is refused, naming the file and the row
    meta.pop("keys")
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"train/part-00000\.parquet: row 0: sparse_0 id -9223372036854775808 "
                                              r"outside \[0, 6\)"):
        list(CTRBatches(data, "train", 4))


def test_raw_keys_bad_rows_still_name_file_and_row(raw_data):
    data, _ = raw_data
    meta = read_meta(data)
    bad = data / meta["splits"]["val"]["files"][0]
    _write_raw(bad, label=pa.array([0, 1, 0], pa.int8()), dense_0=pa.array([0, 0, 0], pa.float32()),
               sparse_0=pa.array([1 << 62, -5, 3]), sparse_1=pa.array([0, None, 0], pa.int64()),
               sparse_2=pa.array([[], [], []], pa.list_(pa.int64())))
    meta["splits"]["val"]["rows"] = 3
    meta["shard_crc32"] = read_meta(data)["shard_crc32"]  # the rewritten shard's, as _write_raw recorded it
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"val/part-00000\.parquet: row 1: sparse_1 is null"):
        list(CTRBatches(data, "val", 2))
    _write_raw(bad, label=pa.array([0, 1, 0], pa.int8()), dense_0=pa.array([0, 0, 0], pa.float32()),
               sparse_0=pa.array([1.5, 2.0, 3.0]), sparse_1=pa.array([0, 1, 0]),
               sparse_2=pa.array([[], [], []], pa.list_(pa.int64())))
    with pytest.raises(DataFormatError, match=r"val/part-00000\.parquet: column sparse_0 is double"):
        list(CTRBatches(data, "val", 2))
    with pytest.raises(DataFormatError, match="has no split 'day_9'"):
        CTRBatches(data, "day_9", 2)


def test_writer_views_and_split_names(tmp_path):
    w = CTRDatasetWriter(tmp_path, 0, FEATURES[:1], source="t", splits=("day_0", "day_1"), counted=("day_0", "day_1"),
                         split_counts=True)
    w.write("day_0", [0, 1], np.zeros((2, 0)), [np.array([1, 1])])
    w.end_split("day_0")
    w.write("day_1", [1], np.zeros((1, 0)), [np.array([4])])
    with pytest.raises(ValueError, match="split must be one of"):
        w.write("train", [1], np.zeros((1, 0)), [np.array([4])])
    with pytest.raises(ValueError, match="no written files"):
        w.add_view("both", ["elsewhere.parquet"], 1)
    meta = w.finish()
    assert list(meta["splits"]) == ["day_0", "day_1"] and "keys" not in meta
    assert meta["split_frequency_files"]["day_0"] == {"file": "freq/day_0.npz", "exact": True}
    assert load_id_frequencies(tmp_path)["sparse_0"].tolist() == [0, 2, 0, 0, 1]  # every counted split
    keys, counts = load_key_frequencies(tmp_path, "day_1")["sparse_0"]
    assert keys.tolist() == [4] and counts.tolist() == [1]
    with pytest.raises(DataFormatError, match="no counts of split 'train'"):
        load_key_frequencies(tmp_path, "train")
    with pytest.raises(ValueError, match="identifiers"):
        CTRDatasetWriter(tmp_path / "x", 0, FEATURES[:1], source="t", splits=("../up",))
