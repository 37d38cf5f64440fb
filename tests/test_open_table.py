"""Open tables (raw 64-bit keys, rows made on first sight, the coldest retired under a
bound): training on raw keys equals training on vocabulary ids of the same data, to the
bit; under a bound it equals an uncached table that retires the same keys."""
import numpy as np
import pytest
import torch
from torch import nn

from embcache import CachedEmbeddingBag
from embcache.cache.open_keys.open_table import OpenTable
from embcache.keys import initial_rows

DIM, BOUND, SEED = 8, 0.1, 3


def key_stream(steps=30, batch=24, pool=400, seed=0, drift=0):
    """Batches of raw int64 keys drawn Zipf-like from a pool that drifts by `drift` keys a step."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-2**63, 2**63 - 1, size=pool + steps * drift, dtype=np.int64)
    out = []
    for t in range(steps):
        ranks = np.minimum(rng.zipf(1.3, size=(batch, 2)) - 1, pool - 1)
        out.append(torch.from_numpy(base[t * drift + ranks]))
    return out


def raw_bag(num, **kw):
    return CachedEmbeddingBag(num, DIM, cache_ratio=0.2, device="cpu", keys="raw", key_seed=SEED,
                              init_bound=BOUND, warmup_ratio=0, **kw)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_raw_keys_equal_vocabulary_ids_to_the_bit(optimizer):
    """No bound reached: the same rows as a vocabulary table whose row i starts at
    initial_rows(key of id i). The open table starts at 16 rows and grows to ~400."""
    batches = key_stream()
    vocab = {}
    for b in batches:
        for k in b.flatten().tolist():
            vocab.setdefault(k, len(vocab))
    keys = torch.tensor(list(vocab), dtype=torch.int64)
    ref = CachedEmbeddingBag(len(vocab), DIM, cache_ratio=0.2, device="cpu", optimizer=optimizer, lr=0.05,
                             weight=initial_rows(keys, DIM, SEED, BOUND), warmup_ratio=0)
    bag = raw_bag(16, optimizer=optimizer, lr=0.05)
    lookup = np.vectorize(vocab.__getitem__)
    for b in batches:
        ids = torch.from_numpy(lookup(b.numpy()).astype(np.int64))
        out_ref, out = ref(ids), bag(b)
        assert torch.equal(out, out_ref)
        (out_ref ** 2).sum().backward()
        (out ** 2).sum().backward()
    got_keys, got_rows = bag.keyed_weight()
    want = ref.full_weight().index_select(0, torch.from_numpy(lookup(got_keys.numpy()).astype(np.int64)))
    assert got_keys.numel() == len(vocab)
    assert torch.equal(got_rows, want)
    assert bag.cache.num_rows > 16 and bag.open_stats()["retired_keys"] == 0


class UncachedRows:
    """The uncached reference store: an nn.EmbeddingBag's weight (and an Adagrad state)."""

    def __init__(self, rows, opt=None):
        self.bag = nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True)
        self.num_rows, self.opt = rows, opt

    def grow(self, n):
        assert n <= self.bag.weight.shape[0]
        self.num_rows = n

    def reset_rows(self, rows, weight):
        with torch.no_grad():
            self.bag.weight[rows] = weight
        if self.opt is not None and self.bag.weight in self.opt.state:
            self.opt.state[self.bag.weight]["sum"][rows] = 0.0

    def held_rows(self):
        return np.zeros(0, np.int64)


@pytest.mark.parametrize("optimizer,retire,ttl", [("sgd", "lru", None), ("adagrad", "lfu", None),
                                                   ("sgd", "lru", 4)])
