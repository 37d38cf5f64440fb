"""The dynamic class pool against a plain-Python shadow: after any sequence of updates the
label -> slot table and the slots agree, the least-recently-used identity is the one replaced,
the pool never holds more than Q identities, and each slot holds its identity's two latest
gallery features."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embcache.cache.bookkeeping.slot_map import SlotMap
from embcache.nn.class_pool import DynamicClassPool

D = 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_shadow(pool, batches, feats):
    """Replay `batches` on `pool` and on a dict-based LRU; check after every update."""
    last_use, history, step = {}, {}, 0
    q = pool.num_slots
    for labels, f in zip(batches, feats):
        step += 1
        before = {int(x) for x in pool.slots.slot_to_id[pool.occupied()]}
        pool.update(torch.tensor(labels), f)
        pool.check_invariants()
        after = {int(x) for x in pool.slots.slot_to_id[pool.occupied()]}
        batch = set(labels)
        evicted, kept = before - after, before & after
        # LRU: every evicted identity was used no later than every surviving one outside the batch
        if evicted:
            assert not (evicted & batch)
            others = [last_use[i] for i in kept - batch]
            if others:
                assert max(last_use[i] for i in evicted) <= min(others)
        assert len(after) <= q
        admitted = len(batch - before)
        assert len(after) == min(q, len(before | batch)) or admitted > q
        for i, lab in enumerate(labels):
            history.setdefault(lab, []).append(f[i])
        for lab in batch:
            last_use[lab] = step
        for lab in evicted:
            history.pop(lab)
        # each resident identity's slot holds its two latest features (one twice if only one so far)
        for lab in after:
            if lab not in batch:
                continue
            slot = int(pool.lookup(torch.tensor([lab]))[0])
            want = history[lab][-2:] if len(history[lab]) >= 2 else history[lab] * 2
            got = pool.features[slot]
            assert {tuple(x.tolist()) for x in got} == {tuple(x.tolist()) for x in want}
    return pool


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(q=st.integers(1, 8),
       batches=st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=6), min_size=1, max_size=20),
       seed=st.integers(0, 1000))
def test_random_updates_keep_pool_and_table_consistent(q, batches, seed):
    gen = torch.Generator().manual_seed(seed)
    batches = [b if len(set(b)) <= q else b[:0] + sorted(set(b))[:q] for b in batches]
    feats = [torch.randn(len(b), D, generator=gen) for b in batches]
    pool = DynamicClassPool(q, D, num_classes=16)
    run_shadow(pool, batches, feats)
    # checkpoint round trip keeps the table and the LRU keys
    clone = DynamicClassPool(q, D, num_classes=16)
    clone.load_state_dict(pool.state_dict())
    assert torch.equal(clone.slots.slot_to_id, pool.slots.slot_to_id)
    assert torch.equal(clone.lru.keys(), pool.lru.keys())
    assert torch.equal(clone.features, pool.features)


def test_least_recently_used_identity_is_replaced():
    pool = DynamicClassPool(3, D, num_classes=100)
    f = torch.eye(D)
    pool.update(torch.tensor([10]), f[:1])
    pool.update(torch.tensor([20]), f[:1])
    pool.update(torch.tensor([30]), f[:1])
    pool.update(torch.tensor([10]), f[:1])          # 10 used again: 20 is now the oldest
    pool.update(torch.tensor([40]), f[:1])
    assert pool.lookup(torch.tensor([20])).item() == -1
    assert (pool.lookup(torch.tensor([10, 30, 40])) >= 0).all()
    pool.update(torch.tensor([50, 60]), f[:2])       # 30 and 10 (oldest two) go
    assert pool.lookup(torch.tensor([10, 30])).tolist() == [-1, -1]
    assert pool.num_resident() == 3 and pool.stats["evicted"] == 3


def test_more_identities_in_one_batch_than_slots_are_counted_not_stored():
    pool = DynamicClassPool(2, D, num_classes=100)
    pool.update(torch.tensor([1, 2, 3, 4]), torch.randn(4, D))
    assert pool.num_resident() == 2 and pool.stats["overflow"] == 2
    pool.check_invariants()


def test_features_alternate_and_centre_is_their_mean():
    pool = DynamicClassPool(2, D, num_classes=10)
    f = torch.eye(D)
    pool.update(torch.tensor([4]), f[0:1])
    assert torch.equal(pool.features[0], torch.stack([f[0], f[0]]))
    pool.update(torch.tensor([4]), f[1:2])
    pool.update(torch.tensor([4]), f[2:3])           # replaces the older (f0), keeps f1
    assert {tuple(r.tolist()) for r in pool.features[0]} == {tuple(f[1].tolist()), tuple(f[2].tolist())}
    want = torch.nn.functional.normalize(f[1] + f[2], dim=0)
    assert torch.allclose(pool.centres()[0], want)


def test_memory_does_not_depend_on_the_number_of_classes():
    small = DynamicClassPool(64, 16, num_classes=1_000)
    huge = DynamicClassPool(64, 16, num_classes=100_000_000)
    assert small.nbytes() == huge.nbytes()
    huge.update(torch.tensor([99_999_999, 5]), torch.randn(2, 16))
    assert huge.lookup(torch.tensor([99_999_999])).item() >= 0
    with pytest.raises(ValueError, match="outside"):
        huge.update(torch.tensor([100_000_000]), torch.randn(1, 16))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 19), min_size=1, max_size=4, unique=True)),
                    max_size=15))
def test_sorted_slot_map_answers_like_the_dense_one(ops):
    dense, sparse = SlotMap(20, 5), SlotMap(20, 5, index="sorted")
    for release, ids in ops:
        for m in (dense, sparse):
            if release:
                m.release(torch.tensor(ids[:5]) % 5)
            else:
                ids_t = torch.tensor(ids)
                ids_t = ids_t[m.lookup(ids_t) < 0]
                free = m.free_slots(ids_t.numel())
                m.assign(ids_t[:free.numel()], free)
            m.check_invariants()
        assert torch.equal(dense.slot_to_id, sparse.slot_to_id)
        assert torch.equal(dense.lookup(torch.arange(20)), sparse.lookup(torch.arange(20)))
