"""One pass per id per step, in parallel: a prefetched batch's forward reuses its
prefetch's decisions, the lookup runs over threads, and a collection concatenates and
checks a batch's ids once. Each must decide exactly what the serial, twice-looked-up path
decides: maps, policy counters, holds, statistics and rows, to the bit."""
import numba
import numpy as np
import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.cache.bookkeeping import fused_admission
from embcache.nn import group_kernels
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.nn.table_groups import _concat_checked
from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

from .cache_helpers import step_alike, zipf_batches
from .test_cache_fused import assert_same_state

N, D = 3000, 4


def reuse_twins(monkeypatch, **kwargs):
    """The same bag twice: `reuse` on, and off (a prefetched batch's forward looks its ids
    up again, `_serve_beside`: what the fast path must equal)."""
    weight = torch.randn(N, D, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(torch.cat([b for b, _ in zipf_batches(N, 20, 16, 6, seed=9)]), minlength=N)
    return [CachedEmbeddingBag(N, D, weight=weight, ids_freq=freq, device="cpu", **kwargs) for _ in range(2)]


def train_twins(bags, batches, depth):
    """Train both, prefetching `depth` ahead (as the trainer: after each forward); the
    second never reuses. Compares lookups and the whole state after every step."""
    for bag in bags:
        for ahead in batches[:depth]:
            bag.prefetch(*ahead)
    bags[1].cache.reuse_prefetch = False  # the reference: a prefetched batch looked up again
    reused = 0
    for i, (ids, offsets) in enumerate(batches):
        reused += any(p.slots is not None and torch.equal(p.ids, ids) for p in bags[0].cache._prefetched)
        outs = step_alike(bags, batches, i, depth)
        assert torch.equal(outs[0], outs[1])
        assert_same_state(*bags)
    return reused


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("eviction,admission", [("freq", False), ("lfu", True), ("lru", False)])
def test_a_forward_reusing_its_prefetch_decides_as_a_second_pass(monkeypatch, depth, eviction, admission):
    bags = reuse_twins(monkeypatch, cache_ratio=0.03 * (depth + 1), eviction=eviction, admission=admission,
                       optimizer="adagrad", lr=0.1)
    reused = train_twins(bags, zipf_batches(N, 18, 16, 6, seed=depth), depth)
    assert reused >= (3 if admission else 10)  # the fast path ran (declined rows leave a prefetch incomplete)
    assert bags[0].cache.stats.evictions > 20  # with eviction


def test_reuse_under_overflow_serves_beside_what_the_prefetch_could_not_place(monkeypatch):
    # 25 slots against batches of ~60 distinct ids: prefetches leave rows unplaced
    bags = reuse_twins(monkeypatch, cache_ratio=25 / N, eviction="freq", optimizer="sgd", lr=0.05,
                       warmup_ratio=0.0, half_life=3)
    train_twins(bags, zipf_batches(N, 10, 16, 6, seed=5, a=1.05), 2)
    assert bags[0].cache.stats.overflow_rows > 0


def test_reuse_trains_the_table_as_torch_does():
    weight = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    bag = CachedEmbeddingBag(N, D, weight=weight, cache_ratio=0.03, optimizer="sgd", lr=0.05, device="cpu")
    ref = torch.nn.EmbeddingBag(N, D, mode="sum", sparse=True, _weight=weight.clone())
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    batches = zipf_batches(N, 12, 16, 6, seed=4)
    bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches):
        out = bag(ids, offsets)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])
        (out * out).sum().backward()
        opt.zero_grad()
        r = ref(ids, offsets)
        (r * r).sum().backward()
        opt.step()
        assert torch.equal(out, r)
    assert torch.equal(bag.full_weight(), ref.weight.detach())


def _serial_lookup(ids, id_to_slot):
    """The lookup stated plainly: slots, distinct touched slots in first-seen order,
    distinct missing ids in first-seen order."""
    out = id_to_slot[ids]
    touched, missing, seen = [], [], set()
    for i, s in zip(ids.tolist(), out.tolist()):
        key = ("s", s) if s >= 0 else ("m", i)
        if key not in seen:
            seen.add(key)
            (touched if s >= 0 else missing).append(s if s >= 0 else i)
    return out, touched, missing


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 100_000])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_parallel_lookup_is_the_serial_one_whatever_the_chunks(chunk, threads):
    """Chunks of any size, over any number of threads, race on the same slots; the claim
    by the first chunk makes the result that of one serial pass, order included."""
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(chunk)
    num_ids, num_slots = 500, 120
    id_to_slot = np.full(num_ids, -1, dtype=np.int64)
    resident = rng.choice(num_ids, num_slots - 20, replace=False)
    id_to_slot[resident] = rng.permutation(num_slots)[: resident.size]
    ids = rng.zipf(1.3, 2000).astype(np.int64) % num_ids
    owner, mark = fused_admission.new_owner(num_slots), np.zeros(num_slots, dtype=np.int64)
    out, touched = np.empty(ids.size, dtype=np.int64), np.empty(ids.size, dtype=np.int64)
    absent_pos, code, missing = (np.empty(ids.size, dtype=np.int64) for _ in range(3))
    before = id_to_slot.copy()
    saved = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        n_touched, n_absent, n_missing = fused_admission._lookup(ids, id_to_slot, owner, mark, 5, out, touched,
                                                                 absent_pos, code, missing, chunk)
    finally:
        numba.set_num_threads(saved)
    want_out, want_touched, want_missing = _serial_lookup(ids, before)
    assert np.array_equal(out, want_out)
    assert touched[:n_touched].tolist() == want_touched
    assert missing[:n_missing].tolist() == want_missing
    assert np.array_equal(absent_pos[:n_absent], np.nonzero(want_out < 0)[0])
    assert [missing[c] for c in code[:n_absent]] == ids[want_out < 0].tolist()
    assert np.array_equal(id_to_slot, before)  # the missing ids' tags are gone
    assert (owner == fused_admission.NO_OWNER).all()  # the scratch is as it was
    assert sorted(np.nonzero(mark == 5)[0].tolist()) == sorted(want_touched)


