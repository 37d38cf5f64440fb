"""What users already have loads into the cache, and what it trained loads back into torch's
and torchrec's modules: `nn.EmbeddingBag.state_dict()` into a `CachedEmbeddingBag`,
torchrec's `EmbeddingBagCollection` (alone or inside a DLRM) into a
`CachedEmbeddingBagCollection`, and `torchrec_state_dict()` out (`embcache.nn.rows_only`)."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.nn import CachedEmbeddingBagCollection

torchrec = pytest.importorskip("torchrec")
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402

SIZES = {"t0": (50, 4), "t1": (31, 4), "t2": (20, 8)}  # two groups: widths 4 and 8


def configs():
    return [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, (r, d) in SIZES.items()]


def batch(seed: int, size: int = 16) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(SIZES) * size,), generator=g)
    values = torch.cat([torch.randint(0, SIZES[n][0], (int(lengths[i * size:(i + 1) * size].sum()),), generator=g)
                        for i, n in enumerate(SIZES)])
    return KeyedJaggedTensor(keys=[f"f_{n}" for n in SIZES], values=values, lengths=lengths)


def cached(**kw) -> CachedEmbeddingBagCollection:
    return CachedEmbeddingBagCollection(configs(), cache_ratio=0.2, device="cpu", optimizer="adagrad", lr=0.1, **kw)


def trained(ebc: CachedEmbeddingBagCollection, steps: int = 3) -> CachedEmbeddingBagCollection:
    """A few steps: rows dirty in the cache, optimizer state that is not zero."""
    for s in range(steps):
        ebc(batch(100 + s)).values().sum().backward()  # gradients of ones: twins take equal Adagrad sums
    return ebc


def optimizer_state(ebc) -> dict[str, torch.Tensor]:
    return {f"{t}.{k}": v.clone() for t in SIZES for k, v in ebc.table_rows(t).items() if k.startswith("optimizer.")}


def test_an_embedding_bags_state_dict_loads_into_the_cached_bag_leaving_its_optimizer_state():
    torch.manual_seed(0)
    plain = torch.nn.EmbeddingBag(40, 6, mode="sum")
    ids, offsets = torch.tensor([1, 5, 5, 39, 0, 7]), torch.tensor([0, 2, 4])
    bag, twin = (CachedEmbeddingBag(40, 6, cache_ratio=0.2, device="cpu", optimizer="adagrad", lr=0.1)
                 for _ in range(2))
    for b in (bag, twin):
        b(ids, offsets).sum().backward()  # rows dirty in the cache, Adagrad sums set
    before = twin.state_dict()  # not `bag`'s: taking it would write the dirty rows back
    result = bag.load_state_dict(plain.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    after = bag.state_dict()
    assert torch.equal(after["weight"], plain.weight.detach())
    assert torch.equal(after["optimizer.sum"], before["optimizer.sum"]) and after["optimizer.sum"].abs().sum() > 0
    assert int(after["step"]) == int(before["step"]) == 1
    assert (after["slot_to_id"] < 0).all()  # the cache starts empty: no resident row keeps the old value
    assert torch.equal(bag(ids, offsets), plain(ids, offsets))


@pytest.mark.parametrize("bookkeeping", ["host", "device"])
def test_a_torchrec_collections_state_dict_loads_and_looks_up_what_torchrec_does(bookkeeping):
    torch.manual_seed(1)
    reference = EmbeddingBagCollection(tables=configs())
    # the twin's optimizer state: reading `ebc`'s would write its dirty rows back
    ebc, state = (trained(cached(bookkeeping=bookkeeping)), optimizer_state(trained(cached(bookkeeping=bookkeeping))))
    result = ebc.load_state_dict(reference.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    for name in SIZES:
        assert torch.equal(ebc.table_weight(name), reference.embedding_bags[name].weight.detach())
    assert {k: torch.equal(v, optimizer_state(ebc)[k]) for k, v in state.items()} == {k: True for k in state}
    kjt = batch(7)
    torch.testing.assert_close(ebc(kjt).values(), reference(kjt).values(), rtol=0, atol=1e-6)


def test_a_torchrec_dlrm_checkpoint_loads_into_the_same_dlrm_over_the_cache_and_predicts_alike():
    torch.manual_seed(2)
    tables = [EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=r, feature_names=[f"f_{n}"])
              for n, (r, _) in SIZES.items()]
    make = dict(dense_in_features=3, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[4, 1])
    reference = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables), **make)
    model = DLRM(embedding_bag_collection=CachedEmbeddingBagCollection(tables, cache_ratio=0.2, device="cpu"), **make)
    model.load_state_dict(reference.state_dict())  # strict: every key of torchrec's model matched
    dense, kjt = torch.randn(16, 3), batch(3)
    torch.testing.assert_close(model(dense, kjt), reference(dense, kjt), rtol=0, atol=1e-6)


def test_what_the_cache_trained_loads_into_torchrecs_collection_and_dlrm():
    torch.manual_seed(3)
    ebc = trained(cached())
    reference = EmbeddingBagCollection(tables=configs())
    reference.load_state_dict(ebc.torchrec_state_dict())  # strict
    kjt = batch(9)
    with ebc.evaluation():
        torch.testing.assert_close(reference(kjt).values(), ebc(kjt).values(), rtol=0, atol=1e-6)
    full = ebc.torchrec_state_dict(prefix="sparse_arch.embedding_bag_collection.")
    assert set(full) == {f"sparse_arch.embedding_bag_collection.embedding_bags.{n}.weight" for n in SIZES}
    copy = full["sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"]
    trained(ebc, 1)
    assert not torch.equal(copy, ebc.table_weight("t0"))  # a copy: training on does not change it


def test_a_table_of_another_shape_is_refused_naming_it_and_nothing_changes():
    ebc = trained(cached())
    before = {n: ebc.table_weight(n).clone() for n in SIZES}
    sd = EmbeddingBagCollection(tables=configs()).state_dict()
    sd["embedding_bags.t2.weight"] = torch.zeros(21, 8)
    with pytest.raises(RuntimeError, match=r"size mismatch for embedding_bags\.t2\.weight: copying a param with "
                                           r"shape torch\.Size\(\[21, 8\]\).*torch\.Size\(\[20, 8\]\)"):
        ebc.load_state_dict(sd)
    assert all(torch.equal(ebc.table_weight(n), before[n]) for n in SIZES)


def test_a_table_with_nan_is_refused_naming_it():
    sd = EmbeddingBagCollection(tables=configs()).state_dict()
    sd["embedding_bags.t1.weight"][3, 1] = float("nan")
    ebc = cached()
    before = ebc.table_weight("t1").clone()
    with pytest.raises(RuntimeError, match=r"embedding_bags\.t1\.weight: holds NaN or inf"):
        ebc.load_state_dict(sd)
    assert torch.equal(ebc.table_weight("t1"), before)


def test_a_missing_table_is_a_missing_key_or_kept_when_not_strict():
    sd = EmbeddingBagCollection(tables=configs()).state_dict()
    del sd["embedding_bags.t1.weight"]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "embedding_bags\.t1\.weight"\. $'):
        cached().load_state_dict(sd)
    ebc = cached()
    kept = ebc.table_weight("t1").clone()
    result = ebc.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["embedding_bags.t1.weight"] and torch.equal(ebc.table_weight("t1"), kept)
    assert torch.equal(ebc.table_weight("t0"), sd["embedding_bags.t0.weight"])


def test_rows_of_half_width_are_the_float_rows_rounded_once():
    sd = EmbeddingBagCollection(tables=configs()).state_dict()
    ebc = cached(row_dtype=torch.float16)
    ebc.load_state_dict(sd)
    assert torch.equal(ebc.table_weight("t0"), sd["embedding_bags.t0.weight"].half())


def test_both_forms_at_once_and_tables_of_raw_keys_are_refused():
    ebc = cached()
    both = {**ebc.state_dict(), "embedding_bags.t0.weight": torch.zeros(50, 4)}
    with pytest.raises(RuntimeError, match="holds tables of both torchrec's form"):
        ebc.load_state_dict(both)
    raw = CachedEmbeddingBagCollection(configs(), cache_ratio=0.2, device="cpu", open_tables={"t0": {}})
    with pytest.raises(RuntimeError, match=r"embedding_bags\.t0\.weight: a table of raw keys"):
        raw.load_state_dict(EmbeddingBagCollection(tables=configs()).state_dict())
    with pytest.raises(ValueError, match=r"table\(s\) t0 take raw keys"):
        raw.torchrec_state_dict()


def test_the_caches_own_state_dict_still_loads_exactly():
    ebc = trained(cached())
    other = cached()
    other.load_state_dict(ebc.state_dict())
    kjt = batch(11)
    assert torch.equal(other(kjt).values(), ebc(kjt).values())
    assert other.cache_stats() == ebc.cache_stats()


def test_a_sharded_collection_takes_its_shards_rows_of_a_torchrec_state_dict():
    """The model-parallel collection (torchrun) on one rank's view: table t0 split by rows into
    two shards held here, t1 whole here, t2 on another rank (not this one's to load)."""
    from embcache.distributed.placement import Shard
    from embcache.distributed.sharded_collection import ShardedEmbeddingBagCollection

    tables = configs()
    shards = [Shard("t0", ("f_t0",), 0, 0, 30, 50), Shard("t0", ("f_t0",), 0, 30, 50, 50),
              Shard("t1", ("f_t1",), 0, 0, 31, 31), Shard("t2", ("f_t2",), 1, 0, 20, 20)]
    sharded = ShardedEmbeddingBagCollection(
        tables, shards, lambda local: CachedEmbeddingBagCollection(local, cache_ratio=0.2, device="cpu"))
    sd = EmbeddingBagCollection(tables=tables).state_dict()
    result = sharded.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(sharded.local.table_weight("t0@0"), sd["embedding_bags.t0.weight"][:30])
    assert torch.equal(sharded.local.table_weight("t0@30"), sd["embedding_bags.t0.weight"][30:])
    assert torch.equal(sharded.local.table_weight("t1"), sd["embedding_bags.t1.weight"])
    sd["embedding_bags.t1.weight"] = torch.zeros(32, 4)
    with pytest.raises(RuntimeError, match=r"size mismatch for embedding_bags\.t1\.weight"):
        sharded.load_state_dict(sd)
