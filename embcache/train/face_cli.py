"""`embcache face`: face classification with a dynamic class pool (F2C), or the full FC /
Partial FC baselines, on synthetic identities (the default: no download), an image folder
per identity, or MXNet RecordIO (`train.rec`/`train.idx`, as MS1MV2 and Glint360K ship)."""
from __future__ import annotations

import argparse
import json

from embcache.arg_types import (
    DefaultsHelpFormatter,
    fraction,
    int_in,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    ratio,
)
from embcache.errors import UserFacingError
from embcache.train.run_cli import (
    apply_threads,
    add_run_arguments,
    config_values,
    print_summary,
    refuse_existing_run,
    run_launched,
    run_rows,
)


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.nn.choices import BACKBONES, HEADS, MARGINS
    from embcache.train.face_config import FaceConfig

    d = FaceConfig()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fmt = DefaultsHelpFormatter
    p = sub.add_parser("train", help="train a face embedding (and evaluate it after each epoch)", formatter_class=fmt,
                       description="Train a probe net with the dcp / fc / pfc head. The progress bar shows loss, "
                                   "learning rate and pool occupancy; verification accuracy (10-fold), TAR@FAR "
                                   "and identification top-1 on held-out identities after each epoch; a summary "
                                   "at the end. Checkpoints are atomic and include the pool and its LRU state; "
                                   "--resume continues exactly where a killed run stopped.")
    p.add_argument("--data", default=d.data, help="'synthetic', an image folder (<dir>/<identity>/<image>), "
                                                  "or a directory with train.rec and train.idx")
    p.add_argument("--val", nargs="*", default=[], metavar="BIN",
                   help="verification .bin files (lfw.bin, cfp_fp.bin, agedb_30.bin) evaluated after each epoch")
    p.add_argument("--head", choices=HEADS, default=d.head,
                   help="dcp: dynamic class pool; fc: one weight row per class; pfc: Partial FC")
    p.add_argument("--num-classes", type=int_in(2), default=None,
                   help=f"synthetic: number of training identities (default {d.num_classes}); real data: the label "
                        f"space, labels must be below it (default there: max label + 1)")
    p.add_argument("--pool-ratio", type=ratio, default=d.pool_ratio, help="dcp: pool slots as a fraction of classes")
    p.add_argument("--sample-rate", type=ratio, default=d.sample_rate, help="pfc: class centres sampled per step")
    p.add_argument("--backbone", choices=("auto",) + BACKBONES, default=d.backbone,
                   help="auto: mlp for feature vectors, iresnet18 for images")
    p.add_argument("--feat-dim", type=positive_int, default=d.feat_dim, help="embedding size")
    p.add_argument("--margin-type", choices=MARGINS, default=d.margin_type)
    p.add_argument("--margin", type=non_negative_float, default=d.margin, help="additive angular (arcface) or cosine margin")
    p.add_argument("--scale", type=positive_float, default=d.scale, help="logit scale s")
    p.add_argument("--topk", type=positive_int, default=d.topk, help="dcp: k of the out-of-pool loss")
    p.add_argument("--gallery-momentum", type=fraction, default=d.gallery_momentum,
                   help="dcp: EMA momentum of the gallery net")
    p.add_argument("--batch-size", type=int_in(4), default=d.batch_size,
                   help="images per step: a quarter are identity pairs (two views each), the rest instances")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="SGD learning rate (cosine decay to 0)")
    p.add_argument("--weight-decay", type=non_negative_float, default=d.weight_decay)
    p.add_argument("--image-size", type=non_negative_int, default=d.image_size,
                   help="synthetic: 0 for feature vectors, S for S x S images; real data: crop size (0 = 112)")
    p.add_argument("--synthetic-samples", type=int_in(2), default=d.synthetic_samples, help="samples per synthetic identity")
    p.add_argument("--eval-classes", type=positive_int, default=d.eval_classes, help="held-out synthetic identities")
    add_run_arguments(p, "face", epochs=d.epochs, epochs_help="passes of the identity loader over the identities",
                      checkpoint_every=d.checkpoint_every)
    p.set_defaults(func=train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on held-out identities / verification files",
                       formatter_class=fmt, description="Load the probe net of a face checkpoint and report "
                                                        "verification (and, on synthetic data, identification).")
    e.add_argument("checkpoint", help="a face checkpoint file, or the --checkpoint-dir holding face-last.pt")
    e.add_argument("--val", nargs="*", default=None, metavar="BIN",
                   help="verification .bin files (default: the run's --val)")
    e.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    e.set_defaults(func=evaluate)
    return parser


