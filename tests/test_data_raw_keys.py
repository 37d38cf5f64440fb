"""Raw 64-bit keys in the prepared format: the Criteo and Avazu converters with `keys="raw"`
(each value's `string_keys` code, no vocabulary), per-key counts, Terabyte's day splits, and
the command-line flags. Expected values come from the hand-written fixtures of
test_data_converters.py, worked out independently of the converter."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import embcache.data.converter as converter
from embcache.cli import main
from embcache.data.avazu import convert_avazu
from embcache.data.criteo import convert_criteo_kaggle, convert_criteo_terabyte
from embcache.data.ctr_format import (
    day_splits,
    is_raw_keys,
    load_id_frequencies,
    load_key_frequencies,
    read_meta,
)
from embcache.data.delimited import string_keys
from embcache.data.frequency import KeyCounter
from embcache.data.loader import CTRBatches
from embcache.errors import DataFormatError
from tests.test_data_converters import AVAZU, GOOD, criteo_line, kaggle_text, key_reference, split_table


def key(value: str) -> int:
    """A value's raw key as the data holds it: `key_reference` (its bytes, big-endian) as int64."""
    return int(np.uint64(key_reference(value)).view(np.int64)) if value else 0


def count_reference(values) -> tuple[list[int], list[int]]:
    """(ascending int64 keys, counts) of a list of raw values, counted in plain Python."""
    counts = Counter(key(v) for v in values)
    keys = sorted(counts)
    return keys, [counts[k] for k in keys]


