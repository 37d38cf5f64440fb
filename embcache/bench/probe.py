"""`embcache bench probe`: what this machine's device and link give the cache, in half a minute.

- the device, torch, CUDA and Triton versions;
- a plain pinned host->device copy, in GB/s (what bulk copies of gathered rows reach);
- random rows of 64, 128 and 512 bytes gathered from pinned host memory through the
  device's unified view (a CUDA tensor over the pinned pages, no host thread in the loop),
  and as many distinct rows scattered back, in GB/s and rows/s, each checked byte for byte
  (`gathered_right`, `written_right`): the rate a device-side cache's misses and
  write-backs can reach; on CUDA also the same gather by the device bookkeeper's Triton row
  kernel handed the pinned tensor itself (the fallback where torch refuses the view); and
  one row read as many times
  (what a masked entry costs the device bookkeeper's tensor-op link, `same_row_reads`);
- `torch.sort` (and its stable form) of 16,384 x 26 and 16,384 x 214 int64 ids: a batch
  of Kaggle one-hot and of MLPerf multi-hot, the ids a device-side dedup sorts each step.

On the CPU the same measurements run over ordinary memory: they prove the code, not a link.
Writes probe.json (--name) under --out.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments

BATCH = 16384
IDS_PER_SAMPLE = {"one-hot": 26, "multi-hot": 214}


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.arg_types import positive_int
    from embcache.train.run_cli import add_device_argument

    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table-mib", type=positive_int, default=4096,
                   help="pinned host table the random rows come from (larger than any device cache)")
    p.add_argument("--rows", type=positive_int, default=1 << 20, help="random rows per gather and scatter")
    p.add_argument("--copy-mib", type=positive_int, default=256, help="size of the plain pinned copy")
    p.add_argument("--batch-size", type=positive_int, default=BATCH, help="samples whose ids are sorted")
    add_device_argument(p)
    add_output_arguments(p, "probe")
    p.set_defaults(func=run)
    return p


def versions(device) -> dict:
    import torch

    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, device_memory_gib=props.total_memory / 2**30)
    return info


def run(args) -> int:
    import torch

    from embcache.bench import link
    from embcache.train.bench_results import write_json
    from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES
    from embcache.device import device_argument

    device = device_argument(args.device)
    result = {"benchmark": "probe", **versions(device), "config": {k: v for k, v in vars(args).items() if k != "func"}}
    print(f"probe on {device}: torch {result['torch']}, cuda {result['cuda']}, triton {result['triton']}"
          + (f", {result['device_name']}" if "device_name" in result else ""), flush=True)
    gbps = link.pinned_copy_gbps(device, args.copy_mib)
    result["pinned_copy_gbps"] = gbps
    if gbps is not None:
        print(f"  pinned copy host->device: {gbps:.1f} GB/s", flush=True)
    table = link.host_table(args.table_mib * 2**20, device)
    # on the CPU there is no link and no unified view: the rows come from ordinary memory, and the label says so
    over = "through the unified view" if device.type == "cuda" else "from ordinary memory (CPU: no link)"
    try:
        rows = []
        for row_bytes in link.ROW_BYTES:
            r = link.random_rows(table, row_bytes, device, min(args.rows, table.numel() * 4 // row_bytes))
            rows.append(r)
            print(f"  random {row_bytes:3d}-byte rows {over}: gather {r['gather_gbps']:.1f} GB/s "
                  f"({r['gather_rows_per_s'] / 1e6:.1f} M rows/s), scatter {r['scatter_gbps']:.1f} GB/s; "
                  f"bytes right: {r['gathered_right'] and r['written_right']}", flush=True)
        result["unified_view"] = {"ok": all(r["gathered_right"] and r["written_right"] for r in rows), "rows": rows,
                                  "measured": over}
        same = link.same_row_reads(table, 512, device, min(args.rows, table.numel() * 4 // 512))
        same["vs_random_rows"] = same["same_row_rows_per_s"] / rows[-1]["gather_rows_per_s"]
        result["same_row_reads"] = same
        print(f"  one 512-byte row read {same['rows']:,} times: {same['same_row_rows_per_s'] / 1e6:.1f} M rows/s "
              f"(x{same['vs_random_rows']:.1f} random rows: the tensor-op link's cost of a masked entry)", flush=True)
    except (RuntimeError, ValueError, TypeError) as e:  # the torch at hand cannot map the pages: say how
        result["unified_view"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"  unified view failed: {result['unified_view']['error']}", flush=True)
    if device.type == "cuda":  # the Triton gather of the same rows: the fallback, and a check of torch's kernel
        try:
            rows = [link.triton_random_rows(table, b, device, min(args.rows, table.numel() * 4 // b))
                    for b in link.ROW_BYTES]
            result["triton_gather"] = {"ok": all(r["gathered_right"] for r in rows), "rows": rows}
            print("  Triton gather of the same rows: " + ", ".join(
                f"{r['row_bytes']} B {r['gather_gbps']:.1f} GB/s" for r in rows), flush=True)
        except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
            result["triton_gather"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(f"  Triton gather failed: {result['triton_gather']['error']}", flush=True)
    del table
    result["sorts"] = []
    for shape, per_sample in IDS_PER_SAMPLE.items():
        s = link.sort_ms(device, args.batch_size * per_sample, sum(CRITEO_KAGGLE_CARDINALITIES))
        result["sorts"].append({"shape": shape, **s})
        print(f"  sort of {s['ids']:,} int64 ids ({shape}): {s['sort_ms']:.2f} ms, stable {s['stable_sort_ms']:.2f} ms",
              flush=True)
    if device.type == "cuda":
        result["peak_device_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    path = write_json(result, args.name, args.out)
    print(f"wrote {path}")
    return 0
