"""`CachedEmbeddingBag`: `nn.EmbeddingBag` semantics over a table that lives in host
memory, with the hot rows cached on the device.

The optimizer step for the looked-up rows happens during `loss.backward()`: when the
gradient of a forward call reaches the cache, the row-wise optimizer updates those rows
(and their state) in place. There is no separate `step()` to call, and the module has no
`nn.Parameter` for an outer optimizer to see. Call each bag once per training step
(one forward, one backward), as a fused embedding kernel expects: two forwards whose
gradients meet in one backward are refused (`torch_idioms.OneUpdateABackward`). A training forward
holds its rows (they cannot be evicted) until its backward; if the output is dropped
without one (validation with gradients on, an exception), the holds go with the autograd
graph.
"""
from __future__ import annotations

import math
import numbers
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from embcache.cache.bookkeeping.eviction import POLICIES
from embcache.cache.stores.host_store import RowInit, parse_host_store
from embcache.cache.optimizers import OPTIMIZERS, RowRounding, make_optimizer, row_dtype_of
from embcache.cache.bookkeeping.row_cache import Lookup, RowCache
from embcache.cache.stats import CacheStats
from embcache.device import resolve_device
from embcache.errors import check_whole

from .bag_input import check_bag_input, to_device
from .input_errors import InputErrors
from .key_stage import KEY_SETTINGS, KeyStage
from .rows_only import bag_rows_only
from .torch_idioms import OneUpdateABackward, refuse_torch_only_args

MODES = ("sum", "mean")


