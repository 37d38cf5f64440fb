"""HEAT kernels (the runs kernel and the per-sample one): exact gradients against PyTorch
autograd, determinism, tiling, chunking, the order of runs, the kernels run as plain Python
(JIT off) against the compiled ones, and cpu_kernels standing alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_kernels.heat import KERNELS, HeatEngine, HeatOptions, chunk_bounds, loss_gradients, user_run_order, user_vectors
from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.torch_reference import cf_loss
from embcache.cf.data.interactions import from_pairs
from embcache.cf.data.synthetic import power_law_interactions
from embcache.cf.evaluation import evaluate_params as evaluate


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


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("model", ["mf-ccl", "simplex"])
def test_kernel_gradients_equal_autograd(model, kernel):
    params, rng = _small_params(model)
    c = params.config
    assert params.hist_len[0] == 0 and params.hist_len[3] == 0 and params.hist_len.max() == c.history
    B = 12
    users = np.concatenate([[0, 3, 0], rng.integers(0, len(params.U), B - 3)])
    pos = rng.integers(0, len(params.I), B)
    negs = rng.integers(0, len(params.I), (B, c.negatives))
    negs[0, :2] = pos[0]  # a negative equal to the positive, and a repeated negative
    if kernel == "runs":  # consecutive samples of one user share the user side: make runs of 1 to 4
        by_user = np.argsort(users, kind="stable")
        users, pos, negs = users[by_user], pos[by_user], negs[by_user]
        assert np.bincount(users).max() >= 3 and (np.bincount(users) == 1).any()

    loss, gU, gI, gW = loss_gradients(params, users, pos, negs, kernel)

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


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_thread_with_a_seed_is_deterministic(small, kernel):
    a, b, c = (_train(small, seed=seed, kernel=kernel) for seed in (5, 5, 6))
    for name in "UIW":
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.array_equal(a.U, c.U) and not np.array_equal(a.I, c.I)


@pytest.mark.parametrize("kernel", KERNELS)
def test_cutting_an_epoch_into_chunks_changes_nothing(small, kernel):
    # progress bars cut epochs into chunks: RNG, tile and W-gradient state carry over exactly,
    # and the runs kernel's chunks end where a run does
    a, b = (_train(small, chunks=chunks, w_sync=50, kernel=kernel, user_run=5) for chunks in (1, 7))
    for name in "UIW":
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_prefetching_coming_rows_changes_nothing(small, monkeypatch):
    """The runs kernel asks the CPU for the rows of a coming sample (`prefetch` places
    ahead): a hint to the caches, so every parameter is the same to the bit at any distance,
    past the end of a thread's share too. Tables that fit the caches are not prefetched."""
    import cpu_kernels.heat as heat

    users, items = small.train_pairs()
    assert HeatEngine(_train(small, epochs=0), users, items, HeatOptions(threads=1)).prefetch == 0  # small
    monkeypatch.setattr(heat, "PREFETCH_MIN_TABLE_BYTES", 0)
    assert HeatEngine(_train(small, epochs=0), users, items, HeatOptions(threads=1)).prefetch == 2
    runs = [_train(small, prefetch=ahead, w_sync=50) for ahead in (0, 1, 2, 100_000)]
    for other in runs[1:]:
        for name in "UIW":
            assert np.array_equal(getattr(runs[0], name), getattr(other, name)), name
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        HeatOptions(prefetch=-1)


def test_runs_of_one_are_the_per_sample_sgd_and_longer_runs_are_not(small):
    """With runs of one sample the runs kernel is the per-sample kernel's SGD (the same order,
    draws and updates; only float rounding differs: fused passes, reassociated sums); runs of
    a user's samples are another SGD (W-path once per run, the runs' order)."""
    config = CFConfig(negatives=16, seed=3)
    users, items = (a[:300] for a in small.train_pairs())  # short enough that rounding stays small

    def one_epoch(**opts):
        params = CFParams.init(config, small.num_users, small.num_items, small.train_indptr, small.train_indices)
        HeatEngine(params, users, items, HeatOptions(threads=1, tile=64, refresh=32, w_sync=50, **opts)).epoch(0)
        return params

    sample, plain, runs = one_epoch(kernel="sample"), one_epoch(user_run=1), one_epoch(user_run=8)
    for name in "UIW":
        a, b, c = getattr(sample, name), getattr(plain, name), getattr(runs, name)
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=name)
        assert np.abs(c - a).max() > 20 * max(np.abs(b - a).max(), 1e-6), name


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=60), st.integers(1, 5), st.integers(0, 2**32 - 1),
       st.integers(1, 9))
def test_user_run_order_is_a_shuffle_of_short_single_user_runs(users, max_run, seed, chunks):
    users = np.array(users, dtype=np.int32)
    order = np.random.default_rng(seed).permutation(len(users))
    shuffled = order.copy()
    starts = user_run_order(users, order, max_run, np.random.default_rng(seed))
    assert sorted(order) == list(range(len(users))) and starts[0]
    bounds = np.append(np.flatnonzero(starts), len(users))
    runs = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    for run in runs:
        assert 1 <= len(run) <= max_run and len(set(users[run])) == 1
    for u in set(users.tolist()):
        # each user's pairs in their shuffled order, cut every max_run: those are its runs
        mine = [i for i in shuffled if users[i] == u]
        want = sorted(tuple(mine[k:k + max_run]) for k in range(0, len(mine), max_run))
        assert sorted(tuple(r) for r in runs if users[r[0]] == u) == want
    cuts = chunk_bounds(starts, chunks)
    assert cuts[0] == 0 and cuts[-1] == len(users) and np.all(np.diff(cuts) >= 0)
    assert all(starts[c] for c in cuts[:-1] if c < len(users))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("tile", [0, 64])
