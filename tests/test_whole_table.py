"""`WholeTableBag`: a whole table trained inside its backward. With torch's kernels it equals
`nn.EmbeddingBag(sparse=True)` and the matching torch optimizer to the bit; with Triton's (the
interpreter here) SGD is the same bits and Adagrad / Adam within the CPU square root's last bits
(tests/test_kernels_fused.py); a step runs on `meta` as a handful of operations."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embcache.bench.op_count import count_ops
from embcache.cache.optimizers import torch_equivalent
from embcache.nn.whole_table import WholeTableBag
from tests.cache_helpers import long_runs_padded

ROWS, DIM = 30, 6


def batches(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(0, 5, (7,), generator=g)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        ids[:2] = ROWS - 1  # the last row, repeated
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        out.append((ids, offsets, torch.randn(7, DIM, generator=g)))
    return out


def train_torch(weight, optimizer, mode, data):
    bag = nn.EmbeddingBag(ROWS, DIM, mode=mode, sparse=True, _weight=weight.clone())
    opt = torch_equivalent(optimizer, bag.parameters(), 0.1)
    for ids, offsets, g in data:
        opt.zero_grad()
        (bag(ids, offsets) * g).sum().backward()
        opt.step()
    return bag.weight.detach()


def train_whole(weight, optimizer, mode, data, kernels):
    bag = WholeTableBag(weight, optimizer, lr=0.1, mode=mode, kernels=kernels)
    for ids, offsets, g in data:
        (bag(ids, offsets) * g).sum().backward()
    return bag.weight


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_torch_kernels_train_as_torch_does(optimizer, mode):
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    data = batches()
    assert torch.equal(train_whole(weight, optimizer, mode, data, "torch"), train_torch(weight, optimizer, mode, data))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_triton_kernels_train_as_torch_kernels(optimizer):
    pytest.importorskip("triton")
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(2))
    data = batches(4, seed=3)
    want = train_whole(weight, optimizer, "sum", data, "torch")
    got = train_whole(weight, optimizer, "sum", data, "triton")
    if optimizer == "sgd":
        assert torch.equal(got, want)
    else:
        assert torch.allclose(got, want, rtol=0, atol=1e-6), (got - want).abs().max()
    assert not torch.equal(got, weight)  # it trained


def test_evaluation_pools_without_updating_and_two_dimensional_input():
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(4))
    bag = WholeTableBag(weight, "sgd", lr=0.1, kernels="torch").eval()
    ids = torch.tensor([[1, 2], [3, 3]])
    assert torch.equal(bag(ids), F.embedding_bag(ids, weight, mode="sum"))
    assert torch.equal(bag.weight, weight)


def test_a_triton_step_on_meta_is_a_handful_of_operations():
    pytest.importorskip("triton")
    bag = WholeTableBag(torch.empty(ROWS, DIM, device="meta"), "adagrad", kernels="triton")
    ids = torch.empty(40, dtype=torch.long, device="meta")
    offsets = torch.empty(8, dtype=torch.long, device="meta")
    grad = torch.empty(8, DIM, device="meta")
    counter = count_ops(lambda: bag(ids, offsets).backward(grad))
    assert counter.ops["pooled_lookup"] == 1 and counter.ops["fused_row_update"] == 2  # one op, two launches
    assert counter.total <= 12, dict(counter.ops)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_padded_batch_updates_every_row_as_the_unpadded_one(optimizer, kernels):
    """A batch padded as a captured step pads it (`nn.fixed_capacity.pad_features`: one extra
    bag repeating the first id, `padded_samples=1`), three rows with runs of about 100 lookups
    and 150 pads, through the fused kernel's chunks of 64 too: the pooled rows and every row
    after two steps equal the unpadded batch's to the bit. The pads read the spare row, so
    their zero terms sort after every real one; left on the first id (`WholeTableBag.forward`'s
    `torch.where` removed), they shift the runs after it across the kernel's chunks."""
    if kernels == "triton":
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(4)
    ids, offsets, padded_ids, padded_offsets = long_runs_padded(g)
    weight, scale = torch.randn(8, 4, generator=g), torch.linspace(0.5, 1.5, 4)
    results = []
    for padded in (False, True):
        bag = WholeTableBag(weight, optimizer, lr=0.05, kernels=kernels)
        outs = []
        for _ in range(2):
            out = bag(padded_ids, padded_offsets, padded_samples=1) if padded else bag(ids, offsets)
            (out * scale).sum().backward()
            outs.append(out.detach())
        results.append((outs, bag.weight.clone(), {k: v[:8].clone() for k, v in bag.state().items()}))
    (want_out, want_weight, want_state), (got_out, got_weight, got_state) = results
    assert ids.bincount().min() > 64 and 450 - ids.numel() > 64  # runs and pads longer than a chunk
    assert all(o.shape == (100, 4) for o in got_out) and all(map(torch.equal, got_out, want_out))
    assert torch.equal(got_weight, want_weight) and not torch.equal(want_weight, weight)
    assert all(torch.equal(got_state[k], want_state[k]) for k in want_state)


def test_its_state_dict_is_an_embedding_bags():
    """Saved and loaded as `nn.EmbeddingBag`: `weight` (`[N, D]`, without the spare row), so
    a collection of these and one of torch's bags read each other's state dicts."""
    torch_bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    bag = WholeTableBag(torch.zeros(ROWS, DIM), "adagrad", kernels="torch")
    assert list(bag.state_dict()) == ["weight"] and bag.state_dict()["weight"].shape == (ROWS, DIM)
    bag.load_state_dict(torch_bag.state_dict())
    assert torch.equal(bag.weight, torch_bag.weight.detach())
    torch_bag.load_state_dict({"weight": bag.state_dict()["weight"] * 2})
    assert torch.equal(torch_bag.weight.detach(), bag.weight * 2)
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        bag.load_state_dict({"weight": torch.zeros(ROWS + 1, DIM)})
    with pytest.raises(RuntimeError, match='Missing key.*"weight"'):
        bag.load_state_dict({})