def test_bounded_open_table_equals_uncached_table_retiring_the_same_keys(optimizer, retire, ttl):
    batches = key_stream(steps=40, drift=6)
    max_rows = 120
    bag = raw_bag(64, optimizer=optimizer, lr=0.05, max_rows=max_rows, retire=retire, ttl=ttl)
    ref_open = OpenTable(DIM, SEED, BOUND, max_rows, retire, ttl)
    store = UncachedRows(1 + max_rows + 48)  # a batch's new keys stay past the bound for its step
    store.opt = opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad)(store.bag.parameters(), lr=0.05)
    for b in batches:
        out = bag(b)
        out_ref = store.bag(ref_open.map(b, store))
        assert torch.equal(out, out_ref)
        opt.zero_grad()
        (out_ref ** 2).sum().backward()
        opt.step()
        (out ** 2).sum().backward()
    stats = bag.open_stats()
    assert stats["retired_keys"] > 0 and stats["retired_keys"] == ref_open.retired
    assert stats["live_keys"] <= max_rows
    keys, rows = bag.keyed_weight()
    ref_keys, ref_rows = ref_open.live_rows()
    assert torch.equal(keys, torch.from_numpy(ref_keys))
    assert torch.equal(rows, store.bag.weight.detach()[torch.from_numpy(ref_rows)])


def test_a_retired_key_comes_back_at_its_first_value_and_unseen_keys_read_the_default_row():
    bag = raw_bag(8, lr=0.5, ttl=2)
    key = torch.tensor([[123456789]])
    bag(key).sum().backward()  # trained once
    for _ in range(4):
        bag(torch.tensor([[7]])).sum().backward()  # 123456789 unused for 4 steps: retired
    assert bag.open_stats()["retired_keys"] == 1
    bag.eval()
    with torch.no_grad():
        assert torch.equal(bag(torch.tensor([[424242]])), torch.zeros(1, DIM))  # never seen: the zero row
        assert torch.equal(bag(key), torch.zeros(1, DIM))  # retired: as never seen
    assert bag.open_stats()["live_keys"] == 1  # evaluation made no key
    bag.train()
    out = bag(key)
    assert torch.equal(out, initial_rows(key.flatten(), DIM, SEED, BOUND))


def test_state_dict_resumes_exactly():
    batches = key_stream(steps=24, drift=5)
    whole = raw_bag(32, optimizer="adagrad", max_rows=90)
    first = raw_bag(32, optimizer="adagrad", max_rows=90)
    for b in batches[:12]:
        (whole(b) ** 2).sum().backward()
        (first(b) ** 2).sum().backward()
    sd = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in first.state_dict().items()}
    resumed = raw_bag(32, optimizer="adagrad", max_rows=90)
    resumed.load_state_dict(sd)
    for b in batches[12:]:
        out_w, out_r = whole(b), resumed(b)
        assert torch.equal(out_w, out_r)
        (out_w ** 2).sum().backward()
        (out_r ** 2).sum().backward()
    for a, b in zip(whole.keyed_weight(), resumed.keyed_weight()):
        assert torch.equal(a, b)
    same = ("live_keys", "new_keys", "retired_keys")  # not the index's bytes: a rebuilt one is tighter
    assert [whole.open_stats()[k] for k in same] == [resumed.open_stats()[k] for k in same]


def test_a_checkpoint_of_another_open_table_is_refused_and_nothing_changes():
    a, b = raw_bag(16, max_rows=50), raw_bag(16, max_rows=60)
    (a(key_stream(1)[0]) ** 2).sum().backward()
    before = b.open_stats()
    with pytest.raises(Exception, match="max_rows"):
        b.load_state_dict(a.state_dict())
    assert b.open_stats() == before


def test_settings_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="keys="):
        CachedEmbeddingBag(10, DIM, device="cpu", max_rows=5)
    with pytest.raises(ValueError, match="weight and ids_freq"):
        CachedEmbeddingBag(10, DIM, device="cpu", keys="raw", weight=torch.zeros(10, DIM))
    with pytest.raises(ValueError, match="mmap"):
        CachedEmbeddingBag(10, DIM, device="cpu", keys="raw", host_store="mmap:/tmp/nowhere")
    with pytest.raises(ValueError, match="keys must be"):
        CachedEmbeddingBag(10, DIM, device="cpu", keys="words")


def test_a_batch_with_more_keys_than_the_bound_holds_them_for_its_step():
    """Like a batch larger than the cache: served and trained, then the bound is restored."""
    bag = raw_bag(8, max_rows=4)
    (bag(torch.arange(10).view(5, 2)) ** 2).sum().backward()
    assert bag.open_stats()["live_keys"] == 10  # this batch's keys stay for its step
    bag(torch.tensor([[100, 101]])).sum().backward()
    stats = bag.open_stats()
    assert stats["live_keys"] <= 4 + 2 and stats["retired_keys"] >= 8


