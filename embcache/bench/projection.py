"""Projection of hybrid-parallel DLRM to many GPUs: samples/s at N GPUs against one, from the
bytes a step sends (the traffic model `bench scaling` checks against measured runs, within
3 %) and a per-GPU compute rate, over the links of one node (NVLink) and of several (NICs).

For a global batch of B one-hot samples over F features of dimension D, N ranks, n_node GPUs a
node (every rank owns the tables `placement.plan` gives it, as the trainer places them):

    T_compute(N) = B / (N * rate) * imbalance        imbalance = max rank load / mean rank load
    bytes_r      = ids_r + 2 * pooled_r + allreduce   (pooled embeddings there, gradients back;
                                                      a rank's larger of sent and received)
    T_link(N)    = bytes_r(within node) / bw_node + bytes_r(to other nodes) / bw_nic
    speed-up(N)  = T_compute(1) / (T_compute(N) + T_link(N))      (no overlap: a lower bound)
                   T_compute(1) / max(T_compute(N), T_link(N))   (full overlap: an upper bound)

`rate` is one GPU's samples/s of the whole step (cache, sparse and dense work). No GPU was at
hand to measure it: the default, 1 M samples/s, is inside the 0.7-1.9 M range published for
one GPU on this model; `--rate` takes `embcache bench gpu`'s figure when there is one. The
link bandwidths are the hardware's peak per GPU and direction (an all-to-all reaches less):
NVLink 4 on an H100 450 GB/s, one 400 Gb/s NIC per GPU 50 GB/s. Whichever of T_compute and
T_link is larger at N binds; the output says which.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, non_negative_int, positive_float, positive_int

NOTHING_MEASURED = ("projected, nothing measured: a model from the bytes a step sends, --rate and the links' peak "
                    "bandwidths (--node-gbps, --nic-gbps)")


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=positive_int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="world sizes to project")
    p.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs a node (NVLink inside, NICs between)")
    p.add_argument("--batch-size", type=positive_int, default=65_536, help="global batch (one-hot samples)")
    p.add_argument("--embedding-dim", type=positive_int, default=128, help="the Criteo-Kaggle DLRM's dim")
    p.add_argument("--dense-params", type=non_negative_int, default=2_368_897,
                   help="parameters of the MLPs, all-reduced each step (the MLPerf Criteo DLRM's: bottom "
                        "13-512-256-128, top 479-1024-1024-512-256-1)")
    p.add_argument("--rate", type=positive_float, nargs="+", default=[0.7e6, 1.0e6, 1.9e6],
                   help="one GPU's samples/s of the whole step (not measured here: see the description)")
    p.add_argument("--node-gbps", type=positive_float, default=450.0, help="GB/s a GPU sends within its node (NVLink)")
    p.add_argument("--nic-gbps", type=positive_float, default=50.0,
                   help="GB/s a GPU sends to other nodes (400 Gb/s NIC)")
    p.add_argument("--best-split", action=argparse.BooleanOptionalAction, default=True,
                   help="also project each world size with the --row-wise-rows threshold that projects fastest "
                        "(more tables split by rows: lookups even, more partial sums sent)")
    add_output_arguments(p, "projection")
    p.set_defaults(func=run)
    return p


def send_matrix(shards, world: int, batch: int, dim: int) -> list[list[float]]:
    """`m[a][b]`: bytes rank a sends rank b a step for a one-hot batch: the routing block of
    lengths and ids to each owner (`scaling.ids_bytes`), pooled embeddings back and their
    gradients out again (float32). The model of `bench scaling`, rank by rank."""
    from embcache.bench.scaling import ids_bytes
    from embcache.partition import slice_bounds

    local = [slice_bounds(batch, world, r)[1] - slice_bounds(batch, world, r)[0] for r in range(world)]
    send = [list(row) for row in ids_bytes(shards, world, batch)]
    for s in shards:
        for r in range(world):
            if r != s.rank:
                send[s.rank][r] += 2 * local[r] * len(s.features) * dim * 4
    return send


def rank_bytes(shards, world: int, batch: int, dim: int, dense_params: int) -> list[dict]:
    """Per rank: bytes exchanged with each rank (the larger of sent and received: an
    all-to-all is bound by the busier direction) and its share of DDP's ring all-reduce."""
    send = send_matrix(shards, world, batch, dim)
    ring = 2 * (world - 1) / world * 4 * dense_params if world > 1 else 0.0
    return [{"to": [max(send[r][b], send[b][r]) for b in range(world)], "allreduce": ring} for r in range(world)]


