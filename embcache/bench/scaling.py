"""Scaling benchmark: DLRM and face training at 1, 2 (and, with the cores for it, 4)
ranks on CPU with gloo, launched by torchrun, in one run.

Each rank gets one compute thread, so N ranks use N cores: the ratio to 1 rank says what
adding a process (and its core) buys once the all-to-all and all-reduce are paid. The
global batch is the same at every world size (`--batch-size` is global), so every run
computes the same steps. Beside the measured traffic per step stands a model of it:

- pooled embeddings: each owner sends its columns for the other ranks' samples,
  `sum_r D_r * (B - B_r) * 4` bytes, and the same again as gradients in the backward;
- ids: one block from every rank to every other owner: a header (`1 + ranks + features the
  owner serves` int64s) and, for every feature the owner serves, the rank's lengths and ids
  (int64; a row-wise shard gets the share of ids its rows hold, modelled as its share of
  the table's rows), each block padded to the capacity the ranks give that owner (its
  largest block plus 1/32, see `distributed/sharded_collection.py`);
- dense gradients: one all-reduce of the MLPs' gradients (DDP), `4 * parameters` bytes.

Face (dcp), bytes one rank sends a step at N > 1 ranks (`face/traffic.py`; d the
embedding size, w = ceil(pairs / N) with pairs = B // 4, c each batch-norm layer's
channels, P the probe's parameters, ring = 2 (N - 1) / N):

- gallery all-gather (features of both views, labels, a header row of counts; float64):
  `(N - 1) (w + 1) (2 d + 1) 8`;
- batch-norm all-reduces (`--batch-norm global`; none with `local`): sums, sums of squares
  and a count in float64 for the gallery's two views, the probe's forward and its backward,
  `ring * sum_c 4 (2 c + 1) 8`;
- DDP's gradient sum (float32): `4 P` at 2 ranks (one all-gather), `ring * 4 P` beyond.
"""
from __future__ import annotations

import argparse
import math
import os
from statistics import median
from pathlib import Path

from embcache.arg_types import add_output_arguments, positive_float, positive_int
from embcache.paths import datasets_dir
from embcache.data.defaults import SYNTHETIC_ROWS, SYNTHETIC_SCALE
from embcache.train.bench_results import run_for_summary, write_json


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = os.cpu_count() or 1
    p.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2] + ([4] if cores >= 4 else []),
                   help="world sizes to run (default: 1, 2, and 4 where the host has 4 cores)")
    p.add_argument("--which", nargs="+", choices=("dlrm", "face"), default=["dlrm", "face"])
    p.add_argument("--rows", type=positive_int, default=SYNTHETIC_ROWS, help="training rows of the synthetic CTR set")
    p.add_argument("--scale", type=positive_float, default=SYNTHETIC_SCALE,
                   help="multiplies Criteo Kaggle's cardinalities")
    p.add_argument("--steps", type=positive_int, default=40, help="training steps of each run")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="rounds of every run, one after another (figures: medians; ratios: the median of each "
                        "round's ratio to 1 rank)")
    p.add_argument("--batch-size", type=positive_int, default=4096, help="global DLRM batch")
    p.add_argument("--face-batch-size", type=positive_int, default=512, help="global face batch")
    p.add_argument("--face-classes", type=positive_int, default=20_000)
    p.add_argument("--face-batch-norm", nargs="+", choices=("global", "local"), default=["global"],
                   help="face's --batch-norm at 2+ ranks, each given one run (1 rank: the same either way, run once)")
    p.add_argument("--independent", action=argparse.BooleanOptionalAction, default=True,
                   help="also run DLRM as N single processes at once, each on its B/N share with nothing sent "
                        "between them: this host's ceiling for N ranks")
    p.add_argument("--data-cache", default=str(datasets_dir()))
    add_output_arguments(p, "scaling")
    p.set_defaults(func=run)
    return p


