"""`embcache bench face`: the classification head's step time and memory against the number of
classes, for the full FC head, Partial FC (sample rate 0.1) and the dynamic class pool (1 % and
10 % of the classes), side by side in one run; then verification accuracy of each head trained
the same steps on the synthetic task. Writes bench/results/face[-<device>].json and .png.

Pools of 1 % and 10 % grow with the classes (Q = ratio x classes); a pool of fixed size
(Q = 10,000) shows the cost at a given Q, whatever the number of classes.

Head step = what the head adds to a training step, given the backbone's features for one batch:
(dcp) the pool update from the gallery features of the batch's identity pairs, the loss, its
backward and the head's own update; (fc) loss, backward, SGD step on the weight table; (pfc)
sampling, loss, backward, per-row SGD on the sampled rows. The backbone is the same for all and
left out of the timing.

Head memory is counted, not sampled from the allocator (on CPU there is no per-tensor peak
counter): persistent state (weight table or pool, pool table and LRU keys, optimizer state)
+ the tensors autograd saves for backward during one step (recorded with
`torch.autograd.graph.saved_tensors_hooks`, each storage counted once) + the gradients the head
receives (the weight table's, or the sampled rows'). Configurations whose persistent state alone
would exceed `--max-gib` are skipped and listed as such.

Beside the counted head memory, the process's own peak is measured: the most host memory the
process held while the configuration built its head and ran its steps, above what it held
before (the kernel's resident high-water mark, reset for each configuration; on CUDA also the
allocator's peak). It covers what counting leaves out (the allocator's slack, temporaries that
autograd does not save), and the same is measured for each accuracy run.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import positive_float, positive_int, non_negative_int
from embcache.paths import results_dir
from embcache.train.run_cli import add_device_argument

DEFAULT_CLASSES = (10**4, 10**5, 10**6, 10**7)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=positive_int, nargs="+", default=list(DEFAULT_CLASSES), help="numbers of classes")
    p.add_argument("--batch-size", type=positive_int, default=128, help="probe features per step")
    p.add_argument("--feat-dim", type=positive_int, default=128)
    p.add_argument("--repeats", type=positive_int, default=3, help="timed steps per configuration (after one warm-up)")
    p.add_argument("--max-gib", type=positive_float, default=6.0,
                   help="skip configurations whose persistent state exceeds this")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch and numba threads (1 keeps ratios stable on a shared machine)")
    add_device_argument(p)
    p.add_argument("--accuracy-classes", type=non_negative_int, default=2000,
                   help="identities of the accuracy task (0: skip it)")
    p.add_argument("--accuracy-epochs", type=positive_int, default=10)
    # --out-dir: the name this option had first, still taken (scripts may pass it)
    p.add_argument("--out", "--out-dir", dest="out_dir", metavar="OUT", default=None,
                   help=f"results directory: writes <--out>/<--name>.json and .png (default: {results_dir()})")
    p.add_argument("--name", default=None, help="result file name (default face, or face-cuda on a GPU)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.face.bench` (and torch) imported only now."""
    from embcache.face import bench

    return bench.run(args)
