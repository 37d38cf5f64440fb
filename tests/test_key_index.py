"""KeyIndex, the host index of an open table, against a plain dict driven by random
operations; its hash table's invariant after every change (each row reachable from its
key's first slot without crossing an empty slot); the free-row order; TableFull and damaged
checkpoints refused with nothing changed; at most 24 bytes per live key."""
import numpy as np
import pytest

from embcache.cache.open_keys.key_index import KeyIndex, TableFull
from embcache.errors import CheckpointError

I64 = np.iinfo(np.int64)


# ------------------------------------------------------------------------ helpers
class DictIndex:
    """The reference: a dict key -> row, a list row -> key, a list of free rows (LIFO)."""

    def __init__(self, max_rows=None):
        self.max_rows = max_rows
        self.row_of, self.key_of, self.free = {}, [], []

    def insert(self, keys):
        new = list(dict.fromkeys(k for k in keys.tolist() if k not in self.row_of))
        available = len(self.free) + (len(new) if self.max_rows is None else self.max_rows - len(self.key_of))
        if len(new) > available:
            raise TableFull("reference")
        new_rows = []
        for k in new:
            if self.free:
                r = self.free.pop()
                self.key_of[r] = k
            else:
                r = len(self.key_of)
                self.key_of.append(k)
            self.row_of[k] = r
            new_rows.append(r)
        return [self.row_of[k] for k in keys.tolist()], new_rows, new

    def retire(self, rows):
        for r in rows:
            del self.row_of[self.key_of[r]]
            self.free.append(r)

    def lookup(self, keys):
        return [self.row_of.get(k, -1) for k in keys.tolist()]


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def homes(index, keys):
    """Each key's first slot, computed here with numpy (splitmix64's finaliser of key + salt,
    top bits): `check_table` fails if this and the kernels' hash disagree."""
    x = np.asarray(keys, dtype=np.int64).view(np.uint64) + index._salt
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    x = x ^ (x >> np.uint64(31))
    return (x >> index._shift).astype(np.int64)


def check_table(index):
    """The hash table holds each live row once, no other, and every row sits in the run of
    occupied slots that starts after the last empty slot before its key's first slot (so a
    probe from there reaches it). Returns the mean displacement (probe steps - 1)."""
    slots = index._slots
    n = slots.shape[0]
    assert n & (n - 1) == 0
    occupied = np.flatnonzero(slots >= 0)
    rows = slots[occupied].astype(np.int64)
    assert len(occupied) == index.live <= 0.7 * n
    np.testing.assert_array_equal(np.sort(rows), np.flatnonzero(index.live_mask()))
    assert len(np.unique(rows)) == len(rows)
    if not len(rows):
        return 0.0
    home = homes(index, index._row_key[rows])
    first_empty = int(np.flatnonzero(slots < 0)[0])  # rotate it to position 0: no run wraps
    empty = np.roll(slots < 0, -first_empty)
    last_empty = np.maximum.accumulate(np.where(empty, np.arange(n), -1))
    p, q = (occupied - first_empty) % n, (home - first_empty) % n
    assert np.all(q <= p) and np.all(q > last_empty[p]), "a row lies beyond an empty slot of its probe"
    return float(np.mean(p - q))


def snapshot(index, probe):
    """Everything observable about an index."""
    sd = index.state_dict()
    return (index.num_rows, index.live, index.free_rows, index.max_rows, index.nbytes(),
            index.lookup(probe).tolist(), index.live_mask().tolist(),
            sd["row_key"].tolist(), sd["free_rows"].tolist(), sd["max_rows"])


def draw_keys(rng, kind, n):
    if kind == "small":  # many repeats, 0 and negatives
        return rng.integers(-40, 40, n)
    if kind == "consecutive":
        return int(rng.integers(-1000, 1000)) + np.sort(rng.integers(0, 3 * n + 1, n))
    if kind == "wide":
        return rng.integers(I64.min, I64.max, n, dtype=np.int64, endpoint=True)
    if kind == "structured":  # equal low bits: only the high ones tell keys apart
        return rng.integers(-300, 300, n) << 44
    raise AssertionError(kind)


