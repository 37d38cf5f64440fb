"""Row-wise optimizers whose state lives beside each row.

Every optimizer here updates only the rows it is given, and keeps its per-row state in
tables shaped like the weight table (or one column for row-wise Adagrad). Because a
row's state moves with the row between host store and device cache, a cached table
trains exactly as an uncached one: the arithmetic below repeats torch's sparse code
paths op for op (`torch.optim.SGD`, `Adagrad`, `SparseAdam`), so results match to the
bit. The sparse ops are written as row ops: `dense.add_(sparse, alpha)` as
`index_add_(rows, values, alpha)` and `sparse_mask` as `index_select` (the same
arithmetic, checked element for element), which need no sorted index, so the cache can
hand over its rows in any order.
"""
from __future__ import annotations

import math

import torch

from embcache.cache.choices import OPTIMIZERS, TORCH_OPTIMIZERS
from embcache.cache.bookkeeping.fixed_size import first_positions
from embcache.keys import mix64, shift_right

# what each optimizer here equals on an uncached table (row-wise Adagrad has none in torch)
TORCH_EQUIVALENTS = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.SparseAdam}
assert tuple(TORCH_EQUIVALENTS) == TORCH_OPTIMIZERS  # the names the command line offers without torch


class RowOptimizer:
    """Base: `update` applies one step, in place on `weight` and `state` (dict of
    tables), from gradient `values` for table `rows`.

    With `needs_coalesced` (non-linear updates) `rows` are distinct and each value is a
    row's whole gradient, summed as torch's `coalesce` sums it (the cache sees to that:
    RowCache._in_torch_order); otherwise `rows` may repeat, one term per lookup, in the
    order torch applies them."""

    name = ""
    needs_coalesced = True

    def __init__(self, lr: float):
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.lr = float(lr)

    def state_widths(self, dim: int) -> dict[str, int]:
        """Per-row state tables: name -> number of columns."""
        return {}

    def init_state(self, rows: int, dim: int, device="cpu") -> dict[str, torch.Tensor]:
        return {name: torch.full((rows, width), self.initial_state_value(name), dtype=torch.float32,
                                 device=device)
                for name, width in self.state_widths(dim).items()}

    def initial_state_value(self, name: str) -> float:
        return 0.0

    def update(self, weight: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor,
               values: torch.Tensor, step: int) -> None:
        raise NotImplementedError


class SGD(RowOptimizer):
    """Plain SGD, as `torch.optim.SGD(lr=lr)` with a sparse gradient."""

    name = "sgd"
    needs_coalesced = False  # a sum of per-lookup updates: kept in torch's order, bit-exact

    def update(self, weight, state, rows, values, step):
        # torch's dense += uncoalesced sparse gradient: the terms added one by one in their
        # order. On the CPU, torch's own op (2-4x faster there than `index_add_`); elsewhere
        # `index_add_`, which is what that op runs on CUDA, and which runs on `meta` (the
        # sparse op does not). The same bits either way (tests/test_device_bookkeeping.py).
        if weight.device.type == "cpu":
            grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, weight.shape, check_invariants=False)
            weight.add_(grad, alpha=-self.lr)
        else:
            weight.index_add_(0, rows, values, alpha=-self.lr)


class Adagrad(RowOptimizer):
    """As `torch.optim.Adagrad(lr, lr_decay, eps, initial_accumulator_value)` with a sparse
    gradient: one accumulator per element."""

    name = "adagrad"

    def __init__(self, lr: float, eps: float = 1e-10, lr_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0):
        super().__init__(lr)
        self.eps, self.lr_decay = float(eps), float(lr_decay)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def state_widths(self, dim):
        return {"sum": dim}

    def initial_state_value(self, name):
        return self.initial_accumulator_value

    def update(self, weight, state, rows, values, step):
        clr = self.lr / (1 + (step - 1) * self.lr_decay)
        state_sum = state["sum"]
        state_sum.index_add_(0, rows, values.pow(2))
        std_values = state_sum.index_select(0, rows).sqrt_().add_(self.eps)
        weight.index_add_(0, rows, values / std_values, alpha=-clr)


