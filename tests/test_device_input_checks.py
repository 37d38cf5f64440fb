"""A batch already on the device is checked there (`nn.input_errors`): no value is read
back, the step runs on the batch made harmless, and the host check's one-line message is
raised when the bag's results are read. On the CPU the device path is forced by
`on_device=True` (the same tensor ops a CUDA batch runs); `meta` proves no value is read."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.nn import bag_input
from embcache.nn.bag_input import check_bag_input, check_feature_ids
from embcache.nn.input_errors import InputErrors, check_feature_ids_on_device

N = 100
BAD = [  # (ids, offsets, weights), the host's message (tests/test_cache_bad_input.py)
    ((torch.tensor([1, 2, N]), torch.tensor([0]), None), rf"^id {N} at position 2 is outside \[0, {N}\)$"),
    ((torch.tensor([1, -3]), torch.tensor([0]), None), r"^id -3 at position 1 is outside"),
    ((torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1]), None),
     r"^offsets must be non-decreasing; offsets\[2\]=1 < offsets\[1\]=2$"),
    ((torch.tensor([1, 2, 3]), torch.tensor([1, 2]), None), r"^offsets must start at 0, got 1$"),
    ((torch.tensor([1, 2, 3]), torch.tensor([0, 5]), None), r"^offsets\[-1\]=5 exceeds the number of ids \(3\)$"),
    ((torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([1.0, float("nan")])),
     r"^per_sample_weights\[1\] is nan: weights must be finite$"),
    ((torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([float("-inf"), 1.0])),
     r"^per_sample_weights\[0\] is -inf: weights must be finite$"),
    ((torch.tensor([1, N]), torch.tensor([1]), None), r"^offsets must start at 0"),  # the host's first problem
]


@pytest.mark.parametrize("batch, message", BAD)
def test_the_device_checks_keep_the_host_checks_message(batch, message):
    with pytest.raises(ValueError, match=message):
        check_bag_input(*batch, N, "sum")
    errors = InputErrors()
    ids, offsets, weights = check_bag_input(*batch, N, "sum", errors=errors, on_device=True)
    assert bool((ids >= 0).all() and (ids < N).all()) and int(offsets[0]) == 0  # harmless to look up
    assert bool((offsets[1:] >= offsets[:-1]).all()) and int(offsets[-1]) <= ids.numel()
    assert weights is None or bool(torch.isfinite(weights).all())
    with pytest.raises(ValueError, match=message):
        errors.raise_pending()
    errors.raise_pending()  # read once, then cleared


def test_a_good_batch_passes_the_device_checks_unchanged():
    errors = InputErrors()
    ids, offsets, weights = torch.tensor([3, 0, 99, 7]), torch.tensor([0, 0, 3]), torch.rand(4)
    got = check_bag_input(ids, offsets, weights, N, "sum", errors=errors, on_device=True)
    assert all(torch.equal(a, b) for a, b in zip(got, (ids, offsets, weights)))
    errors.raise_pending()
    assert int(errors.buffer(ids.device)[0]) == 0  # no site recorded


def test_feature_ids_on_the_device_name_the_feature():
    features = [("user", "t_user", 500), ("item", "t_item", 800), ("item_hist", "t_item", 800)]
    ids, counts = torch.tensor([1, 2, 3, 4, 5, 6, 900, 1, 2, 3]), [1, 1, 8]
    with pytest.raises(ValueError) as host:
        check_feature_ids(ids, counts, features)
    errors = InputErrors()
    safe = check_feature_ids_on_device(ids, counts, features, errors)
    assert int(safe[6]) == 0
    with pytest.raises(ValueError) as device:
        errors.raise_pending()
    assert str(device.value) == str(host.value) == \
        "feature 'item_hist': id 900 at position 4 is outside table 't_item' [0, 800)"


def test_a_device_batchs_bad_id_stops_the_run_when_its_results_are_read(monkeypatch):
    """The bag's own path, with its checks forced to the device's: the step runs (on id 0
    in the bad id's place), and the bag's stats, rows and checkpoint raise the message."""
    monkeypatch.setattr(bag_input, "device_side", lambda input, errors, on_device: errors)
    bag = CachedEmbeddingBag(N, 4, cache_ratio=0.1, device="cpu", bookkeeping="device")
    for read in (bag.cache_stats, bag.state_dict, bag.flush):
        bag(torch.tensor([1, -2]), torch.tensor([0])).sum().backward()
        bag(torch.tensor([1, N + 5, 2]), torch.tensor([0, 1])).sum().backward()  # the first one is said
        with pytest.raises(ValueError, match=r"^id -2 at position 1 is outside \[0, 100\)$"):
            read()
    bag.cache_stats()  # each error raised once


def _batches(hot: int, weighted: bool, device: str):
    """Two batches of 16 samples with `hot` ids each, wholly on `device`; one-hot ones 2-D."""
    g = torch.Generator().manual_seed(hot)
    out = []
    for _ in range(2):
        ids = torch.randint(0, 4000, (16 * hot,), generator=g)
        offsets = torch.arange(0, 16 * hot, hot)
        w = torch.rand(ids.numel(), generator=g) if weighted else None
        if hot == 1:
            ids, offsets, w = ids.view(-1, 1), None, None if w is None else w.view(-1, 1)
        out.append(tuple(None if t is None else t.to(device) for t in (ids, offsets, w)))
    return out


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("sum", True)])
@pytest.mark.parametrize("hot", [1, 5])
def test_a_step_with_ids_offsets_and_weights_on_meta(optimizer, mode, weighted, hot):
    """ids, offsets and weights themselves on `meta` (no values): checks, lookup, prefetch
    and backward with the update run, so none reads a value of the batch on the host. (The
    cache finds a prefetch by its batch's tensor, or by a ticket: a batch on the device is
    not compared by value.)"""
    bag = CachedEmbeddingBag(4000, 8, mode=mode, cache_ratio=0.05, optimizer=optimizer, lr=0.1,
                             device="meta", bookkeeping="device", ids_freq=torch.randint(0, 5, (4000,)))
    batches = _batches(hot, weighted, "meta")
    for i, (ids, offsets, w) in enumerate(batches):
        out = bag(ids, offsets, w)
        bag.prefetch(*batches[(i + 1) % 2][:2])
        out.sum().backward()
        assert out.shape == (16, 8) and out.device.type == "meta"
    assert bag.cache.step == 2
    bag.raise_input_errors()  # meta holds no values: nothing to raise


def test_a_collections_device_batch_is_checked_there_and_said_when_read(monkeypatch):
    """A collection's path for a KeyedJaggedTensor on the device (forced on CPU tensors):
    a bad id, then a NaN weight, each trains harmlessly and is raised, with the host's
    message, when the collection's stats are read; a good batch's output is the host path's."""
    from embcache import CachedEmbeddingBagCollection
    from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

    tables = [EmbeddingBagConfig(name="t_user", embedding_dim=4, num_embeddings=50, feature_names=["user"]),
              EmbeddingBagConfig(name="t_item", embedding_dim=4, num_embeddings=80, feature_names=["item", "hist"])]

    def kjt(values, weights=None):
        return KeyedJaggedTensor(keys=["user", "item", "hist"], values=torch.tensor(values),
                                 lengths=torch.tensor([1, 1, 1, 1, 2, 1]), weights=weights)

    def make():
        torch.manual_seed(0)
        return CachedEmbeddingBagCollection(tables, cache_ratio=0.2, device="cpu", is_weighted=True,
                                            bookkeeping="device")

    host, device = make(), make()
    monkeypatch.setattr(CachedEmbeddingBagCollection, "_device_errors", 
                        lambda self, ids: self.input_errors if self is device else None)
    good = kjt([1, 2, 3, 4, 5, 6, 7], torch.rand(7))
    assert torch.equal(host(good).values(), device(good).values())
    device(kjt([1, 2, 3, 4, 80, 6, 7], torch.rand(7))).values().sum().backward()
    with pytest.raises(ValueError, match=r"^feature 'hist': id 80 at position 0 is outside table 't_item' \[0, 80\)$"):
        device.cache_stats()
    inf = kjt([1, 2, 3, 4, 5, 6, 7], torch.tensor([1.0] * 6 + [float("inf")]))
    with pytest.raises(ValueError) as on_host:
        host(inf)
    device(inf).values().sum().backward()
    with pytest.raises(ValueError) as on_device:
        device.flush()
    assert str(on_device.value) == str(on_host.value) == "per_sample_weights[6] is inf: weights must be finite"
    device.cache_stats()
