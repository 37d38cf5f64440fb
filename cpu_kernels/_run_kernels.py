"""Private numba kernel of HEAT that trains a user's samples in runs (`HeatOptions.kernel =
"runs"`, the default). Only `cpu_kernels.heat` calls it, after checking dtypes and shapes.

Why it exists: at K=64 the per-sample kernel (`_kernels.train_pairs`) spends as long on
SimpleX's user side as on the negatives: per sample it averages the history rows, multiplies
W by their mean, takes the outer product of the gradient with that mean into W's gradient,
multiplies W^T by the gradient and writes every history row back: three d x d products and
three passes over the history. The epoch order here is a shuffle of *runs*: up to
`user_run` consecutive samples of one user (`heat.user_run_order`). A run computes the
history mean h and (1 - gamma) W h once; each sample then only mixes in the user row
(gamma U[u], which is updated sample by sample as before); the gradients that reach h and W
are summed over the run and applied at its end, once. With the parameters fixed (the test
mode) this is exactly the per-sample gradient; when training, the W-path and history rows
see the run's samples as one mini-batch, and the run's samples come one after the other
instead of scattered over the epoch: both are measured by `embcache bench cf`.

The negatives cost less too:
- the forward is branchless: the hinge is a max, and the indices of the negatives inside
  the margin are collected by a store that always happens and a counter that moves by 0
  or 1 (the branch on a ~10 %-taken random condition mispredicted);
- an item row's backward is one pass: its share of the user gradient, its own update and
  its new squared norm (for the 1/|row| cache), where the per-sample kernel made three.
Everything else (the per-thread splitmix64 streams, tiles, Hogwild row updates, W applied
as the mean of a thread's gradient every `w_sync` samples, the mask of the user's own items
that negatives exclude) is the per-sample kernel's. The mask pays off most here: it is
built once per run (and per tile refresh), not once per sample.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels._kernels import _apply_w, _below, _dot, _inv_norms, _mark_seen, _reject_seen, _splitmix
from cpu_kernels.intrinsics import prefetch_row

_OPTS = dict(nogil=True, cache=True, fastmath=False)
# loops that end in a sum: may reorder it and fuse multiply-adds (vectorised), IEEE otherwise
_SUM_OPTS = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"})


@njit(**_SUM_OPTS)
def _item_step(t, r, z, gz, ga, w, a, cb, step, inplace):
    """One item row's backward in one pass: gz += ga * r (its share of the user gradient,
    from the row before it moves), then t -= step * w * (a*z - cb*r). When training t *is*
    r (`inplace`: one array, so LLVM vectorises) and the row's new squared norm is returned;
    in the test mode t is a gradient array and 0 is returned."""
    s = np.float32(0.0)
    if inplace:
        for k in range(t.shape[0]):
            x = t[k]
            gz[k] += ga * x
            x -= step * (w * (a * z[k] - cb * x))
            t[k] = x
            s += x * x
    else:
        for k in range(t.shape[0]):
            gz[k] += ga * r[k]
            t[k] -= step * (w * (a * z[k] - cb * r[k]))
    return s


@njit(**_OPTS)
def _negatives_forward(z, I, negs, inv_norm, inv_z, margin, cos_n, act):
    """cos_n[j] = cos(z, I[negs[j]]); returns (sum of the hinges max(0, cos - margin), the
    number of negatives inside the margin), their indices in act[:count]. Branchless, and the
    dot products in a loop of their own: fused with the hinge sum and the compaction, the
    loop ran 1.4x (d=64) to 1.6x (d=128) slower (measured)."""
    K = negs.shape[0]
    for j in range(K):
        n = negs[j]
        cos_n[j] = _dot(z, I[n]) * inv_z * inv_norm[n]
    hinge = np.float32(0.0)
    na = 0
    for j in range(K):
        c = cos_n[j]
        hinge += max(c - margin, np.float32(0.0))
        act[na] = j
        na += 1 if c > margin else 0
    return hinge, na


@njit(**_OPTS)
def _run_start(I, W, hist, hist_len, u, g1, h, zb):
    """h = mean of user u's history rows; zb = (1 - gamma) * W h: the part of SimpleX's user
    side that the run's samples share."""
    d = h.shape[0]
    n = hist_len[u]
    for k in range(d):
        h[k] = 0.0
    for j in range(n):
        row = I[hist[u, j]]
        for k in range(d):
            h[k] += row[k]
    if n > 0:
        inv = np.float32(1.0) / np.float32(n)
        for k in range(d):
            h[k] *= inv
    for a in range(d):
        zb[a] = g1 * _dot(W[a], h)