class CachedEmbeddingBag(nn.Module):
    """An embedding bag whose full table (and optimizer state) stays in host memory while
    a frequency-aware cache of `ceil(cache_ratio * num_embeddings)` rows serves lookups
    on the device. Training results equal an uncached `nn.EmbeddingBag(sparse=True)`
    trained with the matching torch optimizer.

    Args:
        num_embeddings, embedding_dim: table shape.
        mode: "sum" | "mean", as `nn.EmbeddingBag`.
        cache_ratio: fraction of rows resident on the device, in (0, 1].
        ids_freq: per-id counts over the training data: warm-up and the `freq` policy.
        warmup_ratio: fraction of the cache filled with the hottest ids at construction.
        eviction: "freq" | "lfu" | "lru".
        optimizer: "sgd" | "adagrad" | "rowwise_adagrad" | "adam" (lazy, as SparseAdam).
        lr: learning rate; further optimizer arguments use torch's names (eps, betas,
            lr_decay, initial_accumulator_value).
        device: None picks CUDA when available, else CPU.
        weight: optional initial `[N, D]` table in id order (default: N(0, 1), as
            `nn.EmbeddingBag`).
        bookkeeping: "auto" (default: "device" when the rows are on CUDA and the host store
            in memory, else "host"), "host" or "device": where the cache decides which
            row sits where (`RowCache`). The device bookkeeper never makes the host wait;
            both decide alike, so results are the same either way. Open tables keep the
            host's.
        kernels: "auto" (default: Triton on CUDA where it imports, with the device
            bookkeeper), "torch" or "triton": the device bookkeeper's lookup and fused
            backward + optimizer (`embcache.kernels`); the host bookkeeper keeps torch's.
        admission: `freq` / `lfu` admit a missed row only if it is hotter than the row it
            would evict; colder ones are served beside the cache for the step and counted
            as `bypassed_rows` (results are the same either way; only the hit rate,
            traffic and speed change). Off by default: on the cache benchmark it gains
            0.0-0.3 point, on the default DLRM run 0.5 point at 6 % fewer samples/s (the
            side table costs more on the CPU than the misses it saves); where a batch
            needs more rows than the cache holds it gains up to 14 points (docs/cache.md).
        half_life: `freq` / `lfu` halve their counts every `half_life` lookup passes
            (None: never), to follow a hot set that drifts.
        host_store: "memory" (default) or "mmap:DIR": the full table and its optimizer
            state as files under DIR, memory-mapped, so the page cache is the RAM tier
            and the disk the last one (a table larger than memory; see `HostStore`).
            DIR's files are (re)written with the initial table, made chunk by chunk.
        row_dtype: "float32" (default), "float16" or "bfloat16": how rows are stored in
            the host store and the cache (half the bytes); the optimizer computes in
            float32 and its state stays float32; the pooled output is float32.
        rounding: "stochastic" (default) or "nearest": how a half-precision row is
            rounded when written (`RowRounding`); `rounding_seed` seeds the stochastic one.
            Stochastic rounding keeps, on average, updates smaller than half a unit in
            the last place, which nearest rounding drops (docs/cache.md, "Row precision").
        keys: "ids" (default: inputs are ids in `[0, num_embeddings)`) or "raw": inputs
            are raw 64-bit keys (any int64), each given a row on first sight: an open table,
            a `KeyedEmbeddingBag` (the key stage of `nn.key_stage` in front of this bag),
            which takes these arguments and its own (`max_rows`, `retire`, `ttl`,
            `key_seed`, `init_bound`, `key_freq`; see `KeyStage`).

    Example:
        >>> import torch
        >>> bag = CachedEmbeddingBag(1000, 8, cache_ratio=0.05, device="cpu")
        >>> out = bag(torch.tensor([[1, 2], [3, 999]]))
        >>> out.sum().backward()          # rows 1, 2, 3, 999 are updated here
        >>> tuple(bag.full_weight().shape)
        (1000, 8)
    """

    def __new__(cls, *args, keys: str = "ids", **kwargs):
        """`keys="raw"` makes the keyed bag (an open table in front of a closed one)."""
        if keys not in ("ids", "raw"):
            raise ValueError(f"keys must be 'ids' or 'raw', got {keys!r}")
        if cls is CachedEmbeddingBag and keys == "raw":
            cls = KeyedEmbeddingBag
        elif cls is CachedEmbeddingBag and set(kwargs) & set(KEY_SETTINGS):
            raise ValueError(f"{', '.join(k for k in KEY_SETTINGS if k in kwargs)}: open-table settings, which "
                             f"need keys='raw'")
        return super().__new__(cls)

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "sum",
                 cache_ratio: float = 0.015, ids_freq: torch.Tensor | None = None,
                 warmup_ratio: float = 0.7, eviction: str = "freq", optimizer: str = "sgd",
                 lr: float = 0.01, device: torch.device | str | None = None,
                 weight: torch.Tensor | RowInit | None = None, admission: bool = False,
                 half_life: int | None = None, host_store: str = "memory", row_dtype: str = "float32",
                 rounding: str = "stochastic", rounding_seed: int = 0, keys: str = "ids",
                 bookkeeping: str = "auto", kernels: str = "auto", **optimizer_kwargs):
        super().__init__()
        refuse_torch_only_args(optimizer_kwargs)
        _check_config(num_embeddings, embedding_dim, mode, cache_ratio, warmup_ratio,
                      eviction, optimizer, ids_freq, weight)
        parse_host_store(host_store)
        dtype = row_dtype_of(row_dtype)
        self.num_embeddings, self.embedding_dim, self.mode = int(num_embeddings), int(embedding_dim), mode
        self.cache_ratio = float(cache_ratio)
        device = resolve_device(device)
        if weight is None:  # N(0, 1) as nn.EmbeddingBag: the same values whole or chunk by chunk
            weight = RowInit(self.num_embeddings, self.embedding_dim, _draw_normal)
        elif not isinstance(weight, RowInit):
            weight = weight.detach().to("cpu", torch.float32)
            # the store must not alias the caller's table; with CUDA, pinning it copies anyway
            copied_by_pinning = device.type == "cuda" and not weight.is_pinned()
            if dtype == torch.float32 and host_store == "memory" and not copied_by_pinning:
                weight = weight.clone()
        ids_freq = None if ids_freq is None else ids_freq.detach().cpu()
        self.cache = RowCache(weight, math.ceil(cache_ratio * min(num_embeddings, weight.shape[0])),
                              make_optimizer(optimizer, lr, **optimizer_kwargs), eviction,
                              ids_freq, warmup_ratio, device, admission, half_life, host_store=host_store,
                              row_dtype=dtype, rounding=RowRounding(dtype, rounding, rounding_seed),
                              bookkeeping=bookkeeping, kernels=kernels)
        self.input_errors = InputErrors()  # what device batches' checks found, raised when read
        self.rows_require_grad = True  # False: `requires_grad_(False)`, a frozen table
        self.one_update = OneUpdateABackward()  # two forwards met in one backward are refused

    @property
    def device(self) -> torch.device:
        return self.cache.device

    def requires_grad_(self, requires_grad: bool = True) -> "CachedEmbeddingBag":
        """The rows are no `nn.Parameter` (the cache updates them in backward), so torch's
        `requires_grad_` would find nothing to turn off and a "frozen" table would go on
        training. Off, a training forward reads the rows as an evaluation forward does: no
        hold, no update, an output that needs no gradient (unless per-sample weights do).
        A model's own `requires_grad_` reaches parameters only: call it on the bag (or its
        collection)."""
        self.rows_require_grad = bool(requires_grad)
        return super().requires_grad_(requires_grad)

    def updates_rows(self) -> bool:
        """Whether a forward now trains the rows: training mode, gradients on, not frozen."""
        return self.training and torch.is_grad_enabled() and self.rows_require_grad

    def _apply(self, fn, recurse=True):
        """`.to()`, `.cuda()`, `.half()` and the like reach a module through `_apply`, which
        changes parameters and buffers, and the bag has neither: its rows would stay where
        and as they are without a word. A change of device or dtype is refused in one line
        instead (the cache's device and row type are chosen when it is made)."""
        probe = torch.empty(0, device=self.device)
        moved = fn(probe)
        if moved.device != probe.device:
            raise ValueError(f"CachedEmbeddingBag cannot move to {moved.device}: its cache stays on {probe.device}, "
                             f"the device it was made with (make it with device={str(moved.device)!r} instead)")
        if moved.dtype != probe.dtype:
            raise ValueError(f"CachedEmbeddingBag cannot become {moved.dtype}: its pooled output is float32 "
                             f"(half-precision rows: make it with row_dtype='float16' or 'bfloat16')")
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        c = self.cache
        extra = "" if c.host.weight.dtype == torch.float32 else f", row_dtype={c.host.weight.dtype}"
        extra += "" if c.host.directory is None else f", host_store={c.host.backing!r}"
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, "
                f"cache_rows={c.num_slots}, eviction={c.policy.kind!r}, "
                f"optimizer={c.optimizer.name!r}, device={c.device}{extra}")

    # ------------------------------------------------------------------ lookups
    @torch.compiler.disable  # a compile boundary: the cache's host bookkeeping stays eager
    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        ids, offsets, weights = self.normalize_input(input, offsets, per_sample_weights)
        return self.lookup_normalized(ids, offsets, weights)

    def lookup_checked(self, ids: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None,
                       segments: list[list[int]] | None = None, tables: torch.Tensor | None = None,
                       ticket=None, padded: tuple[int, int] | None = None) -> torch.Tensor:
        """Forward on a collection group's input, checked where it is (on the host, as the
        loader gives it), then moved; `tables`: each id's table (a keyed bag's)."""
        return self.lookup_normalized(*to_device(ids, offsets, weights, self.device), segments=segments,
                                      ticket=ticket, padded=padded)

    def lookup_normalized(self, ids: torch.Tensor, offsets: torch.Tensor,
                          weights: torch.Tensor | None,
                          segments: list[list[int]] | None = None, ticket=None,
                          padded: tuple[int, int] | None = None) -> torch.Tensor:
        """Forward on input already checked and moved (by `normalize_input`, or by a
        collection for its whole group), so that nothing is checked twice. `segments`: per
        table of an uncached collection, its features' numbers of lookups, so that each
        table's gradient is summed as torch sums it. `ticket`: what `prefetch_ids` returned
        for this batch (None: the cache finds its prefetch by the ids). `padded`: (samples
        a feature has, of which the last ones only pad) for a padded batch, whose pad
        lookups the update then sets aside (`DeviceUpdates.set_pads_aside`)."""
        train = self.updates_rows()
        lookup = self._prepare(ids, train, segments, ticket)
        if padded is not None and train and hasattr(self.cache, "set_pads_aside"):
            self.cache.set_pads_aside(lookup, offsets, *padded)
        table = self.cache.working_table()
        if lookup.overflow is not None:
            table = torch.cat([table, lookup.overflow.weight])
        fixed_weights = not (weights is not None and weights.requires_grad)
        pool = self._triton_pool() if fixed_weights else None
        if table.dtype != torch.float32 and pool is None:  # half-precision rows: torch's bag pools float32
            table = table.float()
        if train and self.cache.bookkeeping == "device" and fixed_weights:
            # the gradient's terms, one per lookup (what the sparse gradient would hold), go
            # straight to the update: no sparse tensor, nothing sized by the device
            anchor = torch.empty(0, device=table.device, requires_grad=True)
            width, cache, guard = table.shape[0], self.cache, self.one_update

            def apply(grad_out, indices, offsets, weights, mode) -> None:
                guard.enter()
                cache.apply_bag_gradient(grad_out, indices, offsets, weights, mode, width, lookup)

            weakref.finalize(anchor, self.cache.release, lookup).atexit = False
            return _BagWithRowUpdate.apply(anchor, table, lookup.indices, offsets, weights, self.mode, apply, pool)
        if pool is not None and not train:  # nothing to update: the kernel's output alone
            return pool(table, lookup.indices, offsets, weights, self.mode)
        if train:
            # A fresh leaf aliasing the working table (or its float32 copy): its sparse
            # gradient is handed to the row-wise optimizer as soon as backward produces it.
            # The leaf lives as long as the autograd graph: when it goes without a
            # backward, so do the holds.
            table = table.data.requires_grad_()
            table.register_post_accumulate_grad_hook(self._update_hook(lookup))
            weakref.finalize(table, self.cache.release, lookup).atexit = False
        return F.embedding_bag(lookup.indices, table, offsets, mode=self.mode, sparse=True,
                               per_sample_weights=weights)

    def _triton_pool(self):
        """Our pooled-lookup kernel where the cache runs Triton's (the device bookkeeper's
        working table; it reads half-precision rows in place), else None: torch's bag."""
        if getattr(self.cache, "kernels", "torch") != "triton" or self.cache.bookkeeping != "device":
            return None
        from embcache.kernels.pooled import pooled_lookup

        return pooled_lookup

    def _prepare(self, ids: torch.Tensor, keep: bool, segments, ticket) -> Lookup:
        """The cache's lookup of a batch (its prefetch taken by `ticket`, or by its ids)."""
        return self.cache.prepare(ids, keep=keep, segments=segments, ticket=ticket)

    @property
    def read_only(self) -> bool:
        """In an `evaluation` block: lookups admit, evict and count nothing."""
        return self.cache.frozen

    def restored_prefetch(self):
        """The ticket of the prefetch a checkpoint restored for the batch that comes first
        (None: none pending)."""
        return self.cache.oldest_restored()

    def _update_hook(self, lookup: Lookup):
        cache, guard = self.cache, self.one_update

        def hook(leaf: torch.Tensor) -> None:
            guard.enter()
            grad, leaf.grad = leaf.grad, None
            cache.apply_gradient(grad, lookup)

        return hook

    @torch.compiler.disable
    def prefetch(self, next_input: torch.Tensor, offsets: torch.Tensor | None = None):
        """Load the rows a coming batch will need (with CUDA, on a side stream that
        overlaps the current step). Optional: forward loads whatever is missing. Returns
        the batch's ticket (see `prefetch_ids`); a plain forward of the batch finds its
        prefetch without it."""
        ids, _, _ = self.normalize_input(next_input, offsets, None)
        return self.prefetch_ids(ids)

    def normalize_input(self, input, offsets=None, per_sample_weights=None):
        """Check a batch before anything changes, where it is (host input costs no
        device sync), then move it to the cache's device as 1-D ids, offsets and weights.
        Raises ValueError naming the problem."""
        checked = check_bag_input(input, offsets, per_sample_weights, self._id_limit(), self.mode,
                                  errors=self.input_errors)
        return to_device(*checked, self.device)

    def raise_input_errors(self) -> None:
        """Raise the error a batch on the device was found to have (its checks ran there,
        without a sync; see `nn.input_errors`), if any. Reads four numbers from the device:
        call it where the step's result is read (the bag does when its stats, rows or
        checkpoint are read)."""
        self.input_errors.raise_pending()

    def _id_limit(self) -> int | None:
        """Ids must lie below it (None: any int64)."""
        return self.num_embeddings

    # ------------------------------------------------------------------ host side
    def flush(self) -> None:
        """Write every dirty cached row back to the host store."""
        self.raise_input_errors()
        self.cache.flush()

    def full_weight(self) -> torch.Tensor:
        """The whole `[N, D]` table on CPU (in the row type), id order, current to the
        last update: a snapshot (a copy), so training on does not change it. Taking it
        does not change the cache (dirty rows stay dirty; no cache traffic is counted)."""
        return self.host_weight().clone()

    def save_checkpoint(self, directory) -> None:
        """Copy the table, its optimizer state and the cache's state into `directory`
        (see `RowCache.save_checkpoint`): what a table on disk needs, since training on
        rewrites its files."""
        self.raise_input_errors()
        self.cache.save_checkpoint(directory)

    def load_checkpoint(self, directory) -> None:
        """Resume from `save_checkpoint`, everything verified first (sizes, CRC-32)."""
        self.cache.load_checkpoint(directory)

    def host_weight(self) -> torch.Tensor:
        """The live host store, made current (no copy: for views of big tables). It
        changes as training goes on."""
        self.raise_input_errors()
        self.cache.sync_host()
        return self.cache.host.weight

    # --------------------------------------------- the table, for collections and checkpoints
    # what `nn/` and `distributed/` need of the rows, so that none of them reaches the cache
    def table_rows(self, rows: slice | torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows `rows` (a slice: views of the live store; an index tensor: copies) and their
        optimizer state, current: {"weight", "optimizer.<k>"}."""
        self.raise_input_errors()
        self.cache.sync_host()
        host = self.cache.host
        take = (lambda t: t[rows]) if isinstance(rows, slice) else (lambda t: t.index_select(0, rows))
        return {"weight": take(host.weight), **{f"optimizer.{k}": take(v) for k, v in host.state.items()}}

    def optimizer_state_names(self) -> list[str]:
        """The row optimizer's state tables (`optimizer.<name>` in `table_rows`)."""
        return list(self.cache.host.state)

    def restore_rows(self, parts, step: int) -> None:
        """Rows by (first id, weight, state) part, the caches emptied (`RowCache.restore_row_parts`)."""
        self.cache.restore_row_parts(parts, step)

    def restore_rows_at(self, where: torch.Tensor, weight: torch.Tensor, state: dict, step: int) -> None:
        """Rows at host rows `where`, the caches emptied (`RowCache.restore_rows_at`)."""
        self.cache.restore_rows_at(where, weight, state, step)

    def optimizer_steps(self) -> int:
        return self.cache.step

    def cache_rows(self) -> int:
        return self.cache.num_slots

    def pending_prefetches(self) -> int:
        return self.cache.pending_prefetches()

    def prefetch_ids(self, ids: torch.Tensor, tables: torch.Tensor | None = None):
        """`prefetch` of ids already checked and concatenated (a collection's group).
        Returns the ticket that batch's `lookup_normalized` takes: the cache's prefetch."""
        return self.cache.prefetch(ids)

    def write_checkpoint(self, directory) -> None:
        """`save_checkpoint`'s files into an existing empty directory (one of several
        written together)."""
        self.raise_input_errors()
        self.cache.write_checkpoint(directory)

    def check_checkpoint(self, directory):
        """`load_checkpoint`'s checks, nothing changed: returns what `restore_checkpoint` takes."""
        return self.cache.check_checkpoint(directory)

    def restore_checkpoint(self, checked) -> None:
        self.cache.restore_checkpoint(checked)

    def load_stats(self, totals: dict) -> None:
        """Set the statistics to `totals` (counts carried over from another layout)."""
        self.cache.stats.reset()
        for k, v in totals.items():
            if hasattr(self.cache.stats, k) and k != "hit_rate":
                setattr(self.cache.stats, k, int(v))

    def cache_stats(self) -> dict:
        self.raise_input_errors()
        return self.cache.stats.as_dict()

    def reset_cache_stats(self) -> None:
        self.cache.stats.reset()

    @contextmanager
    def separate_stats(self):
        """Count the lookups of a block (say, validation) apart from the bag's own:
        yields the block's `CacheStats`; afterwards `cache_stats()` is as before it."""
        outer, self.cache.stats = self.cache.stats, CacheStats()
        try:
            yield self.cache.stats
        finally:
            self.cache.stats = outer

    @contextmanager
    def evaluation(self):
        """A validation block: its lookups counted apart (yields their `CacheStats`) and
        read-only: rows that are not resident are served beside the cache, nothing is
        admitted or evicted, so the working set and the eviction policy stay training's
        alone (a run that validates where it stops resumes to the residency of one that
        did not stop). The rows read are the same either way."""
        with self.separate_stats() as stats:
            self.cache.frozen = True
            try:
                yield stats
            finally:
                self.cache.frozen = False

    def open_stats(self) -> dict:
        """An open table's keys: live, made, retired, and the key index's bytes ({}: ids)."""
        return {}

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.raise_input_errors()
        for key, value in self.cache.state_dict().items():
            destination[prefix + key] = value if keep_vars else value.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        mine = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)
                and _is_cache_key(k[len(prefix):])}
        if set(mine) == {"weight"}:  # torch's form (`nn.EmbeddingBag.state_dict()`): rows only (`nn.rows_only`)
            return bag_rows_only(self, mine["weight"], prefix + "weight", error_msgs)
        required = set(self.cache.required_keys())
        missing = required - set(mine) | self._missing_state(state_dict, prefix)
        # another optimizer's state (Adagrad's sums in an SGD bag) would be dropped unread
        unexpected_keys.extend(prefix + k for k in sorted(mine) if k.startswith("optimizer.") and k not in required)
        if missing:
            missing_keys.extend(prefix + k for k in sorted(missing))
            return
        try:
            self._load_state(mine, state_dict, prefix)
        except ValueError as err:
            error_msgs.append(f"{prefix or 'CachedEmbeddingBag'}: {err}")

    def _missing_state(self, state_dict: dict, prefix: str) -> set[str]:
        """State a subclass keeps beside the cache's, missing from `state_dict`."""
        return set()

    def _load_state(self, mine: dict, state_dict: dict, prefix: str) -> None:
        self.cache.load_state_dict(mine)


