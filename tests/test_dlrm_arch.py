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
    want = theirs.over_arch(theirs.inter_arch(theirs.dense_arch(dense), pooled))
    assert torch.equal(ours(pooled, dense), want)


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