# ---------------------------------------------------------------- group inputs
def _collection(cards, **kw):
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=n, feature_names=[f"f{i}"])
              for i, n in enumerate(cards)]
    torch.manual_seed(0)
    return CachedEmbeddingBagCollection(tables, cache_ratio=0.2, device="cpu", **kw)


def _kjt(cards, batch, seed, max_len=3):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (len(cards) * batch,), generator=g)
    per = lengths.view(len(cards), batch).sum(1).tolist()
    values = torch.cat([torch.randint(0, n, (k,), generator=g) for n, k in zip(cards, per)])
    return KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(cards))], values=values, lengths=lengths)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_group_kernel_equals_the_tensor_ops(dtype):
    cards = [50, 7, 300, 1, 90]
    kjt = _kjt(cards, 33, seed=1)
    values, lengths = kjt.values().to(dtype), kjt.lengths().view(len(cards), -1)
    counts = lengths.sum(1).tolist()
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    order = [2, 0, 4, 1, 3]  # a group's features need not follow the batch's order
    row_offsets = np.concatenate([[0], np.cumsum([cards[k] for k in order])[:-1]]).tolist()
    ids, offsets, bad, neg = group_kernels.concat_features(
        values, lengths, [starts[k] for k in order], [counts[k] for k in order], order, row_offsets,
        [cards[k] for k in order], 33)
    spans = {f"f{k}": (k, starts[k], counts[k]) for k in range(len(cards))}
    want_ids, want_offsets = _concat_checked(values, lengths, [f"f{k}" for k in order], spans,
                                             [(f"f{k}", f"t{k}", cards[k]) for k in order], row_offsets)
    assert (bad, neg) == (-1, (-1, -1))
    assert torch.equal(ids, want_ids) and ids.dtype == torch.int64
    assert torch.equal(offsets, want_offsets)


def test_a_bad_id_or_length_is_refused_before_the_cache_changes():
    cards = [40, 40, 40]
    ebc = _collection(cards)
    good = _kjt(cards, 8, seed=2)
    before = ebc.bags[0].cache.slots.slot_to_id.clone()
    values = good.values().clone()
    values[good.lengths()[:8].sum() + 1] = 40  # second feature's second id
    bad = KeyedJaggedTensor(keys=good.keys(), values=values, lengths=good.lengths())
    with pytest.raises(ValueError, match=r"feature 'f1': id 40 at position 1 is outside table 't1' \[0, 40\)"):
        ebc(bad)
    lengths = good.lengths().clone()
    lengths[8 + 3] = -1
    lengths[8 + 4] += 1
    with pytest.raises(ValueError, match=r"feature 'f1': sample 3 has a negative length \(-1\)"):
        ebc(KeyedJaggedTensor(keys=good.keys(), values=good.values(), lengths=lengths))
    assert torch.equal(ebc.bags[0].cache.slots.slot_to_id, before)


def test_a_forward_given_its_ticket_reuses_its_prefetched_group_inputs_unless_the_batch_changed(monkeypatch):
    """The prefetch's ticket carries the batch's checked group inputs: its forward (given
    the ticket, or under `taking`) does not make them again, unless the batch changed in
    place since, or the ticket is another batch's; a forward given none makes them."""
    cards = [30, 60]
    ebc = _collection(cards)
    calls = []
    real = ebc._group_inputs
    monkeypatch.setattr(ebc, "_group_inputs", lambda kjt: calls.append(kjt) or real(kjt))
    a, b, c = (_kjt(cards, 6, seed=s) for s in (3, 4, 5))
    tickets = [ebc.prefetch(a), ebc.prefetch(b), ebc.prefetch(c)]
    assert len(calls) == 3
    ebc(a, tickets[0])
    assert len(calls) == 3  # reused
    with ebc.taking(tickets[0]):  # another batch's ticket: not used
        ebc(c)
    assert len(calls) == 4
    b.values()[0] = (b.values()[0] + 1) % 30  # written in place after its prefetch
    twin = _collection(cards)
    want = twin(KeyedJaggedTensor(keys=b.keys(), values=b.values().clone(), lengths=b.lengths()))
    with ebc.taking(tickets[1]):
        got = ebc(b)
    assert len(calls) == 5  # not reused: made again from what the batch holds now
    assert torch.equal(got.values(), want.values())