class KeyedEmbeddingBag(KeyStage, CachedEmbeddingBag):
    """An open table: raw keys in, each given a row on first sight (`KeyStage`), in front
    of a closed cached bag. `CachedEmbeddingBag(..., keys="raw")` makes one."""


class _BagWithRowUpdate(torch.autograd.Function):
    """`F.embedding_bag` whose backward hands the bag's output gradient to `apply(grad_out,
    indices, offsets, weights, mode)`: the device bookkeeper's update
    (`DeviceUpdates.apply_bag_gradient`), which makes each lookup's term itself. `anchor`
    (an empty leaf that requires grad) is what makes autograd call the backward. `pool`:
    the pooled-lookup kernel to run instead of torch's (`embcache.kernels.pooled`, which
    reads a half-precision table as it is), or None."""

    @staticmethod
    def forward(ctx, anchor, table, indices, offsets, weights, mode, apply, pool=None):
        ctx.save_for_backward(indices, offsets, weights)
        ctx.mode, ctx.update = mode, apply
        if pool is not None:
            return pool(table, indices, offsets, weights, mode)
        return F.embedding_bag(indices, table, offsets, mode=mode, per_sample_weights=weights)

    @staticmethod
    def backward(ctx, grad_out):
        indices, offsets, weights = ctx.saved_tensors
        ctx.update(grad_out, indices, offsets, weights, ctx.mode)
        return (None,) * 8


