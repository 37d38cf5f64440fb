"""Face training's settings (`FaceConfig`), apart from the trainer (`embcache.face.trainer`) so
that `embcache face --help` shows them without importing torch."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

from embcache.arg_types import fraction, int_in, non_negative_float, positive_float, positive_int, ratio
from embcache.nn.choices import BACKBONES, HEADS, MARGINS
from embcache.settings_fields import has_flag, inherit, option_strings, setting
from embcache.train.precision import HELP as PRECISION_HELP, PRECISIONS
from embcache.train.run_config import StepRunConfig

# settings a resumed run must share with its checkpoint: all that shape the data, the nets, the
# loss or the optimizer (epochs may be raised: a run can be extended)
MUST_MATCH = ("data", "holdout", "head", "num_classes", "pool_ratio", "sample_rate", "backbone", "feat_dim", "batch_size",
               "seed", "margin_type", "margin", "scale", "topk", "gallery_momentum", "lr", "momentum",
               "weight_decay", "image_size", "synthetic_dim", "synthetic_id_dim", "synthetic_samples",
               "synthetic_noise")
# how the probe net's batch norms divide the global batch under torchrun (see the field)
BATCH_NORMS = ("global", "local")
# the largest margin (exclusive) of each margin softmax: there the target logit of a feature on its
# class centre, cos(m) (arcface, m in radians) or 1 - m (cosface), falls to 0, an orthogonal class's
MARGIN_LIMITS = {"arcface": (math.pi / 2, "[0, pi/2) radians (pi/2 = 1.571)"), "cosface": (1.0, "[0, 1)")}
# The largest image side, trained (--image-size) or named by a checkpoint's `probe_spec`: far above the
# 112 of the face sets, small enough that a batch of images is gigabytes, not the terabytes a crafted
# side asks; one bound for both, so whatever trains can be opened by `face embed` and `face verify`
MAX_SIDE = 1024
# Settings that size a synthetic run's work and memory but that no tensor of its checkpoint holds, so
# that `face evaluate` generates whatever a checkpoint's config says: each bounded, far above its
# default and every documented run (tests and docs use at most 400 pairs, 200 identities, width 64)
# verification pairs (default 6,000): enough impostors to resolve a FAR of 2e-6; 2 x 10^6 samples, 512 MB at
# the default width (wider samples, and images, are bounded by MAX_SYNTHETIC_BYTES)
MAX_EVAL_PAIRS = 1_000_000
MAX_EVAL_CLASSES = 20_000  # held-out identities (default 500): identification's 2e x e scores, 3.2 GB at the limit
MAX_SYNTHETIC_DIM = 4096  # sample width (default 64): its dim x dim rotation is 64 MiB, its QR seconds
# ... and what they generate together, in float32: the rotation, the pixel projection of images
# (3 S^2 x dim) and the evaluation set (2 eval_pairs + 3 eval_classes samples), which every epoch's
# evaluation keeps. The defaults at --image-size 112 are 2.0 GB; the largest --image-size, 1024, asked
# 170 GB at the defaults, which no machine evaluated (it failed after the first epoch)
MAX_SYNTHETIC_BYTES = 16 * 2**30
# setting -> (least, most, why the most): FaceConfig refuses any other value, a caller's or a checkpoint's
SIZE_LIMITS = {"image_size": (0, MAX_SIDE, "larger images could not be opened by `face embed` and `face verify`"),
               "eval_pairs": (20, MAX_EVAL_PAIRS, "10-fold verification needs 20; MAX_EVAL_PAIRS"),
               "eval_classes": (2, MAX_EVAL_CLASSES, "impostor pairs need 2; MAX_EVAL_CLASSES"),
               "synthetic_dim": (1, MAX_SYNTHETIC_DIM, "MAX_SYNTHETIC_DIM")}


@dataclass
class FaceConfig(StepRunConfig):
    """Everything a run depends on; stored in every checkpoint. The run settings (device,
    seed, epochs, max_steps, checkpoints, resume, metrics, progress) are `StepRunConfig`'s.
    Each field's `help` is what `embcache face train --help` shows; the fields without one
    have no flag. `num_classes` 0 is, on real data, the largest label + 1."""

    data: str = setting("synthetic", help="'synthetic', an image folder (<dir>/<identity>/<image>), or a directory "
                                          "with train.rec and train.idx")
    holdout: float = setting(0.1, type=fraction,
                             help="image folders: the fraction of identities held out of training (seeded, among "
                                  "those with two or more images), evaluated after each epoch (verification, "
                                  "TAR@FAR, identification top-1); 0 trains on every identity")
    head: str = setting("dcp", choices=HEADS,
                        help="dcp: dynamic class pool; fc: one weight row per class; pfc: Partial FC")
    num_classes: int = setting(2000, type=int_in(2),
                               help="synthetic: number of training identities (default {default}); real data: the "
                                    "label space, labels must be below it (default there: max label + 1)")
    pool_ratio: float = setting(0.1, type=ratio,
                                help="dcp: pool slots as a fraction of classes, Q = ceil(ratio * C), raised (with a "
                                     "note) to the identities one step brings where that is more")
    sample_rate: float = setting(0.1, type=ratio, help="pfc: class centres sampled per step")
    backbone: str = setting("auto", choices=("auto",) + BACKBONES,
                            help="auto: mlp for feature vectors, iresnet18 for images")
    feat_dim: int = setting(128, type=positive_int, help="embedding size")
    batch_norm: str = setting("global", choices=BATCH_NORMS,
                              help="under torchrun: global normalises with the whole global batch's statistics, so "
                                   "N ranks train what one process trains (one all-reduce a batch-norm layer in the "
                                   "forward and one in the backward); local normalises each rank's slice alone, as "
                                   "arcface_torch trains (no batch-norm traffic; the ranks' running statistics are "
                                   "averaged before evaluation and checkpoints). One process: the same. A resume "
                                   "may change it, as it may change the number of ranks")
    margin_type: str = setting("arcface", choices=MARGINS,
                               help="arcface: an additive angular margin; cosface: an additive cosine margin")
    margin: float = setting(0.3, type=non_negative_float,
                            help="additive angular margin in radians (arcface, below pi/2) or cosine margin "
                                 "(cosface, below 1)")
    scale: float = setting(32.0, type=positive_float, help="logit scale s")
    topk: int = setting(5, type=positive_int, help="dcp: k of the out-of-pool loss (over the top-k cosines)")
    gallery_momentum: float = setting(0.99, type=fraction, help="dcp: EMA momentum of the gallery net")
    epochs: int = inherit(StepRunConfig, "epochs", 10, help="passes of the identity loader over the identities")
    batch_size: int = setting(128, type=int_in(4),
                              help="images per step: a quarter are identity pairs (two views each), the rest "
                                   "instances")
    lr: float = setting(0.1, type=positive_float, help="SGD learning rate (cosine decay to 0)")
    momentum: float = 0.9
    weight_decay: float = setting(5e-4, type=non_negative_float, help="SGD weight decay")
    eval_pairs: int = 6000              # synthetic verification pairs
    eval_classes: int = setting(500, type=int_in(*SIZE_LIMITS["eval_classes"][:2]),
                                help=f"held-out synthetic identities; at most {MAX_EVAL_CLASSES:,}")
    val: list = setting(default_factory=list, nargs="*", metavar="BIN",
                        help="verification .bin files to evaluate on (lfw.bin, cfp_fp.bin, agedb_30.bin; "
                             "training: after each epoch), read and checked before the first step (images, at "
                             "least 20 pairs)")
    image_size: int = setting(0, type=int_in(*SIZE_LIMITS["image_size"][:2]),
                              help="synthetic: 0 for feature vectors, S for S x S images; real data: crop size "
                                   f"(0 = 112); at most {MAX_SIDE}")
    synthetic_dim: int = 64
    synthetic_id_dim: int = 16
    synthetic_samples: int = setting(8, type=int_in(2), help="samples per synthetic identity")
    synthetic_noise: float = 0.7
    # bf16: the backbone (probe and gallery nets) under bfloat16 autocast; the head's margin softmax stays float32
    precision: str = setting("auto", choices=PRECISIONS, help=PRECISION_HELP)

    # the value a setting had, in effect, in checkpoints written before it existed
    settings_added_later = {"holdout": 0.0, "precision": "fp32"}

    @classmethod
    def sizes_in_checkpoint(cls, ck: dict) -> dict:
        """What the tensors of checkpoint `ck` say of the settings that size the model
        (`embcache.train.run_files.refuse_unheld_sizes`)."""
        return held_sizes(ck)

    def __post_init__(self) -> None:
        check_margin(self.margin_type, self.margin)
        check_sizes(self)  # a library caller's settings, or a checkpoint's config: before anything is built


def check_sizes(cfg: FaceConfig) -> None:
    """ValueError in one line, naming the setting (its flag where it has one) and its limit,
    for a setting of `SIZE_LIMITS` outside its bounds or synthetic settings that together
    would generate more than `MAX_SYNTHETIC_BYTES`. A checkpoint's config is built through
    here (`config_from_checkpoint`), and no tensor of the file says these: a config saying
    eval_pairs 10^12 generated 10^12 pairs in `face evaluate`."""
    for name, (low, high, why) in SIZE_LIMITS.items():
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
            flag = next(iter(option_strings(_FIELDS[name])), name) if has_flag(_FIELDS[name]) else name
            raise ValueError(f"{flag} {value!r:.40}: must be an integer from {low} to {high} ({why})")
    if cfg.data != "synthetic":
        return
    side, dim = cfg.image_size, cfg.synthetic_dim
    sample = 3 * side * side if side else dim
    floats = dim * dim + 3 * side * side * dim + (2 * cfg.eval_pairs + 3 * cfg.eval_classes) * sample
    if 4 * floats > MAX_SYNTHETIC_BYTES:
        raise ValueError(f"synthetic data of image_size {side}, synthetic_dim {dim}, eval_pairs {cfg.eval_pairs:,} "
                         f"and eval_classes {cfg.eval_classes:,} would generate {4 * floats / 1e9:,.1f} GB, more "
                         f"than the {MAX_SYNTHETIC_BYTES / 2**30:g} GiB a synthetic run may hold "
                         f"(MAX_SYNTHETIC_BYTES): a smaller --image-size or --eval-classes")


_FIELDS = {f.name: f for f in fields(FaceConfig)}


def check_margin(kind: str, margin: float) -> None:
    """ValueError, in the flags' words, for a margin the loss cannot train with: from the
    limit on, a feature on its own class centre scores no more than an unrelated class at 90
    degrees, so no feature can meet the margin (an arcface margin of 5 radians was accepted
    without a word, and trained nothing)."""
    limit, words = MARGIN_LIMITS.get(kind, (math.inf, ""))
    if not 0 <= margin < limit:
        raise ValueError(f"--margin {margin:g} with --margin-type {kind}: the margin must be in {words}, or a "
                         f"feature on its class centre scores no more than a class at 90 degrees and nothing is learnt")


def pool_slots(pool_ratio: float, num_classes: int, min_pool: int = 1) -> int:
    """dcp's pool size Q: ceil(ratio * C), at least `min_pool` (the identities one step
    brings, which must all fit), at most C.

    Example:
        >>> pool_slots(0.1, 30), pool_slots(0.1, 30, min_pool=8), pool_slots(0.1, 30, min_pool=64)
        (3, 8, 30)
    """
    return min(num_classes, max(min_pool, math.ceil(pool_ratio * num_classes)))


def held_sizes(ck: dict) -> dict:
    """The sizing settings a face checkpoint's tensors say, read from their shapes (nothing
    built): `feat_dim` from the head (a class table's width, or the class pool's),
    `num_classes` from a class table's rows (where the config names a number: 0 takes the
    data's) or, for dcp, which holds no row a class, as far as its pool's slots bound it
    (`_pool_bound`), `synthetic_dim` from the probe's first layer on synthetic feature
    vectors. A part a checkpoint lacks says nothing."""
    def shape(value) -> tuple:
        return tuple(int(n) for n in getattr(value, "shape", ()))

    config, held = ck.get("config") if isinstance(ck.get("config"), dict) else {}, {}
    head = ck.get("head") if isinstance(ck.get("head"), dict) else {}
    table, pool = shape(head.get("weight")), shape(head.get("pool.features"))
    if len(table) == 2:  # fc, pfc: a row a class
        held["feat_dim"] = table[1]
        if config.get("num_classes"):
            held["num_classes"] = table[0]
    elif len(pool) == 3:  # dcp: slots x (probe, gallery) x feat_dim
        held["feat_dim"] = pool[2]
        held.update(_pool_bound(config, pool[0]))
    probe = ck.get("probe") if isinstance(ck.get("probe"), dict) else {}
    first = next((shape(v) for v in probe.values() if len(shape(v)) == 2), None)
    if config.get("data") == "synthetic" and not config.get("image_size") and first:
        held["synthetic_dim"] = first[1]  # feature vectors: the mlp's input width
    return held


class _Said:
    """What a checkpoint's tensors say of a setting they hold no shape of, as
    `refuse_unheld_sizes` prints it (its repr); equal to no setting."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _pool_bound(config: dict, slots: int) -> dict:
    """`{"num_classes": ...}` where a dcp checkpoint's settings would size a larger pool than
    the `slots` its tensors hold, else `{}`. dcp keeps no row a class (its pool and LRU table
    are O(Q)), so no tensor says num_classes; but Q = pool_slots(pool_ratio, num_classes, the
    identities a step brings), and the build makes that pool before any tensor is compared:
    num_classes 10^11 at pool_ratio 0.1 asked for 10^10 slots (terabytes). On synthetic data
    the identities a step brings are the settings' (a quarter of batch_size, at most every
    class), elsewhere the data's, and so bounded by it. What a checkpoint could still say, a
    huge num_classes beside a tiny pool_ratio, sizes nothing else that evaluation builds (the
    identity loader holds no table of the classes: `SyntheticFaces.all_eligible`)."""
    ratio, classes, batch = config.get("pool_ratio"), config.get("num_classes"), config.get("batch_size")
    try:
        step_ids = min(int(batch) // 4, int(classes)) if config.get("data") == "synthetic" else 1
        want = pool_slots(float(ratio), int(classes), step_ids)
    except (TypeError, ValueError, OverflowError):  # not numbers: no pool these settings size
        return {"num_classes": _Said(f"{slots:,} pool slots (pool_ratio {ratio!r:.12})")}
    return {} if want <= slots else {"num_classes": _Said(f"{slots:,} pool slots (its settings: {want:,})")}
