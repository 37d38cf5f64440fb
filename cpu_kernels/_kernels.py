"""Private numba kernels of HEAT. Only `cpu_kernels.heat` calls them (it checks dtypes and
shapes first); nothing else should know they exist.

Why they look the way they do:
- one parallel loop (`prange`) over threads, each walking its own slice of the shuffled
  training pairs and writing rows without locks (Hogwild: collisions are rare and harmless
  for sparse SGD);
- each thread has its own splitmix64 stream, seeded from (seed, thread), so a run with one
  thread is exactly reproducible;
- similarities are dot products on the rows where they live (no gathered matrices), and the
  forward norms and dot products are reused by the backward:
  d cos(z,i)/dz = i/(|z||i|) - cos z/|z|^2;
- every item's 1/|row| is kept in an array, refreshed whenever the kernel moves that row,
  so a negative costs one dot product, not a dot product and a norm (measured 1.2x per
  epoch at K=1000);
- a row's gradient is applied by one pass over the row, reading and writing it through a
  single array: two views of the same row defeat LLVM's alias check and run scalar;
- `fastmath=False` everywhere except the dot-product helper, which may reassociate its
  sum (and nothing else): without that LLVM keeps it scalar;
- negatives may exclude the user's own training items (`exclude`, the "unseen" rule): a
  thread keeps a byte mask over its current tile (over the whole table without tiling) with
  the current user's items set, built from the user's sorted items by one binary search
  (`_mark_seen`, only the items inside the tile are touched) whenever the user or the tile
  changes; the candidates whose byte is set are redrawn from the same tile, in at most
  `max_redraws` rounds, then kept and counted (a user owning all of a tile cannot loop;
  `_reject_seen`). A mask lookup per candidate costs a byte load from L1; a binary search
  per candidate would cost about as much as the rest of the sample.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_OPTS = dict(nogil=True, cache=True, fastmath=False)
# Reductions only: may reorder the sum and fuse multiply-adds (so LLVM vectorises them);
# NaN/inf semantics stay IEEE. Measured ~2x per epoch over the scalar sum (bench cf).
_DOT_OPTS = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"})

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(**_OPTS)
def _splitmix(state):
    """One step of splitmix64: (new state, 64 random bits)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return state, z ^ (z >> np.uint64(31))


