"""Face data: synthetic identities are generated, not stored, and reproducible; the loaders
are pure functions of (seed, epoch, step); RecordIO, image folders and verification .bin
files are read, and bad input is named (file and index) or counted; evaluation metrics."""
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embcache.data.bad_rows import DataFormatError
from embcache.data.face.folder import ImageFolderFaces
from embcache.data.face.images import encode_jpeg
from embcache.data.face.loaders import PairBatches
from embcache.data.face.recordio import RecordIOFaces, write_recordio
from embcache.data.face.synthetic import SyntheticFaces
from embcache.data.face.verification import load_verification_bin, write_verification_bin
from embcache.train.face_eval import identification_top1, verification


def _jpeg(seed, size=16):
    return encode_jpeg(np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8))


def test_synthetic_identities_are_generated_on_demand_and_reproducible():
    task = SyntheticFaces(10_000_000, dim=32, id_dim=8)
    ids = torch.tensor([9_999_999 * 8 + 3, 5 * 8, 5 * 8 + 1])
    x, ok = task.load(ids)
    assert ok.all() and x.shape == (3, 32)
    again = SyntheticFaces(10_000_000, dim=32, id_dim=8).load(ids[[2, 0]])[0]
    assert torch.equal(again, x[[2, 0]])  # any sample on its own, in any order
    assert not torch.equal(x[1], x[2])    # two views of one identity differ
    # views of one identity are closer in identity space than views of two
    r = task.rotation
    z = lambda v: F.normalize((v @ r)[:, :8], dim=1)
    same = (z(task.generate(torch.arange(200), torch.zeros(200, dtype=torch.long))) *
            z(task.generate(torch.arange(200), torch.ones(200, dtype=torch.long)))).sum(1)
    diff = (z(task.generate(torch.arange(200), torch.zeros(200, dtype=torch.long))) *
            z(task.generate(torch.arange(200, 400), torch.zeros(200, dtype=torch.long)))).sum(1)
    assert same.mean() > diff.mean() + 0.3


def test_pair_batches_are_two_views_of_one_identity_and_deterministic():
    task = SyntheticFaces(100, samples_per_class=4, dim=8, id_dim=4)
    batches = PairBatches(task, 16, seed=3)
    assert batches.identity.pairs == 4 and batches.instance.batch_size == 8
    seen = []
    for step in range(batches.steps_per_epoch):
        ia, ib, y = batches.identity.batch(0, step)
        assert torch.equal(task.label_of(ia), y) and torch.equal(task.label_of(ib), y)
        assert bool((ia != ib).all())
        seen += y.tolist()
    assert sorted(seen) == list(range(100))  # every identity once per epoch
    b1, b2 = batches.get(1, 2), PairBatches(task, 16, seed=3).get(1, 2)
    assert torch.equal(b1.a, b2.a) and torch.equal(b1.c, b2.c) and torch.equal(b1.instance_labels, b2.instance_labels)
    stream = torch.cat([batches.instance.batch(s) for s in range(50)])  # 400 of 400 samples: one permutation
    assert sorted(stream.tolist()) == list(range(400))


def test_recordio_round_trip_with_header_record(tmp_path):
    items = [(y, _jpeg(i)) for i, y in enumerate([0, 0, 1, 1, 1, 2])]
    write_recordio(tmp_path / "train.rec", items)
    faces = RecordIOFaces(tmp_path / "train.rec", image_size=16, progress=False)
    assert faces.num_samples == 6 and faces.num_classes == 3
    assert faces.counts.tolist() == [2, 3, 1]
    assert faces.eligible_identities().tolist() == [0, 1]
    x, ok = faces.load(torch.tensor([0, 5]))
    assert ok.all() and x.shape == (2, 3, 16, 16) and x.abs().max() <= 1.0
    assert (tmp_path / "train.labels.npy").is_file()  # labels cached for the next start
    assert RecordIOFaces(tmp_path / "train.rec", image_size=16, progress=False).counts.tolist() == [2, 3, 1]


