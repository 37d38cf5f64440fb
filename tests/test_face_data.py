"""Face data: synthetic identities are generated, not stored, and reproducible; the loaders
are pure functions of (seed, epoch, step); RecordIO, image folders and verification .bin
files are read, and bad input is named (file and index) or counted; evaluation metrics."""
import os
import pickle
import struct
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embcache.errors import DataFormatError
from embcache.face.data.folder import ImageFolderFaces
from embcache.face.data.images import encode_jpeg
from embcache.face.data.loaders import PairBatches
from embcache.face.data.recordio import (
    RecordFile,
    RecordIOFaces,
    encode_record,
    read_index,
    write_recordio,
)
from embcache.face.data.synthetic import SyntheticFaces
from embcache.face.data.verification import (
    load_verification_bin,
    write_verification_bin,
)
from embcache.face.evaluation import identification_top1, verification


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


MAGIC = struct.pack("<I", 0xCED7230A)


def dmlc_write_record(payload: bytes) -> bytes:
    """A line-by-line transcription of dmlc-core's `RecordIOWriter::WriteRecord`, kept apart
    from the library's writer so that the reader is checked against dmlc, not against itself."""
    out, dptr = b"", 0
    lower_align = (len(payload) >> 2) << 2
    for i in range(0, lower_align, 4):
        if payload[i:i + 4] == MAGIC:
            out += MAGIC + struct.pack("<I", ((1 if dptr == 0 else 2) << 29) | (i - dptr)) + payload[dptr:i]
            dptr = i + 4
    out += MAGIC + struct.pack("<I", ((3 if dptr != 0 else 0) << 29) | (len(payload) - dptr)) + payload[dptr:]
    upper_align = ((len(payload) + 3) >> 2) << 2
    return out + b"\0" * (upper_align - len(payload))


def write_dmlc(path, payloads):
    with open(path, "wb") as rec, open(path.with_suffix(".idx"), "w") as idx:
        for key, payload in enumerate(payloads):
            idx.write(f"{key}\t{rec.tell()}\n")
            rec.write(dmlc_write_record(payload))


def part_flags(data: bytes, offset: int) -> list[int]:
    """The continuation flags of the parts of the record at `offset`, read by hand."""
    flags = []
    while True:
        magic, lrec = struct.unpack_from("<II", data, offset)
        assert magic == 0xCED7230A
        flags.append(lrec >> 29)
        if flags[-1] in (0, 3):
            return flags
        offset += 8 + ((lrec & (2**29 - 1)) + 3) // 4 * 4


def split_payload(label, image):
    """A record that dmlc splits into five parts: the magic word as the header's `id` field
    (offset 8), twice in a row in the image (an empty middle part) and as the last word (an
    empty last part); one unaligned copy must not split."""
    header = struct.pack("<IfQQ", 0, float(label), 0xCED7230A, 0)
    image = image + b"\0" * (-(len(header) + len(image)) % 4)
    return header + image + MAGIC + MAGIC + b"x" + MAGIC + b"yyy" + MAGIC


def test_multi_part_records_are_joined_with_the_magic_put_back(tmp_path):
    images = [_jpeg(0), _jpeg(1), _jpeg(2)]
    payloads = [split_payload(0, images[0]), struct.pack("<IfQQ", 0, 0.0, 1, 0) + images[1],
                split_payload(1, images[2])]
    write_dmlc(tmp_path / "train.rec", payloads)
    data, offsets = (tmp_path / "train.rec").read_bytes(), read_index(tmp_path / "train.idx")[1]
    assert part_flags(data, int(offsets[0])) == [1, 2, 2, 2, 3]  # the file really is multi-part
    assert part_flags(data, int(offsets[1])) == [0]
    assert encode_record(payloads[0]) == dmlc_write_record(payloads[0])  # the library writes as dmlc does
    records = RecordFile(tmp_path / "train.rec")
    for key, payload in enumerate(payloads):
        assert records.payload(key) == payload
    assert records.first_label(2) == (0, 1.0)  # the header itself spans two parts
    assert records.header(0)[2] == payloads[0][24:]
    faces = RecordIOFaces(tmp_path / "train.rec", image_size=16, progress=False)
    assert faces.labels.tolist() == [0, 0, 1]
    x, ok = faces.load(torch.arange(3))
    assert ok.all() and x.abs().max() <= 1.0  # Pillow stops at the end of the JPEG


@pytest.mark.parametrize("damage, message", [
    ("cut", r"train\.rec#0: truncated record"),
    ("flag", r"train\.rec#0: part 2 at byte \d+ has continuation flag 0, expected 2 or 3"),
    ("magic", r"train\.rec#0: bad magic 0x[0-9a-f]{8} at byte \d+ \(part 3\)"),
    ("middle", r"train\.rec#0: part 1 at byte \d+ has continuation flag 2, expected 0 or 1"),
])
def test_garbled_multi_part_records_are_one_line_errors(tmp_path, damage, message):
    payload = split_payload(3, _jpeg(0))
    data = bytearray(dmlc_write_record(payload))
    offset, second = 0, 8 + 8  # parts: 8 bytes (up to the id field), then the rest of the header...
    third = second + 8 + struct.unpack_from("<I", data, second + 4)[0] % 2**29
    if damage == "cut":
        data = data[:third + 20]
    elif damage == "flag":
        data[second + 7] &= 0x1F  # part 2 claims to be a whole record
    elif damage == "magic":
        data[third] ^= 0xFF
    else:
        offset = second  # the index points into the middle of the record
    (tmp_path / "train.rec").write_bytes(bytes(data))
    (tmp_path / "train.idx").write_text(f"0\t{offset}\n")
    with pytest.raises(DataFormatError, match=message) as err:
        RecordFile(tmp_path / "train.rec").payload(0)
    assert "\n" not in str(err.value)


