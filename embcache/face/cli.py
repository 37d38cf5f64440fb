"""`embcache face`: face classification with a dynamic class pool (F2C), or the full FC /
Partial FC baselines, on synthetic identities (the default: no download), an image folder
per identity, or MXNet RecordIO (`train.rec`/`train.idx`, as MS1MV2 and Glint360K ship)."""
from __future__ import annotations

import argparse
import importlib
import json
import logging

from embcache.arg_types import DefaultsHelpFormatter, positive_int
from embcache.errors import UserFacingError
from embcache.safe_load import add_trust_argument
from embcache.settings_fields import add_config_arguments, config_values
from embcache.train.run_cli import (
    apply_threads,
    add_run_arguments,
    print_summary,
    refuse_existing_run,
    run_launched,
    run_rows,
)

SKIP_BAD_IMAGES = "leave out unreadable images and count and name them, instead of stopping at the first"

logger = logging.getLogger(__name__)


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.face.config import FaceConfig

    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fmt = DefaultsHelpFormatter
    p = sub.add_parser("train", help="train a face embedding (and evaluate it after each epoch)", formatter_class=fmt,
                       description="Train a probe net with the dcp / fc / pfc head. The progress bar shows loss, "
                                   "learning rate and pool occupancy; verification accuracy (10-fold), TAR@FAR "
                                   "(n/a, said once, where the impostor pairs are too few to resolve the FAR) "
                                   "and identification top-1 on held-out identities after each epoch; a summary "
                                   "at the end. Checkpoints are atomic and include the pool and its LRU state; "
                                   "--resume continues exactly where a killed run stopped.")
    # the settings are FaceConfig's fields (`embcache.settings_fields`); --num-classes left out
    # is the data's (`_config`)
    add_config_arguments(p, FaceConfig, ["data", "holdout", "val", "head", "num_classes", "pool_ratio", "sample_rate", "backbone",
                                         "feat_dim", "batch_norm", "margin_type", "margin", "scale", "topk", "gallery_momentum",
                                         "batch_size", "lr", "weight_decay", "image_size", "synthetic_samples",
                                         "eval_classes", "precision"], unset=["num_classes"])
    add_run_arguments(p, FaceConfig, "face")
    p.set_defaults(func=train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on held-out identities / verification files",
                       formatter_class=fmt, description="Load the probe net of a face checkpoint and report "
                                                        "verification (and, on synthetic data or an image folder's "
                                                        "held-out identities, identification). Without --val it "
                                                        "scores what the run scored, reading its training data "
                                                        "only for held-out identities (RecordIO data holds none "
                                                        "and is not read); with --val it scores those "
                                                        "files alone, without the training data (--heldout adds "
                                                        "the held-out identities).")
    e.add_argument("checkpoint", help="a face checkpoint file, or the --checkpoint-dir holding face-last.pt")
    add_config_arguments(e, FaceConfig, ["val", "device"], unset=["val"], unset_note="(default: the run's --val)")
    e.add_argument("--heldout", action="store_true",
                   help="with --val: also score the run's own held-out identities (synthetic, or the image "
                        "folder's --holdout), which reads its training data; without --val they always are (a run "
                        "that held none out, as on RecordIO data, says so and reads nothing)")
    e.add_argument("--data", default=None, metavar="DIR",
                   help="where the run's training data is now, if it moved (default: the path the checkpoint "
                        "recorded); read only to score its held-out identities")
    add_trust_argument(e)
    e.set_defaults(func=evaluate)
    _add_use_parsers(sub)
    return parser