def _config(args):
    from embcache.train.face_config import FaceConfig

    values = config_values(args, FaceConfig)
    if values.get("num_classes") is None:
        values["num_classes"] = FaceConfig.num_classes if args.data == "synthetic" else 0
    return FaceConfig(**values)


def train(args) -> int:
    """Train in this process, or as one rank of a torchrun launch (the same options; rank 0
    alone prints)."""
    from embcache.train.face import FaceTrainer

    refuse_existing_run(args, "face")
    apply_threads(args)
    cfg = _config(args)

    def body():  # bad input becomes one line inside the launch, which tells the other ranks
        try:
            trainer = FaceTrainer(cfg)
            if trainer.world.is_main:
                print(f"data: {trainer.source.name}; head {cfg.head} over {trainer.num_classes:,} classes"
                      + (f" (pool of {trainer.head.pool.num_slots:,} slots)" if cfg.head == "dcp" else "")
                      + f"; backbone {trainer.backbone_name} on {trainer.device}"
                      + (f"; {trainer.world.size} ranks" if trainer.world.distributed else ""))
            summary = trainer.fit()
        except (ValueError, OSError) as err:
            raise UserFacingError(str(err)) from None
        if summary["skipped_samples"] and trainer.world.is_main:
            images = trainer.source.bad.total
            distinct = f" ({images:,} distinct)" if summary["skipped_samples"] > images else ""
            print(f"skipped {summary['skipped_samples']:,} unreadable sample(s) in training batches{distinct}:")
            trainer.source.bad.report()
        # the trainer (and its DDP wrapper) goes here, while the process group is alive: a DDP
        # reducer outliving `destroy_process_group` can deadlock the exit with gloo
        return summary

    summary, _ = run_launched(cfg, body)
    print_summary(summary_rows(summary), summary)
    return 0


def evaluate(args) -> int:
    from embcache.train.face import FaceConfig, FaceTrainer, format_epoch
    from embcache.train.run import checkpoint_to_evaluate

    try:
        _, ck, cfg = checkpoint_to_evaluate(args.checkpoint, "face", FaceConfig, args.device)
        if args.val is not None:
            cfg.val = list(args.val)
        trainer = FaceTrainer(cfg)
        trainer.probe.load_state_dict(ck["probe"])
        metrics = trainer.evaluate()
    except (ValueError, OSError) as err:
        raise UserFacingError(str(err)) from None
    print(format_epoch({"epoch": ck["epoch"], **metrics}))
    print(json.dumps(metrics))
    return 0


def summary_rows(s: dict) -> list[tuple[str, str]]:
    rows = [("head", f"{s['head']} over {s['num_classes']:,} classes"), ("backbone", s["backbone"]),
            ("head state", f"{s['head_state_bytes'] / 2**20:,.2f} MiB (parameters/pool + optimizer state)")]
    final = s.get("final") or {}
    for name, m in final.items():
        if isinstance(m, dict):
            rows.append((f"{name} verification", f"{m['accuracy']:.4f} ± {m['accuracy_std']:.4f}"))
            rows.append((f"{name} TAR@FAR=1e-3 / 1e-4", f"{m['tar@far=0.001']:.4f} / {m['tar@far=0.0001']:.4f}"))
            if "identification_top1" in m:
                rows.append((f"{name} identification top-1", f"{m['identification_top1']:.4f}"))
    if "pool" in s:
        p = s["pool"]
        rows.append(("pool", f"{p['slots']:,} slots; {p['admitted']:,} admissions, {p['evicted']:,} evictions"))
    if s["skipped_samples"]:
        rows.append(("skipped samples", f"{s['skipped_samples']:,} unreadable (listed above)"))
    return rows + run_rows(s)