def test_training_learns_with_and_without_tiling(small, tile, kernel):
    from embcache.cf import evaluation as metrics

    u, v = metrics.popularity_scores(small.train_indices, small.num_users, small.num_items)
    pop = metrics.evaluate(u, v, small.train_indptr, small.train_indices, small.test_indptr, small.test_indices,
                           cosine=False)["recall@20"]
    untrained = _train(small, epochs=0)
    trained = _train(small, epochs=6, tile=tile, threads=None, kernel=kernel)
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


def _tiny_kernel_run() -> dict:
    """One HEAT epoch and `loss_gradients` on a tiny input, for each model and kernel: 12 users,
    15 items, d=4, K=3, one thread, tiling on (tile 5, refresh 4), W applied every 3 samples,
    runs of up to 3 samples. Imports
    only numpy and cpu_kernels, so that a subprocess with the JIT disabled can run it too."""
    import numpy as np

    from cpu_kernels import _kernels
    from cpu_kernels.heat import HeatEngine, HeatOptions, loss_gradients
    from cpu_kernels.model import CFConfig, CFParams

    rng = np.random.default_rng(11)
    nu, ni = 12, 15
    keys = np.unique(rng.integers(0, nu * ni, 50))  # distinct (user, item) pairs, sorted
    users, items = np.divmod(keys, ni)
    indptr = np.searchsorted(users, np.arange(nu + 1))
    out = {"jit": np.array(hasattr(_kernels.train_pairs, "py_func"))}
    for model in ("simplex", "mf-ccl"):
        config = CFConfig(model=model, dim=4, negatives=3, margin=0.2, neg_weight=3.0, history=3, init_std=0.5,
                          seed=2)
        params = CFParams.init(config, nu, ni, indptr, items)
        if model == "simplex":
            params.W += (0.3 * rng.standard_normal(params.W.shape)).astype(np.float32)
        b_users, b_pos, b_negs = users[:6], items[:6], rng.integers(0, ni, (6, 3))  # users sorted: runs
        start = params.copy()
        for kernel in ("sample", "runs"):
            params = start.copy()
            loss, gU, gI, gW = loss_gradients(params, b_users, b_pos, b_negs, kernel)
            engine = HeatEngine(params, users, items, HeatOptions(threads=1, tile=5, refresh=4, w_sync=3,
                                                                  kernel=kernel, user_run=3))
            stats = engine.epoch(0)
            key = f"{model}/{kernel}"
            out.update({f"{key}/grad_loss": np.array(loss), f"{key}/gU": gU, f"{key}/gI": gI, f"{key}/gW": gW,
                        f"{key}/U": params.U, f"{key}/I": params.I, f"{key}/W": params.W,
                        f"{key}/epoch_loss": np.array(stats["loss"]),
                        f"{key}/active_negatives": np.array(stats["active_negatives"]),
                        f"{key}/rng": engine.rng, f"{key}/tile_state": engine.tile_state})
    return out


def test_kernels_as_plain_python_equal_the_compiled_kernels(tmp_path):
    """The numba kernels run once as plain Python (NUMBA_DISABLE_JIT=1, set in a subprocess:
    numba reads it at import) and once compiled, on the same tiny input: the trained U, I, W
    after one epoch and `loss_gradients` agree to rtol 1e-5 / atol 1e-6, not bit for bit:
    the compiled dot product may reassociate and fuse its sum (fastmath reassoc, contract),
    which moves float32 results by a few ulps, and plain Python adds the per-sample losses
    in float32 where numba uses float64. The random streams, tiles and active-negative
    counts are integer work and must agree exactly."""
    import inspect
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "plain.npz"
    script = (inspect.getsource(_tiny_kernel_run)
              + f"\nimport numpy as np\nnp.savez({str(out)!r}, **_tiny_kernel_run())\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", "-c", script], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    compiled = _tiny_kernel_run()
    with np.load(out) as plain:
        assert not plain["jit"] and compiled.pop("jit")  # the subprocess really ran the Python functions
        assert set(plain.files) == set(compiled) | {"jit"}
        for key in sorted(compiled):
            if key.endswith(("active_negatives", "rng", "tile_state")):
                assert np.array_equal(plain[key], compiled[key]), key
            else:
                np.testing.assert_allclose(plain[key], compiled[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for key in ("simplex/sample", "simplex/runs", "mf-ccl/sample", "mf-ccl/runs"):  # the input exercises what it should
        assert compiled[f"{key}/active_negatives"] > 0 and np.abs(compiled[f"{key}/gI"]).max() > 1e-3
    assert np.abs(compiled["simplex/sample/gW"]).max() > 1e-3 and np.abs(compiled["simplex/runs/gW"]).max() > 1e-3


def test_cpu_kernels_imports_nothing_from_embcache():
    """cpu_kernels stands alone: no module of it names embcache in an import, and importing
    all of them loads no embcache module."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "cpu_kernels"
    modules = sorted(package.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "_kernels.py", "_run_kernels.py", "heat.py", "model.py",
                                        "torch_reference.py"}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "embcache" for n in names), f"{path.name}:{node.lineno}: {names}"
    imports = "; ".join(f"import cpu_kernels.{m.stem}" for m in modules if m.stem != "__init__")
    check = f"import sys; {imports}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'embcache'))"
    done = subprocess.run([sys.executable, "-c", check], cwd=package.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
