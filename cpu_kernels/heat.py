"""HEAT engine: the thin Python side of the numba kernels. It checks dtypes and shapes,
keeps the per-thread state (RNG streams, tiles, W-gradient buffers) and cuts an epoch into
chunks for the progress bar; the arithmetic is all in `_kernels`. Also the checked entry
points of the other kernels: `loss_gradients`, `user_vectors`, `copy_bandwidth` (the memory
yardstick of `embcache bench cf`) and `compile_kernels`."""
from __future__ import annotations

import time

import numba
import numpy as np

from cpu_kernels import _kernels, _run_kernels
from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.options import KERNELS, HeatOptions  # noqa: F401 (their home before)


PREFETCH_MIN_TABLE_BYTES = 4 << 20  # a table above this misses a core's private caches (L2 here: 512 KiB)


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


class HeatEngine:
    """Trains `CFParams` in place, one epoch per `epoch()` call.

    Example:
        >>> import numpy as np
        >>> users, items = np.array([0, 0, 1, 2]), np.array([1, 3, 2, 0])   # training pairs
        >>> indptr, indices = np.array([0, 2, 3, 4]), np.array([1, 3, 2, 0])  # the same, as CSR
        >>> params = CFParams.init(CFConfig(dim=8, negatives=2), 3, 4, indptr, indices)
        >>> eng = HeatEngine(params, users, items, HeatOptions(threads=1, tile=2))
        >>> stats = eng.epoch(epoch=0)
        >>> sorted(stats), stats["samples"]
        (['active_negatives', 'loss', 'redraws', 'samples', 'seen_negatives'], 4)
    """

    def __init__(self, params: CFParams, users: np.ndarray, items: np.ndarray,
                 options: HeatOptions = HeatOptions()):
        _check_params(params)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError("users and items must be 1-D arrays of the same length")
        self.params, self.options = params, options
        self.users = np.ascontiguousarray(users, dtype=np.int32)
        self.items = np.ascontiguousarray(items, dtype=np.int32)
        if len(self.users) and (self.users.max() >= len(params.U) or self.items.max() >= len(params.I)
                                or self.users.min() < 0 or self.items.min() < 0):
            raise ValueError("a training pair has an id outside the embedding tables")
        self.threads = options.threads or max_threads()
        if not 1 <= self.threads <= max_threads():
            raise ValueError(f"threads must be in 1..{max_threads()}")
        ni, d = params.I.shape
        self.tile = min(options.tile, ni) if options.tile > 0 else 0
        self.exclude = params.config.negatives_from == "unseen"
        self.seen_ptr, self.seen = seen_items(self.users, self.items, len(params.U), ni)
        # prefetch only where rows come from beyond a core's private cache: on tables that
        # fit (MovieLens-100k, d=128: 0.5 + 0.9 MB) it measured 16 % slower, on the
        # synthetic set's (7.7 + 10 MB at d=64) 5-7 % faster
        big = max(params.U.nbytes, params.I.nbytes) > PREFETCH_MIN_TABLE_BYTES
        self.prefetch = options.prefetch if big else 0
        seed = params.config.seed
        # one independent stream per thread: splitmix64 of distinct, seed-derived states
        self.rng = np.array([(seed * 0x1000193 + 0x51ED + t * 0x632BE59BD9B4E019) % 2**64
                             for t in range(self.threads)], dtype=np.uint64)
        # per thread: tile start (-1: draw one first), samples since the tile was drawn,
        # samples since W was last updated
        self.tile_state = np.zeros((self.threads, 3), dtype=np.int64)
        self.tile_state[:, 0] = -1
        self.gW = np.zeros((self.threads, d, d), dtype=np.float32)

    def state_dict(self) -> dict:
        """What the next epoch needs besides the parameters: each thread's RNG, tile and
        pending W gradient (zero after a whole epoch, kept for completeness)."""
        return {"engine": "heat", "threads": self.threads, "rng": self.rng.copy(),
                "tile_state": self.tile_state.copy(), "gW": self.gW.copy()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("engine") != "heat":
            raise ValueError(f"the checkpoint was written by the {state.get('engine')} engine, not heat")
        if state["threads"] != self.threads:
            raise ValueError(f"the checkpoint was written with {state['threads']} thread(s); resume with "
                             f"--threads {state['threads']} (each thread's random stream is part of the state)")
        if state["gW"].shape != self.gW.shape:
            raise ValueError("the checkpoint's W gradient has another dimension")
        self.rng[:] = state["rng"]
        self.tile_state[:] = state["tile_state"]
        self.gW[:] = state["gW"]

    def epoch(self, epoch: int, chunks: int = 1, progress=None, trace: np.ndarray | None = None) -> dict:
        """One pass over the pairs in a seeded shuffled order (of runs of a user's samples
        with the "runs" kernel and SimpleX); `progress(n_done, loss)` is called after each of
        `chunks` about equal parts, cut where a run starts. Returns the mean loss, the
        negatives inside the margin, and with the "unseen" rule the redraws of negatives
        that were the user's own items and how many were kept after `max_redraws`.
        `trace`, an int32 array [pairs, K], receives the negatives drawn for each training
        pair (a test hook: the kernels write it only when it is given)."""
        c, o = self.params.config, self.options
        rng = np.random.default_rng((c.seed, epoch))
        order = rng.permutation(len(self.users))
        runs = o.kernel == "runs" and c.simplex and o.user_run > 1
        starts = user_run_order(self.users, order, o.user_run, rng) if runs else np.ones(len(order), np.bool_)
        numba.set_num_threads(self.threads)
        loss_out = np.zeros(self.threads)
        active_out = np.zeros(self.threads, dtype=np.int64)
        draws_out = np.zeros((self.threads, 2), dtype=np.int64)
        if trace is None:
            trace = np.zeros((0, c.negatives), np.int32)
        elif trace.shape != (len(self.users), c.negatives) or trace.dtype != np.int32:
            raise ValueError(f"trace must be an int32 array of shape ({len(self.users)}, {c.negatives})")
        total_loss, total_active, total_draws = 0.0, 0, np.zeros(2, np.int64)
        bounds = chunk_bounds(starts, chunks)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            self._train(order[lo:hi], starts[lo:hi], bool(hi == len(order)), loss_out, active_out, draws_out,
                        trace)
            total_loss += float(loss_out.sum())
            total_active += int(active_out.sum())
            total_draws += draws_out.sum(0)
            if progress is not None:
                progress(int(hi - lo), float(loss_out.sum()) / max(hi - lo, 1))
        n = len(order)
        return {"loss": total_loss / max(n, 1), "samples": n, "active_negatives": total_active,
                "redraws": int(total_draws[0]), "seen_negatives": int(total_draws[1])}

    def _train(self, order, starts, flush, loss_out, active_out, draws_out, trace) -> None:
        """One kernel call over order (runs begin where `starts` is set)."""
        c, o, p = self.params.config, self.options, self.params
        head = (p.U, p.I, p.W, p.hist, p.hist_len, self.users, self.items, order)
        tail = (c.negatives, np.float32(c.margin), np.float32(c.neg_weight), np.float32(c.gamma), c.simplex,
                np.float32(o.lr), self.tile, o.refresh, o.w_sync, flush, self.rng, self.tile_state, self.gW,
                loss_out, active_out, self.exclude, self.seen_ptr, self.seen, o.max_redraws, draws_out, trace)
        if o.kernel == "runs":
            _run_kernels.train_runs(*head, starts, *tail, self.prefetch)
        else:
            _kernels.train_pairs(*head, *tail)


def seen_items(users: np.ndarray, items: np.ndarray, num_users: int, num_items: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each user's distinct training items, sorted, as CSR (indptr int64 [num_users + 1],
    items int32): what the "unseen" rule's masks are built from by binary search.

    Example:
        >>> ptr, seen = seen_items(np.array([1, 0, 1, 1]), np.array([5, 2, 3, 5]), 3, 6)
        >>> ptr.tolist(), seen.tolist()
        ([0, 1, 3, 3], [2, 3, 5])
    """
    keys = np.unique(users.astype(np.int64) * num_items + items)
    ptr = np.searchsorted(keys, np.arange(num_users + 1, dtype=np.int64) * num_items).astype(np.int64)
    return ptr, (keys % num_items).astype(np.int32)


def user_run_order(users: np.ndarray, order: np.ndarray, max_run: int, rng) -> np.ndarray:
    """Regroup the shuffled `order` (in place) into a shuffle of runs: each user's pairs,
    in their shuffled order, cut into runs of at most `max_run`; the runs in a random order
    drawn from `rng`. Returns the flags of the positions where a run starts. Two O(n)
    kernels: numpy's stable sorts took ~10 % of an ml-100k epoch.

    Example:
        >>> users = np.array([0, 1, 0, 0, 1, 0], dtype=np.int32)
        >>> order = np.arange(6)
        >>> starts = user_run_order(users, order, 2, np.random.default_rng(0))
        >>> [users[order[starts]].tolist().count(u) for u in (0, 1)]   # runs per user
        [2, 1]
        >>> int(starts.sum()), sorted(order.tolist()) == list(range(6))
        (3, True)
    """
    n = len(order)
    by_user = np.empty_like(order)
    run_bounds = np.empty(n + 1, np.int64)
    num_users = int(users.max()) + 1 if n else 0
    runs = _run_kernels.group_by_user(users, order, num_users, max_run, by_user, run_bounds)
    starts = np.empty(n, np.bool_)
    _run_kernels.place_runs(by_user, run_bounds, rng.permutation(runs), order, starts)
    return starts


def chunk_bounds(starts: np.ndarray, chunks: int) -> np.ndarray:
    """`chunks` + 1 about equal cut points of an epoch, each moved to where a run starts (so
    that cutting an epoch changes nothing; repeated points make empty chunks)."""
    n = len(starts)
    bounds = np.linspace(0, n, chunks + 1).astype(np.int64)
    run_starts = np.append(np.flatnonzero(starts), n)
    return run_starts[np.searchsorted(run_starts, bounds)]


def loss_gradients(params: CFParams, users, pos, negs, kernel: str = "sample"
                   ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Summed loss and its exact gradients (gU, gI, gW) for the given samples (users [B],
    pos [B], negs [B, K]); the parameters are not changed. For tests against autograd.
    kernel "runs" computes them as the runs kernel does (consecutive samples of one user
    share the user side), "sample" as the per-sample kernel."""
    _check_params(params)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    c = params.config
    users = np.ascontiguousarray(users, dtype=np.int64)
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    negs = np.ascontiguousarray(negs, dtype=np.int64)
    if negs.ndim != 2 or negs.shape[0] != len(users) or pos.shape != users.shape:
        raise ValueError("expected users [B], pos [B], negs [B, K]")
    gU, gI, gW = np.zeros_like(params.U), np.zeros_like(params.I), np.zeros_like(params.W)
    fn = _run_kernels.loss_gradients_runs if kernel == "runs" else _kernels.loss_gradients
    loss = fn(params.U, params.I, params.W, params.hist, params.hist_len, users, pos, negs, np.float32(c.margin),
              np.float32(c.neg_weight), np.float32(c.gamma), c.simplex, gU, gI, gW)
    return float(loss), gU, gI, gW


def user_vectors(params: CFParams) -> np.ndarray:
    """The user side z of every user: U (MF-CCL) or SimpleX's gated history mix."""
    _check_params(params)
    c = params.config
    out = np.empty_like(params.U)
    _kernels.user_vectors(params.U, params.I, params.W, params.hist, params.hist_len,
                          np.float32(c.gamma), c.simplex, out)
    return out


def copy_bandwidth(threads: int, mib: int, reps: int = 5) -> float:
    """Bytes/s of a parallel array copy (read + write counted), best of `reps` passes, on
    `threads` threads: two float64 arrays of `mib` MiB each.

    Example:
        >>> copy_bandwidth(threads=1, mib=1, reps=2) > 0
        True
    """
    if not 1 <= threads <= max_threads():
        raise ValueError(f"threads must be in 1..{max_threads()}")
    if mib < 1 or reps < 1:
        raise ValueError("mib and reps must be >= 1")
    n = mib * 2**20 // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    numba.set_num_threads(threads)
    _kernels.stream_copy(src, dst, 1)  # compile, touch the pages
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        _kernels.stream_copy(src, dst, 1)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def compile_kernels() -> float:
    """Compile every HEAT kernel on a toy problem (20 users, 30 items; both models and both
    kernels, with and without tiling), so that no epoch's timing includes numba's compiler; returns the
    seconds it took. numba caches the machine code on disk, so only the first call after an
    install or an edit is slow.

    Example:
        >>> compile_kernels() >= 0
        True
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    num_users, num_items = 20, 30
    keys = np.unique(rng.integers(0, num_users * num_items, 150))  # distinct (user, item) pairs, sorted
    users, items = np.divmod(keys, num_items)
    indptr = np.searchsorted(users, np.arange(num_users + 1)).astype(np.int64)
    for model in ("simplex", "mf-ccl"):
        params = CFParams.init(CFConfig(model=model, negatives=4), num_users, num_items, indptr, items)
        for tile in (0, 8):
            for kernel in KERNELS:
                HeatEngine(params, users, items, HeatOptions(threads=1, tile=tile, kernel=kernel)).epoch(0)
        user_vectors(params)
        for kernel in KERNELS:
            loss_gradients(params, users[:4], items[:4], items[4:12].reshape(4, 2), kernel)
    return time.perf_counter() - t0


def _check_params(p: CFParams) -> None:
    for name in ("U", "I", "W"):
        a = getattr(p, name)
        if a.dtype != np.float32 or a.ndim != 2 or not a.flags.c_contiguous:
            raise TypeError(f"{name} must be a C-contiguous 2-D float32 array")
    d = p.U.shape[1]
    if p.I.shape[1] != d or p.W.shape != (d, d) or p.U.shape[1] != p.config.dim:
        raise ValueError("U, I and W disagree on the embedding dimension")
    if p.hist.dtype != np.int64 or p.hist_len.dtype != np.int64 or len(p.hist) != len(p.U):
        raise TypeError("hist and hist_len must be int64 with one row per user")