def _add_use_parsers(sub) -> None:
    """The commands that use a trained checkpoint alone: embed, verify, search, export."""
    fmt = DefaultsHelpFormatter
    m = sub.add_parser("embed", help="L2-normalised embeddings of images, from a checkpoint alone", formatter_class=fmt,
                       description="Embed image files (or every image under a directory) with a face checkpoint, "
                                   "decoded and resized as training read them, each the sum of the image's and its "
                                   "mirror's embedding, L2-normalised (as evaluation does). --out FILE.parquet holds "
                                   "path and embedding; FILE.npy the array, with FILE.npy.paths.txt beside it.")
    _checkpoint_use(m, images=True, progress=True, run=("embcache.face.use", "embed_command"))
    m.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR", help="image files or directories of them")
    m.add_argument("--out", required=True, help="FILE.npy or FILE.parquet")
    m.add_argument("--skip-bad-images", action="store_true", help=SKIP_BAD_IMAGES)

    v = sub.add_parser("verify", help="are two images the same person? cosine and verdict", formatter_class=fmt,
                       description="Embed two images with a face checkpoint and print their cosine and a same / "
                                   "different verdict at the threshold the last evaluation found for FAR 1e-3 "
                                   "(recorded in the checkpoint), or --threshold. Where that evaluation had too "
                                   "few impostor pairs to resolve FAR 1e-3, the line says what the cut is instead.")
    _checkpoint_use(v, images=True, run=("embcache.face.use", "verify_command"))
    v.add_argument("a", metavar="A.jpg")
    v.add_argument("b", metavar="B.jpg")
    v.add_argument("--threshold", type=float, default=None,
                   help="cosine above which the two are the same person (default: the checkpoint's, at FAR 1e-3)")

    s = sub.add_parser("search", help="the nearest gallery identities of query images", formatter_class=fmt,
                       description="Embed a gallery (<gallery>/<identity>/<image>, or images directly in it, each its "
                                   "own entry) with a face checkpoint, one vector per identity (the normalised mean "
                                   "of its images'), and print each query image's K nearest identities by cosine "
                                   "(exact search: faiss where installed, else torch), or write them to --out. "
                                   "Each result says whether it clears the threshold the last evaluation found for "
                                   "FAR 1e-3 (recorded in the checkpoint), or --threshold; a query that clears it "
                                   "for no identity is unknown. Queries are embedded first, so that an unreadable "
                                   "one stops the search before the gallery is embedded.")
    _checkpoint_use(s, images=True, progress=True, run=("embcache.face.search", "search_command"))
    s.add_argument("--gallery", required=True, metavar="DIR", help="<DIR>/<identity>/<image>, or images in DIR")
    s.add_argument("--query", required=True, nargs="+", metavar="IMAGE_OR_DIR", help="query images or directories")
    s.add_argument("--k", type=positive_int, default=5, help="identities per query")
    s.add_argument("--threshold", type=float, default=None,
                   help="cosine above which a result is a match (default: the checkpoint's, at FAR 1e-3)")
    s.add_argument("--skip-bad-images", action="store_true", help=SKIP_BAD_IMAGES + " (query or gallery)")
    s.add_argument("--out", default=None, help="FILE.csv or FILE.parquet (query, rank, identity, cosine, match) "
                                               "(default: printed)")

    x = sub.add_parser("export", help="the embedding network as ONNX, checked with onnxruntime", formatter_class=fmt,
                       description="Export a face checkpoint's embedding network to ONNX (dynamic batch; input as "
                                   "training read it: RGB, pixels (x - 127.5) / 128; output raw features, to be "
                                   "L2-normalised), run it with onnxruntime beside torch on seeded inputs and print "
                                   "the largest difference. Needs the onnx extra: pip install 'embcache[onnx]'.")
    _checkpoint_use(x, run=("embcache.face.onnx_export", "export_command"))
    x.add_argument("--onnx", required=True, metavar="FILE.onnx", help="where to write the model")
    x.add_argument("--no-check", action="store_true", help="do not compare onnxruntime's outputs with torch's")


def _checkpoint_use(p: argparse.ArgumentParser, run: tuple[str, str], images: bool = False,
                    progress: bool = False) -> argparse.ArgumentParser:
    """`p` with what the commands that use a trained checkpoint share: the checkpoint (their
    first argument), how images are embedded and on which device, a progress bar, and their
    function, imported on use."""
    p.add_argument("checkpoint", help="a face checkpoint file, or the --checkpoint-dir holding face-last.pt")
    if images:
        p.add_argument("--no-flip", action="store_true", help="embed each image alone, not with its mirror")
        p.add_argument("--device", default="cpu", help="cpu or cuda")
    if progress:
        p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_trust_argument(p)
    module, name = run
    p.set_defaults(func=lambda args: getattr(importlib.import_module(module), name)(args))
    return p


def _config(args):
    from embcache.face.config import FaceConfig

    values = config_values(args, FaceConfig)
    if values.get("num_classes") is None:
        values["num_classes"] = FaceConfig.num_classes if args.data == "synthetic" else 0
    try:  # settings that are bad only together (a margin too large for its kind), before any data is read
        return FaceConfig(**values)
    except ValueError as err:
        raise UserFacingError(str(err)) from None


