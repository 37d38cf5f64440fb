"""`--prefetch-depth D`: cached DLRM training with D batches prefetched ahead equals whole
tables to the bit at every depth, resumes without prefetching a batch twice, and never
evicts a row an in-flight batch needs (even when the pending batches hold most slots)."""
from dataclasses import replace

import pytest
import torch

from embcache.data.loader import lookahead, lookahead_window
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from embcache.train.prefetch_pipeline import PrefetchPipeline
from tests.test_dlrm import assert_same_checkpoint
from tests.torchrun_helpers import torchrun

STEPS = 52  # past the end of the first epoch (47 batches): the pending prefetches run out there


@pytest.fixture(scope="module")
def synthetic(small_synthetic):
    return small_synthetic


def small_config(**kw):
    base = DLRMConfig(batch_size=128, eval_batch_size=4096, embedding_dim=8, dense_arch=[16], over_arch=[16],
                      device="cpu", progress=False, epochs=2, cache_ratio=0.05)
    return replace(base, **kw)


@pytest.fixture(scope="module")
def uncached(synthetic):
    trainer = DLRMTrainer(small_config(sparse="device", max_steps=STEPS), synthetic)
    trainer.fit()
    return trainer


def assert_equals_uncached(cached, uncached) -> None:
    for t in cached.sparse.embedding_bag_configs():
        want = uncached.sparse.embedding_bags[t.name].weight.detach()
        assert torch.equal(cached.sparse.table_weight(t.name), want), t.name
    dense = lambda m: {k: v for k, v in m.state_dict().items() if not k.startswith("sparse_arch")}  # noqa: E731
    for k, v in dense(uncached.model).items():
        assert torch.equal(dense(cached.model)[k], v), k


def record_prefetches(trainer) -> list[torch.Tensor]:
    """The ids of every batch `trainer` prefetches, in order."""
    calls, prefetch = [], trainer.sparse.prefetch
    trainer.sparse.prefetch = lambda features: calls.append(features.values().clone()) or prefetch(features)
    return calls


def caches(trainer):
    return [bag.cache for bag in trainer.sparse.local.bags]


def test_lookahead_yields_each_item_with_the_next_depth():
    assert list(lookahead_window(range(4), 2)) == [(0, (1, 2)), (1, (2, 3)), (2, (3,)), (3, ())]
    assert list(lookahead_window(range(2), 0)) == [(0, ()), (1, ())]
    assert list(lookahead_window([], 3)) == [] and list(lookahead(range(2))) == [(0, 1), (1, None)]


class _Batch:
    def __init__(self, n):
        self.sparse = n


class _Sparse:
    """Records the batches prefetched; a ticket names its batch."""

    def __init__(self):
        self.prefetched = []

    def prefetch(self, features):
        self.prefetched.append(features)
        return ("ticket", features)


def test_the_pipeline_prefetches_each_batch_once_and_hands_each_its_own_ticket():
    sparse, batches = _Sparse(), [_Batch(i) for i in range(7)]
    pipeline = PrefetchPipeline(sparse, depth=2)
    got = []
    for batch, upcoming in lookahead_window(batches, 2):
        got.append(pipeline.take(batch))
        pipeline.ahead(upcoming)
        assert len(pipeline) == len(upcoming)
    assert sparse.prefetched == list(range(1, 7))  # each batch after the first, once, in order
    assert got == [None] + [("ticket", i) for i in range(1, 7)]
    # a batch that never comes: its ticket is dropped with it, the next batch gets its own
    pipeline.ahead(batches[:2])
    assert pipeline.take(batches[1]) == ("ticket", 1) and len(pipeline) == 0


def test_a_resumed_pipeline_leaves_the_restored_prefetches_batches_without_tickets():
    """The caches of a resumed run hold prefetches for the next batches (3, at the
    checkpoint's depth): those go without a ticket (their forward finds the restored
    prefetch by its ids) and are not prefetched again; at depth 1 the first prefetch made
    is for the fourth batch."""
    sparse, batches = _Sparse(), [_Batch(i) for i in range(6)]
    pipeline = PrefetchPipeline(sparse, depth=1)
    pipeline.resume_with(3)
    got = []
    for batch, upcoming in lookahead_window(batches, 1):
        got.append(pipeline.take(batch))
        pipeline.ahead(upcoming)
    assert sparse.prefetched == [3, 4, 5]
    assert got == [None, None, None, ("ticket", 3), ("ticket", 4), ("ticket", 5)]