def _draw_normal(out: torch.Tensor, start: int) -> None:
    """`torch.randn` into `out` from the global generator: drawn whole, or chunk by chunk
    in chunks of a multiple of 16 elements, the values are the same."""
    out.normal_()


def _is_cache_key(key: str) -> bool:
    """A key of this bag's own state (not of a submodule's): `weight`, `step`, ... or
    one group's `optimizer.sum`, `policy.clock`, `prefetch.ids`."""
    head, _, rest = key.partition(".")
    return not rest or (head in ("optimizer", "policy", "prefetch") and "." not in rest)


def _check_config(num_embeddings, embedding_dim, mode, cache_ratio, warmup_ratio, eviction,
                  optimizer, ids_freq, weight) -> None:
    # whole numbers: int() would take 20.5 as 20 and True as 1 without a word
    check_whole("num_embeddings", num_embeddings, 1)
    check_whole("embedding_dim", embedding_dim, 1)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(cache_ratio, bool) or not isinstance(cache_ratio, numbers.Real) \
            or not 0 < cache_ratio <= 1:
        raise ValueError(f"cache_ratio must lie in (0, 1], got {cache_ratio!r}")
    if isinstance(warmup_ratio, bool) or not isinstance(warmup_ratio, numbers.Real) \
            or not 0 <= warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must lie in [0, 1], got {warmup_ratio!r}")
    if eviction not in POLICIES:
        raise ValueError(f"eviction must be one of {POLICIES}, got {eviction!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if ids_freq is not None:
        if not torch.is_tensor(ids_freq):
            raise ValueError(f"ids_freq must be a 1-D tensor of counts, got {type(ids_freq).__name__}")
        if ids_freq.dim() != 1 or ids_freq.numel() != num_embeddings:
            raise ValueError(f"ids_freq must be 1-D with {num_embeddings} counts, got shape "
                             f"{tuple(ids_freq.shape)}")
        if ids_freq.dtype == torch.bool or ids_freq.is_complex():
            raise ValueError(f"ids_freq must hold real counts, got {ids_freq.dtype}")
        if ids_freq.is_floating_point() and not bool(torch.isfinite(ids_freq).all()):
            raise ValueError("ids_freq holds NaN or inf")
        if bool((ids_freq < 0).any()):
            raise ValueError("ids_freq holds negative counts")
    if weight is not None and not isinstance(weight, RowInit) and tuple(weight.shape) != (num_embeddings, embedding_dim):
        raise ValueError(f"weight must be [{num_embeddings}, {embedding_dim}], got "
                         f"{list(weight.shape)}")