@njit(**_OPTS)
def _run_end(tI, W, hist, hist_len, u, g1, G, h, gW, step, inplace, inv_norm, gh):
    """The run's summed user gradient G reaches W and the history: gW += (1-gamma) G h^T,
    and each history row moves by step * W^T (1-gamma) G / n (its inv_norm refreshed when
    training). G is zeroed for the next run."""
    d = h.shape[0]
    for a in range(d):
        ga = g1 * G[a]
        for k in range(d):
            gW[a, k] += ga * h[k]
    n = hist_len[u]
    if n > 0:
        for k in range(d):
            gh[k] = 0.0
        for a in range(d):
            ga = g1 * G[a]
            for k in range(d):
                gh[k] += W[a, k] * ga
        c = step / np.float32(n)
        for j in range(n):
            i = hist[u, j]
            trow = tI[i]
            for k in range(d):
                trow[k] -= c * gh[k]
            if inplace:
                inv_norm[i] = np.float32(1.0) / np.sqrt(_dot(trow, trow))
    for k in range(d):
        G[k] = 0.0


@njit(**_OPTS)
def _run_sample(U, I, u, p, negs, zb, margin, neg_w, gamma, simplex, tU, tI, step, inplace, inv_norm,
                z, gz, G, cos_n, act):
    """Forward and backward of one (user, positive, negatives) sample of a run: z = gamma
    U[u] + zb (SimpleX) or U[u]; the item rows and the user row move (or, in the test mode,
    their gradients accumulate, as in `_kernels._sample`), and the user-side gradient is
    added to G for the run's end. Returns (loss, negatives inside the margin)."""
    d = U.shape[1]
    K = negs.shape[0]
    if simplex:
        for k in range(d):
            z[k] = gamma * U[u, k] + zb[k]
    else:
        for k in range(d):
            z[k] = U[u, k]
    inv_z = np.float32(1.0) / np.sqrt(_dot(z, z))
    inv_p = inv_norm[p]
    cos_p = _dot(z, I[p]) * inv_z * inv_p
    hinge, na = _negatives_forward(z, I, negs, inv_norm, inv_z, margin, cos_n, act)
    wk = neg_w / np.float32(K)
    loss = np.float32(1.0) - cos_p + wk * hinge
    # backward: gz = sum_i c_i (i/(|z||i|) - cos_i z/|z|^2), each row's share fused with its update
    for k in range(d):
        gz[k] = 0.0
    a = inv_z * inv_p
    s = _item_step(tI[p], I[p], z, gz, -a, np.float32(-1.0), a, cos_p * inv_p * inv_p, step, inplace)
    if inplace:
        inv_norm[p] = np.float32(1.0) / np.sqrt(s)
    c_cos = -cos_p
    for q in range(na):
        j = act[q]
        n = negs[j]
        inv_n = inv_norm[n]
        a = inv_z * inv_n
        c_cos += wk * cos_n[j]
        s = _item_step(tI[n], I[n], z, gz, wk * a, wk, a, cos_n[j] * inv_n * inv_n, step, inplace)
        if inplace:
            inv_norm[n] = np.float32(1.0) / np.sqrt(s)
    zscale = c_cos * inv_z * inv_z
    for k in range(d):
        gz[k] -= zscale * z[k]
    if not simplex:
        for k in range(d):
            tU[u, k] -= step * gz[k]
        return loss, na
    sg = step * gamma
    for k in range(d):
        tU[u, k] -= sg * gz[k]
        G[k] += gz[k]
    return loss, na


