"""The embedding bag's backward fused with the row optimizer, in Triton: no `coalesce`, no
`[lookups, dim]` gradient, the batch's rows updated where their terms are summed.

Which rows each program touches, and in which order: the caller sorts the lookups' keys
(torch's `sort`, outside the kernel, so that equal keys sit in the order the torch path sums
them). Each lookup's term is made as `lookup_terms` makes it (its bag's output gradient,
times 1 / the bag's size for "mean", times the lookup's weight, each product rounded to
float32). The sorted lookups are cut into chunks of `chunk` (64) and two launches follow:

- Phase 1, one program per chunk. A run of equal keys of at most `chunk` lookups is the
  program's where it starts: it reads the run whole, in sorted order (past its chunk's end
  if the run goes on), and steps the row once. SGD applies each term to the row as it comes
  (`w + (-lr) * t`, as torch adds an uncoalesced sparse gradient term by term); Adagrad,
  row-wise Adagrad and Adam sum the terms from -0.0 (a running sum, as
  `summed_in_torch_order`), then apply the optimizer once, with `optimizers.py`'s
  arithmetic op for op. A longer run is cut at the chunks' edges: each program sums the
  piece it holds (from -0.0, in order) into a small workspace (`[chunks, 2, D]`: the piece
  at its head, of a run begun before it, and the one at its tail, of a run that starts in
  it) and flags it.
- Phase 2, one program per chunk: where a long run starts, its program adds the run's
  pieces in chunk order and steps the row once (SGD too: the summed gradient at once).

No program walks more than about 2 x `chunk` lookups in phase 1 or `lookups / chunk`
pieces in phase 2, so a row that a batch looks up twenty thousand times (Criteo's
smallest tables have 3 to 10 rows) no longer holds the whole grid behind one serial loop.
Every row is written by one program (a short run's first chunk, or a long run's in phase 2),
so programs never race, and the order is fixed: the same bits run after run. A weight row
is read in its row type, updated in float32 and written back rounded to nearest even;
state is float32. 64: a run of up to 64 lookups keeps the torch path's order and bits (the
tests' batches, and most rows of a real one), and 64 loads of a row of the gradient keep a
program's loop short beside its launch.

Where it equals the torch path, and why not elsewhere:
- torch's CPU `add(..., alpha)` and `index_add_(..., alpha)` (SGD's and Adagrad's weight
  update) are fused multiply-adds (ATen's vectorised `fmadd`), while CUDA's `index_add_`
  rounds `alpha * t` before its atomic add. `alpha_fma` (the CPU's choice) makes the kernel
  use `tl.fma` there, exact in Triton's interpreter; on CUDA it is off and the kernel is
  compiled with `enable_fp_fusion=False`, so no multiply-add is contracted anywhere.
- Square roots: the kernel's `tl.sqrt_rn` is correctly rounded, as CUDA's `sqrt` is; torch's
  vectorised CPU `sqrt_` is not (about 0.7 % of float32 results one unit in the last place
  off, measured with torch 2.13 here). On the CPU, Adagrad's and Adam's rows are then within
  one ULP of the torch path's a step (their state, which takes no root, is equal); with
  torch's root made exact, the kernel equals the torch path to the bit.
- Row-wise Adagrad's mean of the squared row: torch reduces the row in an order of its own
  (vector lanes on the CPU, a tree on CUDA) that a kernel cannot name; the kernel's is
  `tl.sum`'s. The mean then differs in its last bits, and so the state and the row
  (tests/test_kernels_fused.py states the tolerance).
- SGD on CUDA: torch's `index_add_` adds a row's terms by atomics, in no fixed order; the
  kernel's order is the sorted one, the same every run.
- Runs longer than `chunk`: their terms are summed piece by piece, then the pieces in order,
  so their sum is the torch path's reordered (SGD's applied at once, not term by term):
  within the bound tests/test_kernels_fused.py states, (m + 2) units in the last place for a
  run of m lookups.
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from ._triton import jit as _jit, tl, triton

OPTIMIZER_CODES = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2, "adam": 3}
ROW_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@_jit
def _term(grad_ptr, bags_ptr, scale_ptr, lookup_weights_ptr, order_ptr, j, dim, offs, in_row,
          MEAN: tl.constexpr, WEIGHTED: tl.constexpr):
    """The term of the `j`-th sorted lookup, as `lookup_terms` makes it."""
    p = tl.load(order_ptr + j)
    bag = tl.load(bags_ptr + p)
    t = tl.load(grad_ptr + bag * dim + offs, mask=in_row, other=0.0)
    if MEAN:
        t = t * tl.load(scale_ptr + bag)
    if WEIGHTED:
        t = t * tl.load(lookup_weights_ptr + p)
    return t


@_jit
def _alpha_add(w, t, alpha, ALPHA_FMA: tl.constexpr):
    """`w.add_(t, alpha=alpha)` as torch computes it on the rows' device (module docstring)."""
    if ALPHA_FMA:
        return tl.fma(t, alpha, w)
    return w + t * alpha