def _launch_alone(args: list[str]) -> dict:
    """One run in one process (no torchrun, one thread); its summary."""
    argv = [*args, "--threads", "1"]
    summary, _ = run_for_summary(argv, f"embcache {' '.join(argv)}", env={**os.environ, "OMP_NUM_THREADS": "1"})
    return summary


def _launch(ranks: int, args: list[str]) -> dict:
    """One run on `ranks` processes (torchrun; one thread each); its summary."""
    argv = [*args, "--threads", "1"]
    summary, _ = run_for_summary(argv, f"embcache {' '.join(argv)} on {ranks} rank(s)",
                                 env={**os.environ, "OMP_NUM_THREADS": "1"},
                                 launcher=["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"])
    return summary


def cpu_fields(summary: dict) -> dict:
    """A run's CPU seconds of training (every rank's user + system time, all threads) per
    sample: what adding ranks costs in CPU, seen even where the cores are shared."""
    return {"cpu_seconds_per_sample": summary.get("cpu_seconds_per_sample"),
            "train_cpu_seconds": summary.get("train_cpu_seconds")}


def ids_bytes(shards, world: int, batch: int) -> list[list[float]]:
    """`m[r][o]`: bytes of the routing block rank r sends owner o a step for a one-hot batch
    (`sharded_collection`'s one buffer: a header, then each feature's lengths and ids, a
    row-wise shard getting its rows' share of the ids), padded to the owner's slot."""
    from embcache.distributed.sharded_collection import block_capacity
    from embcache.partition import slice_bounds

    if world == 1:
        return [[0.0]]
    local = [slice_bounds(batch, world, r)[1] - slice_bounds(batch, world, r)[0] for r in range(world)]
    served = [[s for s in shards if s.rank == o] for o in range(world)]
    block = [[1 + world + sum(len(s.features) * (1 + local[r] * (1 + s.rows / s.table_rows)) for s in served[o])
              for o in range(world)] for r in range(world)]  # block[r][o]: rank r's for owner o, in int64s
    capacity = [block_capacity(math.ceil(max(row[o] for row in block))) for o in range(world)]
    return [[8.0 * capacity[o] if o != r else 0.0 for o in range(world)] for r in range(world)]


def dlrm_traffic_model(meta: dict, freq: dict, embedding_dim: int, batch: int, world: int,
                       dense_params: int) -> dict:
    """Modelled bytes per step (summed over ranks) for a one-hot CTR batch of `batch` rows."""
    from embcache.distributed import placement
    from embcache.partition import slice_bounds

    tables = [placement.TableLoad(f"t_{f['name']}", (f["name"],), f["cardinality"], float(freq[f["name"]].sum()))
              for f in meta["sparse"]]
    shards = placement.plan(tables, world)
    local = [slice_bounds(batch, world, r)[1] - slice_bounds(batch, world, r)[0] for r in range(world)]
    pooled = sum(embedding_dim * len(s.features) * (batch - local[s.rank]) * 4 for s in shards)
    ids = sum(map(sum, ids_bytes(shards, world, batch)))
    return {"ids": ids, "pooled": pooled, "pooled_grad": pooled, "dense_allreduce": 4 * dense_params if world > 1 else 0}


def _dlrm_data(args):
    from embcache.data.ctr_format import load_id_frequencies, read_meta
    from embcache.data.synthetic import generate_synthetic

    data_dir = Path(args.data_cache) / f"bench-dlrm-r{args.rows}-s{args.scale:g}"
    if not (data_dir / "meta.json").exists():
        print(f"generating {data_dir} ...", flush=True)
        generate_synthetic(data_dir, rows=args.rows, scale=args.scale, seed=0)
    return data_dir, read_meta(data_dir), load_id_frequencies(data_dir)


