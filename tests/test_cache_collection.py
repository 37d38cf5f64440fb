"""The collection against torchrec's EmbeddingBagCollection, and inside torchrec's DLRM.

To the bit, pooled outputs and tables, for every optimizer: torchrec pools each feature
separately and sums a shared table's gradients feature by feature; the collection does one
call per group but sums each table's gradient terms in the order torchrec's would be."""
import numpy as np
import pytest
import torch
pytest.importorskip("torchrec")  # these tests hold the collection against torchrec's own modules

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402

from embcache import CachedEmbeddingBagCollection
from embcache.cache.optimizers import torch_equivalent

D = 4


def tables(pooling=PoolingType.SUM):
    return [
        EmbeddingBagConfig(name="t_user", embedding_dim=D, num_embeddings=500, feature_names=["user"],
                           pooling=pooling),
        EmbeddingBagConfig(name="t_item", embedding_dim=D, num_embeddings=800,
                           feature_names=["item", "item_hist"], pooling=pooling),
        EmbeddingBagConfig(name="t_tiny", embedding_dim=D, num_embeddings=7, feature_names=["tiny"],
                           pooling=pooling),
    ]


FEATURES = ["user", "item", "item_hist", "tiny"]
SIZES = {"user": 500, "item": 800, "item_hist": 800, "tiny": 7}


def kjt_batches(steps, batch, seed=0, weighted=False):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        lengths = np.concatenate([np.ones(batch, int), np.ones(batch, int),
                                  rng.integers(0, 5, batch), np.ones(batch, int)])
        values = []
        for f, n in zip(FEATURES, lengths.reshape(4, batch).sum(1)):
            values.append((rng.zipf(1.3, n) - 1) % SIZES[f])
        values = torch.from_numpy(np.concatenate(values))
        weights = torch.from_numpy(rng.random(values.numel()).astype(np.float32)) if weighted else None
        yield KeyedJaggedTensor(keys=FEATURES, values=values, lengths=torch.from_numpy(lengths),
                                weights=weights)


def copy_weights(cached, ebc):
    with torch.no_grad():
        for t in cached.embedding_bag_configs():
            ebc.embedding_bags[t.name].weight.copy_(cached.table_weight(t.name))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("pooling, weighted", [(PoolingType.SUM, False), (PoolingType.MEAN, False),
                                               (PoolingType.SUM, True)])
@pytest.mark.parametrize("bookkeeping", ["host", "device"])
def test_collection_trains_like_torchrec(optimizer, pooling, weighted, bookkeeping):
    torch.manual_seed(0)
    cached = CachedEmbeddingBagCollection(tables(pooling), cache_ratio=0.02, optimizer=optimizer,
                                          lr=0.01, device="cpu", is_weighted=weighted, bookkeeping=bookkeeping)
    ebc = EmbeddingBagCollection(tables(pooling), is_weighted=weighted)
    for bag in ebc.embedding_bags.values():
        bag.sparse = True
    copy_weights(cached, ebc)
    opt = torch_equivalent(optimizer, ebc.parameters(), 0.01)
    target = torch.randn(32, 4 * D)
    for kjt in kjt_batches(150, 32, weighted=weighted):
        got, want = cached(kjt), ebc(kjt)
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        torch.testing.assert_close(got.values(), want.values(), rtol=0, atol=0)
        opt.zero_grad()
        (want.values() * target).sum().backward()
        opt.step()
        (got.values() * target).sum().backward()
    assert cached.cache_stats()["evictions"] > 0
    for t in cached.embedding_bag_configs():
        torch.testing.assert_close(cached.table_weight(t.name), ebc.embedding_bags[t.name].weight.detach(),
                                   rtol=0, atol=0)


def test_dlrm_accepts_the_cached_collection_unchanged():
    torch.manual_seed(0)
    cached = CachedEmbeddingBagCollection(tables(), cache_ratio=0.05, optimizer="adagrad", lr=0.05,
                                          device="cpu")
    ebc = EmbeddingBagCollection(tables())
    copy_weights(cached, ebc)
    model_a = DLRM(embedding_bag_collection=cached, dense_in_features=3,
                   dense_arch_layer_sizes=[8, D], over_arch_layer_sizes=[8, 1])
    model_b = DLRM(embedding_bag_collection=ebc, dense_in_features=3,
                   dense_arch_layer_sizes=[8, D], over_arch_layer_sizes=[8, 1])
    model_b.dense_arch.load_state_dict(model_a.dense_arch.state_dict())
    model_b.over_arch.load_state_dict(model_a.over_arch.state_dict())
    kjt = next(kjt_batches(1, 16))
    dense = torch.randn(16, 3)
    logits = model_a(dense, kjt)
    assert logits.shape == (16, 1)
    torch.testing.assert_close(logits, model_b(dense, kjt), rtol=0, atol=1e-6)
    before = cached.table_weight("t_user").clone()
    logits.sum().backward()  # the sparse update happens inside backward
    assert not torch.equal(cached.table_weight("t_user"), before)
    # only rows of the batch moved
    users = kjt["user"].values()
    moved = torch.nonzero((cached.table_weight("t_user") != before).any(1)).flatten()
    assert set(moved.tolist()) <= set(users.tolist())