def _live_keys(table):
    return sorted(table.live_rows()[0].tolist())


def test_lru_retires_the_least_recently_used_key_and_lfu_the_least_used():
    store = UncachedRows(4)
    lru = OpenTable(DIM, SEED, BOUND, max_rows=2, retire="lru", retire_chunk=1)
    for keys in ([1], [2], [1], [3]):
        lru.map(torch.tensor(keys), store)
    assert _live_keys(lru) == [1, 3] and lru.retired == 1

    store = UncachedRows(4)
    lfu = OpenTable(DIM, SEED, BOUND, max_rows=2, retire="lfu", retire_chunk=1)
    for keys in ([1], [1], [2], [3]):  # 3 takes 2's row (2 used once, 1 twice)
        lfu.map(torch.tensor(keys), store)
    assert _live_keys(lfu) == [1, 3]
    lfu.map(torch.tensor([4]), store)  # 3 has one use in that row, not 2's use and its own
    assert _live_keys(lfu) == [1, 4] and lfu.retired == 2


def test_a_new_key_gets_its_first_value_whatever_row_it_takes():
    store = UncachedRows(6)
    table = OpenTable(DIM, SEED, BOUND, max_rows=4, retire_chunk=1)
    rows = table.map(torch.tensor([10, 11, 12, 13, 14][:4]), store)
    assert torch.equal(store.bag.weight.detach()[rows], initial_rows(torch.tensor([10, 11, 12, 13]), DIM, SEED, BOUND))
    row = table.map(torch.tensor([99]), store)
    assert torch.equal(store.bag.weight.detach()[row], initial_rows(torch.tensor([99]), DIM, SEED, BOUND))
    assert table.peek(torch.tensor([10, 99, 5])).tolist()[1:] == [int(row), 0]


def test_a_collection_with_open_tables_equals_one_fed_vocabulary_ids():
    """One closed table and two open ones sharing a cache and a key index: outputs and rows
    equal a collection whose open tables hold the same keys as vocabulary ids; the open
    tables' rows come back table by table, and into another grouping (a checkpoint read
    on another number of ranks) with the same values."""
    from embcache import CachedEmbeddingBagCollection
    from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

    streams = [key_stream(steps=12, batch=16, seed=s) for s in (0, 1)]
    vocabs = [{}, {}]
    for stream, vocab in zip(streams, vocabs):
        for b in stream:
            for k in b.flatten().tolist():
                vocab.setdefault(k, len(vocab))
    keys = [torch.tensor(list(v), dtype=torch.int64) for v in vocabs]

    def tables(open_rows):
        out = [EmbeddingBagConfig(name="closed", embedding_dim=DIM, num_embeddings=50, feature_names=["c"],
                                  init_fn=lambda w: torch.nn.init.constant_(w, 0.01))]
        for i in (0, 1):
            n = open_rows[i]
            out.append(EmbeddingBagConfig(
                name=f"open{i}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"o{i}"],
                init_fn=lambda w, i=i, n=open_rows[i]: w.copy_(initial_rows(keys[i], DIM, 1 + i, (1.0 / (64 * (i + 1))) ** 0.5))))
        return out

    open_tables = {"open0": {}, "open1": {}}
    raw = CachedEmbeddingBagCollection(tables([64, 128]), cache_ratio=0.3, device="cpu", open_tables=open_tables,
                                       warmup_ratio=0, lr=0.1, optimizer="adagrad")
    assert len(raw.bags) == 2  # the closed table's cache, and one for both open tables
    ref = CachedEmbeddingBagCollection(tables([len(vocabs[0]), len(vocabs[1])]), cache_ratio=0.3, device="cpu",
                                       warmup_ratio=0, lr=0.1, optimizer="adagrad")
    lookups = [np.vectorize(v.__getitem__) for v in vocabs]
    rng = np.random.default_rng(1)
    for b0, b1 in zip(*streams):
        closed = torch.from_numpy(rng.integers(0, 50, size=b0.shape[0]))
        lengths = torch.tensor([1] * b0.shape[0] + [2] * b0.shape[0] * 2)
        ids = [torch.from_numpy(lk(b.numpy()).astype(np.int64)).flatten() for lk, b in zip(lookups, (b0, b1))]
        out = raw(KeyedJaggedTensor(keys=["c", "o0", "o1"], values=torch.cat([closed, b0.flatten(), b1.flatten()]),
                                    lengths=lengths))
        out_ref = ref(KeyedJaggedTensor(keys=["c", "o0", "o1"], values=torch.cat([closed, *ids]), lengths=lengths))
        assert torch.equal(out.values(), out_ref.values())
        (out.values() ** 2).sum().backward()
        (out_ref.values() ** 2).sum().backward()
    for i in (0, 1):
        got_keys, got_rows = raw.bags[1].keyed_weight(i)
        want = ref.table_weight(f"open{i}").index_select(0, torch.from_numpy(lookups[i](got_keys.numpy()).astype(np.int64)))
        assert torch.equal(got_rows, want)
        assert raw.open_stats()[f"open{i}"]["live_keys"] == len(vocabs[i])
    assert torch.equal(raw.table_weight("closed"), ref.table_weight("closed"))

    saved = {t.name: {k: v.clone() for k, v in raw.table_rows(t.name).items()} for t in raw.embedding_bag_configs()}
    apart = CachedEmbeddingBagCollection(tables([64, 128]), cache_ratio=0.3, device="cpu", warmup_ratio=0, lr=0.1,
                                         optimizer="adagrad", open_tables={"open0": {}, "open1": {"ttl": 1000}})
    assert len(apart.bags) == 3  # another grouping: each open table alone
    apart.restore_tables(saved, raw.optimizer_steps())
    for i in (0, 1):
        got, want = apart.bags[1 + i].keyed_weight(0), raw.bags[1].keyed_weight(i)
        order_got, order_want = torch.argsort(got[0]), torch.argsort(want[0])
        assert torch.equal(got[0][order_got], want[0][order_want])
        assert torch.equal(got[1][order_got], want[1][order_want])


