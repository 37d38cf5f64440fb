"""A closed-form model of the bytes a face (dcp) training step sends between ranks, beside
what the trainer measures (`FaceTrainer`'s `comm_bytes_per_step`: this rank's bytes a step,
by collective, counted as `face/trainer.py`'s `CollectiveMeter` counts them).

Bytes one rank sends a step at N ranks (none at N = 1), by the measured keys:

- `gallery_allgather`: one all-gather of `w + 1` float64 rows of `2 d + 1` columns (the
  pair features of both views and the label; the first row is the header of counts),
  `w = ceil(pairs / N)` (every rank pads to the widest slice), `pairs = min(B // 4,
  identities)`, sent to each of the N - 1 others: `(N - 1) (w + 1) (2 d + 1) 8`;
- `batch_norm_allreduce` (`--batch-norm global`; 0 with `local`, whose running statistics
  are averaged only before evaluation and checkpoints): for a batch-norm layer of `c`
  channels a float64 row of `2 c + 1` (sums, sums of squares, count) for each of the
  gallery's two views, one row in the probe's forward and one in its backward, so
  `4 (2 c + 1) 8` bytes a layer, all-reduced at `2 (N - 1) / N` of them (a ring);
- `ddp_gradients`: the probe's `P` float32 gradients summed once: at 2 ranks one all-gather
  (`4 P` to the other rank), beyond an all-reduce (`2 (N - 1) / N * 4 P`).

Example (the MLP probe: two hidden layers of 256, d = 128, 116,608 parameters; B = 512):
    >>> model = face_traffic_model(512, 128, [256, 256, 128], 116_608, world=2)
    >>> model == {"batch_norm_allreduce": 41_056.0, "ddp_gradients": 466_432.0, "gallery_allgather": 133_640.0}
    True
"""
from __future__ import annotations

import math


def face_traffic_model(batch_size: int, feat_dim: int, bn_channels: list[int], params: int, world: int,
                       batch_norm: str = "global", identities: int | None = None) -> dict:
    """Modelled bytes one rank sends a dcp step (see the module's docstring) for a global
    batch of `batch_size`, embeddings of `feat_dim`, a probe with batch-norm layers of
    `bn_channels` channels and `params` float32 parameters, on `world` ranks;
    `identities`: those with two samples, when fewer than `batch_size // 4`."""
    if batch_norm not in ("global", "local"):
        raise ValueError(f"batch_norm must be 'global' or 'local', got {batch_norm!r}")
    if world == 1:
        return {"batch_norm_allreduce": 0.0, "ddp_gradients": 0.0, "gallery_allgather": 0.0}
    ring = 2 * (world - 1) / world  # an all-reduce's bytes sent a rank, per byte reduced
    pairs = min(batch_size // 4, identities) if identities is not None else batch_size // 4
    width = math.ceil(pairs / world)
    gallery = (world - 1) * (width + 1) * (2 * feat_dim + 1) * 8
    norms = sum(4 * (2 * c + 1) * 8 for c in bn_channels) * ring if batch_norm == "global" else 0
    grads = 4 * params * (1 if world == 2 else ring)
    return {"batch_norm_allreduce": float(norms), "ddp_gradients": float(grads), "gallery_allgather": float(gallery)}


def probe_shape(backbone: str, feat_dim: int, sample_shape: tuple[int, ...]) -> tuple[list[int], int]:
    """(the channels of each batch-norm layer, the trainable parameters) of the probe net
    `backbone` builds for samples of `sample_shape` (built here on the CPU and counted)."""
    from torch import nn

    from embcache.nn.backbones import build_backbone

    net = build_backbone(backbone, feat_dim, sample_shape)
    channels = [m.num_features for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return channels, sum(p.numel() for p in net.parameters() if p.requires_grad)


def face_model_for(batch_size: int, num_classes: int, world: int, batch_norm: str = "global") -> dict:
    """The model for `embcache face train` on its synthetic data with the other settings
    at their defaults (feature vectors: the MLP probe), as `bench scaling` runs it."""
    from embcache.face.config import FaceConfig

    cfg = FaceConfig()
    channels, params = probe_shape("mlp", cfg.feat_dim, (cfg.synthetic_dim,))
    return face_traffic_model(batch_size, cfg.feat_dim, channels, params, world, batch_norm, identities=num_classes)