def train(args) -> int:
    """Train in this process, or as one rank of a torchrun launch (the same options; rank 0
    alone prints)."""
    from embcache.face.trainer import FaceTrainer

    refuse_existing_run(args, "face")
    apply_threads(args)
    cfg = _config(args)

    def body():  # bad input becomes one line inside the launch, which tells the other ranks
        try:
            trainer = FaceTrainer(cfg)
            if trainer.world.is_main:
                print(f"data: {trainer.source.name}; head {cfg.head} over {trainer.num_classes:,} classes"
                      + (f" (pool of {trainer.head.pool.num_slots:,} slots" + (
                          f", raised from {trainer.pool_raised_from:,} (--pool-ratio {cfg.pool_ratio:g}) to hold the "
                          f"{trainer.batches.identity.pairs:,} identities a step brings" if trainer.pool_raised_from
                          else "") + ")" if cfg.head == "dcp" else "")
                      + (f"; {trainer.batches.size:,} images a step (--batch-size {cfg.batch_size:,} is more "
                         f"than the {trainer.source.num_samples:,} training images)"
                         if trainer.batches.size < cfg.batch_size else "")
                      + f"; backbone {trainer.backbone_name} on {trainer.device}"
                      + (f"; {trainer.world.size} ranks" if trainer.world.distributed else ""))
            note = nothing_evaluated(trainer)
            if note and trainer.world.is_main:
                logger.warning(f"nothing is evaluated after each epoch: {note}")
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
    """Evaluate in this process, or under torchrun with every rank embedding its share of
    the held-out samples (rank 0 scores them and alone prints). With --val alone, the
    checkpoint's network (`probe_spec`) scores the files and the training data is not read:
    it may have moved, and naming a path the user did not type would be a puzzle."""
    from embcache.face.evaluation import format_epoch, unresolved_notes
    from embcache.face.trainer import FaceConfig
    from embcache.train.run import checkpoint_to_evaluate

    try:
        path, ck, cfg = checkpoint_to_evaluate(args.checkpoint, "face", FaceConfig, args.device)
    except (ValueError, OSError) as err:
        raise UserFacingError(str(err)) from None
    if args.val is not None:
        cfg.val = list(args.val)
    if args.data is not None:
        if cfg.data == "synthetic":
            raise UserFacingError(f"{path}: trained on synthetic identities, which are generated, not read: "
                                  f"--data does not apply")
        cfg.data = args.data
    held, none_why = held_out_identities(ck, cfg)
    if held is False and not cfg.val:  # said before any data is read or model built
        raise UserFacingError(f"{args.checkpoint}: nothing to evaluate: {_nothing_line(none_why)}")
    if held is False and args.heldout:
        logger.warning(f"--heldout: {none_why}; the --val files alone are scored")
    # the training data is read only for the identities held out of it: --val alone, or a run that held
    # none out (RecordIO data holds out none), is scored through the checkpoint's network
    alone = ck.get("probe_spec") is not None and (held is False or bool(args.val) and not args.heldout)

    def body():
        try:
            return (_score_val_files if alone else _score_with_data)(args, path, ck, cfg)
        except (ValueError, OSError) as err:
            raise UserFacingError(str(err)) from None

    (metrics, hints), world = run_launched(cfg, body)
    if world.is_main:
        for line in unresolved_notes(metrics, set(), hints):
            logger.warning(line)
        print(format_epoch({"epoch": ck["epoch"], **metrics}))
        print(json.dumps(metrics))
    return 0


def _score_val_files(args, path, ck: dict, cfg) -> tuple[dict, dict]:
    """(scores, no hints): the --val files alone, through the network the checkpoint records,
    each rank embedding its share of their images."""
    from embcache.distributed.world import current
    from embcache.face.data.verification import load_val_sets
    from embcache.face.evaluation import embed_shared, score_val_sets
    from embcache.face.use import probe_from_spec
    from embcache.train import precision

    spec, world = ck["probe_spec"], current()
    device = world.device(cfg.resolved_device())
    probe = probe_from_spec(path, spec, ck.get("probe")).to(device).eval()  # checked before it sizes anything
    val_sets = load_val_sets(cfg.val, tuple(spec["sample_shape"]), cfg.image_size or 112)
    precision.autocast_modules([probe], precision.resolve(cfg.precision, device), device)
    embed_fn = lambda samples, flip: embed_shared(probe, samples, world, device, flip, spec["feat_dim"])  # noqa: E731
    return score_val_sets(val_sets, embed_fn, world.is_main), {}