def test_bench_host_feeds_open_tables_the_same_lookups_as_raw_keys():
    """`bench host --keys raw` compares the key index's cost on the same lookups: its raw
    keys are a bijection of the ids, so each batch has the same distinct rows."""
    from embcache.bench.host import as_raw_keys, build_collection, make_batches

    batches = make_batches([50, 7], [2, 1], batch=64, count=3, seed=0)
    raw = as_raw_keys(batches)
    for b, r in zip(batches, raw):
        assert torch.equal(b.lengths(), r.lengths())
        assert len(set(b.values().tolist())) == len(set(r.values().tolist()))
        assert not torch.equal(b.values(), r.values())
    ebc = build_collection([50, 7], 4, 0.5, None, "freq", raw=True)
    ebc(raw[0]).values().sum().backward()
    stats = ebc.open_stats()
    assert stats["t0"]["live_keys"] == len(set(raw[0].values()[:128].tolist()))


def test_a_key_in_a_reused_row_starts_its_uses_from_nothing():
    """lfu: D takes the row of A, retired (ttl) after 5 uses; D has 1 use, not 6, so D
    (not C, with 3) retires when E needs room."""
    store = UncachedRows(8)
    lfu = OpenTable(DIM, SEED, BOUND, max_rows=2, retire="lfu", ttl=3, retire_chunk=1)
    A, B, C, D, E = 11, 12, 13, 14, 15
    for keys in ([A] * 5, [B], [C], [C], [C], [D], [E]):
        lfu.map(torch.tensor(keys), store)
    assert _live_keys(lfu) == [C, E]


