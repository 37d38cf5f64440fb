"""The work of `embcache bench tiers`: the memory store against the memory-mapped store,
and a table larger than memory trained through the cache. What it measures and how is the
command's description, the docstring of `embcache.bench.tiers_cli` (which holds the flags
and imports this module only to run)."""
from __future__ import annotations

import gc
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from embcache.threads import set_threads
from embcache.train.bench_results import write_json

ROW_STATE = 2  # Adagrad: one float32 accumulator per weight: a row costs 2 x dim x 4 bytes


def zipf_ids(num_rows: int, count: int, rng: np.random.Generator, a: float = 1.1) -> torch.Tensor:
    """`count` Zipf ids over `num_rows` rows, the popular ones scattered over the table."""
    ranks = (rng.zipf(a, count) - 1) % num_rows
    return torch.from_numpy((ranks * 2_654_435_761 + 12_345) % num_rows)


def _memory_now() -> dict:
    """Resident memory of this process now, in MiB: anonymous, file-backed (mapped pages)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def _io_now() -> dict:
    io = {}
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            key, _, value = line.partition(":")
            io[key] = int(value)
    except OSError:
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"read_bytes": io.get("read_bytes", 0), "write_bytes": io.get("write_bytes", 0),
            "major_faults": usage.ru_majflt}


def batches(num_rows: int, steps: int, args, seed: int):
    """(ids, offsets, target) of `steps` batches of sum-pooled bags, made as they are
    consumed (their making is not timed)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(0, args.batch_size * args.bag_size, args.bag_size)
    for _ in range(steps):
        yield (zipf_ids(num_rows, args.batch_size * args.bag_size, rng), offsets,
               torch.randn(args.batch_size, args.dim, generator=gen))


def train(bag, work: list, sample_memory: bool = False) -> dict:
    """Train on `work` (from `batches`); samples/s, and the peak resident memory seen
    between steps when asked."""
    peak = {"RssAnon": 0.0, "RssFile": 0.0}
    io0, elapsed, steps = _io_now(), 0.0, 0
    for ids, offsets, target in work:
        steps += 1
        t0 = time.perf_counter()
        (bag(ids, offsets) * target).sum().backward()
        elapsed += time.perf_counter() - t0
        if sample_memory:
            for k, v in _memory_now().items():
                peak[k] = max(peak[k], v)
    io1 = _io_now()
    out = {"steps": steps, "seconds": elapsed, **{f"disk_{k}": io1[k] - io0[k] for k in io1}}
    if sample_memory:
        out.update(peak_rss_anon_mib=peak["RssAnon"], peak_rss_file_mib=peak["RssFile"])
    return out