def _dlrm_run(args, world: int, data) -> dict:
    data_dir, meta, freq = data
    s = _launch(world, ["dlrm", "train", "--data", str(data_dir), "--max-steps", str(args.steps),
                        "--batch-size", str(args.batch_size), "--device", "cpu", "--no-progress"])
    measured = s.get("comm_bytes_per_step", {"ids": 0, "pooled": 0, "pooled_grad": 0, "dense_allreduce": 0})
    dense_params = measured["dense_allreduce"] // 4 if world > 1 else 0
    model = dlrm_traffic_model(meta, freq, 16, args.batch_size, world, dense_params)
    print(f"  dlrm {world} rank(s): {s['train_samples_per_s']:>9,.0f} samples/s, "
          f"{sum(measured.values()) / 2**20:.2f} MiB sent a step (model {sum(model.values()) / 2**20:.2f})",
          flush=True)
    return {"job": "dlrm", "ranks": world, "samples_per_s": s["train_samples_per_s"],
            "hit_rate": s["hit_rate"], "steps": s["steps"],
            "comm_bytes_per_step": measured, "comm_model_bytes_per_step": model,
            "peak_host_mib_rank0": s["peak_host_mib"], **cpu_fields(s)}


def _dlrm_independent_run(args, world: int, data) -> dict:
    """The host's own ceiling for `world` ranks: `world` single processes at once, each
    training its share of the global batch (`B / world`, one thread) with nothing sent
    between them. What they reach together is what `world` ranks could reach on this host
    with free communication and no duplicated work: the rest of a real run's shortfall is
    the distribution's own cost."""
    from concurrent.futures import ThreadPoolExecutor

    data_dir = data[0]
    argv = ["dlrm", "train", "--data", str(data_dir), "--max-steps", str(args.steps),
            "--batch-size", str(args.batch_size // world), "--device", "cpu", "--no-progress"]
    with ThreadPoolExecutor(world) as pool:
        runs = list(pool.map(lambda _: _launch_alone(argv), range(world)))
    rate = sum(s["train_samples_per_s"] for s in runs)
    cpu = sum(s["train_cpu_seconds"] for s in runs)
    samples = sum(s["train_samples_per_s"] * s["train_seconds"] for s in runs)
    print(f"  dlrm {world} independent process(es), batch {args.batch_size // world} each: {rate:>9,.0f} samples/s "
          f"together", flush=True)
    return {"job": "dlrm", "ranks": world, "variant": "independent", "samples_per_s": rate,
            "samples_per_s_each": [s["train_samples_per_s"] for s in runs], "steps": args.steps,
            "train_cpu_seconds": cpu, "cpu_seconds_per_sample": cpu / samples if samples else None}


def _face_run(args, world: int, norm: str) -> dict:
    from embcache.face.traffic import face_model_for

    s = _launch(world, ["face", "train", "--max-steps", str(args.steps), "--batch-size",
                        str(args.face_batch_size), "--num-classes", str(args.face_classes), "--device", "cpu",
                        "--no-progress", "--epochs", "100", "--batch-norm", norm])
    measured = s["comm_bytes_per_step"]
    model = face_model_for(args.face_batch_size, args.face_classes, world, norm)
    mode = f" (--batch-norm {norm})" if world > 1 else ""
    print(f"  face {world} rank(s){mode}: {s['train_samples_per_s']:>9,.0f} samples/s, "
          f"{sum(measured.values()) / 2**20:.3f} MiB a rank sends a step (model "
          f"{sum(model.values()) / 2**20:.3f})", flush=True)
    return {"job": "face", "ranks": world, **({"batch_norm": norm} if world > 1 else {}),
            "samples_per_s": s["train_samples_per_s"], "steps": s["steps"], **cpu_fields(s),
            "comm_bytes_per_step": measured, "comm_model_bytes_per_step": model}


def _configs(args) -> list[tuple[str, int, str | None]]:
    """(job, world size, face batch norm) of every run a round makes, in order."""
    out = []
    if "dlrm" in args.which:
        out += [("dlrm", w, None) for w in args.ranks]
        if args.independent:
            out += [("dlrm", w, "independent") for w in args.ranks if w > 1]
    if "face" in args.which:
        out += [("face", w, norm) for w in args.ranks
                for norm in (args.face_batch_norm if w > 1 else args.face_batch_norm[:1])]
    return out


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """One result a configuration: its last run's fields, samples/s and CPU a sample as
    medians over the rounds, and its ratios to 1 rank as the median of each round's ratio
    (a round's runs follow one another, so a change of load on a shared host touches
    both sides of a ratio alike)."""
    def key(r):
        return r["job"], r["ranks"], r.get("batch_norm"), r.get("variant")

    out = []
    for cfg in dict.fromkeys(key(r) for r in rounds[0]):
        runs = [next(r for r in rnd if key(r) == cfg) for rnd in rounds]
        bases = [next((r for r in rnd if r["job"] == cfg[0] and r["ranks"] == 1 and "variant" not in r), None)
                 for rnd in rounds]
        row = dict(runs[-1])
        row["samples_per_s"] = median([r["samples_per_s"] for r in runs])
        row["samples_per_s_runs"] = [r["samples_per_s"] for r in runs]
        cpus = [r.get("cpu_seconds_per_sample") for r in runs]
        if all(cpus):
            row["cpu_seconds_per_sample"] = median(cpus)
        if all(bases):
            row["speedup_vs_1_rank"] = median([r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs, bases)])
            row["speedup_vs_1_rank_runs"] = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs, bases)]
            pairs = [(r.get("cpu_seconds_per_sample"), b.get("cpu_seconds_per_sample")) for r, b in zip(runs, bases)]
            if all(c and c0 for c, c0 in pairs):
                row["cpu_per_sample_vs_1_rank"] = median([c / c0 for c, c0 in pairs])
        else:
            row["speedup_vs_1_rank"] = row["cpu_per_sample_vs_1_rank"] = None
        out.append(row)
    return out