def _without_kept_lookups(bag):
    """The bag's open table probes every key again in the forward: its prefetch's lookup is
    found (it still names the cache's prefetch) but none of its rows is used."""
    take = bag.open._take_ahead

    def forgetting(ahead):
        entry = take(ahead)
        if entry is not None:
            entry.rows = np.full_like(entry.rows, -1)
        return entry

    bag.open._take_ahead = forgetting
    return bag


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("retire,ttl,eviction", [("lru", None, "freq"), ("lfu", 3, "lru"), ("lru", 5, "lfu")])
def test_a_forward_reusing_its_prefetch_lookup_decides_as_two_full_passes(depth, retire, ttl, eviction):
    """One pass over the key index and one admission pass a batch (the prefetch's, reused
    by the forward for the keys known then) decide exactly what a forward probing every key
    and admitting every row again decides: rows, keys, retirements, cache maps, policy,
    holds and counts, to the bit; with new keys every step, retirement in between, and
    keys made by an earlier forward after a later batch's prefetch (depth > 1)."""
    
    from .test_cache_fused import assert_same_state

    batches = key_stream(steps=36, batch=24, pool=300, drift=5, seed=depth)
    slots = 30 * (depth + 1)  # room for the batches in flight, not for every key: rows are evicted
    bags = [CachedEmbeddingBag(128, DIM, cache_ratio=slots / 128, device="cpu", keys="raw", key_seed=SEED,
                               init_bound=BOUND, warmup_ratio=0, optimizer="adagrad", lr=0.05, max_rows=110,
                               retire=retire, ttl=ttl, eviction=eviction) for _ in range(2)]
    _without_kept_lookups(bags[1])
    for bag in bags:
        for ahead in batches[:depth]:
            bag.prefetch(ahead)
    calls = {"part": 0, "kept": 0}

    def counted(name, fn, hit):
        def wrapper(*args):
            out = fn(*args)
            calls[name] += hit(out)
            return out
        return wrapper

    cache, table = bags[0].cache, bags[0].open
    cache._reuse_part = counted("part", cache._reuse_part, lambda out: 1)
    table._take_ahead = counted("kept", table._take_ahead, lambda out: out is not None)
    bags[1].cache.reuse_prefetch = False  # the reference: a prefetched batch looked up again
    for i, b in enumerate(batches):
        outs = []
        for bag in bags:
            out = bag(b)
            if i + depth < len(batches):
                bag.prefetch(batches[i + depth])
            (out ** 2).sum().backward()
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        assert_same_state(*bags)
        assert bags[0].open_stats() == bags[1].open_stats()
    keys, rows = bags[0].keyed_weight()
    keys_ref, rows_ref = bags[1].keyed_weight()
    assert torch.equal(keys, keys_ref) and torch.equal(rows, rows_ref)
    assert calls["kept"] == len(batches) and calls["part"] >= 20  # both shortcuts ran
    assert bags[0].open_stats()["retired_keys"] > 20
    assert ttl is not None or bags[0].cache.stats.evictions > 20  # (a ttl frees slots itself)


def test_a_kept_lookup_forgets_a_key_retired_after_it():
    """A lookup kept for a coming batch whose key retires before that batch (a store that
    holds nothing for it, unlike the cache): the batch's map gives the key a fresh row at
    its first value, as a map without the kept lookup does."""
    store = UncachedRows(8)
    table = OpenTable(DIM, SEED, BOUND, max_rows=2, retire="lru", retire_chunk=1)
    table.map(torch.tensor([1]), store)
    table.map(torch.tensor([2]), store)
    ahead_rows, ahead = table.rows_ahead(torch.tensor([1, 5]))
    assert ahead_rows.tolist() == [1, 0]
    table.map(torch.tensor([3]), store)  # 1 (the coldest) retires; 3 takes its row
    assert _live_keys(table) == [2, 3]
    assert table.kept_lookup(torch.tensor([1, 5])) is ahead and ahead.rows.tolist() == [-1, -1]  # 1 forgotten
    rows = table.map(torch.tensor([1, 5]), store, ahead=ahead)
    assert sorted(_live_keys(table)) == [1, 5] and int(rows[0]) != int(table.peek(torch.tensor([3]))[0])
    assert torch.equal(store.bag.weight.detach()[rows], initial_rows(torch.tensor([1, 5]), DIM, SEED, BOUND))