@_jit
def _load_row(weight_ptr, at, in_row, ROW: tl.constexpr):
    """A weight row as float32 (bfloat16 rows come as int16 bits: widening is a shift)."""
    if ROW == 2:
        bits = tl.load(weight_ptr + at, mask=in_row, other=0).to(tl.int32) & 0xFFFF
        return (bits << 16).to(tl.float32, bitcast=True)
    return tl.load(weight_ptr + at, mask=in_row, other=0.0).to(tl.float32)


@_jit
def _store_row(weight_ptr, at, w, in_row, ROW: tl.constexpr):
    """`w` written in the row type, rounded to nearest even (as `.to(dtype)`); bfloat16 by
    its bits, which every Triton and its interpreter round alike (NaN as torch writes it)."""
    if ROW == 2:
        u = w.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where(w != w, 0x7FC0, r)
        tl.store(weight_ptr + at, r.to(tl.int16), mask=in_row)
    elif ROW == 1:
        tl.store(weight_ptr + at, w.to(tl.float16), mask=in_row)
    else:
        tl.store(weight_ptr + at, w, mask=in_row)


@_jit
def _stochastic(w, row, ids_ptr, salt, offs, dim, ROW: tl.constexpr, IDS: tl.constexpr):
    """`w` (float32) moved to a value of the row type (so the store that follows is exact):
    up with probability its distance from the lower neighbour, by `RowRounding`'s hash of
    (seed, step, id, column) bit for bit (the row's id from `ids_ptr`, else the row itself)."""
    rid = tl.load(ids_ptr + row) if IDS else row
    # splitmix64 in int64, whose products wrap as uint64's do; right shifts masked to logical
    x = (rid.to(tl.int64) * dim + offs.to(tl.int64)) * 0x9E3779B1 + salt.to(tl.int64)
    x = (x ^ ((x >> 30) & 0x3FFFFFFFF)) * -4658895280553007687  # 0xBF58476D1CE4E5B9 as int64
    x = (x ^ ((x >> 27) & 0x1FFFFFFFFF)) * -7723592293110705685  # 0x94D049BB133111EB as int64
    noise = ((x ^ ((x >> 31) & 0x1FFFFFFFF)) >> 32) & 0xFFFFFFFF
    bits = w.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    if ROW == 1:  # float16: below its normal range its grid is coarser
        drop = tl.minimum(13 + tl.maximum(113 - exponent, 0), 23)
    else:
        drop = tl.full(exponent.shape, 16, tl.int64)
    rounded = ((bits + (noise & ((1 << drop) - 1))) >> drop) << drop
    rounded = tl.where(exponent == 0xFF, bits, rounded)  # inf and NaN as they are
    return rounded.to(tl.int32).to(tl.float32, bitcast=True)


