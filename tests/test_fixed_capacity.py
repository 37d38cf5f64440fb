"""Multi-hot batches padded to a fixed capacity of ids (`nn.fixed_capacity`) train to the
bit as the unpadded batches do: pooled outputs, rows and optimizer state, for every
optimizer, with the device bookkeeper and a cache small enough to overflow; a batch over
the capacity runs unpadded (outside the graph), counted and said once.

The order a row's repeated terms are summed in is CUDA's here (a stable sort of the keys,
which the device bookkeeper uses off the CPU): padded batches run in CUDA graphs only, and
there the pad lookups, last and on a row of their own, leave every real row's order as it
was. On the CPU torch's coalesce sorts unstably, in an order that depends on the whole
array, so a padded batch's repeated rows could sum in another order there (last bits)."""
from functools import partial

import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.cache.bookkeeping import device_updates
from embcache.cache.bookkeeping.fixed_size import summed_in_torch_order
from embcache.nn.fixed_capacity import FixedCapacity, choose_capacity, pad_batch, pad_features, padded_rows

N, D, BATCH = 300, 4, 12


def _batches(steps: int, seed: int = 0, max_hot: int = 6):
    """Multi-hot batches of varying pooling (empty bags too), repeated rows across bags."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, max_hot + 1, (BATCH,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        ids = torch.randint(0, N // 4, (int(lengths.sum()),), generator=g) ** 2 % N  # skewed, repeats
        out.append((ids, offsets, torch.rand(ids.numel(), generator=g)))
    return out


def _bags(optimizer: str, mode: str):
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(N, D, generator=g)
    kw = dict(mode=mode, cache_ratio=0.05, optimizer=optimizer, lr=0.1, device="cpu", bookkeeping="device")
    plain = CachedEmbeddingBag(N, D, weight=weight, **kw)
    padded = CachedEmbeddingBag(padded_rows(N), D, weight=torch.cat([weight, torch.zeros(1, D)]), **kw)
    return plain, padded


def _train(bag, batch, grad_out, weighted):
    ids, offsets, w = batch
    out = bag(ids, offsets, w if weighted else None)[:BATCH]
    out.backward(grad_out)
    return out.detach()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_padded_batches_train_to_the_bit_as_unpadded_ones(optimizer, mode, weighted, monkeypatch):
    monkeypatch.setattr(device_updates, "summed_in_torch_order", partial(summed_in_torch_order, stable=True))
    plain, padded = _bags(optimizer, mode)
    batches = _batches(4, seed=len(optimizer))
    capacity = choose_capacity([b[0].numel() for b in batches], quantile=1.0, margin=1.0, round_to=16)
    fixed = FixedCapacity(capacity, pad_id=N, say=pytest.fail)
    g = torch.Generator().manual_seed(2)
    for batch in batches:
        grad_out = torch.randn(BATCH, D, generator=g)
        shaped = fixed.pad(*batch)
        assert shaped[0].shape == (capacity,) and shaped[1].shape == (BATCH + 1,)
        want, got = _train(plain, batch, grad_out, weighted), _train(padded, shaped, grad_out, weighted)
        assert torch.equal(want.view(torch.int32), got.view(torch.int32))
    assert plain.cache.num_slots <= padded.cache.num_slots < max(b[0].unique().numel() for b in batches)  # overflow
    want, got = plain.table_rows(slice(0, N)), padded.table_rows(slice(0, N))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k].view(torch.int32), got[k].view(torch.int32)), k
    assert not torch.equal(want["weight"], _bags(optimizer, mode)[0].table_rows(slice(0, N))["weight"])  # trained


def test_a_batch_over_the_capacity_runs_unpadded_counted_and_said_once():
    said = []
    fixed = FixedCapacity(8, pad_id=N, say=said.append)
    small, big = (torch.arange(5), torch.tensor([0, 2]), None), (torch.arange(9), torch.tensor([0, 4]), None)
    assert fixed.pad(*big) is None and fixed.pad(*big) is None
    assert fixed.pad(*small)[0].tolist() == [0, 1, 2, 3, 4, N, N, N]
    assert fixed.over_capacity == 2 and len(said) == 1 and "9 ids is over the graph's capacity of 8" in said[0]
    plain, padded = _bags("adam", "sum")
    grad_out = torch.ones(2, D)
    for bag in (plain, padded):  # eager and unpadded on the padded bag: the plain bag's step
        bag(big[0], big[1]).backward(grad_out)
    assert torch.equal(plain.table_rows(slice(0, N))["optimizer.exp_avg"],
                       padded.table_rows(slice(0, N))["optimizer.exp_avg"])


def test_choosing_the_capacity():
    counts = list(range(1000, 2001))
    assert choose_capacity(counts, quantile=0.5, margin=1.0, round_to=100) == 1500
    assert choose_capacity(counts, quantile=1.0, margin=1.25, round_to=1024) == 3072
    assert choose_capacity([3], round_to=1024) == 1024
    with pytest.raises(ValueError, match="at least one batch"):
        choose_capacity([])
    with pytest.raises(ValueError, match="does not fit a capacity of 2"):
        pad_batch(torch.arange(3), torch.tensor([0]), None, 2, pad_id=N)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_a_padded_step_runs_on_meta_with_the_same_shapes_whatever_the_batch(mode):
    """What a graph captures: padded batches of different poolings, sent to `meta` (no
    values), through the bag (device bookkeeper), an MLP, the loss and backward with the
    update; every batch gives the step the same shapes."""
    bag = CachedEmbeddingBag(padded_rows(N), D, mode=mode, cache_ratio=0.05, optimizer="adam", lr=0.1,
                             device="meta", bookkeeping="device")
    mlp = torch.nn.Linear(D, 1).to("meta")
    fixed = FixedCapacity(128, pad_id=N, say=pytest.fail)
    shapes = set()
    for max_hot in (1, 4, 9):
        ids, offsets, w = fixed.pad(*_batches(1, seed=max_hot, max_hot=max_hot)[0])
        ids, offsets = ids.to("meta"), offsets.to("meta")
        shapes.add((ids.shape, offsets.shape))
        loss = mlp(bag(ids, offsets)[:BATCH]).sum()
        loss.backward()
        assert loss.device.type == "meta"
    assert shapes == {(torch.Size([128]), torch.Size([BATCH + 1]))} and bag.cache.step == 3


def test_a_keyed_batch_is_padded_by_repeating_each_feature_s_own_first_id():
    """`pad_features` (what `dlrm train --cuda-graphs` pads with): each feature's ids, then
    its pads in one extra sample, repeating its own first id, so the cache sees no id the
    batch lacks. A feature over its capacity, or with no id though it has a capacity (no id
    of its own to repeat), gives None: that batch runs eagerly."""
    got = pad_features(torch.tensor([4, 2, 9]), torch.tensor([2, 0, 0, 1]), [3, 2])
    assert got is not None
    padded, padded_lengths = got
    assert padded.tolist() == [4, 2, 4, 9, 9] and padded_lengths.tolist() == [2, 0, 1, 0, 1, 1]
    assert pad_features(torch.tensor([4, 2, 9]), torch.tensor([2, 0, 0, 1]), [1, 2]) is None  # over
    assert pad_features(torch.tensor([4, 2]), torch.tensor([2, 0, 0, 0]), [3, 2]) is None  # the second has none
    kept = pad_features(torch.tensor([4, 2]), torch.tensor([2, 0, 0, 0]), [3, 0])  # ... and no capacity: kept
    assert kept is not None and kept[0].tolist() == [4, 2, 4] and kept[1].tolist() == [2, 0, 1, 0, 0, 0]
