"""The command-line side of the run skeleton, shared by `embcache dlrm|face|cf train`: the
run flags (device, seed, epochs, steps, checkpoints, resume, metrics, progress), made from
the fields of `RunConfig` (`embcache.settings_fields`), and the summary every run ends
with. Light on purpose: no torch import, so `--help` stays instant."""
from __future__ import annotations

import argparse
import json
from dataclasses import fields

from embcache.arg_types import positive_int
from embcache.distributed.settings import DEFAULT_TIMEOUT_S
from embcache.safe_load import add_trust_argument
from embcache.settings_fields import add_config_arguments
from embcache.train.run_config import THREADS_DEFAULT, RunConfig, StepRunConfig

RUN_FLAGS = ("seed", "epochs", "max_steps", "checkpoint_dir", "checkpoint_every", "resume", "overwrite", "metrics_out",
             "log_every", "tensorboard", "eval_every", "progress", "dist_timeout")  # after --device and --threads, in the order `--help` shows them


# the help texts' words for what a run of steps (dlrm, face) and a run of whole epochs (cf) keep
STEP_RUN_HELP = {"checkpoint_when": "every --checkpoint-every steps and at each epoch's end",
                 "metrics_records": "start, step, epoch and summary",
                 "tensorboard_scalars": "loss, samples/s and the trainer's own, e.g. hit rate, every --log-every "
                                        "steps; validation scores per epoch"}
EPOCH_RUN_HELP = {"checkpoint_when": "after every epoch", "metrics_records": "start, epoch and summary",
                  "tensorboard_scalars": "each epoch's loss, samples/s and scores, e.g. Recall@k"}


def add_run_arguments(p: argparse.ArgumentParser, config_cls, kind: str, *, device: bool = True,
                      threads: bool = True, **options) -> None:
    """The flags of `RunConfig` (and `StepRunConfig`'s, for a config class of steps) as
    `config_cls` declares them, with `--threads` (`add_threads_argument`) after `--device`
    unless the trainer has its own. `kind` names the checkpoint file (`<kind>-last.pt`);
    `options` (`unset`, `unset_note`) go to `add_config_arguments`."""
    stepwise = issubclass(config_cls, StepRunConfig)
    run_fields = {f.name for f in fields(StepRunConfig if stepwise else RunConfig)}  # cf's eval_every is its own
    names = [n for n in RUN_FLAGS if n in run_fields and n != "device"]
    context = {"kind": kind, **(STEP_RUN_HELP if stepwise else EPOCH_RUN_HELP)}
    if device:
        add_config_arguments(p, config_cls, ["device"])
    if threads:
        add_threads_argument(p)
    add_config_arguments(p, config_cls, names, context=context, **options)
    add_trust_argument(p)


def add_device_argument(p: argparse.ArgumentParser) -> None:
    """`--device`, as the trainers have it (`RunConfig.device`), for a command that runs on
    one device without a trainer's config (a benchmark)."""
    add_config_arguments(p, RunConfig, ["device"])


def add_threads_argument(p: argparse.ArgumentParser, what: str = "CPU threads of torch and numba") -> None:
    """`--threads N` (where it is no config field); None (not given) is
    `embcache.threads.default_threads()`."""
    from embcache.threads import usable_cores

    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help=f"{what} {THREADS_DEFAULT.format(cores=usable_cores())}")
    p.add_argument("--no-pin-cores", dest="pin_cores", action="store_false",
                   help="under torchrun with several processes on a node, leave the OS to place them (default: "
                        "each keeps to its own share of the cores, its communication threads included)")


def apply_threads(args) -> int:
    """Set torch's and numba's threads from --threads (or its default), then keep this
    torchrun rank to its share of the cores (unless --no-pin-cores); returns the number."""
    from embcache.threads import default_threads, pin_local_rank, set_threads

    threads = default_threads() if args.threads is None else args.threads  # from every usable core
    if getattr(args, "pin_cores", True):
        pin_local_rank()
    return set_threads(threads)


def refuse_existing_run(args, kind: str) -> None:
    """Before any data is read or model built: stop in one line when --checkpoint-dir holds
    a run of `kind` and neither --resume nor --overwrite says what to do with it, or cannot
    be written (the trainer checks the same; this only saves the wait)."""
    if args.checkpoint_dir and not args.resume and not args.overwrite:
        from embcache.train.run import refuse_existing_run as refuse

        refuse(args.checkpoint_dir, kind)
    from embcache.train.run_files import check_checkpoint_dir

    check_checkpoint_dir(args.checkpoint_dir, args.resume)


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
    rows = [("training throughput", throughput_row(s)),
            ("steps", f"{s['steps']:,} ({done})") if "steps" in s else ("epochs", done),
            ("peak host memory", f"{s['peak_host_mib']:,.0f} MiB")]
    steady = s.get("steady_cpu_seconds_per_sample")
    if steady or s.get("cpu_seconds_per_sample"):
        per = (f"{steady * 1e6:,.1f} µs a sample after the first step" if steady else
               f"{s['cpu_seconds_per_sample'] * 1e6:,.1f} µs a sample" + _start_up_note(s))
        rows.insert(1, ("CPU time", f"{per} ({s['train_cpu_seconds']:,.1f} CPU-s in all, all threads and processes)"))
    if s.get("world_size", 1) > 1:
        rows.insert(1, ("processes", f"{s['world_size']} (torchrun)"))
    if "peak_device_mib" in s:
        rows.append(("peak device memory", f"{s['peak_device_mib']:,.0f} MiB"))
    return rows


def throughput_row(s: dict) -> str:
    """Samples a second over the steps after this process's first where there are any (the
    first carries the start-up: compiling, warming up), said so with the first step's time;
    else over every step, a single step's start-up said to be in the figure."""
    from embcache.units import format_seconds

    if s.get("steady_samples_per_s"):
        first = s["first_step_seconds"]
        slow = first > max(1.0, 10 * s["steady_seconds"] / s["steady_steps"])  # far beyond a step: compiling
        return (f"{s['steady_samples_per_s']:,.0f} samples/s over {s['steady_steps']:,} step(s) after the first (the "
                f"first took {format_seconds(first)}" + (": start-up and one-time compilation)" if slow else ")"))
    return (f"{s['train_samples_per_s']:,.0f} samples/s over {format_seconds(s['train_seconds'])}"
            + _start_up_note(s))


def _start_up_note(s: dict) -> str:
    """Where this process ran one step only: the figure holds its start-up."""
    one = s.get("first_step_seconds") is not None and not s.get("steady_steps")
    return ", start-up (compilation, warm-up) included" if one else ""
