"""The embedding bag's backward fused with the row optimizer, one Triton kernel: no `coalesce`,
no `[lookups, dim]` gradient, the batch's rows updated where their terms are summed.

Which rows each program touches, and in which order: the caller sorts the lookups' keys
(torch's `sort`, outside the kernel, so that equal keys sit in the order the torch path sums
them) and launches one program per sorted lookup. A program whose key equals the previous
one's returns at once; the one that leads its run of equal keys reads that run's lookups one
after another in sorted order, makes each lookup's term as `lookup_terms` makes it (its bag's
output gradient, times 1 / the bag's size for "mean", times the lookup's weight, each product
rounded to float32), and

- SGD: applies each term to the row as it comes (`w + (-lr) * t`), as torch adds an
  uncoalesced sparse gradient term by term;
- Adagrad, row-wise Adagrad, Adam: sums the terms from -0.0 (as `summed_in_torch_order`: a
  running sum), then applies the optimizer once, with `optimizers.py`'s arithmetic op for op.

It reads and writes only its own row of the weight and state tables (a row has one leader),
so programs never race. The weight row is read in its row type, updated in float32 and
written back rounded to nearest even; state is float32.

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
"""
from __future__ import annotations

import math

import torch
from torch.library import triton_op, wrap_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the module still imports (the suite collects its doctests); `resolve_kernels` keeps
    triton = tl = None  # a cache from choosing these kernels where Triton is missing
_jit = triton.jit if triton is not None else (lambda fn: fn)

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
def _fused_row_update_kernel(weight_ptr, state_a_ptr, state_b_ptr, keys_ptr, order_ptr, rows_ptr, bags_ptr,
                             grad_ptr, scale_ptr, lookup_weights_ptr, n, dim, alpha, eps, beta1c, beta2c,
                             OPT: tl.constexpr, ROW: tl.constexpr, MEAN: tl.constexpr, WEIGHTED: tl.constexpr,
                             ALPHA_FMA: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    key = tl.load(keys_ptr + i)
    previous = tl.load(keys_ptr + tl.maximum(i - 1, 0))
    if (i == 0) | (previous != key):  # this program leads its run of equal keys
        offs = tl.arange(0, BLOCK_D)
        in_row = offs < dim
        row = tl.load(rows_ptr + tl.load(order_ptr + i))
        at = row * dim + offs
        w = _load_row(weight_ptr, at, in_row, ROW)
        g = tl.full([BLOCK_D], -0.0, tl.float32)
        j = i
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
        if OPT == 1:  # Adagrad: sum += g^2; w += -clr * g / (sqrt(sum) + eps)
            s = tl.load(state_a_ptr + at, mask=in_row, other=0.0) + g * g
            tl.store(state_a_ptr + at, s, mask=in_row)
            w = _alpha_add(w, tl.div_rn(g, tl.sqrt_rn(s) + eps), alpha, ALPHA_FMA)
        elif OPT == 2:  # row-wise Adagrad: sum += mean(g^2); w += (g / (sqrt(sum) + eps)) * -lr
            s = tl.load(state_a_ptr + row) + tl.div_rn(tl.sum(tl.where(in_row, g * g, 0.0), axis=0),
                                                        dim.to(tl.float32))
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
        _store_row(weight_ptr, at, w, in_row, ROW)


@triton_op("embcache::fused_row_update", mutates_args={"weight", "state_a", "state_b"})
def fused_row_update(weight: torch.Tensor, state_a: torch.Tensor, state_b: torch.Tensor, sorted_keys: torch.Tensor,
                     order: torch.Tensor, rows: torch.Tensor, bags: torch.Tensor, grad_out: torch.Tensor,
                     bag_scale: torch.Tensor | None, lookup_weights: torch.Tensor | None, optimizer: str,
                     alpha: float, eps: float, beta1c: float, beta2c: float) -> None:
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
    """
    n, dim = sorted_keys.numel(), weight.shape[1]
    if n == 0:
        return
    cuda = weight.device.type == "cuda"
    options = {"enable_fp_fusion": False} if cuda else {}
    table = weight.view(torch.int16) if weight.dtype == torch.bfloat16 else weight
    grad_out = grad_out.contiguous()  # autograd hands an expanded one for `out.sum()`
    wrap_triton(_fused_row_update_kernel)[(n,)](
        table, state_a, state_b, sorted_keys.contiguous(), order.contiguous(), rows.contiguous(),
        bags.contiguous(), grad_out, bag_scale.contiguous() if bag_scale is not None else grad_out,
        lookup_weights.contiguous() if lookup_weights is not None else grad_out,
        n, dim, alpha, eps, beta1c, beta2c, OPT=OPTIMIZER_CODES[optimizer], ROW=ROW_CODES[weight.dtype],
        MEAN=bag_scale is not None, WEIGHTED=lookup_weights is not None, ALPHA_FMA=not cuda,
        BLOCK_D=triton.next_power_of_2(dim), **options)


@fused_row_update.register_fake
def _(weight, state_a, state_b, sorted_keys, order, rows, bags, grad_out, bag_scale, lookup_weights, optimizer,
      alpha, eps, beta1c, beta2c) -> None:
    return None  # writes its inputs in place: shapes and types as they were


def optimizer_factors(optimizer, step: int) -> dict:
    """`fused_row_update`'s scalars for a row optimizer (`cache.optimizers`'s, read by its
    attributes) at `step`, computed in Python as that optimizer computes them."""
    name = optimizer.name
    if name == "adagrad":
        alpha = -(optimizer.lr / (1 + (step - 1) * optimizer.lr_decay))
    elif name == "adam":
        correction1, correction2 = 1 - optimizer.beta1**step, 1 - optimizer.beta2**step
        alpha = -(optimizer.lr * math.sqrt(correction2) / correction1)
    else:
        alpha = -optimizer.lr
    return {"optimizer": name, "alpha": alpha, "eps": getattr(optimizer, "eps", 0.0),
            "beta1c": 1 - getattr(optimizer, "beta1", 0.0), "beta2c": 1 - getattr(optimizer, "beta2", 0.0)}
