"""DLRM on one GPU: the cache against whole tables on the GPU, in one run.

The model is DLRM's dense part in plain torch (`embcache.dlrm.arch`: no torchrec needed)
over one embedding bag for the 26 Criteo tables concatenated into one id space, as the
cached collection keeps them; the data is synthetic and Criteo-shaped (Kaggle
cardinalities times `--scale`: 33.8 M rows at 1.0, Zipf ids), one-hot (26 ids a sample)
and multi-hot (MLPerf DLRM-DCNv2's pooling factors, 214 ids a sample). Side by side, for
each shape and embedding dim:

- `gpu`: `nn.EmbeddingBag(sparse=True)` holding the whole table on the device, trained by
  the matching torch sparse optimizer (what fits only while the table fits); where
  `--kernels` resolves to triton, also the whole table with the project's kernels
  (`nn.whole_table.WholeTableBag`: the lookup, and the backward fused with the optimizer);
- `cached r`: `CachedEmbeddingBag` with `r` of the rows on the device and the rest with
  their optimizer state in (pinned) host memory, prefetching `--prefetch-depth` batches
  ahead, once per `--bookkeeping` (host: decided on the host, rows sent; device: decided
  on the device, rows read and written through the unified view); at the middle ratio
  also without prefetch, which prices the copies it hides.

Every variant starts from the same table and trains on the same batches, so their losses
agree (to the bit on the CPU; to rounding where CUDA's kernels sum in another order): the
run reports the largest difference. Throughput is timed over a window of steps with one
device synchronisation at each end, so copies may overlap compute as they would in
training. Also reported: hit rate, bytes moved per step, the host->device bandwidth a
plain pinned copy reaches in the same run, the share of the copy time that prefetch hid,
peak device memory, and how many times a step makes the host wait for the device
(`syncs_per_step`, counted by torch's sync debug mode), and the link's bound: the samples/s
at which the bytes a step moves, as scattered rows read (and written) through the device's
unified view of pinned host memory at the measured random-row rate, would fill the link
alone (`link_bound_fraction`: the run's share of it). The JSON's `rows` hold one line per
run (`bookkeeping`, `shape`, `dim`, `cache_ratio`, `samples_per_s`, `vs_all_on_gpu`,
`link_bound_fraction`, the card's name). On CUDA a `torch.profiler` summary of cached steps at the middle
ratio is saved with the results (`profile_cached_middle_ratio`), and one of the whole table's steps
with Triton's kernels (`profile_whole_table_triton`), each of the captured step's replays where
`--cuda-graphs` captured it: they say where the time goes.

With `--from-shards DIR` the batches come from a prepared Criteo-shaped directory through the
parallel loader (`embcache.data.parallel`) instead of from memory, one-hot, the tables sized
by its cardinalities; the loader's own rows/s at each `--readers` count is measured in the
same run over the same batches (JSON `loader`), and every row gets `loader_vs_step`, the
loader's rows/s over the step's samples/s (>= 1.5: the loader is not the bound).
`embcache bench loader DIR` measures the loader alone.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, non_negative_int, positive_float, positive_int, ratio
from embcache.cache.choices import TORCH_OPTIMIZERS
from embcache.dlrm.config import DLRMConfig
from embcache.settings_fields import add_config_arguments
from embcache.train.run_cli import add_device_argument, add_threads_argument


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="times the Kaggle cardinalities (1.0: 33.8 M rows)")
    p.add_argument("--dims", type=positive_int, nargs="+", default=[16, 128],
                   help="embedding dims (16: the make run model)")
    p.add_argument("--ratios", type=ratio, nargs="+", default=[0.005, 0.015, 0.05], help="cache ratios")
    p.add_argument("--shapes", nargs="+", default=["one-hot", "multi-hot"], choices=["one-hot", "multi-hot"],
                   help="one-hot: 26 ids a sample (Criteo Kaggle); multi-hot: MLPerf DLRM-DCNv2's pooling, "
                        "214 ids a sample over the same tables")
    p.add_argument("--batch-size", type=positive_int, default=4096)
    p.add_argument("--steps", type=positive_int, default=60, help="timed steps per variant")
    p.add_argument("--warmup-steps", type=non_negative_int, default=10, help="untimed steps before them")
    p.add_argument("--optimizer", default="adagrad", choices=sorted(TORCH_OPTIMIZERS), help="sparse optimizer")
    p.add_argument("--lr", type=positive_float, default=0.01)
    p.add_argument("--prefetch-depth", type=non_negative_int, default=1, help="batches prefetched ahead (0: none)")
    p.add_argument("--bookkeeping", nargs="+", default=["host", "device"], choices=["host", "device"],
                   help="the cache's bookkeepers to run, each at every ratio (the device one: everything beside "
                        "the rows, rows read and written through the unified view)")
    p.add_argument("--kernels", nargs="+", default=["auto"], choices=["torch", "triton", "auto"],
                   help="the device bookkeeper's embedding kernels to run, each at every ratio (auto: triton on "
                        "CUDA where Triton imports); the host bookkeeper and the whole table use torch's")
    p.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"],
                   help="capture the step as one CUDA graph and replay it: the whole table with Triton's kernels "
                        "and the cached bag with the device bookkeeper (auto, on: where it can be, else eager with "
                        "the reason in the row's cuda_graphs; with --prefetch-depth >= 1 the cached step's graph "
                        "prefetches the next batch); a capture that fails is said and the step runs eagerly")
    p.add_argument("--cached", action=argparse.BooleanOptionalAction, default=True,
                   help="run the cached variants (--no-cached: the whole-table rows alone)")
    p.add_argument("--price-prefetch", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the middle ratio without prefetch (what the copies cost unhidden)")
    p.add_argument("--link-table-mib", type=positive_int, default=1024,
                   help="pinned host table the link's random-row rate is measured on")
    p.add_argument("--from-shards", metavar="DIR", default=None,
                   help="feed the step from this prepared Criteo-shaped directory (13 dense, 26 one-hot features: "
                        "`embcache data synthetic`) through the parallel loader instead of batches made in memory; "
                        "the loader's own rows/s is measured in the same run at each --readers count "
                        "(`loader_vs_step`); the tables' sizes and the shape are the data's (--scale, --shapes unused)")
    p.add_argument("--readers", type=positive_int, nargs="+", default=None,
                   help="with --from-shards: reader threads, each count's rows/s measured; the largest feeds the "
                        "step (default: as the cores allow, embcache.data.parallel.default_readers)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler summary (CUDA only)")
    add_device_argument(p)
    add_config_arguments(p, DLRMConfig, ["precision"])  # as dlrm train's: the same field, the same help
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "gpu")
    add_threads_argument(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.bench.gpu` (and torch) imported only now."""
    from embcache.bench import gpu
    from embcache.device import device_argument
    from embcache.train.precision import precision_scope, resolve

    device = device_argument(args.device)
    args.precision = resolve(args.precision, device)  # as computed: the results' config says tf32, not auto
    with precision_scope(args.precision, device):  # CUDA's TF32 switches for the run, put back after it
        return gpu.run(args)
