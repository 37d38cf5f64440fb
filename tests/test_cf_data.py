"""CF readers: LightGCN text format, MovieLens ratings, the split, the synthetic set."""
from __future__ import annotations

import numpy as np
import pytest

from embcache.cf.data.lightgcn import read_lightgcn
from embcache.cf.data.ratings import read_ratings, split_ratings
from embcache.cf.data.synthetic import power_law_interactions
from embcache.errors import DataFormatError


def _items(indptr, indices, u):
    return indices[indptr[u]:indptr[u + 1]].tolist()


def _lightgcn(tmp_path, train: str, test: str):
    d = tmp_path / "lg"
    d.mkdir()
    (d / "train.txt").write_text(train)
    (d / "test.txt").write_text(test)
    return d


def test_lightgcn_empty_lines_and_users_without_items(tmp_path):
    # user 1 has no training items (its test line is left out of evaluation: its row is never
    # trained), user 4 appears only as an item-less line; blank lines, trailing spaces,
    # duplicates and a missing final newline are all fine
    d = _lightgcn(tmp_path, "0 5 3 3\n\n1\n2 0 7   \n   \n4", "0 1\n1 2\n2 6\n")
    data = read_lightgcn(d)
    assert (data.num_users, data.num_items) == (5, 8)
    assert _items(data.train_indptr, data.train_indices, 0) == [3, 5]
    assert _items(data.train_indptr, data.train_indices, 1) == []
    assert _items(data.train_indptr, data.train_indices, 2) == [0, 7]
    assert _items(data.train_indptr, data.train_indices, 4) == []
    assert _items(data.test_indptr, data.test_indices, 1) == []
    assert data.num_train == 4 and data.num_test == 2 and data.cold_test["users"] == 1


@pytest.mark.parametrize("line, why", [("2 7 x9", "non-integer token 'x9'"), ("2 -7 1", "negative id -7"),
                                       ("-2 7", "negative id -2"), ("2 7.5", "non-integer token '7.5'")])
def test_lightgcn_bad_line_names_file_and_line(tmp_path, line, why):
    d = _lightgcn(tmp_path, "0 1 2\n\n" + line + "\n3 4\n", "0 3\n")
    with pytest.raises(DataFormatError) as err:
        read_lightgcn(d)
    assert str(err.value).startswith(f"{d / 'train.txt'}:3: {why}")
    # skipping instead: the line is counted with its number, the rest is read
    data = read_lightgcn(d, skip_bad=True)
    assert data.bad_rows.total == 1
    assert data.bad_rows.to_json()[str(d / "train.txt")]["first_lines"] == [3]
    assert data.num_train == 3


def test_lightgcn_missing_files(tmp_path):
    with pytest.raises(DataFormatError, match="no such directory"):
        read_lightgcn(tmp_path / "nope")
    d = tmp_path / "half"
    d.mkdir()
    (d / "train.txt").write_text("0 1\n")
    with pytest.raises(DataFormatError, match=r"test\.txt: no such file"):
        read_lightgcn(d)


def test_ratings_both_movielens_layouts_and_bad_lines(tmp_path):
    udata = tmp_path / "u.data"
    udata.write_text("10\t3\t5\t881250949\n2\t7\t1\t881250950\n\n5\t3\t4\t881250951\n")
    dat = tmp_path / "ratings.dat"
    dat.write_text("10::3::5::881250949\n2::7::1::881250950\n5::3::4::881250951\n")
    a, b = read_ratings(udata), read_ratings(dat)
    assert np.array_equal(a, b)
    # raw ids remapped to 0-based contiguous ids in the order of the raw ids
    assert a[:, 0].tolist() == [2, 0, 1] and a[:, 1].tolist() == [0, 1, 0]
    bad = tmp_path / "bad.dat"
    bad.write_text("1::2::3::4\n1::2::3\n")
    with pytest.raises(DataFormatError, match=r"bad\.dat:2: expected 4 fields, found 3"):
        read_ratings(bad)
    bad.write_text("1::2::3::4\n1::-2::3::4\n")
    with pytest.raises(DataFormatError, match=r"bad\.dat:2: negative id -2"):
        read_ratings(bad)
    bad.write_text("1::2::3::4\n1::b::3::4\n")
    with pytest.raises(DataFormatError, match=r"bad\.dat:2: non-integer field 'b'"):
        read_ratings(bad)


def test_split_by_time_takes_each_users_latest_and_random_is_seeded():
    # user 0: items 0..4 rated at times 50, 40, .., 10; user 1: one rating (stays in train)
    r = np.array([[0, i, 5, 50 - 10 * i] for i in range(5)] + [[1, 2, 3, 7]])
    data = split_ratings(r, "time", test_fraction=0.4)
    assert _items(data.test_indptr, data.test_indices, 0) == [0, 1]  # the two latest
    assert _items(data.train_indptr, data.train_indices, 1) == [2] and data.num_test == 2
    a, b = split_ratings(r, "random", seed=3), split_ratings(r, "random", seed=3)
    assert np.array_equal(a.test_indices, b.test_indices) and a.num_test == 1
    # no interaction is in both halves
    assert not set(zip(*np.nonzero(_dense(a.train_indptr, a.train_indices, 5)))) & \
        set(zip(*np.nonzero(_dense(a.test_indptr, a.test_indices, 5))))