@_jit
def _apply(weight_ptr, state_a_ptr, state_b_ptr, row, at, w, g, in_row, dim, alpha, eps, beta1c, beta2c, ids_ptr, salt,
           offs, OPT: tl.constexpr, ROW: tl.constexpr, ALPHA_FMA: tl.constexpr, STOCHASTIC: tl.constexpr,
           IDS: tl.constexpr):
    """One optimizer step of row `row` (`w`: its float32 values, `g`: its summed gradient;
    SGD's short runs have applied their terms to `w` already and pass `g` unused), written
    back in the row type."""
    if OPT == 1:  # Adagrad: sum += g^2; w += -clr * g / (sqrt(sum) + eps)
        s = tl.load(state_a_ptr + at, mask=in_row, other=0.0) + g * g
        tl.store(state_a_ptr + at, s, mask=in_row)
        w = _alpha_add(w, tl.div_rn(g, tl.sqrt_rn(s) + eps), alpha, ALPHA_FMA)
    elif OPT == 2:  # row-wise Adagrad: sum += mean(g^2); w += (g / (sqrt(sum) + eps)) * -lr
        s = tl.load(state_a_ptr + row) + tl.div_rn(tl.sum(tl.where(in_row, g * g, 0.0), axis=0), dim.to(tl.float32))
        tl.store(state_a_ptr + row, s)
        w = w + tl.div_rn(g, tl.sqrt_rn(s) + eps) * alpha
    elif OPT == 3:  # Adam (SparseAdam's order of operations)
        m = tl.load(state_a_ptr + at, mask=in_row, other=0.0)
        v = tl.load(state_b_ptr + at, mask=in_row, other=0.0)
        m_update = (g - m) * beta1c
        v_update = (g * g - v) * beta2c
        tl.store(state_a_ptr + at, m + m_update, mask=in_row)
        tl.store(state_b_ptr + at, v + v_update, mask=in_row)
        w = w + tl.div_rn(m_update + m, tl.sqrt_rn(v_update + v) + eps) * alpha
    if STOCHASTIC:
        w = _stochastic(w, row, ids_ptr, salt, offs, dim, ROW, IDS)
    _store_row(weight_ptr, at, w, in_row, ROW)


@_jit
def _is_long(keys_ptr, start, n, CHUNK: tl.constexpr):
    """Whether the run of equal keys that starts at `start` has more than CHUNK lookups
    (the keys are sorted: it does iff the key CHUNK places on is still its own)."""
    far = tl.load(keys_ptr + tl.minimum(start + CHUNK, n - 1))
    return (start + CHUNK < n) & (far == tl.load(keys_ptr + start))