def test_keys_added_before_training_train_as_keys_first_seen_in_training():
    """`add_keys` gives keys their first values ahead (no use counted): training after it
    gives the same outputs and rows as training that meets the keys as they come."""
    from embcache.bench.host import as_raw_keys, build_collection, make_batches

    batches = as_raw_keys(make_batches([60, 9], [2, 1], batch=32, count=6, seed=2))
    ahead, fresh = (build_collection([60, 9], 4, 0.5, None, "lru", raw=True, device="cpu") for _ in range(2))
    for b in batches:
        ahead.add_keys(b)
    known = {name: s["live_keys"] for name, s in ahead.open_stats().items() if name in ("t0", "t1")}
    assert known == {f"t{i}": len(set(torch.cat([b[f"f{i}"].values() for b in batches]).tolist())) for i in (0, 1)}
    for b in batches:
        out, want = ahead(b).values(), fresh(b).values()
        assert torch.equal(out, want)
        (out ** 2).sum().backward()
        (want ** 2).sum().backward()
    for i in (0, 1):
        assert torch.equal(ahead.bags[0].keyed_weight(i)[1], fresh.bags[0].keyed_weight(i)[1])
    assert ahead.bags[0].open.uses.sum() == fresh.bags[0].open.uses.sum()  # adding counted no use


def test_each_forward_takes_its_own_prefetch_after_a_stray_one():
    """A batch prefetched twice leaves a stray prefetch behind: every later forward still
    takes the prefetch made for its own keys (the kept lookup of its keys names it), not
    the oldest pending one, whose rows belong to another batch."""
    batches = key_stream(steps=10, batch=24, pool=300, drift=5, seed=4)
    bag = raw_bag(128, max_rows=200)
    taken, keys_of = [], {}  # the keys each cache prefetch was made for (by the entry's id)
    take = bag.cache._take_prefetched

    def recording(ids, ticket=None):
        entry = take(ids, ticket)
        taken.append(None if entry is None else keys_of.get(id(entry)))
        return entry

    def prefetch(keys):
        ahead = bag.prefetch(keys)  # an open table's ticket: its kept lookup, naming the cache's prefetch
        keys_of[id(ahead.prefetched)] = ahead.keys

    bag.cache._take_prefetched = recording
    prefetch(batches[0])
    prefetch(batches[0])  # the stray one
    for i, b in enumerate(batches):
        out = bag(b)
        if i + 1 < len(batches):
            prefetch(batches[i + 1])
        (out ** 2).sum().backward()
    assert all(k is not None and torch.equal(k, b.reshape(-1)) for k, b in zip(taken, batches))


def test_keys_raw_makes_a_keyed_bag_that_copies_saves_and_refuses_what_does_not_apply(tmp_path):
    """`CachedEmbeddingBag(keys="raw")` is a `KeyedEmbeddingBag` (the key stage over a
    closed bag): a deep copy and a pickled save train on as the original does, and settings
    of the wrong kind of table are one ValueError naming them."""
    import copy

    from embcache.nn.cached_embedding_bag import KeyedEmbeddingBag

    bag = raw_bag(32, max_rows=40, optimizer="adagrad", lr=0.05)
    assert type(bag) is KeyedEmbeddingBag and isinstance(bag, CachedEmbeddingBag)
    assert type(CachedEmbeddingBag(32, DIM, device="cpu")) is CachedEmbeddingBag
    batches = key_stream(steps=6, pool=60)
    (bag(batches[0]) ** 2).sum().backward()
    torch.save(bag, tmp_path / "bag.pt")
    copies = [copy.deepcopy(bag), torch.load(tmp_path / "bag.pt", weights_only=False)]
    assert all(type(c) is KeyedEmbeddingBag for c in copies)
    for b in batches[1:]:
        outs = [m(b) for m in (bag, *copies)]
        for out in outs:
            (out ** 2).sum().backward()
        assert all(torch.equal(outs[0], o) for o in outs[1:])
    keys, rows = bag.keyed_weight()
    for c in copies:
        assert all(torch.equal(x, y) for x, y in zip(c.keyed_weight(), (keys, rows)))
    with pytest.raises(ValueError, match=r"^max_rows, ttl: open-table settings, which need keys='raw'$"):
        CachedEmbeddingBag(32, DIM, device="cpu", max_rows=5, ttl=3)
    with pytest.raises(ValueError, match="weight and ids_freq do not apply"):
        CachedEmbeddingBag(32, DIM, device="cpu", keys="raw", weight=torch.zeros(32, DIM))
    with pytest.raises(ValueError, match="keys must be 'ids' or 'raw'"):
        CachedEmbeddingBag(32, DIM, device="cpu", keys="hashed")