def _dense(indptr, indices, n):
    m = np.zeros((len(indptr) - 1, n), bool)
    for u in range(len(indptr) - 1):
        m[u, indices[indptr[u]:indptr[u + 1]]] = True
    return m


def test_synthetic_set_is_seeded_and_power_law():
    a = power_law_interactions(num_users=2000, num_items=3000, interactions=60_000, seed=1)
    b = power_law_interactions(num_users=2000, num_items=3000, interactions=60_000, seed=1)
    assert np.array_equal(a.train_indices, b.train_indices) and np.array_equal(a.test_indptr, b.test_indptr)
    assert a.num_train + a.num_test == 60_000
    deg = np.sort(a.item_degrees())[::-1]
    # skewed: the top 1 % of items hold far more than 1 % of the interactions
    assert deg[:30].sum() > 0.08 * deg.sum()
    assert np.diff(a.train_indptr).min() >= 1


def test_lightgcn_test_ids_beyond_train_are_cold_unless_absurd(tmp_path):
    train = "".join(f"{u} {u} {u + 20}\n" for u in range(30))  # 30 users, items 0..49
    # a modest overshoot: an item seen only in test grows the item table and stays in the test
    # split; a user seen only in test gets no row and is left out of evaluation
    data = read_lightgcn(_lightgcn(tmp_path, train, "0 60\n40 3\n"))
    assert (data.num_users, data.num_items) == (30, 61) and data.num_test == 1
    # the bound: twice the training count + 1,000 (items: 2 * 50 + 1000; users: 2 * 30 + 1000)
    far = (("0 1\n2 1100\n", "item id 1100 is far beyond the 50 items of train.txt; a test item id must be "
                             "below 2 x 50 + 1,000 = 1,100"),
           ("0 1\n1060 3\n", "user id 1060 is far beyond the 30 users of train.txt"),
           ("0 1\n2 10000000000\n", "item id 10000000000 is far beyond"))
    for case, (test, why) in enumerate(far):
        (tmp_path / str(case)).mkdir()
        d = _lightgcn(tmp_path / str(case), train, test)
        with pytest.raises(DataFormatError) as err:
            read_lightgcn(d)
        assert str(err.value).startswith(f"{d / 'test.txt'}:2: {why}")
        skipped = read_lightgcn(d, skip_bad=True)
        assert skipped.bad_rows.total == 1 and skipped.num_test == 1 and skipped.num_items == 50
    (tmp_path / "edge").mkdir()
    assert read_lightgcn(_lightgcn(tmp_path / "edge", train, "2 1099\n")).num_items == 1100


def test_min_rating_that_keeps_nothing_is_an_error_not_a_crash():
    r = np.array([[0, 1, 3, 10], [1, 2, 2, 11]])
    with pytest.raises(ValueError, match=r"no rating is >= 4 \(--min-rating\) among 2"):
        split_ratings(r, min_rating=4)


@pytest.mark.parametrize("token,why", [
    ("1000000000000", r"item id 1,000,000,000,000 is far beyond the ids of train\.txt \(an id must be below 2 x the "
                      r"distinct items \+ 1,000 = 1,102\)"),
    ("200000000000000000000", r"token 200000000000000000000 is beyond any 64-bit id"),
])
def test_lightgcn_train_ids_are_bounded_before_they_size_a_table(tmp_path, token, why):
    """A corrupt id in train.txt asked for 466 TiB (10^12) or raised OverflowError (2 x 10^20)."""
    train = "\n".join(f"{u} {u % 50} {(u + 1) % 50}" for u in range(300)).split("\n")
    train[120] = f"120 3 {token} 4"
    d = _lightgcn(tmp_path, "\n".join(train) + "\n", "0 1\n1 2\n")
    with pytest.raises(DataFormatError, match=rf"train\.txt:121: {why}"):
        read_lightgcn(d)
    data = read_lightgcn(d, skip_bad=True)  # counted, and the rest kept
    assert data.bad_rows.total == 1 and data.num_items == 50 and data.num_users == 300
    assert data.num_train == 299 * 2


def test_lightgcn_ids_that_are_not_dense_get_the_hint_to_use_a_table(tmp_path):
    train = "".join(f"{u * 10**9} {u}\n" for u in range(200))
    d = _lightgcn(tmp_path, train, "0 1\n")
    with pytest.raises(DataFormatError, match=r"train\.txt:\d+: user id .* the ids are not dense .* --user-col"):
        read_lightgcn(d)
