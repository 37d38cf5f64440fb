"""CTRBatches under several ranks (`part`): the ranks' slices put together are the batches one
process reads, each rank checks and converts only its own rows and reads only the row groups
holding them, and a bad row is reported by its rank with the file and row one process names."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import embcache.data.loader as loader_module
from embcache.data.ctr_format import CTRDatasetWriter, read_meta
from embcache.data.loader import CTRBatches
from embcache.errors import DataFormatError
from embcache.partition import slice_bounds
from tests.test_data_loader import FEATURES, N, row_lists
from tests.shard_edit import write_shard


@pytest.fixture
def data(tmp_path):
    """23 train rows in shards of 7, 7, 7, 2 rows; row groups of 3 rows (3, 3, 1 in a 7-row shard)."""
    w = CTRDatasetWriter(tmp_path, 2, FEATURES, source="test", rows_per_shard=7, row_group_rows=3)
    _, label, dense, sparse, _ = row_lists(N)
    w.write("train", label, dense, sparse)
    w.finish()
    return tmp_path


def columns(batches):
    """The rows of `batches` (in order) as numpy columns: labels, dense, per key values and lengths."""
    out = {"labels": np.concatenate([b.labels.numpy() for b in batches]),
           "dense": np.concatenate([b.dense.numpy() for b in batches])}
    per_batch = [_by_key(b) for b in batches]
    for k, f in enumerate(FEATURES):
        out[f"{f.name}.values"] = np.concatenate([values[k] for values, _ in per_batch])
        out[f"{f.name}.lengths"] = np.concatenate([lengths[k] for _, lengths in per_batch])
    return out


def _by_key(batch):
    """Per key (meta order) the ids and the lengths of a batch's KJT, read from its key-major
    layout (torchrec's `to_dict` refuses a KJT of no rows, as a rank's empty slice is)."""
    assert batch.sparse.keys() == [f.name for f in FEATURES]
    lengths = batch.sparse.lengths().numpy().reshape(len(FEATURES), len(batch))
    ends = np.cumsum(lengths.sum(1))
    values = np.split(batch.sparse.values().numpy(), ends[:-1])
    return values, list(lengths)


def assert_union_is(slices, whole):
    """The ranks' slices of one global batch, in rank order, are `whole` row for row."""
    assert all(s.global_size == len(whole) for s in slices)
    got, want = columns(slices), columns([whole])
    assert got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size,drop_last,shuffle", [(5, False, False), (6, False, True), (5, True, True),
                                                          (2, False, False), (100, False, True), (11, False, False)])
