"""Benchmarks. Each compares its variants side by side in one run (ratios, not absolute
seconds) and writes JSON, and a PNG where a picture helps, under bench/results/."""

# name -> (module that builds its parser, one-line help); the parsers' modules import no torch
# (`--help` answers at once), a benchmark's work is imported when it runs
COMMANDS: dict[str, tuple[str, str]] = {
    "cache": ("embcache.bench.cache_cli", "hit rate of freq/lfu/lru vs Belady, bytes moved, bookkeeping cost"),
    "dlrm": ("embcache.dlrm.bench", "DLRM throughput: cached (0.5/1.5/5 %) vs whole tables on device / on host"),
    "cf": ("embcache.cf.bench", "HEAT vs the PyTorch reference: epoch time (1 and all threads, tiling on/off), Recall@20, memory traffic"),
    "scaling": ("embcache.bench.scaling", "DLRM and face training at 1, 2 (4) gloo ranks on CPU: samples/s vs 1 rank, bytes sent per step vs a model"),
    "tiers": ("embcache.bench.tiers_cli", "host store tiers: mmap vs memory store samples/s, and a table larger than RAM (--big-gib) with peak RSS and disk reads"),
    "gpu": ("embcache.bench.gpu_cli", "DLRM on one GPU (torch only): cached 0.5/1.5/5 % vs whole tables on the GPU, link use, prefetch"),
    "kernels": ("embcache.bench.kernels_cli", "the embedding kernels alone: Triton's lookup and fused backward + Adagrad vs torch's sparse path, as shares of the copy bandwidth"),
    "loader": ("embcache.bench.loader_cli", "the loader alone: rows/s of prepared Criteo-shaped shards at 1, 2, 4 reader threads, batches checked against one thread's"),
    "probe": ("embcache.bench.probe", "the device and link in half a minute: versions, pinned copy, random host rows through the unified view, id sorts"),
    "host": ("embcache.bench.host_cli", "the cache's host ceiling: samples/s of host work alone (rows on `meta`), one-hot and multi-hot, threads 1..all"),
    "face": ("embcache.face.bench_cli", "face head: step time and memory of fc / pfc 0.1 / dcp 1 % and 10 % vs classes, and accuracy"),
    "vocab": ("embcache.bench.vocab_cli", "raw keys day after day: next-day AUC, memory and speed of open tables vs a day-0 vocabulary and hashing"),
    "projection": ("embcache.bench.projection", "DLRM at 8 GPUs a node and beyond: samples/s vs one GPU from the bytes a step sends, link by link"),
}
