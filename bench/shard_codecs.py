"""The loader's rows/s from the same Criteo-shaped rows written with each Parquet codec.

Decoding Parquet is most of what a loader reader does (about 0.4 CPU-s a million rows with
zstd shards), and the GPU step at batch 65,536 wants millions of rows a second. This writes
one synthetic train split (`--rows`) once per codec with the writer every `data prepare`
uses (`CTRDatasetWriter(compression=...)`), then times the loader on each, one reader
thread, the codecs taking turns (`--repeats`, the best kept: the machine is shared), and
checks that every codec's batches equal the first's to the bit. Reports each codec's rows/s
and CPU-s a million rows, its shard bytes, and both as ratios to zstd (the codec before
lz4 became the default). Writes bench/results/shard_codecs.json.

    python bench/shard_codecs.py [--rows 1048576] [--codecs zstd lz4 none] [--repeats 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from embcache.bench.shard_feed import loader_rates  # noqa: E402
from embcache.data.ctr_format import SHARD_CODECS, CTRDatasetWriter, read_meta, sparse_features  # noqa: E402
from embcache.data.loader import CTRBatches  # noqa: E402
from embcache.data.synthetic import NUM_DENSE, generate_synthetic  # noqa: E402
from embcache.train.bench_results import write_json  # noqa: E402

BATCH = 65_536


def rewrite(base: Path, out: Path, codec: str) -> int:
    """`base`'s train split written again into `out` with `codec`; its shards' bytes."""
    meta = read_meta(base)
    writer = CTRDatasetWriter(out, NUM_DENSE, sparse_features(meta), source=f"{base} as {codec}",
                              splits=("train",), compression=codec)
    for name in meta["splits"]["train"]["files"]:
        for record in pq.ParquetFile(base / name).iter_batches(batch_size=BATCH):
            cols = [c.to_numpy() for c in record.columns]
            writer.write("train", cols[0], np.stack(cols[1:1 + NUM_DENSE], axis=1), cols[1 + NUM_DENSE:])
    writer.finish()
    return sum((out / f).stat().st_size for f in read_meta(out)["splits"]["train"]["files"])


def same_batches(dirs: list[Path], batches: int) -> bool:
    """Every directory's first `batches` batches equal the first directory's, to the bit."""
    import torch
    loaders = [CTRBatches(d, "train", BATCH, drop_last=True).host_batches() for d in dirs]
    for _ in range(batches):
        first, *others = [next(it) for it in loaders]
        for b in others:
            if not (torch.equal(b.dense.view(torch.int32), first.dense.view(torch.int32))
                    and torch.equal(b.labels, first.labels) and torch.equal(b.sparse.values(), first.sparse.values())):
                return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_048_576, help="train rows (16 batches of 65,536 by default)")
    p.add_argument("--codecs", nargs="+", default=["zstd", "lz4", "none"], choices=SHARD_CODECS)
    p.add_argument("--repeats", type=int, default=5, help="timed passes a codec, taking turns; the best is kept")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    batches = args.rows // BATCH
    if batches < 1:
        p.error(f"--rows must hold at least one batch of {BATCH:,}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        generate_synthetic(base, rows=args.rows, progress=False)
        dirs = {c: Path(tmp) / c for c in args.codecs}
        sizes = {c: rewrite(base, d, c) for c, d in dirs.items()}
        runs = {c: [] for c in args.codecs}
        for _ in range(args.repeats):  # taking turns: a busy moment of the machine hits every codec alike
            for c, d in dirs.items():
                runs[c].append(loader_rates(d, BATCH, batches, [1], repeats=1)[0])
        same = same_batches(list(dirs.values()), batches)
    rows = []
    for c in args.codecs:
        best = max(runs[c], key=lambda r: r["rows_per_s"])
        rows.append({"codec": c, "shard_bytes": sizes[c], "rows_per_s": best["rows_per_s"],
                     "cpu_s_per_million_rows": min(r["cpu_s_per_million_rows"] for r in runs[c])})
    ref = next((r for r in rows if r["codec"] == "zstd"), rows[0])
    for r in rows:
        r["speed_vs_" + ref["codec"]] = r["rows_per_s"] / ref["rows_per_s"]
        r["bytes_vs_" + ref["codec"]] = r["shard_bytes"] / ref["shard_bytes"]
        print(f"  {r['codec']:6s} {r['rows_per_s'] / 1e6:5.2f} M rows/s ({r['speed_vs_' + ref['codec']]:.2f}x "
              f"{ref['codec']}), {r['cpu_s_per_million_rows']:.2f} CPU-s a million rows, "
              f"{r['shard_bytes'] / 2**20:.1f} MiB ({r['bytes_vs_' + ref['codec']]:.2f}x)")
    print(f"  batches equal across codecs to the bit: {same}")
    path = write_json({"benchmark": "shard_codecs", "rows": batches * BATCH, "batch_size": BATCH, "readers": 1,
                       "repeats": args.repeats, "same_batches": same, "codecs": rows}, "shard_codecs", args.out)
    print(f"wrote {path}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
