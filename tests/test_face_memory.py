"""Face training's host memory follows what the data and the model need: a step holds at most
the data's images (the backbone saves tens of MiB a 112 x 112 image for backward, so a batch of
128 drawn from 48 images held 5,684 MiB), and `bench face` measures the process's peak beside the
head's counted memory."""
import numpy as np
import torch

from embcache.cli import main
from embcache.face.data.images import encode_jpeg


def _folder(root, identities: int = 10, shots: int = 6, size: int = 24):
    for who in range(identities):
        (root / f"p{who}").mkdir(parents=True)
        base = np.random.default_rng((who, 0)).integers(0, 256, (size, size, 3))
        for shot in range(shots):
            noise = np.random.default_rng((who, shot + 1)).integers(-20, 21, base.shape)
            (root / f"p{who}" / f"{shot}.jpg").write_bytes(encode_jpeg(np.clip(base + noise, 0, 255).astype(np.uint8)))
    return root


def test_a_step_holds_no_more_images_than_the_data_has(tmp_path):
    from embcache.face.config import FaceConfig
    from embcache.face.trainer import FaceTrainer

    data = _folder(tmp_path / "faces")  # 60 images: 8 identities (48 images) trained, 2 held out
    cfg = FaceConfig(data=str(data), image_size=24, backbone="cnn", epochs=2, progress=False, device="cpu")
    trainer = FaceTrainer(cfg)
    assert trainer.source.num_samples == 48 and trainer.batches.identity.pairs == 8
    assert trainer.batches.size == 48  # 16 pair images + 32 instances, not 16 + 112
    seen = []
    trainer.probe.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]) if m.training else None)
    trainer.fit()
    assert seen == [48, 48]  # one step an epoch, each of the data's 48 images' worth
    big = FaceTrainer(FaceConfig(num_classes=40, synthetic_samples=8, batch_size=64, epochs=1, progress=False))
    assert big.batches.size == 64  # data larger than the batch: the batch as asked


def test_the_data_line_says_the_step_is_smaller_than_the_batch(tmp_path, capsys):
    data = _folder(tmp_path / "faces")
    assert main(["face", "train", "--data", str(data), "--image-size", "24", "--backbone", "cnn", "--epochs", "1",
                 "--no-progress", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert "48 images a step (--batch-size 128 is more than the 48 training images)" in out


def test_peak_host_memory_measures_what_a_block_allocates():
    from embcache.face.bench import PeakHostMemory

    with PeakHostMemory() as small:
        a = torch.ones(2**20)  # 4 MiB
        del a
    with PeakHostMemory() as large:
        b = torch.ones(64 * 2**20)  # 256 MiB, freed before the block ends
        del b
    if large.added_bytes is None:  # no /proc/self/clear_refs on this system
        return
    assert large.added_bytes >= 250 * 2**20 > small.added_bytes


def test_bench_face_reports_peak_memory_beside_the_head(tmp_path, capsys):
    import json

    assert main(["bench", "face", "--classes", "1000", "--repeats", "1", "--accuracy-classes", "0",
                 "--out-dir", str(tmp_path), "--name", "f"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "f.json").read_text())["rows"]
    assert rows and all("peak_host_added_bytes" in r for r in rows)
    fc = next(r for r in rows if r["head"] == "fc")
    if fc["peak_host_added_bytes"] is not None:  # the fc table (1000 x 128 floats) and its gradient, at least
        assert fc["peak_host_added_bytes"] >= 2 * 1000 * 128 * 4
    assert "process peak" in out
