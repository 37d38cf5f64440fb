"""The command-line side of the run skeleton, shared by `embcache dlrm|face|cf train`: the
run flags (device, seed, epochs, steps, checkpoints, resume, metrics, progress), the config
they make, and the summary every run ends with. Light on purpose: no torch import, so
`--help` stays instant."""
from __future__ import annotations

import argparse
import json
from dataclasses import fields

from embcache.arg_types import non_negative_int, positive_float, positive_int
from embcache.distributed.settings import DEFAULT_TIMEOUT_S
from embcache.train.run_config import LOG_EVERY


def add_run_arguments(p: argparse.ArgumentParser, kind: str, *, epochs: int, epochs_help: str,
                      seed: int | None = 0, seed_help: str = "seeds the initial parameters and the data order",
                      stepwise: bool = True, checkpoint_every: int = 200, device: bool = True,
                      min_epochs: int = 1, threads: bool = True) -> None:
    """The flags of `RunConfig` (and `StepRunConfig` when `stepwise`), worded the same in
    every trainer, and `--threads` (`add_threads_argument`) unless the trainer words its own.
    `kind` names the checkpoint file (`<kind>-last.pt`)."""
    if device:
        p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    if threads:
        add_threads_argument(p)
    p.add_argument("--seed", type=non_negative_int, default=seed, help=seed_help)
    p.add_argument("--epochs", type=positive_int if min_epochs else non_negative_int, default=epochs,
                   help=epochs_help)
    if stepwise:
        p.add_argument("--max-steps", type=positive_int, default=None,
                       help="stop after this many steps in all, with a checkpoint (default: none, every epoch to its end)")
    where = (f"every --checkpoint-every steps and at each epoch's end" if stepwise else "after every epoch")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help=f"keep the run's checkpoint here as {kind}-last.pt, written atomically {where}: "
                        f"a killed run loses at most the work since (default: none, no checkpoints)")
    if stepwise:
        p.add_argument("--checkpoint-every", type=positive_int, default=checkpoint_every,
                       help="steps between checkpoints")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help=f"continue from {kind}-last.pt in --checkpoint-dir, exactly where it stopped; without "
                            f"one there the run stops with an error (leave out --resume to start afresh); settings "
                            f"that change the arithmetic or the data must be the checkpoint's")
    start.add_argument("--overwrite", action="store_true",
                       help=f"start afresh in a --checkpoint-dir that holds a run's {kind}-last.pt, replacing it "
                            f"(without --resume or --overwrite such a directory is refused: no run is lost)")
    p.add_argument("--metrics-out", default=None, metavar="FILE",
                   help="JSON-lines metrics log (appended): start, step, epoch and summary records (default: none)")
    if stepwise:
        p.add_argument("--log-every", type=positive_int, default=LOG_EVERY, metavar="N",
                       help="steps between two step records of the metrics log; a pipelined trainer (dlrm) "
                            "reads its losses from the device and refreshes the progress bar this often")
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the metrics as TensorBoard scalars to DIR (loss, samples/s and the trainer's "
                        "own, e.g. hit rate, every --log-every steps; validation scores per epoch); "
                        "watch with `tensorboard --logdir DIR` (default: none)")
    if stepwise:
        p.add_argument("--eval-every", type=positive_int, default=None, metavar="N",
                       help="also validate every N steps (default: at each epoch's end, and at --max-steps)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if stepwise:
        p.add_argument("--dist-timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="under torchrun: how long a rank waits for the others before it stops with one "
                            "line (a rank died or hung); the last checkpoint stays intact")


def add_threads_argument(p: argparse.ArgumentParser, what: str = "CPU threads of torch and numba") -> None:
    """`--threads N`; None (not given) is `embcache.threads.default_threads()`."""
    from embcache.threads import usable_cores

    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help=f"{what} (default: the cores this process may use, {usable_cores()} here, shared among "
                        f"torchrun's processes on the node; outside torchrun an OMP_NUM_THREADS you set)")


def apply_threads(args) -> int:
    """Set torch's and numba's threads from --threads (or its default); returns the number."""
    from embcache.threads import set_threads

    return set_threads(args.threads)


def refuse_existing_run(args, kind: str) -> None:
    """Before any data is read or model built: stop in one line when --checkpoint-dir holds
    a run of `kind` and neither --resume nor --overwrite says what to do with it (the
    trainer checks the same; this only saves the wait)."""
    if args.checkpoint_dir and not args.resume and not args.overwrite:
        from embcache.train.run import refuse_existing_run as refuse

        refuse(args.checkpoint_dir, kind)


def run_launched(cfg, body):
    """Run `body()` (which builds a trainer and returns its summary) in the process group
    torchrun set up, or plainly without torchrun. Returns `(summary, world)`. Ranks other
    than 0 print only warnings and errors: one progress bar, one summary per run."""
    import logging

    from embcache.distributed.world import launch

    with launch(cfg.resolved_device(), getattr(cfg, "dist_timeout", DEFAULT_TIMEOUT_S)) as world:
        if not world.is_main:
            logging.getLogger("embcache").setLevel(logging.WARNING)
        return body(), world


def config_values(args: argparse.Namespace, config_cls) -> dict:
    """The fields of `config_cls` that `args` has (under the same names), with `progress`
    from `--no-progress`."""
    names = {f.name for f in fields(config_cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["progress"] = not args.no_progress
    return values


def print_summary(rows: list[tuple[str, str]], summary: dict) -> None:
    """The end of every run: an aligned table for people, then the whole summary as one
    JSON line for programs (always the last line of the output). Under torchrun, rank 0
    alone prints it."""
    import os

    if int(os.environ.get("RANK", "0")) != 0:
        return
    width = max(len(k) for k, _ in rows)
    print("\nsummary")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    print(json.dumps(summary, default=float))


def run_rows(s: dict) -> list[tuple[str, str]]:
    """The summary rows every run has: throughput, steps or epochs, device and memory."""
    done = f"{s['epochs_done']} epoch(s)" + (", stopped early" if s.get("stopped_early") else "")
    rows = [("training throughput", f"{s['train_samples_per_s']:,.0f} samples/s over {s['train_seconds']:.1f} s"),
            ("steps", f"{s['steps']:,} ({done})") if "steps" in s else ("epochs", done),
            ("peak host memory", f"{s['peak_host_mib']:,.0f} MiB")]
    if s.get("world_size", 1) > 1:
        rows.insert(1, ("processes", f"{s['world_size']} (torchrun)"))
    if "peak_device_mib" in s:
        rows.append(("peak device memory", f"{s['peak_device_mib']:,.0f} MiB"))
    return rows