def test_labels_are_cached_and_read_from_the_cache_on_the_next_open(tmp_path, monkeypatch):
    items = [(y, _jpeg(i)) for i, y in enumerate([0, 0, 1, 1, 2])]
    write_recordio(tmp_path / "train.rec", items)
    first_label = RecordFile.first_label
    asked = []
    monkeypatch.setattr(RecordFile, "first_label", lambda self, key: asked.append(key) or first_label(self, key))
    assert RecordIOFaces(tmp_path / "train.rec", progress=False).labels.tolist() == [0, 0, 1, 1, 2]
    assert asked == [0, 1, 2, 3, 4, 5]
    asked.clear()
    assert RecordIOFaces(tmp_path / "train.rec", progress=False).labels.tolist() == [0, 0, 1, 1, 2]
    assert asked == [0]  # only the header record, which says where the images are
    saved = np.load(tmp_path / "train.labels.npy")
    assert saved.dtype == np.int64 and saved[1] == os.stat(tmp_path / "train.rec").st_mtime_ns  # exact
    st = os.stat(tmp_path / "train.rec")
    os.utime(tmp_path / "train.rec", ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a changed file: read again
    RecordIOFaces(tmp_path / "train.rec", progress=False)
    assert asked == [0, 0, 1, 2, 3, 4, 5]


def test_a_label_is_read_without_reading_the_image(tmp_path):
    write_recordio(tmp_path / "train.rec", [(4, b"\xff" * 100_000)])
    records = RecordFile(tmp_path / "train.rec")
    read = []
    f = records._file()
    records._f = type("Counting", (), {"seek": lambda self, pos: f.seek(pos),
                                       "read": lambda self, n: read.append(n) or f.read(n)})()
    assert records.first_label(1) == (0, 4.0)
    assert sum(read) <= 8 + 28


@pytest.mark.parametrize("label, reason", [
    (float("nan"), "non-finite label nan"), (float("inf"), "non-finite label inf"), (-1, "negative label -1"),
    (2.5, "label 2.5 is not an integer"), (3e9, "label 3e\\+09 out of range: not below the 3 image records"),
])
def test_a_bad_label_is_one_line_naming_file_and_record(tmp_path, label, reason):
    write_recordio(tmp_path / "train.rec", [(0, _jpeg(0)), (label, _jpeg(1)), (1, _jpeg(2))])
    with pytest.raises(DataFormatError, match=rf"train\.rec#2: {reason}") as err:
        RecordIOFaces(tmp_path / "train.rec", progress=False)
    assert "\n" not in str(err.value)


def test_the_index_is_two_int64_arrays_not_a_dict_per_record(tmp_path):
    n = 200_000
    keys = np.random.default_rng(0).permutation(n)
    (tmp_path / "train.idx").write_text("".join(f"{k}\t{8 * k}\n" for k in keys) + f"{n - 1}\t7\n")
    (tmp_path / "train.rec").write_bytes(b"")
    tracemalloc.start()
    records = RecordFile(tmp_path / "train.rec")
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert kept < 20 * n  # 16 bytes a record; a dict of Python ints costs well over 50
    assert records.keys.tolist() == list(range(n)) and records.offset_of(12_345) == 8 * 12_345
    assert records.offset_of(n - 1) == 7  # a key listed twice: the later line wins, as in mxnet
    with pytest.raises(DataFormatError, match=rf"train\.rec#{n}: record not in train\.idx"):
        records.offset_of(n)
    (tmp_path / "bad.idx").write_text("0\t0\n1\t8\n2 16 x\n")
    with pytest.raises(DataFormatError, match=r"bad\.idx:3: expected 'index<TAB>offset', got '2 16 x'"):
        read_index(tmp_path / "bad.idx")


def test_unreadable_images_are_counted_and_reported_not_raised(tmp_path, capsys):
    for who, n in (("alice", 3), ("bob", 2)):
        (tmp_path / who).mkdir()
        for i in range(n):
            (tmp_path / who / f"{i}.jpg").write_bytes(_jpeg(i))
    (tmp_path / "bob" / "1.jpg").write_bytes(b"not a jpeg")
    faces = ImageFolderFaces(tmp_path, image_size=16)
    x, ok = faces.load(torch.arange(5))
    assert ok.tolist() == [True, True, True, True, False]
    for _ in range(4):  # drawn again in later batches: skipped without a read, logged once
        assert faces.load(torch.tensor([4, 0]))[1].tolist() == [False, True]
    assert faces.bad.total == 1 and faces.unreadable == {4}
    faces.bad.report()
    err = capsys.readouterr().err  # was: "skipped 5 malformed row(s) ...; first: line 4: ...; line 4: ..."
    assert err.splitlines() == [f"{tmp_path / 'bob' / '1.jpg'}: unreadable image (UnidentifiedImageError: cannot "
                                f"identify image file '{tmp_path / 'bob' / '1.jpg'}')"]
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