@njit(**_OPTS)
def _below(bits, n):
    """A uniform integer in [0, n) from 64 random bits (multiply-shift, no division)."""
    return np.int64(((bits >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(**_OPTS)
def _lower_bound(a, lo, hi, x):
    """The first position in a[lo:hi] (sorted) whose value is >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**_OPTS)
def _mark_seen(seen_ptr, seen, u, start, span, ni, mask, value):
    """mask[i - start] = value for every training item i of user u inside the window of
    `span` items from `start`, which wraps around the table of `ni` items like a tile does
    (seen[seen_ptr[u]:seen_ptr[u + 1]] are u's items, sorted). Returns how many there are.
    One binary search, then only the items inside the window: a tile holds ~5 % of the
    items, so this is far cheaper than a pass over a heavy user's list."""
    lo, hi = seen_ptr[u], seen_ptr[u + 1]
    end = start + span
    count = 0
    j = _lower_bound(seen, lo, hi, start)
    while j < hi and seen[j] < end:
        mask[seen[j] - start] = value
        count += 1
        j += 1
    if end > ni:  # the window wraps: its items [0, end - ni) sit at offsets ni - start on
        j = lo
        while j < hi and seen[j] < end - ni:
            mask[seen[j] + ni - start] = value
            count += 1
            j += 1
    return count


@njit(**_DOT_OPTS)
def _dot(a, b):
    """Dot product of two float32 rows."""
    s = np.float32(0.0)
    for k in range(a.shape[0]):
        s += a[k] * b[k]
    return s


@njit(**_OPTS)
def _inv_norm(r):
    """1 / |r|."""
    return np.float32(1.0) / np.sqrt(_dot(r, r))


@njit(parallel=True, **_OPTS)
def _inv_norms(I, out):
    """out[i] = 1 / |I[i]| for every item, in parallel."""
    for i in prange(I.shape[0]):
        out[i] = _inv_norm(I[i])


@njit(**_OPTS)
def _axpy(y, c, x):
    """y += c * x."""
    for k in range(y.shape[0]):
        y[k] += c * x[k]


@njit(**_OPTS)
def _step_row(t, r, z, w, a, cb, step, inplace):
    """t -= step * w * (a*z - cb*r): the update (or, in the test mode, the gradient) of an
    item row r from its cosine with z. When training, t *is* r; reading and writing it
    through one array (the `inplace` branch) lets LLVM vectorise the loop, where two views
    of the same row fail its runtime alias check and run scalar (5x slower, measured)."""
    if inplace:
        for k in range(t.shape[0]):
            t[k] -= step * (w * (a * z[k] - cb * t[k]))
    else:
        for k in range(t.shape[0]):
            t[k] -= step * (w * (a * z[k] - cb * r[k]))


@njit(**_OPTS)
def _user_vector(U, I, W, hist, hist_len, u, gamma, simplex, z, h):
    """z = U[u] (MF-CCL) or gamma*U[u] + (1-gamma)*W @ mean(I[hist[u]]) (SimpleX); h holds
    the mean of the history (kept for the backward)."""
    d = U.shape[1]
    if not simplex:
        for k in range(d):
            z[k] = U[u, k]
        return
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
        z[a] = gamma * U[u, a] + (np.float32(1.0) - gamma) * _dot(W[a], h)


@njit(**_OPTS)
def _sample(U, I, W, hist, hist_len, u, p, negs, margin, neg_w, gamma, simplex,
            tU, tI, step, inplace, inv_norm, gW, z, h, gz, cos_n, inv_n):
    """Forward and backward of one (user, positive, negatives) sample.

    Each gradient g of a row r is applied as t[r] -= step * g: with t the parameters and
    step the learning rate this is SGD in place; with t a zeroed gradient array and step -1
    it accumulates the exact gradient (the test mode; `inplace` says t is the parameters
    themselves). Each row's share of gz is taken before the row moves. The gradient of W
    is always added to `gW` (the caller decides when to apply it). inv_norm[i] = 1/|I[i]|,
    kept current for every item row this function moves (when training), so that the
    forward needs one dot product per negative, not two. Returns (loss, negatives with a
    gradient).
    """
    d = U.shape[1]
    K = negs.shape[0]
    _user_vector(U, I, W, hist, hist_len, u, gamma, simplex, z, h)
    zz = _dot(z, z)
    inv_z = np.float32(1.0) / np.sqrt(zz)
    # forward: cosines of the positive and of every negative, from in-place dot products
    prow = I[p]
    inv_p = inv_norm[p]
    cos_p = _dot(z, prow) * inv_z * inv_p
    loss = np.float32(1.0) - cos_p
    wk = neg_w / np.float32(K)
    for j in range(K):
        n = negs[j]
        inv_n[j] = inv_norm[n]
        cos_n[j] = _dot(z, I[n]) * inv_z * inv_n[j]
        if cos_n[j] > margin:
            loss += wk * (cos_n[j] - margin)
    # backward: gz = sum_i c_i (i/(|z||i|) - cos_i z/|z|^2), item grads fused with their update
    for k in range(d):
        gz[k] = 0.0
    c_cos = np.float32(0.0)  # sum_i c_i cos_i
    c, a, b = np.float32(-1.0), inv_z * inv_p, inv_p * inv_p
    c_cos += c * cos_p
    _axpy(gz, c * a, prow)
    _step_row(tI[p], prow, z, c, a, cos_p * b, step, inplace)
    if inplace:
        inv_norm[p] = _inv_norm(prow)
    active = 0
    for j in range(K):
        if cos_n[j] <= margin:
            continue
        active += 1
        n = negs[j]
        a, b = inv_z * inv_n[j], inv_n[j] * inv_n[j]
        c_cos += wk * cos_n[j]
        _axpy(gz, wk * a, I[n])
        _step_row(tI[n], I[n], z, wk, a, cos_n[j] * b, step, inplace)
        if inplace:
            inv_norm[n] = _inv_norm(I[n])
    zscale = c_cos * inv_z * inv_z
    for k in range(d):
        gz[k] -= zscale * z[k]
    if not simplex:
        for k in range(d):
            tU[u, k] -= step * gz[k]
        return loss, active
    # SimpleX: z = gamma*u + (1-gamma)*W h, h = mean of the history rows
    g1 = np.float32(1.0) - gamma
    for k in range(d):
        tU[u, k] -= step * gamma * gz[k]
    n_hist = hist_len[u]
    for a_ in range(d):
        ga = g1 * gz[a_]
        for k in range(d):
            gW[a_, k] += ga * h[k]
    if n_hist == 0:
        return loss, active
    # gh = W^T ga / n, reusing h as the buffer (h is no longer needed)
    for k in range(d):
        h[k] = 0.0
    for a_ in range(d):
        ga = g1 * gz[a_]
        for k in range(d):
            h[k] += W[a_, k] * ga
    inv_h = np.float32(1.0) / np.float32(n_hist)
    for j in range(n_hist):
        trow = tI[hist[u, j]]
        for k in range(d):
            trow[k] -= step * inv_h * h[k]
        if inplace:
            inv_norm[hist[u, j]] = _inv_norm(trow)
    return loss, active


@njit(**_OPTS)
def _reject_seen(offs, mask, owned, span, max_redraws, state):
    """Replace the offsets whose mask byte is set (the user's own items) by fresh draws from
    the same window: the kept ones are compacted to the front without a branch (a store that
    always happens, a counter that moves by 0 or 1: the hits are ~10 % and random, so a
    branch per candidate mispredicted, measured ~20 % of an ml-100k epoch), then the missing
    slots are drawn again, at most `max_redraws` rounds; what is still missing after them is
    drawn once more and kept whatever it is. A user owning the whole window (`owned` ==
    `span`) keeps its draws. Returns (state, redraws, negatives kept although the user's)."""
    K = offs.shape[0]
    if owned >= span:
        return state, 0, K
    cnt = 0
    for j in range(K):
        o = offs[j]
        offs[cnt] = o
        cnt += 1 - np.int64(mask[o])
    redraws = 0
    rounds = 0
    while cnt < K and rounds < max_redraws:
        missing = K - cnt
        for q in range(missing):
            state, bits = _splitmix(state)
            o = _below(bits, span)
            offs[cnt] = o
            cnt += 1 - np.int64(mask[o])
        redraws += missing
        rounds += 1
    kept = 0
    for j in range(cnt, K):
        state, bits = _splitmix(state)
        o = _below(bits, span)
        offs[j] = o
        kept += np.int64(mask[o])
    return state, redraws + K - cnt, kept


@njit(parallel=True, **_OPTS)
def train_pairs(U, I, W, hist, hist_len, users, items, order, K, margin, neg_w, gamma,
                simplex, lr, tile, refresh, w_sync, flush, rng, tile_state, gW_buf,
                loss_out, active_out, exclude, seen_ptr, seen, max_redraws, draws_out, trace):
    """SGD over the pairs order[...]; thread t walks its contiguous share of `order`.

    rng[t] (uint64) and tile_state[t] = (tile start, samples since refresh, samples since
    the last W update) carry each thread's state across calls, so with one thread an epoch
    cut into chunks (for a progress bar) gives the same result as one call. tile <= 0 draws
    negatives from all items. gW_buf[t] accumulates thread t's gradient of W, applied to W
    every `w_sync` samples, and at the end of the call when `flush` (the epoch's last chunk),
    as the mean over those samples: W is shared by every user, and applying the sum would be
    a step `w_sync` times larger than the per-row steps, which diverges at the default lr.

    With `exclude` a negative is never one of the user's training items (CSR seen_ptr /
    seen, each user's items sorted) unless `max_redraws` redraws found none other: draws_out[t]
    = (redraws, negatives kept although the user's). trace, when it has rows, receives the
    negatives of each pair (trace[pair] = the K items): a test hook, else shape (0, K).
    """
    T = rng.shape[0]
    n = order.shape[0]
    d = U.shape[1]
    ni = I.shape[0]
    inv_norm = np.empty(ni, np.float32)
    _inv_norms(I, inv_norm)
    for t in prange(T):
        lo = t * n // T
        hi = (t + 1) * n // T
        state = rng[t]
        tile_start = tile_state[t, 0]
        since = tile_state[t, 1]
        z = np.empty(d, np.float32)
        h = np.empty(d, np.float32)
        gz = np.empty(d, np.float32)
        negs = np.empty(K, np.int64)
        cos_n = np.empty(K, np.float32)
        inv_n = np.empty(K, np.float32)
        gW = gW_buf[t]
        pending = tile_state[t, 2]
        loss = 0.0
        active = 0
        span = tile if tile > 0 else ni
        mask = np.zeros(span if exclude else 1, np.uint8)
        mask_user, mask_base, owned = -1, -1, 0
        redraws, kept = 0, 0
        for idx in range(lo, hi):
            pair = order[idx]
            u = users[pair]
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
            l, a = _sample(U, I, W, hist, hist_len, u, items[pair], negs, margin,
                           neg_w, gamma, simplex, U, I, lr, True, inv_norm, gW, z, h, gz, cos_n,
                           inv_n)
            loss += l
            active += a
            if simplex:
                pending += 1
                if pending >= w_sync:
                    _apply_w(W, gW, lr / np.float32(pending))
                    pending = 0
        if simplex and flush and pending > 0:
            _apply_w(W, gW, lr / np.float32(pending))
            pending = 0
        rng[t] = state
        tile_state[t, 0] = tile_start
        tile_state[t, 1] = since
        tile_state[t, 2] = pending
        loss_out[t] = loss
        active_out[t] = active
        draws_out[t, 0] = redraws
        draws_out[t, 1] = kept


@njit(**_OPTS)
def _apply_w(W, gW, lr):
    """W -= lr * gW; gW = 0 (lock-free, like the rows)."""
    d = W.shape[0]
    for a in range(d):
        for k in range(d):
            W[a, k] -= lr * gW[a, k]
            gW[a, k] = 0.0


@njit(**_OPTS)
def loss_gradients(U, I, W, hist, hist_len, users, pos, negs, margin, neg_w, gamma, simplex,
                   gU, gI, gW):
    """Exact gradients of the summed loss over the given samples, parameters unchanged.

    gU, gI and gW must be zeroed by the caller; returns the summed loss. Serial on purpose:
    it is the test oracle's counterpart, not a training path.
    """
    d = U.shape[1]
    K = negs.shape[1]
    z = np.empty(d, np.float32)
    h = np.empty(d, np.float32)
    gz = np.empty(d, np.float32)
    cos_n = np.empty(K, np.float32)
    inv_n = np.empty(K, np.float32)
    inv_norm = np.empty(I.shape[0], np.float32)
    _inv_norms(I, inv_norm)
    total = 0.0
    for s in range(users.shape[0]):
        l, _ = _sample(U, I, W, hist, hist_len, users[s], pos[s], negs[s], margin, neg_w,
                       gamma, simplex, gU, gI, np.float32(-1.0), False, inv_norm, gW, z, h, gz,
                       cos_n, inv_n)
        total += l
    return total


@njit(parallel=True, **_OPTS)
def user_vectors(U, I, W, hist, hist_len, gamma, simplex, out):
    """out[u] = the user side z of every user (for evaluation)."""
    d = U.shape[1]
    for u in prange(U.shape[0]):
        h = np.empty(d, np.float32)
        _user_vector(U, I, W, hist, hist_len, u, gamma, simplex, out[u], h)


@njit(parallel=True, **_OPTS)
def stream_copy(src, dst, reps):
    """dst[:] = src[:] `reps` times, split over threads: the memory-bandwidth yardstick."""
    n = src.shape[0]
    T = 64
    for r in range(reps):
        for t in prange(T):
            lo = t * n // T
            hi = (t + 1) * n // T
            for i in range(lo, hi):
                dst[i] = src[i]