def test_each_trained_batch_is_grouped_once_its_forward_taking_its_prefetch_ticket(synthetic):
    """A step's forward takes the ticket its batch's prefetch returned: the batch's ids are
    concatenated and checked once (in its prefetch), and no cache searches for it."""
    trainer = DLRMTrainer(small_config(max_steps=8, prefetch_depth=2, epochs=1), synthetic)
    local = trainer.sparse.local
    grouped, taken = [], []
    group_inputs, ticket_for = local._group_inputs, local._ticket_for
    local._group_inputs = lambda kjt: grouped.append(kjt) or group_inputs(kjt)

    def recorded_ticket_for(kjt, ticket=None):
        ticket = ticket_for(kjt, ticket)
        taken.append(ticket is not None)
        return ticket

    local._ticket_for = recorded_ticket_for
    searched = []
    for cache in caches(trainer):
        take = cache._take_prefetched
        cache._take_prefetched = lambda ids, ticket=None, take=take: \
            searched.append(ticket is None) or take(ids, ticket)
    trainer.fit()
    assert len({id(k) for k in grouped}) == len(grouped)  # no batch grouped twice
    assert taken[:8] == [False] + [True] * 7  # the first batch of the run was not prefetched
    assert len(taken) > 8 and not any(taken[8:])  # validation's batches: never prefetched
    assert searched.count(True) == len(caches(trainer))  # the first batch's lookups alone


@pytest.mark.parametrize("depth", [0, 1, 2, 4])
def test_cached_training_at_every_depth_equals_whole_tables(synthetic, uncached, depth):
    trainer = DLRMTrainer(small_config(max_steps=STEPS, prefetch_depth=depth), synthetic)
    calls = record_prefetches(trainer)
    trainer.fit()
    assert trainer.sparse.cache_stats()["evictions"] > 0, "the small cache must evict"
    # each batch after an epoch's first is prefetched once: 46 of epoch 1 (47 batches); in epoch 2,
    # whose 5th step is the last, the batches up to the 5th + depth
    assert len(calls) == (0 if depth == 0 else 46 + 4 + depth)
    assert_equals_uncached(trainer, uncached)


@pytest.fixture(scope="module")
def stopped_at_depth_3(synthetic, tmp_path_factory):
    """A depth-3 run of 20 steps, and the same run stopped after 8 and resumed: (whole,
    resumed, their prefetches, checkpoint directory)."""
    tmp = tmp_path_factory.mktemp("depth3")
    cfg = small_config(max_steps=20, prefetch_depth=3, checkpoint_every=1000)
    whole = DLRMTrainer(replace(cfg, checkpoint_dir=str(tmp / "w")), synthetic)
    whole_calls = record_prefetches(whole)
    whole.fit()
    DLRMTrainer(replace(cfg, max_steps=8, checkpoint_dir=str(tmp / "p")), synthetic).fit()
    resumed = DLRMTrainer(replace(cfg, checkpoint_dir=str(tmp / "p"), resume=True), synthetic)
    resumed_calls = record_prefetches(resumed)
    resumed.fit()
    return whole, resumed, whole_calls, resumed_calls, tmp


def test_a_run_stopped_at_depth_3_resumes_exactly_and_prefetches_no_batch_twice(stopped_at_depth_3):
    """The resumed cache has the three prefetches pending at the stop; the resumed run adds
    only the batch three ahead at each step."""
    whole, resumed, whole_calls, resumed_calls, tmp = stopped_at_depth_3
    assert len(whole_calls) == 3 + 19 and len(resumed_calls) == 20 - 8  # none twice
    assert all(torch.equal(a, b) for a, b in zip(resumed_calls, whole_calls[-len(resumed_calls):]))
    for ours, theirs in zip(caches(resumed), caches(whole)):  # the batches of steps 21-23 are pending, each once
        pending = [p.ids for p in ours._prefetched]
        assert len(pending) == 3 and all(torch.equal(a.ids, b) for a, b in zip(theirs._prefetched, pending))
        assert not any(torch.equal(a, b) for i, a in enumerate(pending) for b in pending[i + 1:])
    assert_same_checkpoint(tmp / "w" / "dlrm-last.pt", tmp / "p" / "dlrm-last.pt")


def test_a_run_stopped_at_depth_3_resumes_with_the_same_cache_statistics(stopped_at_depth_3):
    whole, resumed, _, _, tmp = stopped_at_depth_3
    assert whole.sparse.cache_stats() == resumed.sparse.cache_stats()
    assert_same_checkpoint(tmp / "w" / "dlrm-last.pt", tmp / "p" / "dlrm-last.pt", residency=True)