def test_collection_rejects_out_of_range_ids_naming_the_feature():
    cached = CachedEmbeddingBagCollection(tables(), cache_ratio=0.05, device="cpu")
    bad = KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 2, 3, 7]),
                            lengths=torch.tensor([1, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"feature 'tiny': id 7 at position 0 is outside table 't_tiny' \[0, 7\)"):
        cached(bad)
    with pytest.raises(ValueError, match=r"lacks features \['tiny'\]"):
        cached(KeyedJaggedTensor(keys=FEATURES[:3], values=torch.tensor([1, 2, 3]),
                                 lengths=torch.tensor([1, 1, 1])))


def test_ids_freq_by_feature_name_warms_the_hottest_rows():
    freq = {"user": torch.zeros(500), "item": torch.zeros(800), "tiny": torch.zeros(7)}
    freq["user"][[3, 4]] = 100
    freq["item"][10] = 50
    cached = CachedEmbeddingBagCollection(tables(), cache_ratio=0.01, ids_freq=freq, device="cpu",
                                          warmup_ratio=1.0)
    resident = set(cached.bags[0].cache.slots.slot_to_id.tolist())
    assert {3, 4, 500 + 10} <= resident


def test_bad_input_in_a_later_group_changes_no_group():
    """Two groups (dims 4 and 6): a NaN weight of the second is refused before the
    first group's cache admits, counts or holds anything."""
    two = [EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=50, feature_names=["fa"]),
           EmbeddingBagConfig(name="b", embedding_dim=6, num_embeddings=50, feature_names=["fb"])]
    cached = CachedEmbeddingBagCollection(two, cache_ratio=0.2, device="cpu", is_weighted=True)
    assert len(cached.bags) == 2
    kjt = KeyedJaggedTensor(keys=["fa", "fb"], values=torch.tensor([1, 2, 3, 4]),
                            lengths=torch.tensor([1, 1, 1, 1]),
                            weights=torch.tensor([1.0, 1.0, 1.0, float("nan")]))
    before = [(b.cache.slots.slot_to_id.clone(), b.cache_stats()) for b in cached.bags]
    with pytest.raises(ValueError, match="per_sample_weights"):
        cached(kjt)
    for bag, (slots, stats) in zip(cached.bags, before):
        assert torch.equal(bag.cache.slots.slot_to_id, slots) and bag.cache_stats() == stats
        assert int(bag.cache.holds.sum()) == 0


@pytest.mark.parametrize("values, message", [
    # the position is the position within that feature's ids
    ([1, 2, 3, 4, 5, 6, 900, 1, 2, 3], r"feature 'item_hist': id 900 at position 2 is outside table 't_item' \[0, 800\)"),
    ([1, -4, 3, 4, 5, 6, 7, 1, 2, 3], r"feature 'user': id -4 at position 1 is outside table 't_user' \[0, 500\)"),
    ([1, 2, 800, 4, 5, 6, 7, 1, 2, 3], r"feature 'item': id 800 at position 0 is outside table 't_item' \[0, 800\)"),
])
def test_collection_names_the_feature_and_the_position_within_it(values, message):
    cached = CachedEmbeddingBagCollection(tables(), cache_ratio=0.05, device="cpu")
    kjt = KeyedJaggedTensor(keys=FEATURES, values=torch.tensor(values, dtype=torch.int32),
                            lengths=torch.tensor([1, 1, 1, 1, 2, 3, 1, 1]))
    with pytest.raises(ValueError, match=message):
        cached(kjt)
    with pytest.raises(ValueError, match=message):
        cached.prefetch(kjt)


def test_collection_checks_each_group_once(monkeypatch):
    """One range check per group, none per feature and none again in the bag's lookup."""
    from embcache.nn import cached_embedding_bag, group_kernels, table_groups

    two = [EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=50, feature_names=["fa", "fa2"]),
           EmbeddingBagConfig(name="b", embedding_dim=4, num_embeddings=9, feature_names=["fb"]),
           EmbeddingBagConfig(name="c", embedding_dim=6, num_embeddings=50, feature_names=["fc"])]
    cached = CachedEmbeddingBagCollection(two, cache_ratio=0.2, device="cpu")
    calls = []

    def counting(*args):  # the concatenation into a group's id space checks the range
        calls.append(args)
        return group_kernels.concat_features(*args)

    def refuse(*args):
        raise AssertionError("the collection's input was checked again")

    monkeypatch.setattr(table_groups, "concat_features", counting)
    monkeypatch.setattr(cached_embedding_bag, "check_bag_input", refuse)
    kjt = KeyedJaggedTensor(keys=["fa", "fa2", "fb", "fc"], values=torch.tensor([1, 49, 2, 8, 3]),
                            lengths=torch.tensor([1, 0, 1, 1, 1, 0, 0, 1]))
    out = cached(kjt)
    assert out.values().shape == (2, 4 + 4 + 4 + 6) and len(calls) == 2
    cached.prefetch(kjt)
    assert len(calls) == 4
