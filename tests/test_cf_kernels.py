"""HEAT kernels: exact gradients against PyTorch autograd, determinism, tiling, chunking."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_kernels.heat import HeatEngine, HeatOptions, loss_gradients, user_vectors
from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.torch_reference import cf_loss
from embcache.data.cf.interactions import from_pairs
from embcache.data.cf.synthetic import power_law_interactions
from embcache.train.cf_eval import evaluate_params as evaluate


def _small_params(model: str, seed: int = 1):
    """6 users (0 and 3 without history), 15 items, d=8, a W far from the identity."""
    rng = np.random.default_rng(seed)
    d, nu, ni = 8, 6, 15
    pairs = [(u, i) for u in (1, 2, 4, 5) for i in rng.choice(ni, 5, replace=False)]
    users, items = np.array(pairs).T
    data = from_pairs(users, items, users[:0], items[:0], num_users=nu, num_items=ni)
    config = CFConfig(model=model, dim=d, negatives=7, margin=0.1, neg_weight=3.0, gamma=0.3, history=3, seed=seed)
    params = CFParams.init(config, nu, ni, data.train_indptr, data.train_indices)
    params.U[:] = rng.standard_normal(params.U.shape)
    params.I[:] = rng.standard_normal(params.I.shape)
    params.W[:] = np.eye(d) + 0.5 * rng.standard_normal((d, d))
    return params, rng


@pytest.mark.parametrize("model", ["mf-ccl", "simplex"])
def test_kernel_gradients_equal_autograd(model):
    params, rng = _small_params(model)
    c = params.config
    assert params.hist_len[0] == 0 and params.hist_len[3] == 0 and params.hist_len.max() == c.history
    B = 12
    users = np.concatenate([[0, 3, 0], rng.integers(0, len(params.U), B - 3)])
    pos = rng.integers(0, len(params.I), B)
    negs = rng.integers(0, len(params.I), (B, c.negatives))
    negs[0, :2] = pos[0]  # a negative equal to the positive, and a repeated negative

    loss, gU, gI, gW = loss_gradients(params, users, pos, negs)

    t = {name: torch.tensor(getattr(params, name), dtype=torch.float64, requires_grad=True) for name in "UIW"}
    ref = cf_loss(t["U"], t["I"], t["W"], torch.from_numpy(params.hist), torch.from_numpy(params.hist_len),
                  torch.from_numpy(users), torch.from_numpy(pos), torch.from_numpy(negs), c, reduction="sum")
    ref.backward()

    # the hinge must be exercised on both sides, and no cosine may sit on its kink
    z = user_vectors(params)[users].astype(np.float64)
    rows = params.I[negs].astype(np.float64)
    cos = np.einsum("bd,bkd->bk", z, rows) / np.linalg.norm(z, axis=1)[:, None] / np.linalg.norm(rows, axis=2)
    assert (cos > c.margin).sum() >= 10 and (cos < c.margin).sum() >= 10
    assert np.abs(cos - c.margin).min() > 1e-3

    np.testing.assert_allclose(loss, ref.item(), rtol=1e-5)
    np.testing.assert_allclose(gU, t["U"].grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gI, t["I"].grad.numpy(), rtol=1e-5, atol=1e-5)
    if model == "simplex":
        np.testing.assert_allclose(gW, t["W"].grad.numpy(), rtol=1e-5, atol=1e-5)
        assert np.abs(gW).max() > 1e-2
        # a user without history: the user row carries gamma of the gradient, history nothing
        assert np.abs(gU[0]).max() > 0
    else:
        assert t["W"].grad is None and not gW.any()
    # rows no sample touches get no gradient
    touched = set(pos) | set(negs.ravel())
    if model == "simplex":
        touched |= {int(i) for u in users for i in params.hist[u, :params.hist_len[u]]}
    untouched = [i for i in range(len(params.I)) if i not in touched]
    assert not gI[untouched].any()


def test_user_vectors_equal_the_reference_user_side():
    from cpu_kernels.torch_reference import user_side

    params, _ = _small_params("simplex", seed=4)
    t = {name: torch.from_numpy(getattr(params, name)) for name in ("U", "I", "W", "hist", "hist_len")}
    want = user_side(t["U"], t["I"], t["W"], t["hist"], t["hist_len"], torch.arange(len(params.U)), params.config)
    np.testing.assert_allclose(user_vectors(params), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def small():
    return power_law_interactions(num_users=400, num_items=600, interactions=12_000, communities=8, seed=3)


def _train(data, epochs=2, seed=0, chunks=1, model="simplex", **opts):
    config = CFConfig(model=model, negatives=16, seed=seed)
    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    engine = HeatEngine(params, *data.train_pairs(), HeatOptions(**{"threads": 1, "tile": 64, "refresh": 32, **opts}))
    for e in range(epochs):
        engine.epoch(e, chunks=chunks)
    return params


def test_one_thread_with_a_seed_is_deterministic(small):
    a, b, c = _train(small, seed=5), _train(small, seed=5), _train(small, seed=6)
    for name in "UIW":
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.array_equal(a.U, c.U) and not np.array_equal(a.I, c.I)


def test_cutting_an_epoch_into_chunks_changes_nothing(small):
    # progress bars cut epochs into chunks: RNG, tile and W-gradient state carry over exactly
    a, b = _train(small, chunks=1, w_sync=50), _train(small, chunks=7, w_sync=50)
    for name in "UIW":
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("tile", [0, 64])
def test_training_learns_with_and_without_tiling(small, tile):
    from embcache.train import cf_eval as metrics

    u, v = metrics.popularity_scores(small.train_indices, small.num_users, small.num_items)
    pop = metrics.evaluate(u, v, small.train_indptr, small.train_indices, small.test_indptr, small.test_indices,
                           cosine=False)["recall@20"]
    untrained = _train(small, epochs=0)
    trained = _train(small, epochs=6, tile=tile, threads=None)
    before, after = evaluate(untrained, small)["recall@20"], evaluate(trained, small)["recall@20"]
    assert after > 3 * before and after > 1.3 * pop, (before, after, pop)


def test_engine_checks_its_inputs(small):
    params = _train(small, epochs=0)
    users, items = small.train_pairs()
    with pytest.raises(ValueError, match="outside the embedding tables"):
        HeatEngine(params, users, items + small.num_items)
    with pytest.raises(ValueError, match="threads"):
        HeatEngine(params, users, items, HeatOptions(threads=10_000))
    params.U = params.U.astype(np.float64)
    with pytest.raises(TypeError, match="float32"):
        HeatEngine(params, users, items)
