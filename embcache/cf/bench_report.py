"""`bench cf`'s report: one line a variant, the table of a run's cases, and the plot
(bench/results/cf.png)."""
from __future__ import annotations

BASELINE = "heat per-sample, tiling"  # the kernel before runs (HeatOptions.kernel = "sample")


def format_cost(c: dict) -> str:
    return (f"exclusion cost, heat tiling {c['threads']:>2} thr: {c['epoch_s_unseen']:.3f} s (unseen) / "
            f"{c['epoch_s_all']:.3f} s (all) = {c['time_ratio_unseen_vs_all']:.3f}, {c['epochs']} interleaved epochs "
            f"each; {c['redraws_per_sample']:.2f} redraws and {c['seen_negatives_per_sample']:.4f} own items kept "
            f"per sample")


def variant_name(r: dict) -> str:
    return r["variant"] + (", all items" if r.get("negatives_from") == "all" else "")


def format_row(r: dict) -> str:
    s = f"{variant_name(r):23s} {r['threads']:>2} thr  {r['epoch_s']:9.3f} s/epoch  {r['samples_per_s']:>12,.0f} pairs/s"
    if "recall_at_20" in r:
        s += f"  Recall@20 {r['recall_at_20']:.4f}  NDCG@20 {r['ndcg_at_20']:.4f}"
    if "best_recall_at_20" in r:
        s += f"  (best epoch: {r['best_recall_at_20']:.4f} / {r['best_ndcg_at_20']:.4f})"
    if "timed_on" in r:
        s += "  (subset timing, projected)"
    if "touched_rate_vs_copy_bandwidth" in r:
        s += (f"  touched {r['bytes_per_epoch']['bytes'] / 2**30:.2f} GiB/epoch "
              f"({r['touched_rate_vs_copy_bandwidth']:.0%} of copy bw), DRAM model "
              f"{r['dram_model_bytes_per_epoch']['bytes'] / 2**30:.2f} GiB "
              f"({r['dram_model_fraction_of_copy_bandwidth']:.0%})")
    return s


def fmt_topk(t: dict) -> str:
    times = ", ".join(f"{b} {t[f'{b}_s']:.2f} s" for b in ("torch", "faiss") if f"{b}_s" in t)
    return times + f" (faster: {t['faster']})" + "".join(f"; {b} not installed" for b in t.get("missing", []))


def print_table(cases: list[dict]) -> None:
    head = (f"{'data':9s} {'d':>3} {'K':>5} {'engine':23s} {'thr':>3} {'s/epoch':>9} {'pairs/s':>11} {'x torch':>8} {'x before':>8} "
            f"{'Recall@20':>9} {'NDCG@20':>8} {'touched':>7} {'%copy':>5} {'DRAM<=':>7} {'%copy':>5}")
    print("\n" + head)
    print("-" * len(head))
    for c in cases:
        for r in c["rows"] + c.get("baseline_rows", []) + c.get("old_rule_rows", []):
            sp = f"{r['speedup_vs_torch']:.1f}" if "speedup_vs_torch" in r else "1*" if "timed_on" in r else "1"
            xb = f"{r['speedup_vs_per_sample']:.2f}" if "speedup_vs_per_sample" in r else "-"
            rec = f"{r['recall_at_20']:.4f}" if "recall_at_20" in r else "-"
            nd = f"{r['ndcg_at_20']:.4f}" if "ndcg_at_20" in r else "-"
            gib = f"{r['bytes_per_epoch']['bytes'] / 2**30:.2f}" if "bytes_per_epoch" in r else "-"
            bw = f"{100 * r['touched_rate_vs_copy_bandwidth']:.0f}" if "touched_rate_vs_copy_bandwidth" in r else "-"
            dram = (f"{r['dram_model_bytes_per_epoch']['bytes'] / 2**30:.2f}" if "dram_model_bytes_per_epoch" in r
                    else "-")
            dbw = (f"{100 * r['dram_model_fraction_of_copy_bandwidth']:.0f}"
                   if "dram_model_fraction_of_copy_bandwidth" in r else "-")
            print(f"{c['data']:9s} {c.get('dim', 64):>3} {c['negatives']:>5} {variant_name(r):23s} {r['threads']:>3} {r['epoch_s']:9.3f} "
                  f"{r['samples_per_s']:>11,.0f} {sp:>8} {xb:>8} {rec:>9} {nd:>8} {gib:>7} {bw:>5} {dram:>7} {dbw:>5}")
        print(f"{c['data']:9s} {'':>3} {'':>5} {'popularity':23s} {'':>3} {'':>9} {'':>11} {'':>8} "
              f"{c['popularity_recall_at_20']:>9.4f} {c['popularity_ndcg_at_20']:>8.4f}")
    for c in cases:
        for cost in c.get("exclusion_cost", []):
            print(f"{c['data']:9s} {c.get('dim', 64):>3} {c['negatives']:>5} " + format_cost(cost))
    print("negatives from the items each user has no training pair with, except rows marked \"all items\" "
          "(the rule before issue 23)")
    print(f"{BASELINE}: HEAT's per-sample kernel (before the runs kernel), measured in the same run; "
          f"x before: a runs-kernel row's speed-up over it on the same threads")
    print("touched: GiB of embedding rows a HEAT epoch accesses, %copy: their rate over the copy kernel's "
          "(not a DRAM fraction: tiled negatives are read from L2); DRAM<=: GiB the memory-traffic model says "
          "must come from beyond the tile (an upper bound), %copy: its share of the copy bandwidth")
    if any("timed_on" in r for c in cases for r in c["rows"]):
        print("* torch timed on a seeded subset of the training pairs, epoch time projected from its pairs/s; "
              "its accuracy is not measured there")


def plot(cases: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 4), squeeze=False)
    colors = {"torch": "tab:gray", BASELINE: "tab:green", "heat, no tiling": "tab:blue", "heat, tiling": "tab:orange"}
    for ax, c in zip(axes[0], cases):
        threads = sorted({r["threads"] for r in c["rows"]})
        all_rows = c["rows"] + c.get("baseline_rows", [])
        variants = [v for v in colors if any(r["variant"] == v for r in all_rows)]
        width = 0.8 / len(variants)
        for j, variant in enumerate(variants):
            ys = [next((r["epoch_s"] for r in all_rows if r["variant"] == variant and r["threads"] == t), 0)
                  for t in threads]
            xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(threads))]
            ax.bar(xs, ys, width, label=variant + (" (projected)" if variant == "torch" and any(
                "timed_on" in r for r in c["rows"]) else ""), color=colors[variant])
        ax.set_xticks(range(len(threads)), [f"{t} thread{'s' if t > 1 else ''}" for t in threads])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per epoch")
        ax.set_title(f"{c['data']}, d={c.get('dim', 64)}, K={c['negatives']}: {c['train_pairs']:,} pairs",
                     fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