def fitting_table(args, work: Path) -> dict:
    """Part 1: memory store vs mapped store on the same table, ids and cache, in
    alternating rounds (a shared machine's load falls on both alike)."""
    from embcache import CachedEmbeddingBag

    bags = {}
    for name, store in (("memory", "memory"), ("mmap", f"mmap:{work / 'fits'}")):
        torch.manual_seed(0)
        bags[name] = CachedEmbeddingBag(args.rows, args.dim, cache_ratio=args.cache_ratio, optimizer="adagrad",
                                        lr=0.05, eviction="lru", device="cpu", host_store=store)
    warm = list(batches(args.rows, 5, args, seed=1))
    for bag in bags.values():
        train(bag, warm)  # first-touch costs, allocator, compiled kernels
        bag.reset_cache_stats()
    work_batches = list(batches(args.rows, args.steps, args, seed=2))
    totals = {name: {"steps": 0, "seconds": 0.0} for name in bags}
    round_ratios = []  # per round, mmap samples/s over memory's on the same batches
    for r in range(args.rounds):
        part = work_batches[r * len(work_batches) // args.rounds: (r + 1) * len(work_batches) // args.rounds]
        seconds = {}
        for name in (("memory", "mmap") if r % 2 == 0 else ("mmap", "memory")):
            got = train(bags[name], part)
            totals[name]["steps"] += got["steps"]
            totals[name]["seconds"] += got["seconds"]
            seconds[name] = got["seconds"]
        round_ratios.append(seconds["memory"] / seconds["mmap"])
    results = {}
    for name, bag in bags.items():
        stats = bag.cache_stats()
        t = totals[name]
        results[name] = {**t, "samples_per_s": t["steps"] * args.batch_size / t["seconds"],
                         "hit_rate": stats["hit_rate"], "bytes_h2d": stats["bytes_h2d"]}
    same = torch.equal(bags["memory"].full_weight(), bags["mmap"].full_weight())
    del bags
    gc.collect()
    shutil.rmtree(work / "fits", ignore_errors=True)
    return {**results, "mmap_vs_memory": results["mmap"]["samples_per_s"] / results["memory"]["samples_per_s"],
            "mmap_vs_memory_median_of_rounds": float(np.median(round_ratios)), "round_ratios": round_ratios,
            "tables_equal": same}


def big_table(args, work: Path) -> dict:
    """Part 2: a table of `--big-gib` GiB (rows + Adagrad state) on disk, trained through
    the cache; the files' pages are dropped from the page cache before training, so the
    run starts from the disk."""
    from embcache import CachedEmbeddingBag

    rows = int(args.big_gib * 2**30 // (args.dim * 4 * ROW_STATE))
    directory = work / "big"
    t0 = time.perf_counter()
    torch.manual_seed(0)
    bag = CachedEmbeddingBag(rows, args.dim, cache_ratio=args.cache_ratio, optimizer="adagrad", lr=0.05,
                             eviction="lru", warmup_ratio=0.0, device="cpu", host_store=f"mmap:{directory}")
    create_s = time.perf_counter() - t0
    file_bytes = sum(f.stat().st_size for f in directory.glob("*.bin"))
    _drop_from_page_cache(directory)
    try:
        work_batches = batches(rows, args.big_steps, args, seed=3)
        result = train(bag, work_batches, sample_memory=True)
        stats = bag.cache_stats()
        result.update(samples_per_s=result["steps"] * args.batch_size / result["seconds"],
                      hit_rate=stats["hit_rate"], evictions=stats["evictions"], bytes_h2d=stats["bytes_h2d"],
                      bytes_d2h=stats["bytes_d2h"])
        # each row loaded reads about one page of each table file (a 256-byte row never straddles one):
        # the share of those reads the page cache served, by the major faults
        page_reads = stats["bytes_h2d"] // bag.cache.host.row_bytes() * len(bag.cache.host.tensors())
        result["page_cache_hit_rate_est"] = 1 - result["disk_major_faults"] / max(page_reads, 1)
    finally:
        del bag
        gc.collect()
        shutil.rmtree(directory, ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"rows": rows, "dim": args.dim, "file_bytes": file_bytes, "file_gib": file_bytes / 2**30,
            "ram_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "cache_rows": int(np.ceil(args.cache_ratio * rows)), "create_seconds": create_s,
            "peak_rss_mib_getrusage": usage.ru_maxrss / 1024, **result}


def _drop_from_page_cache(directory: Path) -> None:
    """Write the files' dirty pages and drop their clean pages from the page cache (ours
    only), so that training starts from the disk rather than from the fill's pages."""
    for path in directory.glob("*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(args) -> int:
    set_threads(args.threads)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="embcache-tiers-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        fits = fitting_table(args, work)
        print(f"table of {args.rows:,} x {args.dim} (+ Adagrad), cache {args.cache_ratio:.1%}: "
              f"memory {fits['memory']['samples_per_s']:,.0f} samples/s, mmap {fits['mmap']['samples_per_s']:,.0f} "
              f"samples/s (x{fits['mmap_vs_memory']:.2f}; median of {args.rounds} rounds "
              f"x{fits['mmap_vs_memory_median_of_rounds']:.2f})", flush=True)
        payload = {"benchmark": "tiers", "config": {k: v for k, v in vars(args).items() if k != "func"},
                   "fits_in_memory": fits, "complete": False}
        if args.big_gib > 0:
            write_json(payload, args.name, args.out)  # part 2 takes long: a run cut short keeps part 1
            big = big_table(args, work)
            payload["larger_than_memory"] = big
            print(f"table of {big['file_gib']:.1f} GiB on disk ({big['rows']:,} rows), RAM {big['ram_gib']:.1f} GiB: "
                  f"{big['samples_per_s']:,.0f} samples/s over {big['steps']} batches, hit rate {big['hit_rate']:.3f}, "
                  f"peak RSS anon {big['peak_rss_anon_mib']:,.0f} MiB + mapped file pages "
                  f"{big['peak_rss_file_mib']:,.0f} MiB, read from disk {big['disk_read_bytes'] / 2**30:.2f} GiB",
                  flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    payload["complete"] = True
    path = write_json(payload, args.name, args.out)
    print(f"wrote {path}")
    return 0
