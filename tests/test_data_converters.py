"""Criteo and Avazu converters on small hand-written files; expected values worked out by hand."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.data.avazu import convert_avazu
from embcache.data.bad_rows import BadRowLog
from embcache.errors import DataFormatError
from embcache.data.criteo import (
    convert_criteo_kaggle,
    convert_criteo_terabyte,
    parse_days,
)
from embcache.data.ctr_format import load_id_frequencies, read_meta
from embcache.data.delimited import string_keys
from embcache.data.vocabulary import ValueCounter, Vocabulary


def criteo_line(label, i1, c1, c2):
    return "\t".join([label, i1] + ["1"] * 12 + [c1, c2] + [""] * 24)


# (label, I1, C1, C2) of the good rows, in file order; bad lines are inserted between them
GOOD = [("0", "0", "aa", "x"), ("1", "3", "bb", "x"), ("0", "-1", "aa", ""), ("1", "", "", "y"),
        ("0", "2", "cc", "x"), ("1", "7", "aa", "y"), ("0", "0", "bb", "x"), ("0", "1", "aa", "x"),
        ("1", "0", "dd", "y"), ("0", "0", "aa", "x"), ("0", "0", "bb", "y"), ("1", "0", "aa", "x"),
        ("0", "5", "ee", "x"), ("1", "0", "aa", "z")]


def kaggle_text():
    lines = [criteo_line(*g) for g in GOOD]
    lines.insert(2, "")                                       # line 3: empty
    lines.insert(6, criteo_line("2", "0", "aa", "x"))         # line 7: bad label
    lines.insert(9, "\t".join(["0"] * 39))                    # line 10: 39 fields
    lines.insert(13, criteo_line("0", "1.5.3", "aa", "x"))    # line 14: not a number
    return "\n".join(lines) + "\n"


def split_table(d, split):
    meta = read_meta(d)
    return pa.concat_tables([pq.read_table(d / f) for f in meta["splits"][split]["files"]]).to_pydict()


L = math.log


def test_kaggle_by_hand(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    meta = convert_criteo_kaggle(src, tmp_path / "out", progress=False, block_bytes=300)
    out = tmp_path / "out"
    # 14 good rows: the last 14 // 7 = 2 are held out, one val, one test
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == {"train": 12, "val": 1, "test": 1}
    assert meta["num_dense"] == 13 and len(meta["sparse"]) == 26
    # C1: aa 7x, bb 3x, cc dd ee once -> 1..5 in sorted order; C2: x, y, z -> 1..3; C3.. all missing
    assert [f["cardinality"] for f in meta["sparse"]] == [6, 4] + [1] * 24
    train = split_table(out, "train")
    assert train["label"] == [0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1]
    assert train["sparse_0"] == [1, 2, 1, 0, 3, 1, 2, 1, 4, 1, 2, 1]
    assert train["sparse_1"] == [1, 1, 0, 2, 1, 2, 1, 1, 2, 1, 2, 1]
    assert set(train["sparse_25"]) == {0}
    assert train["dense_0"] == pytest.approx([0, L(4), 0, 0, L(3), L(8), 0, L(2), 0, 0, 0, 0])
    assert train["dense_12"] == pytest.approx([L(2)] * 12)
    val, test = split_table(out, "val"), split_table(out, "test")
    assert (val["label"], val["sparse_0"], val["sparse_1"], val["dense_0"]) == ([0], [5], [1], [pytest.approx(L(6))])
    assert (test["label"], test["sparse_0"], test["sparse_1"]) == ([1], [1], [3])
    freq = load_id_frequencies(out)  # train rows only
    assert freq["sparse_0"].tolist() == [1, 6, 3, 1, 1, 0]
    assert freq["sparse_1"].tolist() == [1, 7, 4, 0]
    bad = meta["bad_rows"][str(src)]
    assert bad["count"] == 4 and bad["first_lines"] == [3, 7, 10, 14]
    assert bad["by_reason"] == {"empty line": 1, "bad label": 1, "wrong column count": 1, "unparsable number": 1}
    assert bad["first_reasons"][3] == "unparsable number: I1='1.5.3'"
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["bad_rows"] == meta["bad_rows"] and on_disk["min_count"] == 1


def test_kaggle_frequency_threshold_and_hash_cap(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    meta = convert_criteo_kaggle(src, tmp_path / "t", min_count=2, progress=False)
    assert [f["cardinality"] for f in meta["sparse"][:2]] == [3, 3]  # aa, bb | x, y (z is rare)
    assert split_table(tmp_path / "t", "train")["sparse_0"] == [1, 2, 1, 0, 0, 1, 2, 1, 0, 1, 2, 1]
    assert split_table(tmp_path / "t", "test")["sparse_1"] == [0]
    meta = convert_criteo_kaggle(src, tmp_path / "h", max_ids=3, progress=False)
    # C1 (aa..ee) and C2 (x, y, z) have more than max_ids - 1 = 2 distinct values: hashed into
    # buckets 1 + splitmix64(key) % 2, then the occupied buckets get ids 1.. in bucket order
    expected = {}
    for f, values in ((0, ["aa", "bb", "cc", "dd", "ee"]), (1, ["x", "y", "z"])):
        bucket = {v: 1 + splitmix64_reference(key_reference(v)) % 2 for v in values}
        rank = {b: i + 1 for i, b in enumerate(sorted(set(bucket.values())))}
        expected[f] = ({v: rank[b] for v, b in bucket.items()}, 1 + len(rank))
    assert [f["cardinality"] for f in meta["sparse"][:3]] == [expected[0][1], expected[1][1], 1]
    assert meta["hashed_features"] == ["sparse_0", "sparse_1"] and meta["max_ids_per_feature"] == 3
    train = split_table(tmp_path / "h", "train")
    assert train["sparse_0"] == [expected[0][0].get(g[2], 0) for g in GOOD[:12]]
    assert train["sparse_1"] == [expected[1][0].get(g[3], 0) for g in GOOD[:12]]
    # under the cap nothing changes: C1 has 5 distinct values, a cap of 6 keeps exact ids
    meta = convert_criteo_kaggle(src, tmp_path / "e", max_ids=6, progress=False)
    assert meta["sparse"][0]["cardinality"] == 6 and meta["hashed_features"] == []
    assert split_table(tmp_path / "e", "train")["sparse_0"] == [1, 2, 1, 0, 3, 1, 2, 1, 4, 1, 2, 1]


def key_reference(value: str) -> int:
    """string_keys for a value of up to 8 bytes: its bytes, big-endian, zero-padded."""
    raw = value.encode()
    assert len(raw) <= 8
    return int.from_bytes(raw.ljust(8, b"\0"), "big")


def splitmix64_reference(x: int) -> int:
    """SplitMix64's finalizer in plain Python integers (independent of the numpy version)."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_terabyte_days_plain_and_gzip(tmp_path):
    days = tmp_path / "days"
    days.mkdir()
    (days / "day_0").write_text("\n".join(criteo_line(*g) for g in GOOD[:3]) + "\n")
    with gzip.open(days / "day_1.gz", "wt") as f:
        f.write("\n".join(criteo_line(*g) for g in GOOD[3:7]) + "\n")
    meta = convert_criteo_terabyte(days, tmp_path / "out", days="0-1", progress=False)
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == {"train": 3, "val": 2, "test": 2}
    # C1 over both days: aa x2, bb x2, cc x1, one missing -> aa1 bb2 cc3
    assert split_table(tmp_path / "out", "train")["sparse_0"] == [1, 2, 1]
    assert split_table(tmp_path / "out", "val")["sparse_0"] == [0, 3]
    assert split_table(tmp_path / "out", "test")["label"] == [1, 0]
    assert meta["days"] == [0, 1] and meta["bad_rows"][str(days / "day_1.gz")]["count"] == 0
    with pytest.raises(DataFormatError, match=r"day_2: missing"):
        convert_criteo_terabyte(days, tmp_path / "x", days="0-2", progress=False)
    with pytest.raises(DataFormatError, match="at least two days"):
        convert_criteo_terabyte(days, tmp_path / "x", days="0", progress=False)
    assert parse_days("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(DataFormatError, match="listed twice"):
        parse_days("0-2,1")


def test_unreadable_inputs_are_one_clear_line(tmp_path):
    with pytest.raises(DataFormatError, match=r"nope\.txt: no such file"):
        convert_criteo_kaggle(tmp_path / "nope.txt", tmp_path / "o", progress=False)
    truncated = tmp_path / "train.txt.gz"
    truncated.write_bytes(gzip.compress(kaggle_text().encode())[:-30])
    with pytest.raises(DataFormatError, match=r"train\.txt\.gz: cannot read") as err:
        convert_criteo_kaggle(truncated, tmp_path / "o", progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "o" / "meta.json").exists()
    only_bad = tmp_path / "bad.txt"
    only_bad.write_text("x\ty\n\n")
    with pytest.raises(DataFormatError, match="no usable rows"):
        convert_criteo_kaggle(only_bad, tmp_path / "o", progress=False)


AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")
TAIL_A = "0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79"
TAIL_C = "0,85f751fd,c4e18dd6,50e219e0,51cedd4e,aefc06bd,0f2161f8,c357dbff,f1ac7184,373ecbe6,0,0,21689,320,50,2496,3,167,100191,23"
AVAZU = "\n".join([
    AVAZU_HEADER,
    f"1000009418151094273,0,14102100,1005,{TAIL_A}",   # line 2: Tue 2014-10-21 00h
    f"10000169349117863715,1,14102923,1005,{TAIL_A}",  # line 3: Wed 2014-10-29 23h
    "",                                                # line 4: empty
    f"2,x,14102100,1005,{TAIL_A}",                     # line 5: bad label
    f"3,1,14103001,1002,{TAIL_C}",                     # line 6: Thu 2014-10-30 01h
    "4,1,141030xx,1002,0,85f751fd",                    # line 7: 6 fields
    f"5,0,1410300x,1002,{TAIL_C}",                     # line 8: bad hour
]) + "\n"


def test_avazu_time_split_by_hand(tmp_path):
    src = tmp_path / "train.csv"
    src.write_text(AVAZU)
    meta = convert_avazu(src, tmp_path / "out", split="time", progress=False)
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == {"train": 1, "val": 1, "test": 1}
    assert meta["num_dense"] == 1 and len(meta["sparse"]) == 23
    rows = {s: split_table(tmp_path / "out", s) for s in ("train", "val", "test")}
    assert [rows[s]["label"][0] for s in ("train", "val", "test")] == [0, 1, 1]
    assert [rows[s]["dense_0"][0] for s in ("train", "val", "test")] == pytest.approx([0, 1, 1 / 23])
    # hour of day 0, 23, 1 -> ids by key order 0->1, 1->2, 23->3 ; weekday Tue/Wed/Thu -> 1, 2, 3
    assert [rows[s]["sparse_0"][0] for s in ("train", "val", "test")] == [1, 3, 2]
    assert [rows[s]["sparse_1"][0] for s in ("train", "val", "test")] == [1, 2, 3]
    # C1: "1002" < "1005"; site_id: "1fbe01fe" < "85f751fd"
    assert [rows[s]["sparse_2"][0] for s in ("train", "val", "test")] == [2, 2, 1]
    assert [rows[s]["sparse_4"][0] for s in ("train", "val", "test")] == [1, 1, 2]
    bad = meta["bad_rows"][str(src)]
    assert bad["count"] == 4 and bad["first_lines"] == [4, 5, 7, 8]
    assert bad["by_reason"] == {"empty line": 1, "bad label": 1, "wrong column count": 1,
                                "bad hour (expected YYMMDDHH)": 1}


def test_avazu_random_split_and_bad_header(tmp_path):
    src = tmp_path / "train.csv"
    src.write_text(AVAZU)
    a = convert_avazu(src, tmp_path / "a", seed=4, progress=False)
    b = convert_avazu(src, tmp_path / "b", seed=4, progress=False)
    assert sum(a["splits"][s]["rows"] for s in ("train", "val", "test")) == 3
    assert a["splits"] == b["splits"]
    src.write_text(AVAZU.replace("id,click,hour", "id,clicked,hour", 1))
    with pytest.raises(DataFormatError, match=r"train\.csv:1: header"):
        convert_avazu(src, tmp_path / "c", progress=False)


def test_string_keys_and_vocabulary():
    keys = string_keys(pa.array(["", "b", "a", "abcdefgh", "abcdefghi", "abcdefghj", "b"]))
    assert keys[0] == 0 and keys[1] == keys[6] and len(set(keys.tolist())) == 6
    assert keys[2] < keys[1]  # up to 8 bytes: the key orders like the string
    assert keys[2] == ord("a") << 56
    counter = ValueCounter()
    for chunk in (keys[:3], keys[3:], keys[1:2]):
        counter.update(chunk)
    k, c = counter.result()
    assert dict(zip(k.tolist(), c.tolist()))[int(keys[1])] == 3 and 0 not in k.tolist()
    vocab = Vocabulary.build(k, c, min_count=2)
    assert vocab.cardinality == 2 and vocab.lookup(keys).tolist() == [0, 1, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="max_ids must be >= 2"):
        Vocabulary.build(k, c, max_ids=1)


def test_bad_row_log_keeps_the_smallest_lines():
    log = BadRowLog(keep=2)
    for line in (9, 4, 7, 1):
        log.add("f", line, f"kind: {line}")
    assert log.to_json()["f"]["first_lines"] == [1, 4] and log.to_json()["f"]["count"] == 4
    assert np.array_equal(log.to_json()["f"]["first_reasons"], ["kind: 1", "kind: 4"])


def test_count_fields_that_are_not_finite_numbers_are_bad():
    from embcache.data.delimited import parse_count_feature

    values, ok = parse_count_feature(pa.array(["3", "nan", "inf", "1e400", "-2", "", "0x10", "1.5e1"]))
    assert ok.tolist() == [True, False, False, False, True, True, False, True]
    assert np.isfinite(values).all()
    assert values[ok].tolist() == pytest.approx([L(4), 0.0, 0.0, L(16)])


def test_avazu_random_split_fills_one_shard_per_split(tmp_path):
    """Rows of the three splits arrive interleaved, block after block; each split still gets
    one shard when rows_per_shard exceeds its rows, holding exactly its rows in file order."""
    from embcache.data.converter import hashed_fraction

    n = 300
    src = tmp_path / "train.csv"
    # C1 = the row number, zero-padded: its ids (sparse_2) are row + 1, so rows can be traced
    src.write_text("\n".join([AVAZU_HEADER] + [f"{r},{r % 2},1410{21 + r % 9:02d}{r % 24:02d},{r:05d},{TAIL_A}"
                                               for r in range(n)]) + "\n")
    meta = convert_avazu(src, tmp_path / "out", seed=3, progress=False, block_bytes=2048,
                         rows_per_shard=1_000)
    assert [len(meta["splits"][s]["files"]) for s in ("train", "val", "test")] == [1, 1, 1]
    u = hashed_fraction(3, 0, np.arange(n))
    expected = {"train": np.flatnonzero(u < 0.8), "val": np.flatnonzero((u >= 0.8) & (u < 0.9)),
                "test": np.flatnonzero(u >= 0.9)}
    assert all(len(rows) for rows in expected.values())
    for split, rows in expected.items():
        table = split_table(tmp_path / "out", split)
        assert np.array_equal(np.array(table["sparse_2"]) - 1, rows), split
        assert table["label"] == (rows % 2).tolist()
        assert table["dense_0"] == pytest.approx((rows % 24 / 23).tolist())
    # shards are still cut at rows_per_shard: 7 rows each, the last one shorter
    meta = convert_avazu(src, tmp_path / "small", seed=3, progress=False, block_bytes=2048, rows_per_shard=7)
    for split, rows in expected.items():
        sizes = [pq.ParquetFile(tmp_path / "small" / f).metadata.num_rows for f in meta["splits"][split]["files"]]
        assert sizes == [7] * (len(rows) // 7) + ([len(rows) % 7] if len(rows) % 7 else []), split


def line_of_reference(rows, skipped, header):
    """Physical line of each delivered row by walking the lines one by one."""
    skipped, out, line, delivered = set(skipped), {}, header, -1
    wanted = set(int(r) for r in rows)
    while len(out) < len(wanted):
        line += 1
        if line not in skipped:
            delivered += 1
            if delivered in wanted:
                out[delivered] = line
    return np.array([out[int(r)] for r in rows])


def test_line_numbers_exact_while_forgetting():
    from embcache.data.delimited import LineNumbers

    rng = np.random.default_rng(5)
    for trial in range(30):
        header = trial % 2
        total = int(rng.integers(20, 400))
        bad = np.flatnonzero(rng.random(total) < rng.choice([0.05, 0.5, 0.95]))
        skipped = [int(b) + 1 + header for b in bad]
        delivered_rows = total - len(bad)
        lines, fed, done = LineNumbers(header), 0, 0
        while done < delivered_rows:  # blocks of a random size, skips reported up to block end
            block = int(rng.integers(1, 30))
            end = min(done + block, delivered_rows)
            last_line = line_of_reference([end - 1], skipped, header)[0]
            while fed < len(skipped) and skipped[fed] < last_line + int(rng.integers(0, 3)):
                lines.skip(skipped[fed])
                fed += 1
            rows = np.arange(done, end)
            assert lines.of(rows).tolist() == line_of_reference(rows, skipped, header).tolist()
            done = end
            lines.forget_before(done)
            assert all(s > last_line for s in lines.recent)  # only skips past the last row kept


def test_wrong_delimiter_file_keeps_bounded_line_bookkeeping(tmp_path):
    """Most lines have the wrong field count: each is counted and the first few listed, and the
    line map holds no more than a block's worth of line numbers however long the file."""
    import tracemalloc

    from embcache.data.delimited import read_blocks

    good = criteo_line("1", "2", "aa", "x")
    text = "\n".join(good if k % 1000 == 999 else f"0;{k};{k}" for k in range(60_000)) + "\n"
    src = tmp_path / "train.txt"
    src.write_text(text)
    log = BadRowLog()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        grown, delivered = 0, 0
        for block, first, lines in read_blocks(src, COLUMNS_CRITEO, "\t", False, log, block_bytes=4096):
            assert lines.of(np.arange(first, first + block.num_rows)).tolist() == \
                [1000 * (first + r) + 1000 for r in range(block.num_rows)]
            delivered += block.num_rows
            grown = max(grown, tracemalloc.get_traced_memory()[0] - base)
    finally:
        tracemalloc.stop()
    assert delivered == 60 and log.files[str(src)].count == 59_940
    assert log.to_json()[str(src)]["first_lines"] == [1, 2, 3, 4, 5]
    assert grown < 400_000, f"line bookkeeping grew to {grown} bytes over 59,940 skipped lines"
    assert len(lines.recent) < 1000 and lines.before > 59_000


COLUMNS_CRITEO = ["label", *[f"I{j}" for j in range(1, 14)], *[f"C{j}" for j in range(1, 27)]]


def test_hashed_counting_matches_a_plain_bucket_count():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2**63, size=5_000, dtype=np.uint64)
    keys[::7] = 0  # missing values are never counted
    stream = np.concatenate([keys, keys[:1000]])
    counter = ValueCounter(max_ids=50)
    for chunk in np.array_split(stream, 13):
        counter.update(chunk)
    k, c = counter.result()
    expected: dict[int, int] = {}
    for key in stream.tolist():
        if key:
            b = 1 + splitmix64_reference(key) % 49
            expected[b] = expected.get(b, 0) + 1
    assert counter.hashed and dict(zip(k.tolist(), c.tolist())) == expected
    vocab = Vocabulary.build(k, c, max_ids=50, hashed=True)
    assert vocab.cardinality == 50  # 5,000 values fill all 49 buckets
    assert vocab.lookup(keys[:20]).tolist() == [0 if x == 0 else 1 + splitmix64_reference(x) % 49
                                               for x in keys[:20].tolist()]
    # exact counts of more keys than the cap, hashed at build time, give the same vocabulary
    exact = ValueCounter()
    exact.update(stream)
    again = Vocabulary.build(*exact.result(), max_ids=50)
    assert again.hashed and np.array_equal(again.keys, vocab.keys)


def test_hash_cap_bounds_counting_memory():
    """3M distinct values under a cap of 1,024: counting memory follows the cap, not the values
    (exact counting would hold 3M x 16 bytes = 48 MB)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    counter = ValueCounter(max_ids=1024)
    tracemalloc.start()
    try:
        for _ in range(30):
            counter.update(rng.integers(1, 2**63, size=100_000, dtype=np.uint64))
        k, c = counter.result()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counter.hashed and len(k) == 1023 and int(c.sum()) == 3_000_000
    assert peak < 12_000_000, f"counting peaked at {peak} bytes"