def result_line(r: dict, repeats: int) -> str:
    """A configuration's ratios to 1 rank; without a 1-rank run (--ranks 2 4) there is none, and
    the line says so (it printed x0.00, a speed-up of nothing)."""
    mode = f" (--batch-norm {r['batch_norm']})" if "batch_norm" in r else \
        " independent processes (the host's ceiling)" if "variant" in r else ""
    head = f"  {r['job']} {r['ranks']} rank(s){mode}: "
    if r["speedup_vs_1_rank"] is None:
        return head + f"{r['samples_per_s']:,.0f} samples/s (no 1-rank run to compare with: add 1 to --ranks)"
    cpu = r.get("cpu_per_sample_vs_1_rank")
    return (head + f"x{r['speedup_vs_1_rank']:.2f} samples/s"
            + (f", x{cpu:.2f} CPU-seconds a sample" if cpu else "") + " vs 1 rank"
            + (f" (medians of {repeats} rounds)" if repeats > 1 else ""))


def run(args) -> int:
    data = _dlrm_data(args) if "dlrm" in args.which else None
    config = {k: v for k, v in vars(args).items() if k != "func"}
    config["threads_per_rank"] = 1

    def save(results: list[dict], complete: bool):  # after every round: a run cut short keeps its rounds
        return write_json({"benchmark": "scaling", "config": config, "rounds_done": len(rounds), "results": results,
                           "complete": complete}, args.name, args.out)

    rounds, configs = [], _configs(args)
    for i in range(args.repeats):
        if args.repeats > 1:
            print(f"round {i + 1} of {args.repeats}", flush=True)
        rounds.append([])
        for n, (job, w, mode) in enumerate(configs, 1):  # a line a run: a round takes minutes
            rounds[-1].append(_dlrm_independent_run(args, w, data) if mode == "independent" else
                              _dlrm_run(args, w, data) if job == "dlrm" else _face_run(args, w, mode))
            print(f"  run {n} of {len(configs)}: {job} {w} rank(s){' ' + mode if mode else ''}: "
                  f"{rounds[-1][-1]['samples_per_s']:,.0f} samples/s", flush=True)
        if i + 1 < args.repeats:
            save(summarize(rounds), complete=False)
    results = summarize(rounds)
    for r in results:
        print(result_line(r, args.repeats), flush=True)
    path = save(results, complete=True)
    print(f"wrote {path}")
    return 0
