"""The torch-only DLRM dense part against torchrec's: same parameter names, same logits."""
import pytest
import torch

from embcache.dlrm.arch import DLRMDense, OverArch, interaction_width


def test_same_parameter_names_and_bit_equal_logits_as_torchrec():
    dlrm = pytest.importorskip("torchrec.models.dlrm")
    torch.manual_seed(0)
    num_dense, tables, dim = 13, 5, 8
    theirs = torch.nn.Module()
    theirs.dense_arch = dlrm.DenseArch(num_dense, [16, dim])
    theirs.inter_arch = dlrm.InteractionArch(tables)
    theirs.over_arch = dlrm.OverArch(dim + dlrm.choose(tables, 2) + tables, [12, 6, 1])
    ours = DLRMDense(num_dense, tables, dim, dense_arch=[16], over_arch=[12, 6])
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())  # strict: every name and shape matches
    pooled, dense = torch.randn(64, tables, dim), torch.randn(64, num_dense)
    pooled.requires_grad_(True)
    want = theirs.over_arch(theirs.inter_arch(theirs.dense_arch(dense), pooled))
    (want_grad,) = torch.autograd.grad(want.sum(), pooled)
    got = ours(pooled, dense)
    (got_grad,) = torch.autograd.grad(got.sum(), pooled)
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)  # the backward too


def test_interaction_counts_each_pair_once_after_the_dense_vector():
    model = DLRMDense(3, 2, 2, dense_arch=[4], over_arch=[4])
    dense_vec = torch.tensor([[1.0, 2.0]])
    pooled = torch.tensor([[[3.0, 0.0], [0.0, 5.0]]])
    out = model.inter_arch(dense_vec, pooled)
    # dense itself, then <d,e0> = 3, <d,e1> = 10, <e0,e1> = 0
    assert out.tolist() == [[1.0, 2.0, 3.0, 10.0, 0.0]]
    assert out.shape[1] == interaction_width(2, 2)


def test_the_logit_layer_has_no_relu_and_a_one_layer_top_is_refused():
    top = OverArch(4, [3, 1])
    with torch.no_grad():
        top.model[1].weight.fill_(-1.0)
        top.model[1].bias.fill_(0.0)
    assert float(top(torch.ones(1, 4)).detach()) <= 0  # negative logits pass through
    with pytest.raises(ValueError, match="at least two layers"):
        OverArch(4, [1])


def test_the_interactions_backward_adds_distinct_positions_and_equals_indexing_to_the_bit():
    """The pairs are taken by `index_select` of their flat positions: its backward adds each
    pair's gradient into a position of its own (no sorting `index_put_`, as `z[:, i, j]`'s
    backward is), and gives the same bits as that indexing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from embcache.dlrm.arch import InteractionArch

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    inter = InteractionArch(6)
    dense, pooled = torch.randn(32, 4, requires_grad=True), torch.randn(32, 6, 4, requires_grad=True)
    upstream = torch.randn(32, interaction_width(6, 4))
    out = inter(dense, pooled)
    with Ops() as ops:
        got = torch.autograd.grad(out, (dense, pooled), upstream)
    assert not any(n.startswith("index_put") for n in ops.names) and any(n.startswith("index_add") for n in ops.names)
    combined = torch.cat((dense.unsqueeze(1), pooled), dim=1)
    z = torch.bmm(combined, combined.transpose(1, 2))
    i, j = torch.triu_indices(7, 7, offset=1)
    want_out = torch.cat((dense, z[:, i, j]), dim=1)
    want = torch.autograd.grad(want_out, (dense, pooled), upstream)
    assert torch.equal(out, want_out) and all(torch.equal(a, b) for a, b in zip(got, want))