def test_slices_put_together_are_the_one_process_batches(data, world, batch_size, drop_last, shuffle):
    """23 rows are a multiple of no batch size here; batch 2 leaves a last batch of one row,
    so at 2+ ranks some slices are empty (and still yielded, with the global size)."""
    def loader(rank, start=0):
        return CTRBatches(data, "train", batch_size, shuffle_shards=shuffle, seed=4, drop_last=drop_last,
                          start_batch=start, part=(rank, world))

    whole = list(CTRBatches(data, "train", batch_size, shuffle_shards=shuffle, seed=4, drop_last=drop_last))
    assert sum(len(b) for b in whole) == (N // batch_size * batch_size if drop_last else N)
    small_reads = [list(CTRBatches(data, "train", batch_size, shuffle_shards=shuffle, seed=4, drop_last=drop_last,
                                   part=(r, world), read_rows=2)) for r in range(world)]
    for k, one in enumerate(whole):  # record batches of 2 rows, within a row group of 3
        assert_union_is([r[k] for r in small_reads], one)
    for start in range(len(whole) + 2):
        ranks = [list(loader(r, start)) for r in range(world)]
        skipped = [list(loader(r).skip(start)) for r in range(world)]
        assert [len(b) for b in ranks] == [len(whole[start:])] * world == [len(loader(r, start)) for r in range(world)]
        for k, one in enumerate(whole[start:]):
            assert [len(r[k]) for r in ranks] == [b - a for a, b in (slice_bounds(len(one), world, r)
                                                                    for r in range(world))]
            assert_union_is([r[k] for r in ranks], one)
            assert_union_is([r[k] for r in skipped], one)


def _watch(monkeypatch):
    """Records the shard rows `_host_batch` is given to check and convert, the shard rows
    `_check` (which names a bad row) is given, and how many rows are read from Parquet
    (`read_shard`'s records)."""
    seen = {"converted": [], "checked": [], "read": 0}
    check, host_batch, read_shard = CTRBatches._check, CTRBatches._host_batch, loader_module.read_shard

    def watched_check(self, record, path, first_row):
        seen["checked"] += [(path, first_row + k) for k in range(record.num_rows)]
        return check(self, record, path, first_row)

    def watched_host_batch(self, pieces, global_size):
        seen["converted"] += [(p.source.path, p.first_row + k) for p in pieces for k in range(len(p))]
        return host_batch(self, pieces, global_size)

    def watched_read_shard(*args, **kwargs):
        for record in read_shard(*args, **kwargs):
            seen["read"] += record.num_rows
            yield record

    monkeypatch.setattr(CTRBatches, "_check", watched_check)
    monkeypatch.setattr(CTRBatches, "_host_batch", watched_host_batch)
    monkeypatch.setattr(loader_module, "read_shard", watched_read_shard)
    return seen


def _layout(files):
    """The epoch's rows (shards in visiting order) as (shard, row in it), and the epoch rows
    of each row group."""
    where, groups = [], []
    for path in files:
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            groups.append(range(len(where), len(where) + md.row_group(g).num_rows))
            where += [(path, groups[-1].start - groups[-1 - g].start + k) for k in range(len(groups[-1]))]
    return where, groups


@pytest.mark.parametrize("world,batch_size,start", [(1, 5, 0), (2, 5, 0), (3, 7, 1), (4, 12, 0), (4, 12, 1)])
def test_a_rank_checks_and_converts_only_its_rows(data, monkeypatch, world, batch_size, start):
    """Each rank checks and converts exactly its slices' rows (never another rank's), calls
    `_check` (which only names a bad row) on none, and reads from Parquet only the row
    groups holding some of its rows."""
    seen = _watch(monkeypatch)
    rows_of_ranks = []
    for rank in range(world):
        seen.update(converted=[], checked=[], read=0)
        batches = CTRBatches(data, "train", batch_size, shuffle_shards=True, seed=1, start_batch=start,
                             part=(rank, world))
        where, groups = _layout(batches.files())
        mine = []
        for k, batch in enumerate(batches):
            first = (start + k) * batch_size
            a, b = slice_bounds(batch.global_size, world, rank)
            mine += range(first + a, first + b)
        assert seen["converted"] == [where[r] for r in mine]
        assert seen["checked"] == []
        assert seen["read"] == sum(len(g) for g in groups if set(g) & set(mine))
        rows_of_ranks.append(mine)
    assert sorted(r for mine in rows_of_ranks for r in mine) == list(range(start * batch_size, N))
    if world == 4 and batch_size == 12:  # 3-row slices in 3-row groups: most groups are not read
        assert seen["read"] < N - start * batch_size


def _rewrite_with(path, column, row, value):
    """Rewrite shard `path` with `column`'s value at `row` replaced (row groups of 3 kept)."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[row] = value
    table = table.set_column(table.schema.get_field_index(column), column,
                             pa.array(values, table.schema.field(column).type))
    write_shard(table, path, row_group_size=3)


@pytest.mark.parametrize("column,value,message", [
    ("sparse_1", 9, r"row 3: sparse_1 id 9 outside \[0, 7\)"),
    ("sparse_0", None, r"row 3: sparse_0 is null"),
    ("sparse_2", [1, 2, 4], r"row 3: sparse_2 id 4 outside \[0, 4\)"),
    ("label", None, r"row 3: label is null"),
])
def test_a_bad_row_is_reported_by_its_rank_as_one_process_reports_it(data, monkeypatch, column, value, message):
    """Batch 4 at 2 ranks: epoch row 10 (shard 1, row 3) is the third row of batch 2,
    in rank 1's slice [10, 12): rank 1 names the same file and row as one process, having
    looked for it (`_check`) in its own slice only; rank 0 reads its batches to the end.
    (A null makes the record batch holding it searched by `_check`, each rank its own rows
    of it.)"""
    meta = read_meta(data)
    path = data / meta["splits"]["train"]["files"][1]
    _rewrite_with(path, column, 3, value)
    assert slice_bounds(4, 2, 1) == (2, 4) and 2 * 4 + 2 == 7 + 3
    pattern = rf"train/part-00001\.parquet: {message}"
    with pytest.raises(DataFormatError, match=pattern) as one:
        list(CTRBatches(data, "train", 4))
    with pytest.raises(DataFormatError, match=pattern) as rank1:
        list(CTRBatches(data, "train", 4, part=(1, 2)))
    assert str(rank1.value) == str(one.value) and "\n" not in str(rank1.value)
    where, _ = _layout(CTRBatches(data, "train", 4).files())
    own = [{where[4 * k + r] for k in range(6) for r in range(a, b) if 4 * k + r < N}  # (last batch: 20, 21 | 22)
           for a, b in (slice_bounds(4, 2, 0), slice_bounds(4, 2, 1))]
    seen = _watch(monkeypatch)
    with pytest.raises(DataFormatError, match=pattern):
        list(CTRBatches(data, "train", 4, part=(1, 2)))
    assert set(seen["checked"]) <= own[1] and seen["checked"][-2:] == [(path, 3), (path, 4)]  # epoch rows 10, 11
    seen["checked"] = []
    rank0 = list(CTRBatches(data, "train", 4, part=(0, 2)))
    assert set(seen["checked"]) <= own[0] and (value is None or seen["checked"] == [])
    assert len(rank0) == 6 and np.concatenate([b.dense[:, 0].numpy() for b in rank0]).tolist() == [
        r for k in range(6) for r in range(4 * k, min(4 * k + 2, N))]
    assert len(list(CTRBatches(data, "train", 4, part=(1, 2)).skip(3))) == 3  # past the bad row


def test_a_shard_of_wrong_column_types_stops_every_rank(data):
    """A shard's column types are checked when it is opened, and every rank opens every shard
    its global batches reach, whichever rank's rows it holds."""
    meta = read_meta(data)
    path = data / meta["splits"]["train"]["files"][3]  # rows 21, 22: the last batch of 4 (20..22)
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("sparse_1"), "sparse_1",
                             table.column("sparse_1").cast(pa.float64()))
    write_shard(table, path)
    for rank in range(4):  # rank 0's slice of the last batch is row 20, in shard 2
        with pytest.raises(DataFormatError, match=r"train/part-00003\.parquet: column sparse_1 is double"):
            list(CTRBatches(data, "train", 4, part=(rank, 4)))
