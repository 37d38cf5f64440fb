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
from embcache.data.bad_rows import BadRowLog, DataFormatError
from embcache.data.criteo import convert_criteo_kaggle, convert_criteo_terabyte, parse_days
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
    assert meta["sparse"][0]["cardinality"] == 3
    # ids aa1 bb2 cc3 dd4 ee5 folded onto 1 + (id-1) % 2
    assert split_table(tmp_path / "h", "train")["sparse_0"] == [1, 2, 1, 0, 1, 1, 2, 1, 2, 1, 2, 1]


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
