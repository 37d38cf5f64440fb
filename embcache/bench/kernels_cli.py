"""The embedding kernels alone (`embcache.kernels`), against torch's ops, in one run.

For each shape (one-hot: 26 ids a sample, Criteo Kaggle; multi-hot: MLPerf DLRM-DCNv2's
pooling, 214) and batch size, over the 26 tables at Kaggle cardinalities times `--scale`,
whole on the device (rows float32 with Adagrad's state beside them):

- forward: Triton's pooled lookup (`pooled_lookup`, every table in one launch) against
  `F.embedding_bag`; and the same lookup with 1, 4 and 16 bags a program
  (`forward_share_by_bags_per_program`: the same bits, other loads in flight);
- a list of writes as long as the batch's lookups, 5 % of them masked in, as the device
  bookkeeper writes its slot arrays: torch's `index_copy_` (masked entries to one trash entry)
  against `scatter_masked` (masked entries skipped), `masked_write_ms`;
- the device bookkeeper's lookup of the batch against a 1.5 % cache: its torch path against
  `kernels.batch_lookup` (a sort and two launches), `lookup_ms`;
- forward + backward + optimizer: the pooled lookup, then the sort of the batch's rows and the
  fused backward + optimizer (`fused_row_update`), against `nn.EmbeddingBag(sparse=True)`,
  its backward and `torch.optim.Adagrad` (torch's `coalesce` and `index_put`). The backward's
  figures are the difference of the two.

Both start from the same table and batch; the run reports the largest difference between their
tables after one step. Bytes touched a second are reported as a share of the same run's
device-to-device copy bandwidth (`copy_gbps`: a buffer copied, read plus written): forward,
the rows read, the pooled output written, the ids and offsets; backward, the output gradient
read once a lookup, the distinct rows' weight and state read and written, and the ids, keys
and order. Targets (issue "Embedding kernels of our own", on an H100 or H200): forward >= 60 %,
backward with Adagrad >= 40 %, at least 5x torch's sparse path. Timing windows have one device
synchronisation at each end. On the CPU the kernels run under Triton's interpreter
(TRITON_INTERPRET=1, set by this command where no GPU is): a check of the run, not a speed.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, non_negative_int, positive_float, positive_int
from embcache.train.run_cli import add_device_argument


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="times the Kaggle cardinalities (1.0: 33.8 M rows)")
    p.add_argument("--dim", type=positive_int, default=128, help="embedding dim")
    p.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[16384, 65536], help="samples a batch")
    p.add_argument("--shapes", nargs="+", default=["one-hot", "multi-hot"], choices=["one-hot", "multi-hot"])
    p.add_argument("--steps", type=positive_int, default=20, help="timed calls per measurement")
    p.add_argument("--warmup-steps", type=non_negative_int, default=3, help="untimed calls first (compilation)")
    p.add_argument("--copy-mib", type=positive_int, default=1024, help="the buffer the copy bandwidth is measured on")
    add_device_argument(p)
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "kernels")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    import os

    import torch

    if not torch.cuda.is_available():  # before triton is imported: it reads this when kernels are defined
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") == "1":  # else minutes of silence read as a hang
        print("bench kernels: the kernels run under Triton's interpreter (TRITON_INTERPRET=1): a check that both "
              "paths agree, not a speed (minutes even at small sizes)", flush=True)
    from embcache.bench.kernels import run_all

    return run_all(args)
