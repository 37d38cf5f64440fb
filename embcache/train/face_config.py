"""Face training's settings (`FaceConfig`), apart from the trainer (`embcache.train.face`) so
that `embcache face --help` shows them without importing torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from embcache.train.run_config import StepRunConfig

# settings a resumed run must share with its checkpoint: all that shape the data, the nets, the
# loss or the optimizer (epochs may be raised: a run can be extended)
MUST_MATCH = ("data", "head", "num_classes", "pool_ratio", "sample_rate", "backbone", "feat_dim", "batch_size",
               "seed", "margin_type", "margin", "scale", "topk", "gallery_momentum", "lr", "momentum",
               "weight_decay", "image_size", "synthetic_dim", "synthetic_id_dim", "synthetic_samples",
               "synthetic_noise")


@dataclass
class FaceConfig(StepRunConfig):
    """Everything a run depends on; stored in every checkpoint. The run settings (device,
    seed, epochs, max_steps, checkpoints, resume, metrics, progress) are `StepRunConfig`'s."""

    data: str = "synthetic"             # "synthetic", an image folder, or a directory with train.rec/train.idx
    head: str = "dcp"                   # dcp | fc | pfc
    num_classes: int = 2000             # synthetic: training identities; real data: checked against the labels
    pool_ratio: float = 0.1             # dcp: Q = ceil(pool_ratio * num_classes)
    sample_rate: float = 0.1            # pfc: fraction of class centres per step
    backbone: str = "auto"              # auto (mlp for vectors, iresnet18 for images) | mlp | cnn | iresnet18 | iresnet50
    feat_dim: int = 128
    margin_type: str = "arcface"        # arcface | cosface
    margin: float = 0.3
    scale: float = 32.0
    topk: int = 5                       # dcp: out-of-pool loss over the top-k cosines
    gallery_momentum: float = 0.99      # dcp: EMA momentum of the gallery net
    epochs: int = 10
    batch_size: int = 128               # images per step: a quarter pairs (x2 views), half instances
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    eval_pairs: int = 6000              # synthetic verification pairs
    eval_classes: int = 500             # synthetic held-out identities
    val: list = field(default_factory=list)  # verification .bin files for real data
    image_size: int = 0                 # synthetic: 0 = vectors, else S x S images; real data: crop size (112)
    synthetic_dim: int = 64
    synthetic_id_dim: int = 16
    synthetic_samples: int = 8
    synthetic_noise: float = 0.7