def test_kaggle_raw_keys_by_hand(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    meta = convert_criteo_kaggle(src, tmp_path / "raw", progress=False, block_bytes=300, keys="raw")
    ids = convert_criteo_kaggle(src, tmp_path / "ids", progress=False, block_bytes=300)
    assert is_raw_keys(meta) and is_raw_keys(read_meta(tmp_path / "raw")) and not is_raw_keys(ids)
    assert "keys" not in ids  # ids data is written as it always was
    assert meta["splits"] == ids["splits"]  # the same rows in the same splits
    train = split_table(tmp_path / "raw", "train")
    assert train["sparse_0"] == [key(g[2]) for g in GOOD[:12]]
    assert train["sparse_1"] == [key(g[3]) for g in GOOD[:12]]
    assert set(train["sparse_25"]) == {0}  # missing
    assert train["label"] == split_table(tmp_path / "ids", "train")["label"]
    assert train["dense_0"] == split_table(tmp_path / "ids", "train")["dense_0"]
    assert split_table(tmp_path / "raw", "val")["sparse_0"] == [key("ee")]
    assert split_table(tmp_path / "raw", "test")["sparse_1"] == [key("z")]
    # the ids data's vocabulary holds exactly these keys: id i > 0 stands for keys[i - 1]
    vocab = np.load(tmp_path / "ids" / "vocabulary.npz")["sparse_0"].view(np.int64)
    assert [0 if i == 0 else int(vocab[i - 1]) for i in split_table(tmp_path / "ids", "train")["sparse_0"]] \
        == train["sparse_0"]
    # per-key counts over train, against a plain count of the values
    freq = load_key_frequencies(tmp_path / "raw")
    for f, column in ((0, 2), (1, 3), (25, None)):
        keys, counts = count_reference([g[column] if column else "" for g in GOOD[:12]])
        assert freq[f"sparse_{f}"][0].tolist() == keys and freq[f"sparse_{f}"][1].tolist() == counts
    assert [f["cardinality"] for f in meta["sparse"][:3]] == [5, 3, 1]  # distinct keys in train, 0 included
    assert meta["key_counts"]["exact"] and meta["key_counts"]["splits"] == ["train"]
    assert meta["key_kinds"]["sparse_0"] == "string" and meta["features"]["sparse_0"] == "C1 id"
    bad = meta["bad_rows"][str(src)]
    assert bad["count"] == 4 and bad["first_lines"] == [3, 7, 10, 14]
    assert bad["by_reason"] == {"empty line": 1, "bad label": 1, "wrong column count": 1, "unparsable number": 1}
    with pytest.raises(DataFormatError, match="raw keys"):
        load_id_frequencies(tmp_path / "raw")
    # ids data: the same counts through load_key_frequencies, keyed by id
    by_id = load_key_frequencies(tmp_path / "ids")
    assert by_id["sparse_0"][0].tolist() == [0, 1, 2, 3, 4] and by_id["sparse_0"][1].tolist() == [1, 6, 3, 1, 1]


def test_raw_keys_refuse_vocabulary_options(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    with pytest.raises(ValueError, match="raw keys have none"):
        convert_criteo_kaggle(src, tmp_path / "o", progress=False, keys="raw", min_count=2)
    with pytest.raises(ValueError, match="keys must be one of"):
        convert_criteo_kaggle(src, tmp_path / "o", progress=False, keys="hashed")


def test_capped_counts_keep_the_hot_keys_and_say_so(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    meta = convert_criteo_kaggle(src, tmp_path / "raw", progress=False, keys="raw", max_counted_keys=2)
    keys, counts = load_key_frequencies(tmp_path / "raw")["sparse_0"]
    # C1 over train: aa 6, bb 3, then cc, dd and missing once each: the two hottest are kept, exactly
    assert keys.tolist() == sorted([key("aa"), key("bb")]) and counts.tolist() == [6, 3]
    entry = meta["key_counts"]["features"]["sparse_0"]
    assert not meta["key_counts"]["exact"] and meta["key_counts"]["max_keys_per_feature"] == 2
    assert entry["forgotten_occurrences"] == 3 and entry["occurrences"] == 12 and not entry["distinct_exact"]
    assert meta["sparse"][0]["cardinality"] == 5  # the sketch still counts every distinct key
    assert meta["key_counts"]["features"]["sparse_25"]["distinct_exact"]  # one key: under the cap


def test_key_counter_against_an_exact_count():
    rng = np.random.default_rng(0)
    stream = (rng.zipf(1.3, 100_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # spread
    exact = Counter(stream.tolist())
    capped, full = KeyCounter(max_keys=500), KeyCounter(max_keys=None)
    for start in range(0, len(stream), 4096):
        capped.update(stream[start:start + 4096])
        full.update(stream[start:start + 4096])
    keys, counts = full.result()
    assert full.exact and dict(zip(keys.tolist(), counts.tolist())) == exact and full.distinct() == len(exact)
    keys, counts = capped.result()
    assert not capped.exact and len(keys) == 500 and np.all(np.diff(keys) > 0)
    assert all(counts[i] <= exact[k] for i, k in enumerate(keys.tolist()))  # lower bounds
    hottest = [k for k, _ in exact.most_common(20)]
    assert set(hottest) <= set(keys.tolist())
    assert int(counts.sum()) + capped.forgotten == len(stream) == capped.occurrences
    assert abs(capped.distinct() - len(exact)) < 0.05 * len(exact)  # HyperLogLog, ~1 % error


def write_days(tmp_path):
    days = tmp_path / "days"
    days.mkdir()
    # day 0: 3 good rows and an empty line (line 3); day 1 (gz): 4 good rows, a bad label (line 2)
    (days / "day_0").write_text("\n".join([criteo_line(*GOOD[0]), criteo_line(*GOOD[1]), "",
                                           criteo_line(*GOOD[2])]) + "\n")
    with gzip.open(days / "day_1.gz", "wt") as f:
        f.write("\n".join([criteo_line(*GOOD[3]), criteo_line("7", "0", "aa", "x")]
                          + [criteo_line(*g) for g in GOOD[4:7]]) + "\n")
    return days


def test_terabyte_raw_keys_and_day_splits(tmp_path, monkeypatch):
    days = write_days(tmp_path)
    read = []
    real = converter.read_blocks
    monkeypatch.setattr(converter, "read_blocks", lambda path, *a, **k: read.append(path.name) or real(path, *a, **k))
    meta = convert_criteo_terabyte(days, tmp_path / "raw", days="0-1", progress=False, keys="raw",
                                   day_splits=True, rows_per_shard=2)
    assert read == ["day_1.gz", "day_0", "day_1.gz"]  # pass 1 reads only the held-out day
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == {"train": 3, "val": 2, "test": 2}
    assert day_splits(meta) == ["day_0", "day_1"] and meta["day_splits"][1] == {"split": "day_1", "rows": 4}
    assert meta["splits"]["day_0"]["files"] == meta["splits"]["train"]["files"]
    for split, rows in (("day_0", GOOD[0:3]), ("day_1", GOOD[3:7])):
        got = [b.sparse["sparse_0"].values().tolist() for b in CTRBatches(tmp_path / "raw", split, 100)]
        assert got == [[key(g[2]) for g in rows]], split
    assert [g["label"] for g in [split_table(tmp_path / "raw", "val")]] == [[1, 0]]
    # bad rows of both days, in file order, whichever pass found them
    assert list(meta["bad_rows"]) == [str(days / "day_0"), str(days / "day_1.gz")]
    assert meta["bad_rows"][str(days / "day_0")]["first_lines"] == [3]
    assert meta["bad_rows"][str(days / "day_1.gz")]["first_reasons"] == ["bad label: label='7'"]
    assert meta["good_rows_per_file"] == [3, 4]
    # ids with day splits: the same days, vocabulary ids
    ids = convert_criteo_terabyte(days, tmp_path / "ids", days="0-1", progress=False, day_splits=True)
    assert day_splits(ids) == ["day_0", "day_1"] and "keys" not in ids
    assert [b.sparse["sparse_0"].values().tolist() for b in CTRBatches(tmp_path / "ids", "day_1", 100)] == [[0, 3, 1, 2]]


def test_avazu_raw_keys(tmp_path, monkeypatch):
    src = tmp_path / "train.csv"
    src.write_text(AVAZU)
    meta = convert_avazu(src, tmp_path / "time", split="time", progress=False, keys="raw")
    rows = {s: split_table(tmp_path / "time", s) for s in ("train", "val", "test")}
    assert [rows[s]["label"][0] for s in ("train", "val", "test")] == [0, 1, 1]
    # hour of day + 1 (0, 23, 1), weekday + 1 (Tue, Wed, Thu), then C1's, banner_pos's and site_id's bytes
    assert [rows[s]["sparse_0"][0] for s in ("train", "val", "test")] == [1, 24, 2]
    assert [rows[s]["sparse_1"][0] for s in ("train", "val", "test")] == [2, 3, 4]
    assert [rows[s]["sparse_2"][0] for s in ("train", "val", "test")] == [key("1005"), key("1005"), key("1002")]
    assert [rows[s]["sparse_3"][0] for s in ("train", "val", "test")] == [key("0")] * 3
    assert [rows[s]["sparse_4"][0] for s in ("train", "val", "test")] == \
        string_keys(pa.array(["1fbe01fe", "1fbe01fe", "85f751fd"])).view(np.int64).tolist()
    assert meta["key_kinds"]["sparse_0"] == "int+1" and meta["key_kinds"]["sparse_3"] == "string"
    bad = meta["bad_rows"][str(src)]
    assert bad["count"] == 4 and bad["first_lines"] == [4, 5, 7, 8]
    read = []
    real = converter.read_blocks
    monkeypatch.setattr(converter, "read_blocks", lambda path, *a, **k: read.append(path.name) or real(path, *a, **k))
    random = convert_avazu(src, tmp_path / "random", seed=4, progress=False, keys="raw")
    ids = convert_avazu(src, tmp_path / "ids", seed=4, progress=False)
    assert read == ["train.csv", "train.csv", "train.csv"]  # raw + random split: one pass (ids: two)
    assert {s: random["splits"][s]["rows"] for s in random["splits"]} == {s: ids["splits"][s]["rows"] for s in ids["splits"]}
    assert random["bad_rows"][str(src)]["first_lines"] == [4, 5, 7, 8]


def test_prepare_command_with_raw_keys(tmp_path, capsys):
    src = tmp_path / "train.txt"
    src.write_text(kaggle_text())
    assert main(["data", "prepare", "criteo-kaggle", "--input", str(src), "--out", str(tmp_path / "o"),
                 "--keys", "raw", "--max-counted-keys", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "raw 64-bit keys" in out and "train 12 rows" in out
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["keys"] == "raw" and meta["key_counts"]["max_keys_per_feature"] is None
    assert pq.read_table(tmp_path / "o" / "train" / "part-00000.parquet").column("sparse_0")[1].as_py() == key("bb")


def test_prepare_terabyte_command_with_day_splits(tmp_path, capsys):
    days = write_days(tmp_path)
    assert main(["data", "prepare", "criteo-terabyte", "--input-dir", str(days), "--days", "0-1", "--keys", "raw",
                 "--day-splits", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    meta = read_meta(tmp_path / "o")
    assert day_splits(meta) == ["day_0", "day_1"] and is_raw_keys(meta)
    assert "day_1 4 rows in 2 file(s)" in capsys.readouterr().out  # val's and test's


@pytest.mark.parametrize("argv,message", [
    (["prepare", "criteo-kaggle", "--keys", "raw", "--min-count", "2"], "--keys raw has none"),
    (["prepare", "avazu", "--keys", "raw", "--max-ids-per-feature", "9"], "--keys raw has none"),
    (["prepare", "criteo-kaggle", "--max-counted-keys", "9"], "--max-counted-keys caps"),
    (["synthetic", "--drift", "0.1"], "--drift needs --days"),
])
def test_flags_that_do_not_go_together_are_one_line(tmp_path, capsys, argv, message):
    src = tmp_path / "in.txt"
    src.write_text(kaggle_text())
    extra = ["--input", str(src)] if argv[0] == "prepare" else ["--rows", "10"]
    assert main(["data", *argv, *extra, "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,message", [
    (["synthetic", "--days", "0"], "--days: must be a positive integer, not 0"),
    (["synthetic", "--days", "2", "--drift", "1"], "--drift: must be in [0, 1), not 1"),
    (["synthetic", "--days", "2", "--drift", "-0.1"], "--drift: must be in [0, 1), not -0.1"),
    (["synthetic", "--keys", "hashed"], "--keys: invalid choice: 'hashed'"),
    (["prepare", "criteo-kaggle", "--input", "x", "--max-counted-keys", "-1"], "--max-counted-keys: must be >= 0"),
])
def test_bad_new_numbers_are_usage_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["data", *argv, "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
