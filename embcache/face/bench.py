"""The work of `embcache bench face`: the face heads' step time and memory against the
number of classes, and their accuracy. What it measures and how is the command's description,
the docstring of `embcache.face.bench_cli` (which holds the flags and imports this module only
to run)."""
from __future__ import annotations

import logging
import math
import os
import time

import torch
import torch.nn.functional as F

from embcache.device import device_argument

VARIANTS = (("fc", None), ("pfc", 0.1), ("dcp", 0.01), ("dcp", 0.1))
FIXED_Q = 10_000  # a pool of fixed size besides the fixed ratios: the flat line


def label(head: str, rate) -> str:
    if head == "fc":
        return "fc"
    if head == "pfc":
        return f"pfc {rate:g}"
    return f"dcp Q={rate:,}" if rate >= 1 else f"dcp {rate:.0%}"


def num_slots(rate, classes: int) -> int:
    """dcp pool size: a fraction of the classes, or a fixed number of slots when >= 1."""
    return min(int(rate), classes) if rate >= 1 else math.ceil(rate * classes)


def persistent_bytes(head: str, rate, classes: int, dim: int) -> int:
    if head == "fc":
        return 3 * classes * dim * 4  # weight, gradient, momentum
    if head == "pfc":
        return 2 * classes * dim * 4  # weight, momentum
    return num_slots(rate, classes) * (2 * dim * 4 + 8 * 5)


