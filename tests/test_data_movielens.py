"""MovieLens-100k reader: both layouts give the same arrays; bad files give one clear line."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embcache.errors import DataFormatError
from embcache.data.movielens import GENRES, load_ml100k, ml100k_dir
from tests.offline_data import load_or_skip

FLAGS = {g: k for k, g in enumerate(GENRES)}


def _flags(*names):
    row = ["0"] * len(GENRES)
    for n in names:
        row[FLAGS[n]] = "1"
    return "|".join(row)


# Raw ids deliberately non-contiguous and out of order: users 10, 2, 5 -> 2, 0, 1.
U_DATA = "10\t3\t5\t881250949\n2\t7\t1\t881250950\n5\t3\t4\t881250951\n2\t9\t3\t881250952\n10\t1\t2\t881250953\n"
U_USER = "10|24|M|technician|85711\n2|53|F|other|T8H1N\n5|23|M|writer|32067\n"
U_ITEM = (f"1|Toy Story (1995)|01-Jan-1995||http://x|{_flags('Animation', 'Comedy')}\n"
          f"3|Caf\xe9 Noir (1994)|01-Jan-1994||http://x|{_flags('Drama')}\n"
          f"7|unknown||||{_flags('unknown')}\n"
          f"9|Land Before Time (V) (1995)|01-Jan-1997||http://x|{_flags('Action', 'War', 'Western')}\n")

INTER = ("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
         "10\t3\t5\t881250949\n2\t7\t1\t881250950\n5\t3\t4\t881250951\n2\t9\t3\t881250952\n10\t1\t2\t881250953\n")
USER = ("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
        "10\t24\tM\ttechnician\t85711\n2\t53\tF\tother\tT8H1N\n5\t23\tM\twriter\t32067\n")
ITEM = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "1\tToy Story\t1995\tAnimation Comedy\n3\tCaf\xe9 Noir\t1994\tDrama\n7\tunkonwn\tunkonwn\tunknown\n"
        "9\tLand Before Time (1995)\tV\tAction War Western\n")


def write_standard(d):
    (d / "u.data").write_text(U_DATA, encoding="latin-1")
    (d / "u.user").write_text(U_USER, encoding="latin-1")
    (d / "u.item").write_text(U_ITEM, encoding="latin-1")
    return d


def write_atomic(d):
    (d / "ml-100k.inter").write_text(INTER, encoding="utf-8")
    (d / "ml-100k.user").write_text(USER, encoding="utf-8")
    (d / "ml-100k.item").write_text(ITEM, encoding="utf-8")
    return d


@pytest.fixture
def standard(tmp_path):
    (tmp_path / "std").mkdir()
    return write_standard(tmp_path / "std")


@pytest.fixture
def atomic(tmp_path):
    (tmp_path / "atomic").mkdir()
    return write_atomic(tmp_path / "atomic")


def test_standard_files_give_the_hand_computed_arrays(standard):
    ml = load_ml100k(standard)
    # users 2,5,10 -> 0,1,2 ; items 1,3,7,9 -> 0,1,2,3
    np.testing.assert_array_equal(ml.ratings, [[2, 1, 5, 881250949], [0, 2, 1, 881250950], [1, 1, 4, 881250951],
                                               [0, 3, 3, 881250952], [2, 0, 2, 881250953]])
    assert ml.ratings.dtype == np.int64
    assert (ml.num_users, ml.num_items) == (3, 4)
    np.testing.assert_array_equal(ml.user_age, [53, 23, 24])
    assert ml.gender_names == ("F", "M")
    np.testing.assert_array_equal(ml.user_gender, [0, 1, 1])
    assert ml.occupation_names == ("other", "technician", "writer")
    np.testing.assert_array_equal(ml.user_occupation, [0, 2, 1])
    assert list(ml.user_zip) == ["T8H1N", "32067", "85711"]
    np.testing.assert_array_equal(ml.item_genre_offsets, [0, 2, 3, 4, 7])
    np.testing.assert_array_equal(ml.item_genres(0), [FLAGS["Animation"], FLAGS["Comedy"]])
    np.testing.assert_array_equal(ml.item_genres(2), [FLAGS["unknown"]])
    np.testing.assert_array_equal(ml.item_genres(3), [FLAGS["Action"], FLAGS["War"], FLAGS["Western"]])
    np.testing.assert_array_equal(ml.item_year, [1995, 1994, -1, 1995])
    np.testing.assert_array_equal(ml.user_raw_ids, [2, 5, 10])
    np.testing.assert_array_equal(ml.item_raw_ids, [1, 3, 7, 9])


def test_both_layouts_give_identical_arrays(standard, atomic):
    a, b = load_ml100k(standard), load_ml100k(atomic)
    for f in dataclasses.fields(a):
        if f.name == "source":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def test_partial_directory_names_what_is_missing(standard):
    (standard / "u.item").unlink()
    with pytest.raises(DataFormatError, match=r"incomplete MovieLens-100k.*not u\.item"):
        ml100k_dir(standard)


def test_missing_directory_is_one_clear_line(tmp_path):
    with pytest.raises(DataFormatError, match="no such directory") as err:
        load_ml100k(tmp_path / "nope")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name,bad_line,lineno,message", [
    ("u.data", "2\t7\tfive\t881250950", 2, r"u\.data:2: rating 'five' is not an integer"),
    ("u.data", "2\t7\t1", 2, r"u\.data:2: 3 fields, expected 4"),
    ("u.data", "", 2, r"u\.data:2: 1 fields, expected 4"),
    ("u.data", "2\t8\t1\t881250950", 2, r"u\.data:2: item id 8 is not in u\.item"),
    ("u.data", "4\t7\t1\t881250950", 2, r"u\.data:2: user id 4 is not in u\.user"),
    ("u.data", "2\t7\t6\t881250950", 2, r"u\.data:2: rating 6 outside 1\.\.5"),
    ("u.user", "2|fifty|F|other|T8H1N", 2, r"u\.user:2: age 'fifty' is not an integer"),
    ("u.user", "10|53|F|other|T8H1N", 2, r"u\.user:2: user id 10 appears again \(first on line 1\)"),
])
def test_bad_line_names_file_and_line(standard, name, bad_line, lineno, message):
    path = standard / name
    lines = path.read_text(encoding="latin-1").splitlines()
    lines[lineno - 1] = bad_line
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    with pytest.raises(DataFormatError, match=message):
        load_ml100k(standard)


def test_atomic_unknown_genre_and_missing_column(atomic):
    item = atomic / "ml-100k.item"
    item.write_text(ITEM.replace("Drama", "Dramedy"), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"ml-100k\.item:3: unknown genre 'Dramedy'"):
        load_ml100k(atomic)
    (atomic / "ml-100k.user").write_text(USER.replace("age:token", "years:token"), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"ml-100k\.user:1: header lacks column\(s\) age"):
        load_ml100k(atomic)


@pytest.fixture(scope="module")
def real_ml100k():
    return load_or_skip(load_ml100k)


def test_real_copy_has_the_published_counts(real_ml100k):
    ml = real_ml100k
    assert ml.ratings.shape == (100_000, 4)
    assert (ml.num_users, ml.num_items) == (943, 1682)
    # every user and every item is rated at least once; each user rated at least 20 movies
    assert np.bincount(ml.ratings[:, 0], minlength=943).min() >= 20
    assert np.bincount(ml.ratings[:, 1], minlength=1682).min() >= 1
    assert set(np.unique(ml.ratings[:, 2])) == {1, 2, 3, 4, 5}
    assert len(ml.occupation_names) == 21 and ml.gender_names == ("F", "M")
    assert len(ml.item_genre_offsets) == 1683 and ml.item_genre_ids.max() < len(GENRES)
