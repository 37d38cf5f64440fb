"""Bad input is a ValueError that names the problem, and leaves the cache unchanged."""
import pytest
import torch

from embcache import CachedEmbeddingBag

N, D = 100, 4


@pytest.fixture
def bag():
    b = CachedEmbeddingBag(N, D, cache_ratio=0.1, device="cpu", ids_freq=torch.arange(N))
    (b(torch.tensor([[1, 2], [3, 4]])).sum()).backward()
    return b


def snapshot(b):
    c = b.cache
    return (c.slots.slot_to_id.clone(), c.weight.clone(), c.host.weight.clone(), c.dirty.clone(),
            c.holds.clone(), dict(b.cache_stats()), c.policy.clock)


@pytest.mark.parametrize("args, message", [
    ((torch.tensor([1, 2, N]), torch.tensor([0])), rf"id {N} at position 2 is outside \[0, {N}\)"),
    ((torch.tensor([1, -3]), torch.tensor([0])), r"id -3 at position 1"),
    ((torch.tensor([1.0, 2.0]), torch.tensor([0])), "int64 or int32 ids, got torch.float32"),
    ((torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1])), r"non-decreasing; offsets\[2\]=1 < offsets\[1\]=2"),
    ((torch.tensor([1, 2, 3]), torch.tensor([1, 2])), "offsets must start at 0"),
    ((torch.tensor([1, 2, 3]), torch.tensor([0, 5])), "exceeds the number of ids"),
    ((torch.tensor([1, 2, 3]), None), "1-D input needs offsets"),
    ((torch.tensor([[1, 2]]), torch.tensor([0])), "offsets must be None when input is 2-D"),
    ((torch.tensor([1, 2]), torch.tensor([0.0])), "offsets must be a 1-D int64 or int32"),
])
def test_bad_lookups_raise_and_change_nothing(bag, args, message):
    before = snapshot(bag)
    with pytest.raises(ValueError, match=message):
        bag(*args)
    after = snapshot(bag)
    for a, b in zip(before, after):
        assert (torch.equal(a, b) if torch.is_tensor(a) else a == b)


def test_bad_per_sample_weights(bag):
    before = snapshot(bag)
    with pytest.raises(ValueError, match=r"per_sample_weights\[1\] is nan"):
        bag(torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="does not match input shape"):
        bag(torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([1.0]))
    mean_bag = CachedEmbeddingBag(N, D, mode="mean", cache_ratio=0.1, device="cpu")
    with pytest.raises(ValueError, match="need mode='sum'"):
        mean_bag(torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([1.0, 2.0]))
    assert snapshot(bag)[0].equal(before[0])


@pytest.mark.parametrize("kwargs, message", [
    ({"cache_ratio": 0.0}, r"cache_ratio must lie in \(0, 1\], got 0.0"),
    ({"cache_ratio": 1.5}, r"cache_ratio must lie in \(0, 1\]"),
    ({"cache_ratio": -0.1}, r"cache_ratio must lie in \(0, 1\]"),
    ({"mode": "max"}, "mode must be one of"),
    ({"eviction": "fifo"}, "eviction must be one of"),
    ({"optimizer": "lamb"}, "optimizer must be one of"),
    ({"ids_freq": torch.ones(N + 1)}, "ids_freq must be 1-D with 100 counts"),
    ({"weight": torch.zeros(N, D + 1)}, r"weight must be \[100, 4\]"),
    ({"lr": 0.0}, "lr must be positive"),
    ({"optimizer": "adam", "betas": (1.2, 0.9)}, "betas must lie in"),
    ({"optimizer": "sgd", "momentum": 0.9}, "bad argument for optimizer 'sgd'"),
])
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CachedEmbeddingBag(N, D, device="cpu", **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"cache_ratio": True}, r"cache_ratio must lie in \(0, 1\], got True"),
    ({"cache_ratio": "0.1"}, r"cache_ratio must lie in \(0, 1\]"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio must lie in \[0, 1\]"),
    ({"ids_freq": [1] * N}, "ids_freq must be a 1-D tensor of counts, got list"),
    ({"ids_freq": torch.full((N,), float("nan"))}, "ids_freq holds NaN or inf"),
    ({"ids_freq": -torch.ones(N)}, "ids_freq holds negative counts"),
    ({"device": "tpu"}, "is not a device"),
])
def test_more_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CachedEmbeddingBag(N, D, **{"device": "cpu", **kwargs})


def test_numpy_ratios_are_accepted():
    import numpy as np

    bag = CachedEmbeddingBag(N, D, cache_ratio=np.float32(0.1), device="cpu")
    assert bag.cache.num_slots == 10


def test_float64_per_sample_weights_raise_and_change_nothing(bag):
    before = snapshot(bag)
    with pytest.raises(ValueError, match="per_sample_weights must be float32"):
        bag(torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([1.0, 2.0], dtype=torch.float64))
    for a, b in zip(before, snapshot(bag)):
        assert (torch.equal(a, b) if torch.is_tensor(a) else a == b)


def test_an_optimizer_without_a_torch_equivalent_names_the_choices():
    from embcache.cache.optimizers import torch_equivalent

    weight = torch.nn.Parameter(torch.zeros(3, 2))
    assert isinstance(torch_equivalent("adam", [weight], 0.1), torch.optim.SparseAdam)
    with pytest.raises(ValueError, match=r"'rowwise_adagrad' has no torch equivalent; choose from "
                                         r"\['adagrad', 'adam', 'sgd'\]"):
        torch_equivalent("rowwise_adagrad", [weight], 0.1)
