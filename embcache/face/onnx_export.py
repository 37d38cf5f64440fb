"""`embcache face export CHECKPOINT --onnx FILE`: the checkpoint's embedding network as an
ONNX model with a dynamic batch, checked with onnxruntime against torch before the file is
put in place.

The model takes what training fed the network: RGB images, `[batch, 3, S, S]` float (each
image resized whole to S x S, bilinear: a centre crop gives other embeddings), pixels as
(x - 127.5) / 128 (feature vectors `[batch, D]` for a network trained on them), and
returns the raw features. `face embed` sums the features of the image and its mirror and
L2-normalises them; a serving program does the same. Both conventions are written into the
model's metadata (`metadata_props`), beside the checkpoint's `probe_spec`.
"""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from embcache.errors import UserFacingError

ONNX_EXTRA = "pip install 'embcache[onnx]' (onnx, onnxscript, onnxruntime)"
CHECK_BATCH = 5  # the check runs a batch other than the export's example, so the batch is truly dynamic


def export_onnx(probe: torch.nn.Module, spec: dict, path: str | Path, check: bool = True, seed: int = 0) -> float | None:
    """Write `probe` to `path` as ONNX; with `check`, the largest absolute difference of
    onnxruntime's features from torch's on `CHECK_BATCH` seeded inputs (the file is put in
    place only after the check has run)."""
    try:
        import onnx  # noqa: F401  (torch's exporter needs both)
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise UserFacingError(f"face export --onnx needs {err.name}: {ONNX_EXTRA}") from None
    path = Path(path)
    shape = tuple(spec["sample_shape"])
    probe = probe.cpu().eval()
    example = torch.zeros(2, *shape)
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet_exporter():
        program = torch.onnx.export(probe, (example,), dynamo=True, verbose=False, external_data=False,
                                    input_names=["input"], output_names=["features"],
                                    dynamic_shapes=({0: torch.export.Dim("batch")},))
    model = program.model_proto
    meta = {"embcache.probe_spec": json.dumps(spec), "embcache.output": "raw features: L2-normalise (face embed "
            "sums the image's and its mirror's features first)"}
    if len(shape) == 3:
        meta["embcache.input"] = (f"RGB [batch, 3, {shape[1]}, {shape[2]}] float: each image converted to RGB "
                                  f"(Pillow's convert) and resized whole to {shape[2]}x{shape[1]} (bilinear, "
                                  f"no crop: the aspect is not kept), pixels (x - 127.5) / 128")
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    import onnx

    onnx.save(model, tmp)
    diff = None
    try:
        if check:
            diff = max_abs_diff(probe, tmp, shape, seed)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return diff


def max_abs_diff(probe: torch.nn.Module, onnx_file: str | Path, shape: tuple, seed: int = 0) -> float:
    """The largest |onnxruntime - torch| over the features of `CHECK_BATCH` inputs drawn
    uniformly from [-1, 1) (the pixel range) by `seed`."""
    try:
        import onnxruntime
    except ImportError:
        raise UserFacingError(f"the export's check needs onnxruntime: {ONNX_EXTRA}, or --no-check") from None
    x = torch.rand(CHECK_BATCH, *shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = probe(x).numpy()
    return float(np.abs(got - want).max())


class _quiet_exporter:
    """torch's ONNX exporter prints its stages and warns about torchvision's operators, which
    this network does not use: silenced for the export, errors still raised."""

    def __enter__(self):
        self.logger = logging.getLogger("torch.onnx")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        self.warnings.__exit__(*exc)
        self.logger.setLevel(self.level)


def export_command(args) -> int:
    from embcache.face.use import load_probe

    out = Path(args.onnx)
    if out.suffix != ".onnx":
        raise UserFacingError(f"{out}: the export is written as FILE.onnx")
    probe, spec, _ = load_probe(args.checkpoint)
    diff = export_onnx(probe, spec, out, check=not args.no_check)
    shape = "x".join(map(str, spec["sample_shape"]))
    print(f"wrote {out} ({spec['backbone']}, input [batch, {shape}] -> {spec['feat_dim']} features)"
          + (f"; onnxruntime vs torch on {CHECK_BATCH} inputs: max abs diff {diff:.2e}" if diff is not None else ""))
    return 0
