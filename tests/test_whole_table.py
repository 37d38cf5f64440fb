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