class RowWiseAdagrad(RowOptimizer):
    """Adagrad with one accumulator per row (the mean of the squared gradient over the
    row), as FBGEMM's row-wise Adagrad: D times less state, nearly the same quality."""

    name = "rowwise_adagrad"

    def __init__(self, lr: float, eps: float = 1e-10, initial_accumulator_value: float = 0.0):
        super().__init__(lr)
        self.eps = float(eps)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def state_widths(self, dim):
        return {"sum": 1}

    def initial_state_value(self, name):
        return self.initial_accumulator_value

    def update(self, weight, state, rows, values, step):
        state_sum = state["sum"]
        state_sum.index_add_(0, rows, values.pow(2).mean(dim=1, keepdim=True))
        std = state_sum.index_select(0, rows).sqrt_().add_(self.eps)
        # w + (-lr * (g / std)), each product rounded on its own (no fused multiply-add)
        weight.index_add_(0, rows, (values / std).mul_(-self.lr))


class Adam(RowOptimizer):
    """Lazy Adam, as `torch.optim.SparseAdam(lr, betas, eps)`: only rows with a gradient
    update their moments; bias correction uses the global step count.

    The step count may be a 0-d int64 tensor on the device (a captured step's, which each
    replay advances): the step size then comes from a table of `step_size` computed in
    Python, the same bits (a device's `pow` need not round as the host's does). Past
    `settled_step` both corrections are exactly 1 and the step size is `lr`, so the table
    ends there (for the default betas at step 37,412: 292 KiB)."""

    name = "adam"
    MAX_TABLE = 1 << 20  # steps a table of step sizes may hold (betas nearer 1 settle later)

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(lr)
        beta1, beta2 = betas
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self._tables: dict[torch.device, torch.Tensor] = {}

    def step_size(self, step: int) -> float:
        """SparseAdam's `lr * sqrt(1 - beta2^step) / (1 - beta1^step)`, in its order."""
        bias_correction1 = 1 - self.beta1**step
        bias_correction2 = 1 - self.beta2**step
        return self.lr * math.sqrt(bias_correction2) / bias_correction1

    def settled_step(self) -> int | None:
        """The first step whose bias corrections are both exactly 1.0 (each only grows
        towards 1), or None past `MAX_TABLE`."""
        def settled(k):
            return 1 - self.beta1**k == 1.0 and 1 - self.beta2**k == 1.0

        low, high = 1, self.MAX_TABLE
        if not settled(high):
            return None
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if not settled(mid) else (low, mid)
        return low

    def step_size_of(self, step: torch.Tensor) -> torch.Tensor:
        """`step_size` of a step count on the device (0-d int64 >= 1), as a 0-d float64
        there: one gather from the table (class docstring), no sync."""
        table = self._tables.get(step.device)
        if table is None:
            settled = self.settled_step()
            if settled is None:
                raise ValueError(f"Adam's betas {self.beta1, self.beta2} settle past step {self.MAX_TABLE:,}: "
                                 f"its step size cannot be tabled for a step count on the device")
            sizes = [0.0] + [self.step_size(k) for k in range(1, settled + 1)]
            table = self._tables[step.device] = torch.tensor(sizes, dtype=torch.float64, device=step.device)
        return table.index_select(0, step.clamp(max=table.numel() - 1).reshape(1)).reshape(())

    def state_widths(self, dim):
        return {"exp_avg": dim, "exp_avg_sq": dim}

    def update(self, weight, state, rows, values, step):
        if values.numel() == 0:
            return
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        old_exp_avg = exp_avg.index_select(0, rows)
        exp_avg_update = values.sub(old_exp_avg).mul_(1 - self.beta1)
        exp_avg.index_add_(0, rows, exp_avg_update)
        old_exp_avg_sq = exp_avg_sq.index_select(0, rows)
        exp_avg_sq_update = values.pow(2).sub_(old_exp_avg_sq).mul_(1 - self.beta2)
        exp_avg_sq.index_add_(0, rows, exp_avg_sq_update)
        numer = exp_avg_update.add_(old_exp_avg)
        exp_avg_sq_update.add_(old_exp_avg_sq)
        denom = exp_avg_sq_update.sqrt_().add_(self.eps)
        # a float, or a 0-d float64 tensor: either is rounded to float32 before the product
        step_size = self.step_size_of(step) if torch.is_tensor(step) else self.step_size(step)
        weight.index_add_(0, rows, -step_size * numer.div_(denom))