def _score_with_data(args, path, ck: dict, cfg) -> tuple[dict, dict]:
    """(scores, hints) of the run's own evaluation (synthetic or held-out identities, and its
    --val files), which rebuilds its training data: where that is not found, the line says
    it is the path the checkpoint recorded and how to point to where it is now."""
    from pathlib import Path

    from embcache.face.evaluation import pair_hints
    from embcache.face.trainer import FaceTrainer

    if cfg.data != "synthetic" and not Path(cfg.data).exists():
        if args.data is not None:
            raise ValueError(f"{args.data}: no such directory (--data, where the run's training data is now)")
        why = ("--heldout scores the run's held-out identities" if args.val and args.heldout
               else "the checkpoint predates recording its network's shape, which scoring without it needs"
               if ck.get("probe_spec") is None else "it holds the run's held-out identities")
        raise ValueError(f"{cfg.data}: the training data recorded in {path}, not found ({why}): give --data DIR "
                         f"where it is now"
                         + ("" if args.val else ", or --val FILE to score verification files without it"))
    trainer = FaceTrainer(cfg)
    note = nothing_evaluated(trainer)
    if note:
        raise ValueError(f"{args.checkpoint}: nothing to evaluate: {note}")
    trainer.probe.load_state_dict(ck["probe"])
    metrics = trainer.evaluate()
    return metrics, pair_hints(trainer.source, cfg.eval_pairs, metrics)


def _head_state_scope(s: dict) -> str:
    """What the head-state figure counts: under torchrun it is rank 0's, which for fc / pfc
    is its share of a class table split over the ranks, so read as the run's it would be
    N times too small."""
    ranks = s.get("world_size", 1)
    if ranks <= 1:
        return "(parameters/pool + optimizer state)"
    if s["head"] == "dcp":
        return f"a rank (the pool + optimizer state; each of the {ranks} ranks holds the whole pool)"
    return f"a rank (its share of the class table + optimizer state, split over {ranks} ranks)"


def held_out_identities(ck: dict, cfg) -> tuple[bool | None, str]:
    """(whether the run's own evaluation scores identities held out of its training data, which
    only that data holds; why none where it does not), told without reading the data: RecordIO
    data (its train.rec still there) and --holdout 0 hold out none; else the checkpoint's record
    (`heldout_identities`), or in older ones what its evaluations scored. None where nothing
    tells (an older checkpoint, no evaluation yet): the data is read to know."""
    from pathlib import Path

    if cfg.data == "synthetic":
        return True, ""
    if (Path(cfg.data) / "train.rec").is_file():
        return False, "RecordIO data holds out no identities"
    if cfg.holdout == 0:
        return False, "--holdout 0 holds out no identities"
    held = ck.get("heldout_identities")
    if held is None and ck.get("history"):
        held = sum("heldout" in record for record in ck["history"])
    if held is None:
        return None, ""
    return bool(held), "the run held out no identities"


def _nothing_line(why: str) -> str:
    return f"{why}, and no --val was given (a verification .bin such as lfw.bin)"


def nothing_evaluated(trainer) -> str | None:
    """Why an evaluation of this run would score nothing (None where it scores something):
    its data holds out no identities and no --val file was given. Said, since a bare epoch
    line, or `face evaluate` printing `{}`, reads as a score."""
    cfg, source = trainer.cfg, trainer.source
    if cfg.data == "synthetic" or trainer.val_sets or getattr(source, "heldout_paths", None):
        return None
    if not hasattr(source, "heldout_paths"):
        why = "RecordIO data holds out no identities"
    elif cfg.holdout == 0:
        why = "--holdout 0 holds out no identities"
    else:
        why = "no identities are held out (fewer than 4 have two images)"
    return _nothing_line(why)


def summary_rows(s: dict) -> list[tuple[str, str]]:
    from embcache.face.evaluation import identification_text, tar_text

    rows = [("head", f"{s['head']} over {s['num_classes']:,} classes"), ("backbone", s["backbone"]),
            ("head state", f"{s['head_state_bytes'] / 2**20:,.2f} MiB {_head_state_scope(s)}")]
    final = s.get("final") or {}
    for name, m in final.items():
        if not isinstance(m, dict):
            continue
        if "accuracy" not in m:
            rows.append((f"{name} verification", f"not scored: {m.get('pairs', 0)} pairs, under 20"))
        else:
            rows.append((f"{name} verification", f"{m['accuracy']:.4f} ± {m['accuracy_std']:.4f}"))
            rows.append((f"{name} TAR@FAR=1e-3 / 1e-4", f"{tar_text(m, 1e-3)} / {tar_text(m, 1e-4)}"))
        if "identification_top1" in m:
            rows.append((f"{name} identification top-1", identification_text(m, long=True)))
    if "pool" in s:
        p = s["pool"]
        rows.append(("pool", f"{p['slots']:,} slots; {p['admitted']:,} admissions, {p['evicted']:,} evictions"))
    if s["skipped_samples"]:
        rows.append(("skipped samples", f"{s['skipped_samples']:,} unreadable (listed above)"))
    return rows + run_rows(s)