class PeakHostMemory:
    """The most host memory the process held inside `with`, above what it held on entry
    (`added_bytes`): the kernel's resident high-water mark (VmHWM) is reset on entry
    (`/proc/self/clear_refs`) after freed heap is given back (`malloc_trim`), so the mark is
    this block's, not an earlier configuration's. None where Linux's /proc is not there. On
    CUDA, `device_added_bytes` is the allocator's peak above what was allocated on entry."""

    def __init__(self, device=None):
        self.device = device
        self.added_bytes = self.peak_bytes = self.device_added_bytes = None

    @staticmethod
    def _status(field: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                line = next(x for x in f if x.startswith(field + ":"))
        except (OSError, StopIteration):
            return None
        return int(line.split()[1]) * 1024

    def __enter__(self) -> "PeakHostMemory":
        import ctypes
        import gc

        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._start = self._status("VmRSS")
        except (OSError, AttributeError):
            self._start = None
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._device_start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> None:
        peak = self._status("VmHWM") if self._start is not None else None
        if peak is not None:
            self.peak_bytes, self.added_bytes = peak, max(0, peak - self._start)
        if self.device is not None and self.device.type == "cuda":
            self.device_added_bytes = torch.cuda.max_memory_allocated(self.device) - self._device_start


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_head(head_kind: str, rate, classes: int, batch: int, dim: int, repeats: int, device) -> dict:
    from embcache.face.head_factory import build_head
    from embcache.face.trainer import head_state_bytes

    gen = torch.Generator().manual_seed(0)
    ratio = num_slots(rate, classes) / classes if head_kind == "dcp" else 0.1
    head = build_head(head_kind, classes, dim, pool_ratio=ratio, sample_rate=rate or 0.1, device=device)
    opt = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4) if head_kind == "fc" else None
    pairs = batch // 4
    times, saved, grads = [], 0, 0
    for step in range(repeats + 1):
        labels = torch.randint(0, classes, (batch,), generator=gen).to(device)
        pair_labels = labels[:pairs]
        labels[pairs:2 * pairs] = pair_labels  # the second views of the pairs
        feats = torch.randn(batch, dim, generator=gen).to(device).requires_grad_()
        gallery = F.normalize(torch.randn(2 * pairs, dim, generator=gen), dim=1).to(device)
        seen: dict[int, int] = {}

        def pack(t):
            try:
                key = t.untyped_storage().data_ptr()
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
            except RuntimeError:
                pass
            return t

        _sync(device)
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if head_kind == "dcp":
                head.update_pool(torch.cat([pair_labels, pair_labels]), gallery)
                positives = torch.cat([gallery[pairs:], gallery[:pairs], torch.zeros(batch - 2 * pairs, dim,
                                                                                     device=device)])
                has_pos = torch.arange(batch, device=device) < 2 * pairs
                loss = head.loss(feats, labels, positives, has_pos)
            else:
                loss = head.loss(feats, labels)
        if opt is not None:
            opt.zero_grad(set_to_none=False)
        loss.backward()
        if head_kind == "fc":
            grads = head.weight.grad.numel() * 4
            opt.step()
        elif head_kind == "pfc":
            grads = head._sub.grad.numel() * 4
        head.after_backward(0.1)
        _sync(device)
        if step:  # the first step is a warm-up (allocations, optimizer state)
            times.append(time.perf_counter() - start)
        saved = max(saved, sum(seen.values()))
    state = head_state_bytes(head, opt)
    if head_kind == "fc":
        state -= head.weight.grad.numel() * 4 if head.weight.grad is not None else 0  # counted under grads
    times.sort()
    return {"step_ms": 1e3 * times[len(times) // 2], "step_ms_all": [1e3 * t for t in times],
            "state_bytes": state, "saved_activation_bytes": saved, "grad_bytes": grads,
            "head_peak_bytes": state + saved + grads}


def peak_fields(peak: PeakHostMemory) -> dict:
    out = {"peak_host_added_bytes": peak.added_bytes, "peak_host_bytes": peak.peak_bytes}
    if peak.device_added_bytes is not None:
        out["peak_device_added_bytes"] = peak.device_added_bytes
    return out


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"+{n / 2**20:,.1f} MiB"


def accuracy_runs(classes: int, epochs: int, device) -> dict:
    from embcache.face.trainer import FaceConfig, FaceTrainer

    out = {}
    for head, rate in VARIANTS:
        cfg = FaceConfig(head=head, num_classes=classes, batch_size=64, epochs=epochs, pool_ratio=rate or 0.1,
                         sample_rate=rate or 0.1, progress=False, device=str(device))
        q = math.ceil((rate or 0) * classes)
        if head == "dcp" and q < cfg.batch_size // 4:
            out[label(head, rate)] = {"skipped": f"pool of {q} slots < {cfg.batch_size // 4} identities per step"}
            print(f"  accuracy {label(head, rate):8s} skipped ({out[label(head, rate)]['skipped']})")
            continue
        start = time.perf_counter()
        with PeakHostMemory(device) as peak:
            s = FaceTrainer(cfg).fit()
        m = s["final"]["synthetic"]
        out[label(head, rate)] = {"verification_accuracy": m["accuracy"], "accuracy_std": m["accuracy_std"],
                                  "tar@far=1e-3": m["tar@far=0.001"], "identification_top1": m["identification_top1"],
                                  "steps": s["steps"], "train_seconds": time.perf_counter() - start,
                                  **peak_fields(peak)}
        print(f"  accuracy {label(head, rate):8s} {m['accuracy']:.4f}  ({s['steps']} steps, process peak "
              f"{mib(peak.added_bytes)})")
    return out


def fc_over_dcp1(rows: list[dict], classes: list[int]) -> dict:
    """The full FC head's step time over the 1 % pool's at each number of classes both ran,
    said as well as saved: the comparison the benchmark is for."""
    by = {(r["head"], r["classes"]): r for r in rows}
    ratios = {}
    for c in classes:
        fc, dcp = by.get(("fc", c), {}), by.get(("dcp 1%", c), {})
        if "step_ms" in fc and "step_ms" in dcp:
            ratios[str(c)] = fc["step_ms"] / dcp["step_ms"]
    if ratios:
        print("fc / dcp 1% head step time: " + ", ".join(f"{int(c):,} classes {r:.2f}x" for c, r in ratios.items()))
    return ratios


def run(args) -> int:
    from embcache.train.bench_results import write_json
    from embcache.threads import set_threads

    set_threads(args.threads)
    device = device_argument(args.device)  # cuda without a GPU, a name that is no device: one line
    load_before = os.getloadavg()
    # an unmeasured small step first: imports and torch's first-use buffers are no row's
    time_head("fc", None, 100, args.batch_size, args.feat_dim, 1, device)
    rows = []
    for classes in args.classes:
        for head, rate in VARIANTS + (("dcp", FIXED_Q),):
            name = label(head, rate)
            need = persistent_bytes(head, rate, classes, args.feat_dim)
            row = {"head": name, "classes": classes}
            if head == "dcp":
                row["slots"] = num_slots(rate, classes)
            if need > args.max_gib * 2**30:
                row["skipped"] = f"persistent state {need / 2**30:.1f} GiB > --max-gib {args.max_gib:g}"
                print(f"{name:12s} {classes:>10,}  skipped ({row['skipped']})")
            else:
                with PeakHostMemory(device) as peak:
                    row.update(time_head(head, rate, classes, args.batch_size, args.feat_dim, args.repeats, device))
                row.update(peak_fields(peak))
                print(f"{name:12s} {classes:>10,}  {row['step_ms']:9.2f} ms/step  head memory "
                      f"{row['head_peak_bytes'] / 2**20:9.1f} MiB, process peak {mib(peak.added_bytes)}"
                      + (f", device peak {mib(peak.device_added_bytes)}" if peak.device_added_bytes is not None
                         else ""))
            rows.append(row)
    accuracy = {}
    if args.accuracy_classes:
        print(f"accuracy on the synthetic task ({args.accuracy_classes:,} identities, {args.accuracy_epochs} epochs):")
        accuracy = accuracy_runs(args.accuracy_classes, args.accuracy_epochs, device)
    ratios = fc_over_dcp1(rows, args.classes)
    payload = {"benchmark": "face head: step time and memory vs number of classes",
               "device": str(device), "batch_size": args.batch_size, "feat_dim": args.feat_dim,
               "repeats": args.repeats, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
               "memory_method": "persistent state (weights or pool + table + LRU keys + optimizer state) + tensors "
                                "saved for backward in one step (saved_tensors_hooks, per storage) + gradients "
                                "received by the head; counted from tensor sizes",
               "peak_memory_method": "peak_host_added_bytes: the process's resident high-water mark (VmHWM, reset "
                                     "through /proc/self/clear_refs after malloc_trim) while the configuration "
                                     "built its head and ran its steps, less its resident memory before; "
                                     "peak_host_bytes: that mark itself; on CUDA peak_device_added_bytes: "
                                     "max_memory_allocated above what was allocated before",
               "timing_method": "median of --repeats head steps after one warm-up; the backbone is left out",
               "rows": rows, "fc_over_dcp1_step_time": ratios,
               "accuracy": {"classes": args.accuracy_classes, "epochs": args.accuracy_epochs, "batch_size": 64,
                            "results": accuracy}}
    name = args.name or ("face" if device.type == "cpu" else "face-cuda")
    path = write_json(payload, name, args.out_dir)
    plot(rows, path.with_suffix(".png"), device)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def plot(rows: list[dict], path, device) -> None:
    # matplotlib logs each math font it lacks ("findfont: ... not found") while drawing: a
    # fallback that changes nothing in the figure, kept out of the benchmark's output
    fonts = logging.getLogger("matplotlib.font_manager")
    level = fonts.level
    fonts.setLevel(logging.ERROR)
    try:
        _plot(rows, path, device)
    finally:
        fonts.setLevel(level)


def _plot(rows: list[dict], path, device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["head"] for r in rows):
        pts = [r for r in rows if r["head"] == name and "step_ms" in r]
        if not pts:
            continue
        xs = [r["classes"] for r in pts]
        axes[0].plot(xs, [r["step_ms"] for r in pts], marker="o", label=name)
        axes[1].plot(xs, [r["head_peak_bytes"] / 2**20 for r in pts], marker="o", label=name)
    for ax, title in zip(axes, ("head step time (ms)", "head memory (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of classes")
        ax.set_title(f"{title}, {device.type}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