def test_recordio_bad_input_names_file_and_index(tmp_path):
    write_recordio(tmp_path / "train.rec", [(0, _jpeg(0)), (7, _jpeg(1))])
    with pytest.raises(DataFormatError, match=r"train\.rec#2: label 7 out of range \[0, 5\)"):
        RecordIOFaces(tmp_path / "train.rec", num_classes=5, progress=False)
    # a broken magic number in record 1
    data = bytearray((tmp_path / "train.rec").read_bytes())
    offset = int((tmp_path / "train.idx").read_text().splitlines()[1].split()[1])
    data[offset] ^= 0xFF
    (tmp_path / "bad.rec").write_bytes(bytes(data))
    (tmp_path / "bad.idx").write_text((tmp_path / "train.idx").read_text())
    with pytest.raises(DataFormatError, match=r"bad\.rec#1: bad magic"):
        RecordIOFaces(tmp_path / "bad.rec", progress=False)
    # truncated file
    good = (tmp_path / "train.rec").read_bytes()
    (tmp_path / "cut.rec").write_bytes(good[: offset + 20])
    (tmp_path / "cut.idx").write_text((tmp_path / "train.idx").read_text())
    with pytest.raises(DataFormatError, match=r"cut\.rec#\d: truncated"):
        RecordIOFaces(tmp_path / "cut.rec", progress=False)
    with pytest.raises(DataFormatError, match="no such file"):
        RecordIOFaces(tmp_path / "missing.rec")


def test_unreadable_images_are_counted_and_reported_not_raised(tmp_path, capsys):
    for who, n in (("alice", 3), ("bob", 2)):
        (tmp_path / who).mkdir()
        for i in range(n):
            (tmp_path / who / f"{i}.jpg").write_bytes(_jpeg(i))
    (tmp_path / "bob" / "1.jpg").write_bytes(b"not a jpeg")
    faces = ImageFolderFaces(tmp_path, image_size=16)
    x, ok = faces.load(torch.arange(5))
    assert ok.tolist() == [True, True, True, True, False]
    assert faces.bad.total == 1
    faces.bad.report()
    assert "bob/1.jpg" in capsys.readouterr().err
    batch = PairBatches(faces, 4, seed=0).get(0, 0)
    assert batch.a.shape[0] + batch.dropped >= 1
    with pytest.raises(DataFormatError, match="no images"):
        ImageFolderFaces(tmp_path / "alice", image_size=16)  # images but no identity folders


def test_verification_bin_round_trip_and_malicious_pickle(tmp_path):
    imgs = [_jpeg(i) for i in range(8)]
    write_verification_bin(tmp_path / "lfw.bin", imgs, [True, False, True, False])
    a, b, same = load_verification_bin(tmp_path / "lfw.bin", image_size=16)
    assert a.shape == (4, 3, 16, 16) and same.tolist() == [True, False, True, False]

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "evil.bin").write_bytes(pickle.dumps((Evil(), [True])))
    with pytest.raises(DataFormatError, match="evil.bin: not a verification .bin"):
        load_verification_bin(tmp_path / "evil.bin")
    write_verification_bin(tmp_path / "odd.bin", imgs[:3], [True, False])
    with pytest.raises(DataFormatError, match="3 images for 2 pairs"):
        load_verification_bin(tmp_path / "odd.bin")
    write_verification_bin(tmp_path / "broken.bin", imgs[:3] + [b"xx"], [True, False])
    with pytest.raises(DataFormatError, match=r"broken.bin#3: unreadable image"):
        load_verification_bin(tmp_path / "broken.bin", image_size=16)


def test_verification_metrics_by_hand():
    # 20 pairs: positives score 0.9 except one at 0.1; negatives score 0.2 except one at 0.95
    same = torch.tensor([i % 2 == 0 for i in range(20)])
    scores = torch.where(same, torch.tensor(0.9), torch.tensor(0.2))
    scores[4], scores[7] = 0.1, 0.95
    e1 = torch.stack([torch.tensor([1.0, 0.0])] * 20)
    e2 = torch.stack([scores, (1 - scores ** 2).sqrt()], 1)
    out = verification(e1, e2, same)
    assert out["accuracy"] == pytest.approx(18 / 20)  # each fold's threshold sits between 0.2 and 0.9
    assert out["tar@far=0.001"] == pytest.approx(0.0)  # above the 0.95 negative no positive is left
    assert out["negatives"] == 10


def test_identification_top1_with_faiss():
    gallery = torch.eye(4)
    probes = torch.tensor([[0.9, 0.1, 0, 0], [0, 0, 0.2, 0.8], [0.6, 0.5, 0, 0]])
    assert identification_top1(gallery, torch.arange(4), probes, torch.tensor([0, 3, 1])) == pytest.approx(2 / 3)