def test_a_resume_at_another_depth_continues_exactly(synthetic, uncached, tmp_path):
    cfg = small_config(max_steps=STEPS, checkpoint_dir=str(tmp_path), checkpoint_every=1000)
    DLRMTrainer(replace(cfg, max_steps=10, prefetch_depth=4), synthetic).fit()
    resumed = DLRMTrainer(replace(cfg, prefetch_depth=1, resume=True), synthetic)
    calls = record_prefetches(resumed)
    resumed.fit()
    # batches 11-13 (0-based) are pending from the checkpoint (prefetched at depth 4); batches 14-46
    # are prefetched one a step, then in epoch 2 batches 1-5
    assert len(calls) == (46 - 13) + 5
    assert_equals_uncached(resumed, uncached)


def test_rows_of_in_flight_batches_are_never_evicted(synthetic, uncached):
    """Depth 4 into a cache that holds about 1.3 batches' rows: the pending batches hold
    most slots (up to about 70 %; the training batch holds the rest). Around every prefetch,
    a slot held by a batch in flight (the one training, or a pending one) keeps its row, and
    each pending batch's held slots hold its rows."""
    trainer = DLRMTrainer(small_config(max_steps=STEPS, prefetch_depth=4, cache_ratio=0.04), synthetic)
    prefetch, most_held = trainer.sparse.prefetch, []

    def checked(features):
        before = [(c.holds > 0, c.slots.slot_to_id.clone()) for c in caches(trainer)]
        prefetch(features)
        for cache, (held, ids) in zip(caches(trainer), before):
            assert torch.equal(cache.slots.slot_to_id[held], ids[held]), "a held row was evicted"
            for entry in cache._prefetched:
                assert bool(torch.isin(cache.slots.slot_to_id[entry.held], entry.ids).all())
            by_pending = torch.cat([p.held for p in cache._prefetched]).unique().numel()
            most_held.append(by_pending / cache.num_slots)

    trainer.sparse.prefetch = checked
    trainer.fit()
    assert max(most_held) > 0.6, "the pending batches were meant to hold most of the cache"
    assert trainer.sparse.cache_stats()["overflow_rows"] > 0
    assert_equals_uncached(trainer, uncached)


def test_prefetch_depth_options_and_old_configs():
    from embcache.dlrm.cli import build_parser

    assert DLRMConfig(prefetch=False).prefetch_depth == 0  # earlier versions' configs and checkpoints
    assert DLRMConfig(prefetch=True, prefetch_depth=3).prefetch_depth == 3
    assert replace(DLRMConfig(prefetch=False), prefetch_depth=2).prefetch_depth == 2
    with pytest.raises(ValueError, match="prefetch_depth must be from 0 to 4, got 5"):
        DLRMConfig(prefetch_depth=5)
    parser = build_parser("embcache dlrm")
    assert parser.parse_args(["train", "--no-prefetch"]).no_prefetch
    assert parser.parse_args(["train", "--prefetch-depth", "4"]).prefetch_depth == 4
    for bad in (["--prefetch-depth", "5"], ["--prefetch-depth", "2", "--no-prefetch"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["train", *bad])


def test_two_ranks_at_depth_3_stop_and_resume_as_if_never_stopped(synthetic, tmp_path):
    """Every rank makes the same (collective) prefetches, a resumed one included (a rank
    making one more or fewer would hang the run)."""
    def args(ckdir, *extra):
        return ["dlrm", "train", "--data", str(synthetic), "--batch-size", "256", "--embedding-dim", "8",
                "--dense-arch", "16", "--over-arch", "16", "--device", "cpu", "--no-progress", "--cache-ratio",
                "0.05", "--row-wise-rows", "3000", "--prefetch-depth", "3", "--checkpoint-dir", str(ckdir), *extra]

    for proc in (torchrun(2, *args(tmp_path / "w")), torchrun(2, *args(tmp_path / "p", "--max-steps", "9")),
                 torchrun(2, *args(tmp_path / "p", "--resume"))):
        assert proc.returncode == 0, proc.stderr[-3000:]
    # parameters to the bit, and rank 0's residency and statistics
    assert_same_checkpoint(tmp_path / "w" / "dlrm-last.pt", tmp_path / "p" / "dlrm-last.pt", residency=True)
