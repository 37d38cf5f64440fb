"""Open tables given their keys' counts (`key_freq`): the `freq` policy's prior for the rows
keys take, as `ids_freq` is a vocabulary table's. Keys known in id order with the ids'
counts cache exactly as the ids do; a reused row takes its new key's count; uncounted keys
and other policies get none; `dlrm train` on raw keys passes the data's counts."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from embcache import CachedEmbeddingBag, CachedEmbeddingBagCollection
from embcache.bench.host import as_raw_keys, id_counts, key_counts, key_of, make_batches, vocabulary_as_keys
from embcache.keys import initial_rows
from embcache.sparse_types import EmbeddingBagConfig

DIM = 4
CARD, SIZES = [400, 150], [2, 1]


def _tables():
    """Two tables whose row i starts where the open table starts key_of(i) (seed: the
    table's position, bound: sqrt(1 / rows), as a collection's open tables default)."""
    return [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{i}"],
                               init_fn=lambda w, i=i, n=n: w.copy_(initial_rows(key_of(torch.arange(n)), DIM, i,
                                                                                (1.0 / n) ** 0.5)))
            for i, n in enumerate(CARD)]


def _train(ebc, batches):
    """The trainer's order: one batch prefetched ahead; returns every step's output."""
    outs = []
    ebc.prefetch(batches[0])
    for now, ahead in zip(batches, batches[1:]):
        out = ebc(now).values()
        ebc.prefetch(ahead)
        (out ** 2).sum().backward()
        outs.append(out.detach())
    return outs


def _resident(ebc, shift=0):
    ids = ebc.bags[0].cache.slots.slot_to_id
    return sorted((ids[ids >= 0] - shift).tolist())


def test_known_keys_with_the_ids_counts_cache_exactly_as_the_ids():
    """Every id a key (`key_of`), known in id order (key row = id + 1), given the ids' counts:
    the same outputs, rows, hits, misses and residency as the vocabulary table with
    `ids_freq`, under `freq` with a cache too small for the hot set. Without the counts
    the hits differ: the prior is what makes them equal."""
    batches = make_batches(CARD, SIZES, batch=16, count=20, seed=3)
    freq = id_counts(batches, CARD)
    common = dict(cache_ratio=0.15, device="cpu", warmup_ratio=0, eviction="freq", optimizer="adagrad", lr=0.1)
    ids = CachedEmbeddingBagCollection(_tables(), ids_freq=freq, **common)
    want = _train(ids, batches)
    runs = {}
    for prior in (True, False):
        raw = CachedEmbeddingBagCollection(_tables(), **common, open_tables={
            f"t{i}": {"key_freq": key_counts(freq[f"t{i}"])} if prior else {} for i in range(len(CARD))})
        raw.add_keys(vocabulary_as_keys(CARD))
        got = _train(raw, as_raw_keys(batches))
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert torch.equal(raw.bags[0].host_weight()[1:], ids.bags[0].host_weight())
        runs[prior] = raw
    stats = {k: v for k, v in ids.cache_stats().items() if k != "hit_rate"}
    assert {k: runs[True].cache_stats()[k] for k in stats} == stats
    assert _resident(runs[True], shift=1) == _resident(ids)
    assert runs[False].cache_stats()["hits"] != stats["hits"]


def _bag(eviction="freq", **kw):
    return CachedEmbeddingBag(8, DIM, cache_ratio=0.5, device="cpu", keys="raw", warmup_ratio=0,
                              eviction=eviction, **kw)


def _step(bag, keys):
    bag(torch.tensor([keys])).sum().backward()


def _row(bag, key):
    return int(bag.open.peek(torch.tensor([key])))


def test_a_retired_row_reused_by_a_new_key_takes_the_new_keys_count():
    """max_rows 2: C's arrival retires A (least recently used), whose row loses A's count;
    D's arrival (B retires) takes A's row with D's count, not 0 and not A's; a state_dict
    resume restores the same prior."""
    A, B, C, D = 101, -7, 2**40, 55
    counts = {A: 5, B: 9, C: 3, D: 7}
    keys = torch.tensor(sorted(counts))
    key_freq = (keys, torch.tensor([counts[k] for k in keys.tolist()]))
    bag = _bag(max_rows=2, key_freq=key_freq)
    _step(bag, [A, B])
    _step(bag, [B])
    row_a = _row(bag, A)
    assert bag.cache.policy.prior[row_a] == 5
    _step(bag, [C])
    prior = bag.cache.policy.prior  # (grown: a new tensor)
    assert _row(bag, A) == 0 and prior[row_a] == 0 and prior[_row(bag, C)] == 3
    _step(bag, [D])
    assert _row(bag, B) == 0 and _row(bag, D) == row_a  # B retired, A's row reused
    prior = bag.cache.policy.prior
    assert prior[row_a] == 7 and prior[_row(bag, C)] == 3
    again = _bag(max_rows=2, key_freq=key_freq)
    again.load_state_dict(bag.state_dict())
    assert torch.equal(again.cache.policy.prior[: bag.cache.num_rows], prior[: bag.cache.num_rows])


def test_an_uncounted_key_gets_no_prior_and_other_policies_ignore_the_counts():
    key_freq = (torch.tensor([3, 10]), torch.tensor([4, 6]))
    bag = _bag(key_freq=key_freq)
    _step(bag, [10, 11, 3])
    assert bag.cache.policy.prior[[_row(bag, k) for k in (10, 11, 3)]].tolist() == [6.0, 0.0, 4.0]
    for eviction in ("lru", "lfu"):
        other = _bag(eviction, key_freq=key_freq)
        _step(other, [10, 11, 3])
        assert other.open.key_counts is None and other.cache.policy.prior is None


def test_counts_without_open_tables_or_out_of_order_are_one_line_errors():
    with pytest.raises(ValueError, match="key_freq of open table 't1': keys must be ascending and distinct"):
        CachedEmbeddingBagCollection(_tables(), device="cpu", open_tables={
            "t0": {}, "t1": {"key_freq": (torch.tensor([5, 2]), torch.tensor([1, 1]))}})
    with pytest.raises(ValueError, match="need keys='raw'"):
        CachedEmbeddingBag(8, DIM, device="cpu", key_freq=(torch.tensor([1]), torch.tensor([1])))


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("raw")
    generate_synthetic(out, rows=1500, scale=0.002, seed=0, keys="raw")
    return out


def _open_priors(trainer):
    """(feature, live raw keys, their rows' prior) of every open table of the trainer's model."""
    local = trainer.sparse.local
    for bag, group in zip(local.bags, local._groups):
        if bag.open is None:
            continue
        for j, table in enumerate(group.tables):
            keys, rows = bag.open.live_rows(j)
            prior = bag.cache.policy.prior
            yield table.feature_names[0], keys, None if prior is None else prior[rows].numpy()


def test_dlrm_train_on_raw_keys_gives_open_tables_the_datas_counts(raw_data):
    from embcache.data.ctr_format import load_key_frequencies
    from embcache.cache.open_keys.key_counts import KeyCounts
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    cfg = DLRMConfig(batch_size=256, embedding_dim=8, dense_arch=[16], over_arch=[16], device="cpu",
                     progress=False, cache_ratio=0.2, max_steps=2)
    trainer = DLRMTrainer(cfg, raw_data)
    trainer.fit()
    counts = load_key_frequencies(raw_data)
    seen = 0
    for feature, keys, prior in _open_priors(trainer):
        assert prior is not None
        np.testing.assert_array_equal(prior, KeyCounts.of(counts[feature], feature).lookup(keys))
        seen += int((prior > 0).sum())
    assert seen > 0
    lru = DLRMTrainer(replace(cfg, eviction="lru"), raw_data)
    assert all(bag.open is None or bag.open.key_counts is None for bag in lru.sparse.local.bags)


def test_bench_hosts_raw_variant_starts_from_the_ids_counts_and_residency():
    """`bench host --keys raw`: the open tables get the ids' counts as their keys' and, the
    vocabulary's keys known, their caches warm up as the ids' do (the same counts resident;
    rows of equal counts may differ)."""
    from embcache.bench.host import build_collection, warm_up_known_keys

    card = [50, 7]
    freq = id_counts(make_batches(card, [2, 1], batch=64, count=3, seed=0), card)
    ids = build_collection(card, 4, 0.5, freq, "freq", device="cpu")
    raw = build_collection(card, 4, 0.5, freq, "freq", raw=True, device="cpu")
    raw.add_keys(vocabulary_as_keys(card))
    warm_up_known_keys(raw)
    counts = torch.cat([freq["t0"], freq["t1"]]).double()
    want = sorted(counts[_resident(ids)].tolist())
    assert want and sorted(raw.bags[0].cache.policy.prior[_resident(raw)].tolist()) == want
    assert torch.equal(raw.bags[0].cache.policy.prior[1:], counts)