def project(cardinalities: list[int], world: int, per_node: int, batch: int, dim: int, dense_params: int,
            rate: float, node_gbps: float, nic_gbps: float, row_wise_rows: int | None = None) -> dict:
    """One world size's projection (see the module docstring), the tables placed as the
    trainer places them with `--row-wise-rows row_wise_rows` (None: its default)."""
    from embcache.distributed import placement

    tables = [placement.TableLoad(f"t{i}", (f"f{i}",), rows, float(batch)) for i, rows in enumerate(cardinalities)]
    shards = placement.plan(tables, world, row_wise_rows)
    lookups = [0.0] * world
    for s in shards:
        lookups[s.rank] += batch * s.rows / s.table_rows
    imbalance = max(lookups) / (sum(lookups) / world)
    t_compute = batch / (world * rate) * imbalance
    per_rank = rank_bytes(shards, world, batch, dim, dense_params)
    t_links = []
    for r, b in enumerate(per_rank):
        node = r // per_node
        inside = sum(v for k, v in enumerate(b["to"]) if k // per_node == node)
        across = sum(v for k, v in enumerate(b["to"]) if k // per_node != node)
        # the all-reduce's ring crosses the NICs once there are several nodes
        ring_inside = b["allreduce"] / (node_gbps * 1e9) if world <= per_node else 0.0
        ring_across = b["allreduce"] / (nic_gbps * 1e9) if world > per_node else 0.0
        t_links.append((inside / (node_gbps * 1e9) + ring_inside, across / (nic_gbps * 1e9) + ring_across))
    t_inside, t_across = max(t_links, key=sum)
    t_link = t_inside + t_across
    t_one = batch / rate
    return {"gpus": world, "rate_per_gpu": rate, "row_wise_rows": row_wise_rows,
            "split_tables": len({s.table for s in shards if not s.whole}), "imbalance": imbalance, "compute_ms": t_compute * 1e3,
            "link_ms": t_link * 1e3, "bytes_per_rank_mib": max(sum(b["to"]) + b["allreduce"] for b in per_rank) / 2**20,
            "speedup_no_overlap": t_one / (t_compute + t_link), "speedup_full_overlap": t_one / max(t_compute, t_link),
            "binds": "compute" if t_compute >= t_link else ("NVLink" if t_inside >= t_across else "NIC")}


def best_split(cardinalities: list[int], world: int, *args) -> dict:
    """The projection at `world` for the `--row-wise-rows` threshold that projects fastest
    (no overlap; a tie to the fewer split tables). Table-wise placement balances lookups
    only to a whole table (26 one-hot tables on 8 ranks: 3 or 4 a rank), so splitting a few
    more tables by rows evens the lookups, at the price of more pooled partial sums on the
    links: this weighs the two with the same model."""
    candidates = [None, *sorted({c - 1 for c in cardinalities if c > 1}, reverse=True)]
    best = None
    for threshold in candidates:
        r = project(cardinalities, world, *args, row_wise_rows=threshold)
        if best is None or r["speedup_no_overlap"] > best["speedup_no_overlap"] + 1e-12:
            best = r
    return best


def run(args) -> int:
    from embcache.train.bench_results import write_json
    from embcache.data.synthetic import CRITEO_KAGGLE_CARDINALITIES

    hardware = (args.gpus_per_node, args.batch_size, args.embedding_dim, args.dense_params)
    links = (args.node_gbps, args.nic_gbps)
    rows = [{**project(list(CRITEO_KAGGLE_CARDINALITIES), n, *hardware, rate, *links), "placement": "default"}
            for rate in args.rate for n in args.gpus]
    if args.best_split:
        rows += [{**best_split(list(CRITEO_KAGGLE_CARDINALITIES), n, *hardware, rate, *links), "placement": "best split"}
                 for rate in args.rate for n in args.gpus if n > 1]
    print(NOTHING_MEASURED)  # a table of GPU figures from a CPU-only command: said before it
    print(f"DLRM, Criteo-Kaggle shape ({len(CRITEO_KAGGLE_CARDINALITIES)} tables, {sum(CRITEO_KAGGLE_CARDINALITIES):,} "
          f"rows, dim {args.embedding_dim}), global batch {args.batch_size:,}; {args.gpus_per_node} GPUs a node, "
          f"{args.node_gbps:g} GB/s inside, {args.nic_gbps:g} GB/s between nodes")
    print("| GPUs | one GPU's samples/s | placement (--row-wise-rows: tables split) | compute ms | link ms | "
          "MiB a rank | imbalance | speed-up (no overlap - full overlap) | binds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        where = f"{r['row_wise_rows'] or 'default'}: {r['split_tables']}"
        print(f"| {r['gpus']} | {r['rate_per_gpu'] / 1e6:.1f} M | {where} | {r['compute_ms']:.2f} | {r['link_ms']:.2f} | "
              f"{r['bytes_per_rank_mib']:.1f} | {r['imbalance']:.2f} | {r['speedup_no_overlap']:.2f} - "
              f"{r['speedup_full_overlap']:.2f} | {r['binds']} |")
    config = {k: v for k, v in vars(args).items() if k != "func"}
    path = write_json({"benchmark": "projection", "measured": NOTHING_MEASURED, "config": config, "results": rows},
                      args.name, args.out)
    print(f"wrote {path}")
    return 0
