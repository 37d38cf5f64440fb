"""A program serving `face export --onnx`'s model read in its metadata "RGB [batch, 3, 32, 32],
pixels (x - 127.5) / 128", and nothing of how an image of another shape becomes 32 x 32: a
centre crop (the usual serving habit) gave other embeddings than `face embed`. The metadata
now says the image is resized whole (bilinear, aspect not kept); following it gives embed's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from embcache.face.onnx_export import export_onnx
from embcache.face.use import embed_images
from embcache.nn.backbones import build_backbone


def test_the_metadata_s_input_rule_reproduces_face_embed(tmp_path):
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from PIL import Image

    torch.manual_seed(0)
    spec = {"backbone": "cnn", "feat_dim": 8, "sample_shape": [3, 16, 16]}
    probe = build_backbone("cnn", 8, (3, 16, 16)).eval()
    out = tmp_path / "probe.onnx"
    export_onnx(probe, spec, out, check=False)
    said = {p.key: p.value for p in onnx.load(str(out)).metadata_props}["embcache.input"]
    assert "resized whole to 16x16 (bilinear, no crop" in said and "(x - 127.5) / 128" in said, said

    image = tmp_path / "wide.png"  # not square, with an alpha channel
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 44, 4), dtype=np.uint8)).save(image)
    rgb = Image.open(image).convert("RGB").resize((16, 16), Image.BILINEAR)
    x = ((np.asarray(rgb, np.float32) - 127.5) / 128).transpose(2, 0, 1)[None]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    features = session.run(None, {"input": np.concatenate([x, x[..., ::-1]])})[0].sum(0)
    want = embed_images(probe, spec, [image]).numpy()[0]
    np.testing.assert_allclose(features / np.linalg.norm(features), want, atol=1e-5)