# ---------------------------------------------------------------------- row precision
ROW_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ROUNDINGS = ("nearest", "stochastic")
# float32 mantissa bits a row type drops (float16: in its normal range; below, more)
_DROPPED_BITS = {torch.float16: 13, torch.bfloat16: 16}


def row_dtype_of(name: str | torch.dtype) -> torch.dtype:
    """The torch type for "float32" | "float16" | "bfloat16" (or such a dtype)."""
    if isinstance(name, torch.dtype) and name in ROW_DTYPES.values():
        return name
    if name not in ROW_DTYPES:
        raise ValueError(f"row_dtype must be one of {tuple(ROW_DTYPES)}, got {name!r}")
    return ROW_DTYPES[name]


class RowRounding:
    """How float32 results are written to rows stored in float16 or bfloat16.

    `nearest` rounds to nearest even (what `.to(dtype)` does). `stochastic` rounds up
    with probability equal to the distance from the lower neighbour, so an update
    smaller than half a unit in the last place still moves the row on average instead
    of being lost. Its randomness is a hash of (seed, step, id, column), not a stream:
    the same row at the same step gets the same bits whatever order rows are written in,
    so a cached table and an uncached one round identically.

    Example:
        >>> x = torch.full((1000, 1), 1 + 1 / 512)  # a quarter of the way to bfloat16's next value
        >>> RowRounding(torch.bfloat16, "nearest")(x, torch.arange(1000), step=1).unique()
        tensor([1.], dtype=torch.bfloat16)
        >>> up = RowRounding(torch.bfloat16, "stochastic")(x, torch.arange(1000), step=1) > 1
        >>> 0.2 < up.float().mean().item() < 0.3
        True
    """

    def __init__(self, dtype: torch.dtype = torch.float32, mode: str = "nearest", seed: int = 0):
        if mode not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {mode!r}")
        self.dtype, self.mode, self.seed = row_dtype_of(dtype), mode, int(seed)

    def __call__(self, values: torch.Tensor, ids: torch.Tensor, step: int) -> torch.Tensor:
        """`values` (float32 `[n, D]`, rows of ids `ids`) in the row type."""
        if self.dtype == torch.float32:
            return values
        if self.mode == "nearest":
            return values.to(self.dtype)
        bits = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        exponent = (bits >> 23) & 0xFF
        drop = torch.full_like(exponent, _DROPPED_BITS[self.dtype])
        if self.dtype == torch.float16:  # below float16's normal range its grid is coarser
            drop = (drop + (113 - exponent).clamp(min=0)).clamp(max=23)
        noise = self._noise(ids, step, values.shape[1]) & ((1 << drop) - 1)
        rounded = ((bits + noise) >> drop) << drop
        rounded = torch.where(exponent == 0xFF, bits, rounded)  # inf and NaN as they are
        rounded = torch.where(rounded >= 1 << 31, rounded - (1 << 32), rounded)
        return rounded.to(torch.int32).view(torch.float32).to(self.dtype)

    def _noise(self, ids: torch.Tensor, step, width: int) -> torch.Tensor:
        """32 random bits per element, a splitmix64 hash of (seed, step, id, column); `step`
        a number, or a 0-d int64 tensor on the device (`salt_of`)."""
        cols = torch.arange(width, device=ids.device)
        x = (ids.to(torch.int64).unsqueeze(1) * width + cols) * 0x9E3779B1
        return shift_right(mix64(x + (self.salt_of(step) if torch.is_tensor(step) else self.salt(step))), 32)

    def salt(self, step: int) -> int:
        """The hash's share of (seed, step), as an int64 (the fused kernel takes it too)."""
        return _wrapped(int(step) * 0x632BE59B + self.seed * 0x85157AF5)

    def salt_of(self, step: torch.Tensor) -> torch.Tensor:
        """`salt` of a step count held on the device (0-d int64), as a 0-d int64 tensor: the
        same bits, computed there, so that a replayed step rounds with its own step's salt."""
        return step * 0x632BE59B + _wrapped(self.seed * 0x85157AF5)  # int64 products and sums wrap