# ------------------------------------------------------------------------ against a dict
@pytest.mark.parametrize("max_rows", [None, 150])
@pytest.mark.parametrize("kind", ["small", "consecutive", "wide", "structured"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_operations_match_a_dict(seed, kind, max_rows):
    rng = np.random.default_rng(seed)
    index, ref = KeyIndex(max_rows=max_rows, capacity=4), DictIndex(max_rows)
    seen = np.zeros(0, dtype=np.int64)
    full = 0
    for _ in range(120):
        op = rng.choice(["insert", "retire", "lookup"], p=[0.55, 0.2, 0.25])
        if op == "insert":
            keys = draw_keys(rng, kind, int(rng.integers(0, 120)))
            seen = np.concatenate([seen, keys])
            np.testing.assert_array_equal(index.unseen(keys), list(dict.fromkeys(
                k for k in keys.tolist() if k not in ref.row_of)))
            try:
                expected = ref.insert(keys)
            except TableFull:
                before = snapshot(index, seen)
                with pytest.raises(TableFull):
                    index.insert(keys)
                assert snapshot(index, seen) == before
                full += 1
                continue
            rows, new_rows, new_keys = index.insert(keys)
            assert rows.dtype == new_rows.dtype == new_keys.dtype == np.int64
            assert (rows.tolist(), new_rows.tolist(), new_keys.tolist()) == expected
        elif op == "retire" and ref.row_of:
            live = np.array(sorted(ref.row_of.values()))
            rows = rng.permutation(live)[:int(rng.integers(1, len(live) + 1))]
            ref.retire(rows.tolist())
            index.retire(rows)
        probe = np.concatenate([seen, draw_keys(rng, kind, 50)])
        assert index.lookup(probe).tolist() == ref.lookup(probe)
        assert (index.num_rows, index.live, index.free_rows) == (len(ref.key_of), len(ref.row_of), len(ref.free))
        live_rows = sorted(ref.row_of.values())
        assert np.flatnonzero(index.live_mask()).tolist() == live_rows
        assert index.keys_of(np.array(live_rows, dtype=np.int64)).tolist() == [ref.key_of[r] for r in live_rows]
        check_table(index)
    assert index.live > 0 and (max_rows is None or index.num_rows <= max_rows)
    if max_rows is not None and kind != "small":
        assert full > 0  # the bound was reached, and refused


def test_consecutive_negative_and_zero_keys():
    index = KeyIndex(capacity=2)
    keys = np.arange(-5000, 5000)  # 0 and negatives among them, several resizes
    rows, new_rows, new_keys = index.insert(keys)
    np.testing.assert_array_equal(rows, np.arange(10_000))
    np.testing.assert_array_equal(new_keys, keys)
    np.testing.assert_array_equal(index.lookup(keys[::-1]), np.arange(10_000)[::-1])
    assert index.lookup(np.array([0, -1, 5000, I64.min, I64.max])).tolist() == [5000, 4999, -1, -1, -1]
    rows, new_rows, _ = index.insert(np.array([I64.min, I64.max, 0, I64.min]))
    assert rows.tolist() == [10_000, 10_001, 5000, 10_000] and new_rows.tolist() == [10_000, 10_001]
    assert index._slots.shape[0] >= 10_002 / 0.7
    check_table(index)


def test_uint64_keys_keep_their_bits():
    index = KeyIndex()
    big = np.array([2**64 - 1, 2**63, 5], dtype=np.uint64)
    index.insert(big)
    assert index.lookup(np.array([-1, I64.min, 5])).tolist() == [0, 1, 2]
    assert index.keys_of(np.array([0, 1])).tolist() == [-1, I64.min]
    with pytest.raises(TypeError):
        index.lookup(np.array([1.5]))
    with pytest.raises(ValueError):
        index.insert(np.zeros((2, 2), dtype=np.int64))
    assert index.lookup(np.zeros(0, dtype=np.int64)).shape == (0,)
    assert [a.shape for a in index.insert(np.zeros(0, dtype=np.int64))] == [(0,), (0,), (0,)]


@pytest.mark.parametrize("kind", ["consecutive", "structured", "shifted"])
def test_structured_keys_spread_over_the_table(kind):
    """Keys that differ only in low bits, or only in high bits, sit about as far from their
    first slot as under a uniform hash (linear probing at load a: a / (2 (1 - a)) on average,
    0.3 here; asserted below twice that): an identity or low-bits hash would pile them into
    long runs."""
    index = KeyIndex(capacity=16)
    keys = {"consecutive": np.arange(-50_000, 50_000), "structured": np.arange(100_000) << 40,
            "shifted": np.arange(100_000) * 4096 + 7}[kind]
    index.insert(keys)
    load = index.live / index._slots.shape[0]
    assert check_table(index) < load / (1 - load)
    np.testing.assert_array_equal(index.lookup(keys), np.arange(100_000))


def test_two_indexes_place_keys_differently_but_give_the_same_rows():
    keys = np.arange(1000) << 33
    a, b = KeyIndex(), KeyIndex()
    assert a._salt != b._salt
    assert a.insert(keys)[0].tolist() == b.insert(keys)[0].tolist()
    assert not np.array_equal(a._slots, b._slots)


# ------------------------------------------------------------------------ deletion
def keys_homed_at(index, wanted, count, rng):
    """`count` distinct random keys whose first slot is `wanted` (found by trying)."""
    found = []
    while len(found) < count:
        cand = rng.integers(I64.min, I64.max, 200_000, dtype=np.int64)
        found.extend(cand[homes(index, cand) == wanted].tolist())
    return np.array(found[:count], dtype=np.int64)


@pytest.mark.parametrize("at_end", [False, True])
def test_backward_shift_keeps_a_probe_chain_whole(at_end):
    """Keys of two neighbouring first slots share one run (across the table's end when
    `at_end`); retiring keys inside it moves the rest back, and every other key is still
    found; retired keys are not; new keys of the same slots fill in."""
    rng = np.random.default_rng(5)
    index = KeyIndex(capacity=1000)  # 2048 slots, no resize below
    mask = index._slots.shape[0] - 1
    h = mask if at_end else 100
    a, b = keys_homed_at(index, h, 10, rng), keys_homed_at(index, (h + 1) & mask, 6, rng)
    c = keys_homed_at(index, (h + 3) & mask, 4, rng)
    keys = np.concatenate([a[:4], b[:3], a[4:7], c, b[3:], a[7:]])
    slots_before = index._slots.shape[0]
    index.insert(keys)
    assert index._slots.shape[0] == slots_before
    assert check_table(index) > 3  # one long run
    retired_keys = np.array([a[0], b[0], a[5], c[1], a[9]])
    retired_rows = index.lookup(retired_keys)
    index.retire(retired_rows)
    check_table(index)
    others = np.array([k for k in keys.tolist() if k not in retired_keys.tolist()])
    np.testing.assert_array_equal(index.lookup(others), np.flatnonzero(~np.isin(keys, retired_keys)))
    assert (index.lookup(retired_keys) == -1).all()
    more = keys_homed_at(index, h, 13, rng)[10:]
    rows = index.insert(more)[0]
    assert rows.tolist() == retired_rows[::-1][:3].tolist()  # the last retired first
    check_table(index)
    np.testing.assert_array_equal(index.lookup(others), np.flatnonzero(~np.isin(keys, retired_keys)))
    index.retire(index.lookup(others))
    check_table(index)
    np.testing.assert_array_equal(index.lookup(more), rows)
    assert index.live == 3


# ------------------------------------------------------------------------ rows
def test_free_rows_are_reused_last_retired_first():
    index = KeyIndex()
    index.insert(np.arange(100, 110))  # rows 0..9
    index.retire(np.array([3, 7, 1]))
    assert index.free_rows == 3 and index.num_rows == 10 and index.live == 7
    assert index.lookup(np.array([103, 107, 101, 102])).tolist() == [-1, -1, -1, 2]
    rows, new_rows, new_keys = index.insert(np.array([50, 102, 51, 50, 52, 53]))
    assert rows.tolist() == [1, 2, 7, 1, 3, 10]
    assert new_rows.tolist() == [1, 7, 3, 10] and new_keys.tolist() == [50, 51, 52, 53]
    assert index.num_rows == 11 and index.free_rows == 0
    assert index.live_mask().all()
    # a key that comes back gets a row like any new key
    index.retire(np.array([0]))
    assert index.insert(np.array([100]))[0].tolist() == [0]


def test_retire_and_keys_of_refuse_bad_rows_changing_nothing():
    index = KeyIndex()
    index.insert(np.arange(10))
    index.retire(np.array([4]))
    probe = np.arange(-2, 12)
    before = snapshot(index, probe)
    for rows, what in (([1, 10], "out of range"), ([-1], "out of range"), ([2, 4], "free"),
                       ([5, 6, 5], "listed twice")):
        with pytest.raises(ValueError, match=what):
            index.retire(np.array(rows))
        assert snapshot(index, probe) == before
    with pytest.raises(ValueError, match="free"):
        index.keys_of(np.array([4]))
    with pytest.raises(ValueError, match="out of range"):
        index.keys_of(np.array([10]))
    assert index.keys_of(np.array([9, 0, 9])).tolist() == [9, 0, 9]


def test_table_full_changes_nothing():
    index = KeyIndex(max_rows=10, capacity=4)
    index.insert(np.arange(8))
    index.retire(np.array([2]))
    probe = np.arange(-5, 30)
    before = snapshot(index, probe)
    batch = np.array([20, 21, 1, 22, 23, 20, 21, 3])  # 4 new keys, 3 rows free
    with pytest.raises(TableFull, match="4 new keys need rows, 3 are free") as err:
        index.insert(batch)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    assert snapshot(index, probe) == before
    # a batch longer than the free rows, with few enough new keys, goes in
    rows = index.insert(np.array([20, 21, 20, 1, 1, 21, 22, 20]))[0]
    assert rows.tolist() == [2, 8, 2, 1, 1, 8, 9, 2]
    assert index.num_rows == 10 and index.free_rows == 0
    with pytest.raises(TableFull, match="1 new keys need rows, 0 are free"):
        index.insert(np.array([99]))
    assert index.insert(np.array([22, 0]))[0].tolist() == [9, 0]


def test_constructor_checks_its_arguments():
    for bad in ({"max_rows": -1}, {"max_rows": 2**31}, {"capacity": 0}, {"max_rows": 2.5}):
        with pytest.raises(ValueError):
            KeyIndex(**bad)
    index = KeyIndex(max_rows=0)
    with pytest.raises(TableFull):
        index.insert(np.array([1]))
    assert index.insert(np.zeros(0, dtype=np.int64))[0].shape == (0,)


# ------------------------------------------------------------------------ checkpoints
def busy_index(seed=3, max_rows=None):
    """An index after inserts, retires and reuse: free rows, rows whose key came back."""
    rng = np.random.default_rng(seed)
    index = KeyIndex(max_rows=max_rows, capacity=8)
    for _ in range(30):
        index.insert(rng.integers(-500, 500, 80))
        live = np.flatnonzero(index.live_mask())
        index.retire(rng.permutation(live)[:int(rng.integers(0, len(live) // 3 + 1))])
    assert index.free_rows > 0
    return index


@pytest.mark.parametrize("max_rows", [None, 5000])
def test_state_dict_round_trip(max_rows):
    a = busy_index(max_rows=max_rows)
    sd = a.state_dict()
    assert sd["row_key"].dtype == np.int64 and sd["free_rows"].dtype == np.int32
    assert sd["max_rows"] == (-1 if max_rows is None else max_rows)
    b = KeyIndex(max_rows=7)
    b.insert(np.arange(5))
    b.load_state_dict(sd)
    probe = np.arange(-600, 600)
    assert snapshot(b, probe)[:4] == snapshot(a, probe)[:4]
    assert snapshot(b, probe)[5:] == snapshot(a, probe)[5:]
    check_table(b)
    # the same future: new keys take the same rows, retires free the same ones
    rng = np.random.default_rng(9)
    for _ in range(10):
        keys = rng.integers(-700, 700, 60)
        assert [x.tolist() for x in a.insert(keys)] == [x.tolist() for x in b.insert(keys)]
        rows = rng.permutation(np.flatnonzero(a.live_mask()))[:20]
        a.retire(rows)
        b.retire(rows)
        assert snapshot(b, probe)[5:] == snapshot(a, probe)[5:]
    # the state is a copy, not a view of the index
    sd2 = a.state_dict()
    kept = {k: v.copy() for k, v in sd2.items() if k != "max_rows"}
    assert a.free_rows > 0
    a.insert(np.arange(10_000, 10_500))  # overwrites the free rows' keys in the index
    assert a.free_rows == 0
    assert all(np.array_equal(sd2[k], v) for k, v in kept.items())


def test_a_free_row_may_keep_a_key_that_a_live_row_holds():
    """A retired row keeps its last key in `row_key`; when that key comes back to another
    row, the state holds it twice, once at a free row, and that is no damage."""
    index = KeyIndex()
    index.insert(np.array([10, 11, 12]))
    index.retire(np.array([0]))
    index.retire(np.array([2]))
    assert index.insert(np.array([10]))[0].tolist() == [2]
    sd = index.state_dict()
    assert sd["row_key"].tolist() == [10, 11, 10] and sd["free_rows"].tolist() == [0]
    fresh = KeyIndex()
    fresh.load_state_dict(sd)
    assert fresh.lookup(np.array([10, 11, 12])).tolist() == [2, 1, -1]
    assert fresh.insert(np.array([55]))[0].tolist() == [0]


def damaged_states():
    def with_(**changes):
        def damage(sd):
            sd.update(changes)
            return sd
        return damage

    def live_duplicate(sd):
        live = np.setdiff1d(np.arange(len(sd["row_key"])), sd["free_rows"])
        sd["row_key"][live[7]] = sd["row_key"][live[2]]
        return sd

    def free_twice(sd):
        sd["free_rows"] = np.append(sd["free_rows"], sd["free_rows"][0])
        return sd

    def free_out_of_range(value):
        def damage(sd):
            sd["free_rows"] = np.append(sd["free_rows"], np.int32(len(sd["row_key"]) if value is None else value))
            return sd
        return damage

    def drop(name):
        def damage(sd):
            del sd[name]
            return sd
        return damage

    def add(sd):
        sd["extra"] = 1
        return sd

    def too_many_free(sd):
        sd["free_rows"] = np.arange(len(sd["row_key"]) + 1, dtype=np.int32)
        return sd

    return {
        "live duplicate": (live_duplicate, "same key"),
        "free row twice": (free_twice, "listed twice"),
        "free row past the end": (free_out_of_range(None), "out of range"),
        "negative free row": (free_out_of_range(-1), "out of range"),
        "more free rows than rows": (too_many_free, "free rows of"),
        "row_key int32": (lambda sd: with_(row_key=sd["row_key"].astype(np.int32))(sd), "row_key must be"),
        "row_key 2-D": (lambda sd: with_(row_key=sd["row_key"][:, None])(sd), "row_key must be"),
        "row_key a list": (lambda sd: with_(row_key=sd["row_key"].tolist())(sd), "row_key must be"),
        "free_rows int64": (lambda sd: with_(free_rows=sd["free_rows"].astype(np.int64))(sd), "free_rows must be"),
        "max_rows below rows": (with_(max_rows=10), "more than max_rows"),
        "max_rows a bool": (with_(max_rows=True), "max_rows must be"),
        "max_rows a float": (with_(max_rows=2000.0), "max_rows must be"),
        "max_rows -2": (with_(max_rows=-2), "max_rows must be"),
        "no free_rows": (drop("free_rows"), "expected the entries"),
        "an extra entry": (add, "expected the entries"),
        "not a dict": (lambda sd: list(sd), "expected the entries"),
    }


@pytest.mark.parametrize("name", list(damaged_states()))
def test_damaged_state_is_refused_changing_nothing(name):
    damage, message = damaged_states()[name]
    bad = damage(busy_index(seed=4).state_dict())
    target = busy_index(seed=5, max_rows=5000)
    probe = np.arange(-600, 600)
    before = snapshot(target, probe)
    with pytest.raises(CheckpointError, match=message) as err:
        target.load_state_dict(bad)
    assert "\n" not in str(err.value) and str(err.value).startswith("key index state: ")
    assert snapshot(target, probe) == before
    check_table(target)


# ------------------------------------------------------------------------ memory
def test_at_most_24_bytes_per_live_key():
    """At 10 k, 100 k and 1 M live keys, and every 2,500 keys in between (the worst is
    right after a resize), and after retiring half and inserting as many new keys."""
    rng = np.random.default_rng(11)
    index = KeyIndex(capacity=1000)
    keys = rng.integers(I64.min, I64.max, 1_000_000, dtype=np.int64, endpoint=True)
    ratios = {}
    for start in range(0, len(keys), 2500):
        index.insert(keys[start:start + 2500])
        ratios[index.live] = index.nbytes() / index.live
    assert index.live == index.num_rows == 1_000_000  # (2**64 random keys: no repeat, almost surely)
    assert max(ratios[n] for n in (10_000, 100_000, 1_000_000)) <= 24
    assert max(r for n, r in ratios.items() if n >= 10_000) <= 24, max(ratios.items(), key=lambda x: x[1])
    full_bytes = index.nbytes()
    retired = rng.permutation(index.num_rows)[:index.num_rows // 2]
    index.retire(retired)
    assert index.nbytes() / index.live > 24  # row_key cannot shrink: the bound holds for a table in use
    more = rng.integers(I64.min, I64.max, len(retired), dtype=np.int64, endpoint=True)
    rows = index.insert(more)[0]
    assert index.free_rows == 0 and index.num_rows == len(keys)
    assert index.nbytes() / index.live <= 24, index.nbytes() / index.live
    assert index.nbytes() <= full_bytes + 1024  # the free stack gave its memory back
    np.testing.assert_array_equal(np.sort(rows), np.sort(retired))
    sample = rng.integers(0, len(more), 2000)
    np.testing.assert_array_equal(index.lookup(more[sample]), rows[sample])
    kept = np.ones(len(keys), dtype=bool)
    kept[retired] = False
    kept = np.flatnonzero(kept)[:2000]
    np.testing.assert_array_equal(index.lookup(keys[kept]), kept)
    np.testing.assert_array_equal(index.lookup(keys[retired[:2000]]), -1)


def test_nbytes_counts_every_array():
    index = KeyIndex(capacity=100)
    index.insert(np.arange(50))
    index.retire(np.arange(10))
    arrays = (index._slots, index._row_key, index._free, index._meta)
    assert index.nbytes() == sum(a.nbytes for a in arrays)
    assert index._slots.dtype == np.int32 and index._free.dtype == np.int32 and index._row_key.dtype == np.int64


def test_a_lookup_over_threads_finds_what_one_thread_finds(monkeypatch):
    """Chunks of a batch looked up in parallel (each with its own ring of homes) give the
    rows of the serial pass: known keys, unknown ones, repeats, chunk edges anywhere."""
    import numba

    from embcache.cache.open_keys import key_index

    rng = np.random.default_rng(5)
    index = KeyIndex(None)
    known = rng.integers(-2**63, 2**63 - 1, size=20_000, dtype=np.int64)
    index.insert(known)
    batch = np.concatenate([known[rng.integers(0, known.size, 30_000)],
                            rng.integers(-2**63, 2**63 - 1, size=7_000, dtype=np.int64)])
    rng.shuffle(batch)
    serial = index.lookup(batch)  # 37 k keys: one thread below 2 chunks of 32 k
    monkeypatch.setattr(key_index, "_PARALLEL_CHUNK", 777)
    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        parallel = index.lookup(batch)
    finally:
        numba.set_num_threads(threads)
    assert np.array_equal(parallel, serial)
    assert (serial >= 0).sum() == 30_000 and np.array_equal(index.keys_of(serial[serial >= 0]), batch[serial >= 0])