@njit(parallel=True, **_OPTS)
def train_runs(U, I, W, hist, hist_len, users, items, order, starts, K, margin, neg_w, gamma, simplex, lr,
               tile, refresh, w_sync, flush, rng, tile_state, gW_buf, loss_out, active_out, exclude, seen_ptr,
               seen, max_redraws, draws_out, trace, ahead):
    """SGD over the pairs order[...] in runs: a run begins where starts[idx] is set and at
    each thread's first sample (thread t walks its contiguous share of `order`, as in
    `_kernels.train_pairs`, whose arguments these are, with the same per-thread state). A
    run's user-side gradient reaches W and the history at its end; a thread's W gradient
    is applied as the mean over its samples once `w_sync` samples have passed at a run's
    end, and at the call's end when `flush`. Every call ends its threads' last runs, so the
    caller cuts an epoch into chunks only where a run starts. The user and positive rows of
    the sample `ahead` places on are prefetched (0: none), which changes no result. The
    negatives exclude the user's items as in `_kernels.train_pairs` (`exclude` ... `trace`)."""
    T = rng.shape[0]
    n = order.shape[0]
    d = U.shape[1]
    ni = I.shape[0]
    g1 = np.float32(1.0) - gamma
    inv_norm = np.empty(ni, np.float32)
    _inv_norms(I, inv_norm)
    for t in prange(T):
        lo = t * n // T
        hi = (t + 1) * n // T
        state = rng[t]
        tile_start = tile_state[t, 0]
        since = tile_state[t, 1]
        pending = tile_state[t, 2]
        z = np.empty(d, np.float32)
        gz = np.empty(d, np.float32)
        h = np.empty(d, np.float32)
        zb = np.zeros(d, np.float32)
        G = np.zeros(d, np.float32)
        negs = np.empty(K, np.int64)
        cos_n = np.empty(K, np.float32)
        act = np.empty(K, np.int64)
        gW = gW_buf[t]
        loss = 0.0
        active = 0
        u_run = -1
        span = tile if tile > 0 else ni
        mask = np.zeros(span if exclude else 1, np.uint8)
        mask_user, mask_base, owned = -1, -1, 0
        redraws, kept = 0, 0
        for idx in range(lo, hi):
            pair = order[idx]
            u = users[pair]
            if ahead > 0 and idx + ahead < hi:
                coming = order[idx + ahead]
                prefetch_row(U, users[coming])
                prefetch_row(I, items[coming])
            if simplex and (idx == lo or starts[idx]):
                if u_run >= 0:
                    _run_end(I, W, hist, hist_len, u_run, g1, G, h, gW, lr, True, inv_norm, gz)
                    if pending >= w_sync:
                        _apply_w(W, gW, lr / np.float32(pending))
                        pending = 0
                _run_start(I, W, hist, hist_len, u, g1, h, zb)
                u_run = u
            # the same draw as `_kernels.train_pairs` (a seed gives both kernels the same negatives);
            # written out here on purpose: one shared njit helper, inlined or not, measured 5-15 %
            # slower per epoch on ml-100k (median of 25 epochs, 4 interleaved runs)
            base = 0
            if tile > 0:
                if since >= refresh or tile_start < 0:
                    state, bits = _splitmix(state)
                    tile_start = _below(bits, ni)
                    since = 0
                since += 1
                base = tile_start
            if exclude and (u != mask_user or base != mask_base):
                if mask_user >= 0:
                    _mark_seen(seen_ptr, seen, mask_user, mask_base, span, ni, mask, 0)
                owned = _mark_seen(seen_ptr, seen, u, base, span, ni, mask, 1)
                mask_user, mask_base = u, base
            for j in range(K):
                state, bits = _splitmix(state)
                negs[j] = _below(bits, span)  # an offset into the window, made an item below
            if exclude and owned > 0:
                state, r, k = _reject_seen(negs, mask, owned, span, max_redraws, state)
                redraws += r
                kept += k
            for j in range(K):
                n_ = base + negs[j]
                negs[j] = n_ - ni if n_ >= ni else n_  # the tile wraps around the table
            if trace.shape[0] > 0:
                trace[pair, :] = negs
            l, a = _run_sample(U, I, u, items[pair], negs, zb, margin, neg_w, gamma, simplex, U, I, lr, True,
                               inv_norm, z, gz, G, cos_n, act)
            loss += l
            active += a
            pending += 1
        if u_run >= 0:
            _run_end(I, W, hist, hist_len, u_run, g1, G, h, gW, lr, True, inv_norm, gz)
        if simplex and pending > 0 and (flush or pending >= w_sync):
            _apply_w(W, gW, lr / np.float32(pending))
            pending = 0
        rng[t] = state
        tile_state[t, 0] = tile_start
        tile_state[t, 1] = since
        tile_state[t, 2] = pending if simplex else 0
        loss_out[t] = loss
        active_out[t] = active
        draws_out[t, 0] = redraws
        draws_out[t, 1] = kept