@_jit
def _chunk_kernel(weight_ptr, state_a_ptr, state_b_ptr, keys_ptr, order_ptr, rows_ptr, bags_ptr, grad_ptr, scale_ptr,
                  lookup_weights_ptr, partial_ptr, flags_ptr, ids_ptr, salt_ptr, n, dim, alpha_ptr, eps, beta1c, beta2c,
                  OPT: tl.constexpr, ROW: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr,
                  ALPHA_FMA: tl.constexpr, STOCHASTIC: tl.constexpr, IDS: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """Phase 1: the program of chunk k (sorted lookups [k*CHUNK, (k+1)*CHUNK)) finishes every
    short run that starts in it and writes the pieces of long runs it holds (module docstring)."""
    k = tl.program_id(0)
    salt = tl.load(salt_ptr)  # the stochastic rounding's salt, from the device (a replay's own step)
    alpha = tl.load(alpha_ptr)  # as the salt: Adam's step size follows the step
    s = k * CHUNK
    e = tl.minimum(s + CHUNK, n)
    offs = tl.arange(0, BLOCK_D)
    in_row = offs < dim
    tl.store(flags_ptr + 2 * k, 0)
    tl.store(flags_ptr + 2 * k + 1, 0)
    j = s
    key_s = tl.load(keys_ptr + s)
    if s > 0:
        if tl.load(keys_ptr + s - 1) == key_s:  # the chunk opens inside a run begun before it
            back = s - CHUNK + tl.arange(0, CHUNK)
            count = tl.sum((tl.load(keys_ptr + back, mask=back >= 0, other=-1) == key_s).to(tl.int32), axis=0)
            head_long = (count >= CHUNK) | _is_long(keys_ptr, s - count, n, CHUNK)
            g = tl.full([BLOCK_D], -0.0, tl.float32)
            following = key_s
            while (following == key_s) & (j < e):
                if head_long:
                    g = g + _term(grad_ptr, bags_ptr, scale_ptr, lookup_weights_ptr, order_ptr, j, dim, offs, in_row,
                                  MEAN, WEIGHTED)
                j += 1
                following = tl.load(keys_ptr + j, mask=j < n, other=-1)
            if head_long:  # a long run's piece: phase 2 adds it; a short run is its first chunk's
                tl.store(partial_ptr + (2 * k) * dim + offs, g, mask=in_row)
                tl.store(flags_ptr + 2 * k, 1)
    while j < e:  # the runs that start in this chunk
        key = tl.load(keys_ptr + j)
        row = tl.load(rows_ptr + tl.load(order_ptr + j))
        at = row * dim + offs
        g = tl.full([BLOCK_D], -0.0, tl.float32)
        if _is_long(keys_ptr, j, n, CHUNK):  # it runs past this chunk: its piece here, for phase 2
            while j < e:
                g = g + _term(grad_ptr, bags_ptr, scale_ptr, lookup_weights_ptr, order_ptr, j, dim, offs, in_row,
                              MEAN, WEIGHTED)
                j += 1
            tl.store(partial_ptr + (2 * k + 1) * dim + offs, g, mask=in_row)
            tl.store(flags_ptr + 2 * k + 1, 1)
        else:  # a short run, read whole (past the chunk's end if it goes on) in sorted order
            w = _load_row(weight_ptr, at, in_row, ROW)
            following = key
            while following == key:
                t = _term(grad_ptr, bags_ptr, scale_ptr, lookup_weights_ptr, order_ptr, j, dim, offs, in_row,
                          MEAN, WEIGHTED)
                if OPT == 0:
                    w = _alpha_add(w, t, alpha, ALPHA_FMA)
                else:
                    g = g + t
                j += 1
                following = tl.load(keys_ptr + j, mask=j < n, other=-1)
            _apply(weight_ptr, state_a_ptr, state_b_ptr, row, at, w, g, in_row, dim, alpha, eps, beta1c, beta2c,
                   ids_ptr, salt, offs, OPT, ROW, ALPHA_FMA, STOCHASTIC, IDS)


@_jit
def _continues(flags_ptr, keys_ptr, kk, chunks, key, CHUNK: tl.constexpr):
    """Whether chunk `kk` holds a piece at its head of the long run of `key`."""
    return (tl.load(flags_ptr + 2 * kk, mask=kk < chunks, other=0) == 1) & \
        (tl.load(keys_ptr + kk * CHUNK, mask=kk < chunks, other=-1) == key)


@_jit
def _long_run_kernel(weight_ptr, state_a_ptr, state_b_ptr, keys_ptr, order_ptr, rows_ptr, partial_ptr, flags_ptr,
                     ids_ptr, salt_ptr, n, chunks, dim, alpha_ptr, eps, beta1c, beta2c, OPT: tl.constexpr,
                     ROW: tl.constexpr,
                     ALPHA_FMA: tl.constexpr, STOCHASTIC: tl.constexpr, IDS: tl.constexpr, CHUNK: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """Phase 2: the program of a chunk where a long run starts adds that run's pieces in
    chunk order and steps its row once."""
    k = tl.program_id(0)
    salt = tl.load(salt_ptr)
    alpha = tl.load(alpha_ptr)
    if tl.load(flags_ptr + 2 * k + 1) == 1:
        offs = tl.arange(0, BLOCK_D)
        in_row = offs < dim
        last = tl.minimum(k * CHUNK + CHUNK, n) - 1  # the chunk's last lookup is the long run's
        key = tl.load(keys_ptr + last)
        row = tl.load(rows_ptr + tl.load(order_ptr + last))
        at = row * dim + offs
        g = tl.load(partial_ptr + (2 * k + 1) * dim + offs, mask=in_row, other=0.0)
        kk = k + 1
        while _continues(flags_ptr, keys_ptr, kk, chunks, key, CHUNK):
            g = g + tl.load(partial_ptr + (2 * kk) * dim + offs, mask=in_row, other=0.0)
            kk += 1
        w = _load_row(weight_ptr, at, in_row, ROW)
        if OPT == 0:  # SGD's long run: its summed gradient applied once
            w = _alpha_add(w, g, alpha, ALPHA_FMA)
        _apply(weight_ptr, state_a_ptr, state_b_ptr, row, at, w, g, in_row, dim, alpha, eps, beta1c, beta2c,
               ids_ptr, salt, offs, OPT, ROW, ALPHA_FMA, STOCHASTIC, IDS)


CHUNK = 64  # lookups a phase-1 program walks (module docstring)


@triton_op("embcache::fused_row_update", mutates_args={"weight", "state_a", "state_b"})
def fused_row_update(weight: torch.Tensor, state_a: torch.Tensor, state_b: torch.Tensor, sorted_keys: torch.Tensor,
                     order: torch.Tensor, rows: torch.Tensor, bags: torch.Tensor, grad_out: torch.Tensor,
                     bag_scale: torch.Tensor | None, lookup_weights: torch.Tensor | None, optimizer: str,
                     alpha: float, eps: float, beta1c: float, beta2c: float, chunk: int = CHUNK,
                     stochastic_salt: int | None = None, row_ids: torch.Tensor | None = None,
                     salt_tensor: torch.Tensor | None = None, alpha_tensor: torch.Tensor | None = None) -> None:
    """One optimizer step of the rows `rows` from their lookups' terms (module docstring).

    Args:
        weight: `[R, D]` rows (float32, float16 or bfloat16), updated in place.
        state_a, state_b: the optimizer's float32 state beside the rows (Adagrad's `sum`
            `[R, D]`, row-wise Adagrad's `[R, 1]`, Adam's `exp_avg` and `exp_avg_sq`);
            empty where the optimizer keeps less.
        sorted_keys, order: `keys.sort()` of one key per lookup (equal for lookups of one
            row, any int64 >= 0): the order a row's terms are summed in.
        rows: each lookup's row of `weight`; bags: each lookup's row of `grad_out` `[B, D]`.
        bag_scale: 1 / each bag's size (float32, "mean"), or None; lookup_weights: each
            lookup's per-sample weight, or None.
        alpha: the weight update's factor (SGD, Adagrad: -lr; row-wise Adagrad: -lr; Adam:
            -step_size); eps; beta1c, beta2c: Adam's 1 - beta1 and 1 - beta2.
        chunk: lookups a program walks, a power of two: runs of up to `chunk` lookups keep
            the torch path's order (module docstring).
        stochastic_salt: half-precision rows written by stochastic rounding with this salt
            (`RowRounding.salt(step)`), as `RowRounding` writes them; None: to nearest even.
        row_ids: the id of each row of `weight`, for that rounding's hash (None: the row).
        salt_tensor: the salt as a 0-d int64 tensor on the device instead
            (`RowRounding.salt_of(step)` of the device's step count): what a captured step
            passes, so that each replay rounds with its own step's salt.
        alpha_tensor: `alpha` as a 0-d tensor on the device instead (Adam's step size of the
            device's step count, `cache.optimizers.Adam.step_size_of`), for the same reason;
            rounded to float32 as `alpha` is.
    """
    n, dim = sorted_keys.numel(), weight.shape[1]
    if n == 0:
        return
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    cuda = weight.device.type == "cuda"
    chunks = (n + chunk - 1) // chunk
    partial = torch.empty(chunks * 2, dim, dtype=torch.float32, device=weight.device)
    flags = torch.empty(chunks * 2, dtype=torch.int32, device=weight.device)
    table = weight.view(torch.int16) if weight.dtype == torch.bfloat16 else weight
    keys, order, rows = sorted_keys.contiguous(), order.contiguous(), rows.contiguous()
    grad_out = grad_out.contiguous()  # autograd hands an expanded one for `out.sum()`
    stochastic = (stochastic_salt is not None or salt_tensor is not None) and weight.dtype != torch.float32
    ids = row_ids.contiguous() if row_ids is not None else keys  # (unread without `row_ids`)
    fixed = {"OPT": OPTIMIZER_CODES[optimizer], "ROW": ROW_CODES[weight.dtype], "ALPHA_FMA": not cuda,
             "STOCHASTIC": stochastic, "IDS": row_ids is not None, "CHUNK": chunk,
             "BLOCK_D": triton.next_power_of_2(dim), **({"enable_fp_fusion": False} if cuda else {})}
    salt = salt_tensor.reshape(1) if salt_tensor is not None else \
        torch.full((1,), int(stochastic_salt or 0), dtype=torch.int64, device=weight.device)
    alpha_at = alpha_tensor.reshape(1).to(torch.float32) if alpha_tensor is not None else \
        torch.full((1,), alpha, dtype=torch.float32, device=weight.device)
    wrap_triton(_chunk_kernel)[(chunks,)](
        table, state_a, state_b, keys, order, rows, bags.contiguous(), grad_out,
        bag_scale.contiguous() if bag_scale is not None else grad_out,
        lookup_weights.contiguous() if lookup_weights is not None else grad_out, partial, flags, ids, salt,
        n, dim, alpha_at, eps, beta1c, beta2c, MEAN=bag_scale is not None, WEIGHTED=lookup_weights is not None, **fixed)
    wrap_triton(_long_run_kernel)[(chunks,)](table, state_a, state_b, keys, order, rows, partial, flags, ids, salt, n,
                                             chunks, dim, alpha_at, eps, beta1c, beta2c, **fixed)


@fused_row_update.register_fake
def _(weight, state_a, state_b, sorted_keys, order, rows, bags, grad_out, bag_scale, lookup_weights, optimizer,
      alpha, eps, beta1c, beta2c, chunk=CHUNK, stochastic_salt=None, row_ids=None, salt_tensor=None,
      alpha_tensor=None) -> None:
    return None  # writes its inputs in place: shapes and types as they were


def state_tensors(state: dict, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_row_update`'s `state_a`, `state_b` from a row optimizer's state dict (its
    `init_state` names): Adagrad's `sum` or Adam's `exp_avg`, then Adam's `exp_avg_sq`; an
    empty float32 tensor on `like`'s device where the optimizer keeps less (SGD)."""
    empty = like.new_empty(0, dtype=torch.float32)
    return state.get("sum", state.get("exp_avg", empty)), state.get("exp_avg_sq", empty)


def optimizer_factors(optimizer, step: int | torch.Tensor) -> dict:
    """`fused_row_update`'s scalars for a row optimizer (`cache.optimizers`'s, read by its
    attributes) at `step`, computed in Python as that optimizer computes them. Adam's at a
    step count on the device (a 0-d tensor, a captured step's): its step size as
    `alpha_tensor`, from the optimizer's table (`Adam.step_size_of`)."""
    name, device_alpha = optimizer.name, None
    if name == "adagrad" and torch.is_tensor(step):  # its step count is read only with lr_decay
        if optimizer.lr_decay:
            raise ValueError("Adagrad's lr_decay reads the step count on the host: give it as a number")
        alpha = -optimizer.lr  # -(lr / 1.0): the same bits
    elif name == "adagrad":
        alpha = -(optimizer.lr / (1 + (step - 1) * optimizer.lr_decay))
    elif name == "adam" and torch.is_tensor(step):
        alpha, device_alpha = 0.0, -optimizer.step_size_of(step)  # (`alpha` unread)
    elif name == "adam":
        alpha = -optimizer.step_size(step)
    else:
        alpha = -optimizer.lr
    return {"optimizer": name, "alpha": alpha, "eps": getattr(optimizer, "eps", 0.0),
            "beta1c": 1 - getattr(optimizer, "beta1", 0.0), "beta2c": 1 - getattr(optimizer, "beta2", 0.0),
            **({"alpha_tensor": device_alpha} if device_alpha is not None else {})}
