"""state_dict mid-training, then continue: identical (to the bit) to never stopping."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from tests.cache_helpers import zipf_batches

N, D = 3000, 6


FREQ = torch.randint(0, 9, (N,), generator=torch.Generator().manual_seed(5))


def make(optimizer, seed=0):
    """`ids_freq` is construction input (the data's statistics), so a resumed run passes
    the same one; the initial table differs with `seed` and must be overwritten."""
    torch.manual_seed(seed)
    return CachedEmbeddingBag(N, D, cache_ratio=0.03, optimizer=optimizer, lr=0.05,
                              ids_freq=FREQ, device="cpu")


def run(bag, batches):
    for ids, offsets in batches:
        (bag(ids, offsets) ** 2).sum().backward()


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "rowwise_adagrad"])
def test_resume_equals_uninterrupted(optimizer, tmp_path):
    batches = zipf_batches(N, 120, 32, 3, seed=3)
    whole = make(optimizer)
    run(whole, batches)

    first = make(optimizer)
    run(first, batches[:50])
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    resumed = make(optimizer, seed=99)  # different initial table: the checkpoint must win
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    run(resumed, batches[50:])

    assert torch.equal(resumed.full_weight(), whole.full_weight())
    sd_a, sd_b = resumed.state_dict(), whole.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for key in sd_a:
        assert torch.equal(sd_a[key], sd_b[key]), key
    # taking the checkpoint changed nothing: the counters, bytes included, are the same
    assert resumed.cache_stats() == whole.cache_stats()


def test_state_dict_holds_full_table_in_id_order_with_state():
    bag = make("adagrad")
    run(bag, zipf_batches(N, 20, 32, 3))
    sd = bag.state_dict()
    assert sd["weight"].shape == (N, D) and sd["optimizer.sum"].shape == (N, D)
    touched = torch.unique(torch.cat([ids for ids, _ in zipf_batches(N, 20, 32, 3)]))
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[touched] = False
    assert bool((sd["optimizer.sum"][touched].sum(1) > 0).all())
    assert bool((sd["optimizer.sum"][untouched] == 0).all())


def test_loading_a_checkpoint_of_another_shape_or_optimizer_fails_clearly():
    sd = make("adagrad").state_dict()
    with pytest.raises(RuntimeError, match="lacks optimizer state|exp_avg"):
        make("adam").load_state_dict(sd)
    other = CachedEmbeddingBag(N + 1, D, cache_ratio=0.03, optimizer="adagrad", device="cpu")
    with pytest.raises(RuntimeError, match="checkpoint table is"):
        other.load_state_dict(sd)


def test_checkpoint_with_a_prefetch_in_flight_resumes_exactly_stats_included(tmp_path):
    """A pipeline checkpoints between prefetching batch t+1 and training it: the pending
    prefetch (its ids, holds and counts) is part of the checkpoint."""
    batches = zipf_batches(N, 60, 32, 3, seed=4)

    def pipeline(bag, start, stop, save_at=None):
        for i in range(start, stop):
            out = bag(*batches[i])
            if i + 1 < len(batches):
                bag.prefetch(*batches[i + 1])
            (out ** 2).sum().backward()
            if i + 1 == save_at:
                torch.save(bag.state_dict(), tmp_path / "mid.pt")

    whole = make("adam")
    whole.prefetch(*batches[0])
    pipeline(whole, 0, 60, save_at=25)
    resumed = make("adam", seed=7)
    sd = torch.load(tmp_path / "mid.pt")
    assert sd["prefetch.sizes"].tolist() == [batches[25][0].numel()]
    resumed.load_state_dict(sd)
    pipeline(resumed, 25, 60)
    assert torch.equal(resumed.full_weight(), whole.full_weight())
    assert resumed.cache_stats() == whole.cache_stats()
    assert resumed.cache_stats()["batches"] == 60


def test_taking_a_checkpoint_changes_nothing():
    batches = zipf_batches(N, 40, 32, 3, seed=6)
    a, b = make("adagrad"), make("adagrad")
    for i, (ids, offsets) in enumerate(batches):
        (a(ids, offsets) ** 2).sum().backward()
        (b(ids, offsets) ** 2).sum().backward()
        if i % 5 == 0:
            b.state_dict(), b.full_weight()
    assert torch.equal(a.cache.dirty, b.cache.dirty)
    assert a.cache_stats() == b.cache_stats()


def test_a_checkpoint_loads_into_a_cache_of_another_size_and_trains_on_exactly(tmp_path):
    batches = zipf_batches(N, 80, 32, 3, seed=8)
    whole = make("adagrad")
    run(whole, batches)
    first = make("adagrad")
    run(first, batches[:30])
    bigger = CachedEmbeddingBag(N, D, cache_ratio=0.2, optimizer="adagrad", lr=0.05,
                                eviction="lru", device="cpu")
    bigger.load_state_dict(first.state_dict())
    assert int(bigger.cache.slots.occupied().sum()) == 0  # residency starts cold
    run(bigger, batches[30:])
    assert torch.equal(bigger.full_weight(), whole.full_weight())


def test_a_failed_load_changes_nothing():
    bag = make("adagrad")
    run(bag, zipf_batches(N, 10, 32, 3))
    before = {k: v.clone() for k, v in bag.state_dict().items()}
    bad = dict(before)
    bad["slot_to_id"] = bad["slot_to_id"].clone()
    occupied = torch.nonzero(bad["slot_to_id"] >= 0).flatten()
    bad["slot_to_id"][occupied[1]] = bad["slot_to_id"][occupied[0]]  # one id in two slots
    with pytest.raises(RuntimeError, match="residency is damaged"):
        bag.load_state_dict(bad)
    nan = dict(before)
    nan["weight"] = before["weight"].clone()
    nan["weight"][3, 1] = float("nan")
    with pytest.raises(RuntimeError, match="NaN or inf"):
        bag.load_state_dict(nan)
    no_policy = {k: v for k, v in before.items() if k != "policy.id_count"}  # freq keeps counts per id
    with pytest.raises(RuntimeError, match="lacks 'policy.id_count'"):
        bag.load_state_dict(no_policy)
    after = bag.state_dict()
    for k in before:
        assert torch.equal(before[k], after[k]), k


def test_a_checkpoint_from_before_bypassed_rows_loads_and_one_from_a_later_version_is_refused(tmp_path):
    """Statistics fields are only appended: a checkpoint whose statistics end before
    `bypassed_rows` resumes exactly, the new counter at 0; more fields than this cache
    knows is a later version's, refused before anything changes."""
    bag = make("adagrad")
    run(bag, zipf_batches(N, 10, 32, 3))
    old = dict(bag.state_dict())
    old["stats"] = old["stats"][:7]  # hits .. batches, as the first checkpoints saved them
    resumed = make("adagrad", seed=1)
    resumed.load_state_dict(old)
    want = {**bag.cache_stats(), "bypassed_rows": 0}
    assert resumed.cache_stats() == want and torch.equal(resumed.full_weight(), bag.full_weight())
    later = dict(bag.state_dict())
    later["stats"] = torch.cat([later["stats"], torch.tensor([5])])
    before = resumed.full_weight()
    with pytest.raises(RuntimeError, match="statistics have 9 fields"):
        resumed.load_state_dict(later)
    assert torch.equal(resumed.full_weight(), before)


def test_pending_prefetches_restore_the_slots_they_held_and_older_checkpoints_still_load():
    """Three batches prefetched ahead: a row admitted by a later prefetch is resident but
    not held for an earlier one, so the checkpoint keeps each prefetch's held slots.
    A checkpoint without them (earlier versions) loads, holding every resident row of the
    batch; damaged ones are refused before anything changes."""
    batches = zipf_batches(N, 4, 32, 3, seed=6)
    bag = make("adagrad")
    for ids, offsets in batches[:3]:
        bag.prefetch(ids, offsets)
    sd = {k: v.clone() for k, v in bag.state_dict().items()}
    assert sd["prefetch.held_sizes"].tolist() == [p.held.numel() for p in bag.cache._prefetched]
    restored = make("adagrad", seed=3)
    restored.load_state_dict(sd)
    assert torch.equal(restored.cache.holds, bag.cache.holds)
    old = make("adagrad", seed=3)
    old.load_state_dict({k: v for k, v in sd.items() if not k.startswith("prefetch.held")})
    assert int(old.cache.holds.sum()) >= int(bag.cache.holds.sum())
    damaged = dict(sd, **{"prefetch.held": sd["prefetch.held"] + bag.cache.num_slots})
    with pytest.raises(RuntimeError, match="pending prefetches are damaged"):
        old.load_state_dict(damaged)
    assert int(old.cache.holds.sum()) >= int(bag.cache.holds.sum())  # unchanged by the failed load


def test_rows_restored_in_pieces_must_cover_the_table_once():
    """`restore_row_parts` copies pieces (mapped from a checkpoint's files) straight into
    the store; a gap, an overlap or a piece of another width is refused before anything
    changes."""
    bag = make("adagrad")
    weight, state = bag.full_weight(), bag.cache.host.state["sum"].clone()
    new = torch.randn(N, D)
    halves = [(0, new[:1000], {"sum": state[:1000] + 1}), (1000, new[1000:], {"sum": state[1000:] + 1})]
    for bad in ([halves[0]], [halves[0], (999, new[999:], {"sum": state[999:]})],
                [halves[0], (1000, new[1000:, :3], {"sum": state[1000:]})]):
        with pytest.raises(ValueError):
            bag.cache.restore_row_parts(bad, step=5)
        assert torch.equal(bag.full_weight(), weight) and bag.cache.step == 0
    bag.cache.restore_row_parts(halves[::-1], step=5)
    assert torch.equal(bag.full_weight(), new) and torch.equal(bag.cache.host.state["sum"], state + 1)
    assert bag.cache.step == 5