@njit(**_OPTS)
def loss_gradients_runs(U, I, W, hist, hist_len, users, pos, negs, margin, neg_w, gamma, simplex, gU, gI, gW):
    """`_kernels.loss_gradients` computed the way `train_runs` computes it: consecutive
    samples of one user form a run (user side once, W and history gradients at the run's
    end). With the parameters fixed the result must be the same exact gradients."""
    d = U.shape[1]
    K = negs.shape[1]
    g1 = np.float32(1.0) - gamma
    z = np.empty(d, np.float32)
    gz = np.empty(d, np.float32)
    h = np.empty(d, np.float32)
    zb = np.zeros(d, np.float32)
    G = np.zeros(d, np.float32)
    cos_n = np.empty(K, np.float32)
    act = np.empty(K, np.int64)
    inv_norm = np.empty(I.shape[0], np.float32)
    _inv_norms(I, inv_norm)
    total = 0.0
    step = np.float32(-1.0)
    for s in range(users.shape[0]):
        u = users[s]
        if simplex and (s == 0 or u != users[s - 1]):
            if s > 0:
                _run_end(gI, W, hist, hist_len, users[s - 1], g1, G, h, gW, step, False, inv_norm, gz)
            _run_start(I, W, hist, hist_len, u, g1, h, zb)
        l, _ = _run_sample(U, I, u, pos[s], negs[s], zb, margin, neg_w, gamma, simplex, gU, gI, step, False,
                           inv_norm, z, gz, G, cos_n, act)
        total += l
    if simplex and users.shape[0] > 0:
        _run_end(gI, W, hist, hist_len, users[-1], g1, G, h, gW, step, False, inv_norm, gz)
    return total


@njit(**_OPTS)
def group_by_user(users, order, num_users, max_run, by_user, run_bounds):
    """by_user = `order` stably sorted by user (a counting sort: O(pairs + users)), and
    run_bounds[r]..run_bounds[r+1] the positions of run r in it: each user's pairs cut into
    runs of at most `max_run`. Returns the number of runs (run_bounds must hold pairs + 1)."""
    count = np.zeros(num_users + 1, np.int64)
    for i in range(order.shape[0]):
        count[users[order[i]] + 1] += 1
    for u in range(num_users):
        count[u + 1] += count[u]
    runs = 0
    for u in range(num_users):
        for lo in range(count[u], count[u + 1], max_run):
            run_bounds[runs] = lo
            runs += 1
    run_bounds[runs] = order.shape[0]
    for i in range(order.shape[0]):
        u = users[order[i]]
        by_user[count[u]] = order[i]
        count[u] += 1
    return runs


@njit(**_OPTS)
def place_runs(by_user, run_bounds, run_order, order, starts):
    """order = the runs of `by_user` in the order `run_order`; starts flags each run's
    first position."""
    pos = 0
    for q in range(run_order.shape[0]):
        r = run_order[q]
        lo, hi = run_bounds[r], run_bounds[r + 1]
        for i in range(lo, hi):
            order[pos] = by_user[i]
            starts[pos] = i == lo
            pos += 1