def _wrapped(value: int) -> int:
    """`value` as int64 arithmetic wraps it."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def update_rows(optimizer: RowOptimizer, weight: torch.Tensor, state: dict[str, torch.Tensor],
                rows: torch.Tensor, values: torch.Tensor, step: int | torch.Tensor, row_ids: torch.Tensor | None,
                rounding: RowRounding, distinct: bool = False, fixed_size: bool | None = None,
                rounding_step: torch.Tensor | None = None) -> None:
    """`optimizer.update` for a table of any row type. float32 rows update in place; rows
    of a lower precision are copied to float32 (with their state), updated by the very
    same float32 arithmetic, and written back through `rounding` (`row_ids[r]`: the id of
    row r, for stochastic rounding; unread for float32 rows). The state stays float32 and is never rounded.
    `distinct`: the caller's rows are distinct (the device bookkeeper's coalesced ones,
    whose only repeats are its trash row). Otherwise rows may repeat (SGD's terms, one a
    lookup) and are deduplicated: by `unique` on the CPU, where no device is waited for
    and it is cheapest; `fixed_size` (the default off the CPU, and the device bookkeeper's
    everywhere) without it, since its size is one the device would report (a sync on CUDA):
    each entry gets a copy of its row, a row's terms all go to its first copy
    (`first_positions`), and every copy takes that one's result, so that a row written
    several times is written the same bits each time (copies the size of the terms).
    `rounding_step`: the step count as the device holds it, for the rounding's hash (a
    captured step's), else `step`. `step` may itself be the device's count (Adam's, read by
    `Adam.update`)."""
    if weight.dtype == torch.float32:
        optimizer.update(weight, state, rows, values, step)
        return
    if rows.numel() == 0:
        return
    spread = not distinct and (rows.device.type != "cpu" if fixed_size is None else fixed_size)
    if distinct or spread:
        touched = rows
        local = first_positions(rows) if spread else torch.arange(rows.numel(), device=rows.device)
    else:
        touched, local = torch.unique(rows, return_inverse=True)
    work = weight.index_select(0, touched).float()
    work_state = {k: v.index_select(0, touched) for k, v in state.items()}
    optimizer.update(work, work_state, local, values, step)
    if spread:
        work = work.index_select(0, local)
        work_state = {k: v.index_select(0, local) for k, v in work_state.items()}
    weight.index_copy_(0, touched, rounding(work, row_ids.index_select(0, touched),
                                            step if rounding_step is None else rounding_step))
    for k, v in state.items():
        v.index_copy_(0, touched, work_state[k])


def make_optimizer(name: str, lr: float, **kwargs) -> RowOptimizer:
    """Build a row-wise optimizer by name; keyword arguments follow torch's names."""
    classes = {"sgd": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad, "adam": Adam}
    if name not in classes:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    try:
        return classes[name](lr, **kwargs)
    except TypeError as err:
        raise ValueError(f"bad argument for optimizer {name!r}: {err}") from None


def torch_equivalent(name: str, params, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer that trains an uncached sparse table as optimizer `name`
    trains a cached one: the baseline of benchmarks and the reference of tests."""
    if name not in TORCH_EQUIVALENTS:
        raise ValueError(f"optimizer {name!r} has no torch equivalent; choose from "
                         f"{sorted(TORCH_EQUIVALENTS)}")
    if not torch.sparse.check_sparse_tensor_invariants.is_enabled():
        # torch's sparse Adagrad builds sparse tensors from the coalesced gradient (valid
        # indices by construction) without saying whether to check them, and torch 2.13 warns
        # "Sparse invariant checks are implicitly disabled" at the first step. Disabled is
        # torch's default: saying so explicitly silences the warning and changes nothing
        # (checks a caller enabled stay enabled).
        torch.sparse.check_sparse_tensor_invariants.disable()
    return TORCH_EQUIVALENTS[name](params, lr=lr)
