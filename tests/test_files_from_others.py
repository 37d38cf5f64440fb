"""Files from someone else, read adversarially (docs/integrity.md, "Opening files from others"):
a face checkpoint whose network spec asks for terabytes, a meta.json naming shards outside
its directory, JSON nested too deeply or holding a 5,000-digit number, a manifest of the wrong
shape, a zip whose entries inflate a thousand times. Each is refused in one line naming the
file, before any huge allocation, with no traceback. Every file is a few kilobytes."""
import json
import pathlib
import shutil
import zipfile

import numpy as np
import pytest
import torch

from embcache.cli import main
from embcache.errors import UserFacingError


def _one_line(argv, capsys, name, rc=1):
    """Run the command: exit `rc`, and (failing) one line (warnings aside) naming `name`."""
    got = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith(("warning:", "note:"))]
    assert got == rc, (argv, err)
    assert "Traceback" not in "\n".join(err), err
    if rc:
        assert len(lines) == 1 and name in lines[0], (argv, err)
    return lines[0] if lines else ""


# ----------------------------------------------------------------- a face checkpoint's network spec
@pytest.fixture(scope="module")
def face_files(tmp_path_factory):
    """A face checkpoint of a small CNN (written directly: no training) and two images."""
    from embcache.checkpoint import save_checkpoint
    from embcache.face.data.images import encode_jpeg
    from embcache.nn.backbones import build_backbone

    root = tmp_path_factory.mktemp("adv_face")
    spec = {"backbone": "cnn", "feat_dim": 8, "sample_shape": [3, 24, 24]}
    probe = build_backbone("cnn", 8, (3, 24, 24)).state_dict()
    save_checkpoint({"probe": probe, "probe_spec": spec, "history": []}, root / "good" / "face-last.pt", "face")
    rng = np.random.default_rng(0)
    for name in ("a.jpg", "b.jpg"):
        (root / name).write_bytes(encode_jpeg(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)))
    return root


HOSTILE_SPECS = {
    "feat_dim of 10^11 (25 TB of weights)": {"feat_dim": 10 ** 11},
    "images of side 10^6 (terabytes of pixels)": {"sample_shape": [3, 10 ** 6, 10 ** 6]},
    "a negative feat_dim": {"feat_dim": -3},
    "an unknown backbone": {"backbone": "evil"},
    "a sample shape of text": {"sample_shape": "abc"},
    "another backbone than its tensors": {"backbone": "iresnet18", "sample_shape": [3, 32, 32]},
}


@pytest.mark.parametrize("change", HOSTILE_SPECS.values(), ids=HOSTILE_SPECS.keys())
def test_a_face_checkpoints_network_spec_is_checked_against_its_tensors(face_files, change, tmp_path, capsys):
    from embcache.checkpoint import load_checkpoint, save_checkpoint
    from embcache.face.use import load_probe

    ck = load_checkpoint(face_files / "good" / "face-last.pt", "face")
    path = tmp_path / "face-last.pt"
    save_checkpoint({**ck, "probe_spec": {**ck["probe_spec"], **change}}, path, "face")
    a, b = face_files / "a.jpg", face_files / "b.jpg"
    for argv in (["face", "verify", path, a, b, "--threshold", "0.5"],
                 ["face", "embed", path, a, "--out", tmp_path / "e.npy", "--no-progress"]):
        assert "probe_spec" in _one_line(argv, capsys, path.name)
    with pytest.raises(UserFacingError, match="face-last.pt.*probe_spec"):
        load_probe(path)
    assert not (tmp_path / "e.npy").exists()


def test_a_face_checkpoint_with_a_true_spec_still_embeds(face_files, capsys):
    good = face_files / "good"
    line = _one_line(["face", "verify", good, face_files / "a.jpg", face_files / "b.jpg", "--threshold", "0.5"],
                     capsys, "", rc=0)
    assert line == ""


# ----------------------------------------------------------------- a prepared data set's meta.json
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    root = tmp_path_factory.mktemp("adv_data") / "data"
    generate_synthetic(root, rows=200, scale=0.0001, seed=0, val_rows=50, test_rows=50)
    return root


def _meta_variant(data_dir, tmp_path, change) -> pathlib.Path:
    out = tmp_path / "data"
    shutil.copytree(data_dir, out)
    meta = json.loads((out / "meta.json").read_text())
    text = change(meta, out)
    (out / "meta.json").write_text(text if isinstance(text, str) else json.dumps(meta))
    return out


def _outside(where):
    def change(meta, out):
        elsewhere = out.parent / "elsewhere.parquet"
        shutil.copy(out / meta["splits"]["train"]["files"][0], elsewhere)
        name = str(elsewhere) if where == "absolute" else "../elsewhere.parquet"
        if where == "frequencies":
            meta["id_frequency_file"] = "../" + meta["id_frequency_file"]
        else:
            meta["splits"]["train"]["files"] = [name]
        meta.pop("shard_crc32", None)
    return change


META_VARIANTS = {
    "a shard by absolute path": (_outside("absolute"), "outside the data directory"),
    "a shard in ../": (_outside("parent"), "outside the data directory"),
    "the id frequencies in ../": (_outside("frequencies"), "outside the data directory"),
    "nested 100,000 deep": (lambda meta, out: "[" * 100_000, "nested too deeply"),
    "a 5,000-digit number": (lambda meta, out: '{"format": ' + "1" * 5000 + "}", "digits"),
    "splits as a list": (lambda meta, out: meta.__setitem__("splits", ["train"]), "splits"),
    "a JSON list": (lambda meta, out: "[1, 2]", "not an object"),
}


@pytest.mark.parametrize("change,why", META_VARIANTS.values(), ids=META_VARIANTS.keys())
def test_a_meta_json_from_someone_else_is_refused_in_one_line(data_dir, change, why, tmp_path, capsys):
    from embcache.data.ctr_format import read_meta

    out = _meta_variant(data_dir, tmp_path, change)
    assert why in _one_line(["data", "info", out], capsys, "meta.json")
    with pytest.raises(UserFacingError, match=f"meta.json.*{why}"):
        read_meta(out)


def test_a_meta_json_naming_its_own_shards_still_reads(data_dir, capsys):
    _one_line(["data", "info", data_dir], capsys, "", rc=0)


# ----------------------------------------------------------------- an export's manifest
MANIFESTS = {
    "nested 100,000 deep": ("[" * 100_000, "nested too deeply"),
    "a JSON list": ("[1]", "not an object"),
    "no tables": ({"dense_model": {"file": "dense.pt2"}}, "KeyError: 'tables'"),
    "tables as text": ({"tables": "abc", "dense_model": {"file": "dense.pt2"}}, "AttributeError"),
    "no dense model": ({"tables": []}, "KeyError: 'dense_model'"),
}


@pytest.mark.parametrize("manifest,why", MANIFESTS.values(), ids=MANIFESTS.keys())
def test_an_export_manifest_of_another_shape_is_refused_in_one_line(manifest, why, tmp_path, capsys):
    from embcache.serve import EXPORT_FORMAT, load_export

    export = tmp_path / "export"
    export.mkdir()
    text = manifest if isinstance(manifest, str) else json.dumps({"format": EXPORT_FORMAT, "version": 1,
                                                                  "files_crc32": {}, **manifest})
    (export / "manifest.json").write_text(text)
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    line = _one_line(["dlrm", "predict", export, "--input", tmp_path / "rows.csv", "--out", tmp_path / "p.csv"],
                     capsys, "manifest.json")
    assert why in line
    with pytest.raises(UserFacingError, match=f"manifest.json.*{why}"):
        load_export(export)


# ----------------------------------------------------------------- a zip that inflates
def _deflated(path: pathlib.Path) -> None:
    """`path` rewritten with its biggest entry compressed (as no torch or numpy writer does),
    sealed with a valid CRC as embcache seals its files."""
    from embcache.integrity import seal_zip

    with zipfile.ZipFile(path) as z:
        entries = [(info, z.read(info.filename)) for info in z.infolist()]
    biggest = max(entries, key=lambda e: len(e[1]))[0].filename
    path.unlink()
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            z.writestr(info.filename, data,
                       compress_type=zipfile.ZIP_DEFLATED if info.filename == biggest else zipfile.ZIP_STORED)
    seal_zip(path)


def test_a_checkpoint_whose_entries_inflate_is_refused_before_it_loads(tmp_path, capsys):
    from embcache.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint({"w": torch.zeros(1_000_000)}, tmp_path / "dlrm-last.pt", "dlrm")  # 4 MB of zeros
    _deflated(path)
    assert path.stat().st_size < 100_000  # a thousand times less than what it would fill
    with pytest.raises(UserFacingError, match="dlrm-last.pt.*compressed"):
        load_checkpoint(path, "dlrm")
    assert "compressed" in _one_line(["upgrade", path], capsys, path.name)


def test_an_npz_whose_entries_inflate_is_refused_before_numpy_reads_it(tmp_path, capsys):
    from embcache.cf.model import CFModel
    from embcache.integrity import save_npz, verify_zip

    path = tmp_path / "model.npz"
    save_npz(path, {"U": np.zeros(1_000_000, np.float32), "meta": np.array("{}")})
    _deflated(path)
    with pytest.raises(UserFacingError, match="model.npz.*'U.npy'.*compressed"):
        verify_zip(path, "CF model")
    with pytest.raises(ValueError, match="model.npz.*compressed"):
        CFModel.load(path)
    assert "compressed" in _one_line(["cf", "recommend", path, "--user", "1"], capsys, path.name)


# ----------------------------------------------------------------- a CF model's own content
@pytest.fixture(scope="module")
def cf_model(tmp_path_factory):
    """A small CF model saved whole (no training: its rows as initialised) and its arrays."""
    from cpu_kernels.model import CFConfig, CFParams
    from embcache.cf.data.interactions import from_pairs
    from embcache.cf.model import CFModel

    data = from_pairs([0, 0, 1, 2, 2], [0, 1, 2, 3, 1], [], [], num_items=5)
    params = CFParams.init(CFConfig(dim=8), 3, 5, data.train_indptr, data.train_indices)
    path = CFModel(params, data.train_indptr, data.train_indices, None, None,
                   {"data": "elsewhere", "skip_bad_lines": False}).save(tmp_path_factory.mktemp("adv_cf") / "m.npz")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _cf_variant(arrays, tmp_path, meta=None, **changed) -> pathlib.Path:
    from embcache.integrity import save_npz

    out = {**arrays, **changed}
    if meta is not None:
        out["meta"] = np.array(json.dumps(meta({**json.loads(str(arrays["meta"]))})))
    path = tmp_path / "model.npz"
    save_npz(path, out)
    return path


CF_MODELS = {  # each was a traceback (TypeError, IndexError, KeyError, ValueError) before
    "settings as text": ("recommend", dict(meta=lambda m: {**m, "config": "abc"}), "CFConfig"),
    "histories beyond its items": ("recommend", dict(hist=np.full((3, 32), 10 ** 9)), "outside its 5 items"),
    "a record of text": ("evaluate", dict(meta=lambda m: {**m, "trained_on": "abc"}), "record of the data"),
    "a record without its data": ("evaluate", dict(meta=lambda m: {**m, "trained_on": {}}), "record of the data"),
    "training items out of order": ("evaluate", dict(train_indptr=np.array([5, 2, 1, 0])), "do not fit together"),
}


@pytest.mark.parametrize("command,change,why", CF_MODELS.values(), ids=CF_MODELS.keys())
def test_a_cf_model_from_someone_else_is_refused_in_one_line(cf_model, command, change, why, tmp_path, capsys):
    path = _cf_variant(cf_model, tmp_path, **change)
    argv = ["cf", "recommend", path, "--user", "1"] if command == "recommend" else ["cf", "evaluate", path]
    assert why in _one_line(argv, capsys, path.name)


def test_cf_embeddings_whose_settings_disagree_with_their_rows_are_refused_on_load(cf_model, tmp_path):
    from embcache.cf.data.embeddings_file import load

    def dim(meta):
        meta["config"]["dim"] = 10 ** 12
        return meta

    with pytest.raises(ValueError, match="model.npz: rows of .* dim 1000000000000"):
        load(_cf_variant(cf_model, tmp_path, meta=dim))


def test_a_whole_cf_model_still_recommends(cf_model, tmp_path, capsys):
    path = _cf_variant(cf_model, tmp_path)
    assert _one_line(["cf", "recommend", path, "--user", "1"], capsys, "", rc=0) == ""


# ----------------------------------------------------------------- a sharded table checkpoint
def _tables(root: pathlib.Path, dir_name="dlrm-tables-000000002", part="t.0-2") -> tuple[pathlib.Path, dict]:
    """A run checkpoint's path and its tables manifest, with one part of a 2 x 4 table
    written as the trainer writes it."""
    from embcache.cache.stores import table_files as tf

    (root / dir_name / part).mkdir(parents=True, exist_ok=True)
    tf.save_tensors(root / dir_name / part, {"weight": torch.ones(2, 4), "optimizer.sum": torch.zeros(2, 4)})
    return root / "run" / "dlrm-last.pt", {"dir": dir_name, "tables": {"t": {"rows": 2, "dim": 4,
                                                                             "parts": [[0, 2, part]]}}}


def test_a_checkpoint_naming_table_files_outside_its_folder_is_refused(tmp_path):
    from embcache.distributed.table_checkpoint import full_tables

    checkpoint, manifest = _tables(tmp_path)  # the tables beside the checkpoint's folder, not in it
    assert full_tables(tmp_path / "dlrm-last.pt", manifest)["t"]["weight"].sum() == 8
    for changed in ({"dir": "../dlrm-tables-000000002"}, {"dir": str(tmp_path / "dlrm-tables-000000002")},
                    {"tables": {"t": {"rows": 2, "dim": 4, "parts": [[0, 2, "../../dlrm-tables-000000002/t.0-2"]]}},
                     "dir": "x"}):
        with pytest.raises(UserFacingError, match="dlrm-last.pt: names table files .* outside the folder"):
            full_tables(checkpoint, {**manifest, **changed})


HEADERS = {
    "nested 100,000 deep": (lambda h, d: "[" * 100_000, "unreadable"),
    "a JSON list": (lambda h, d: "[1]", "unreadable"),
    "a negative shape": (lambda h, d: h["tensors"]["weight"].__setitem__("shape", [-2, -4]), "not \\[rows, dim\\]"),
    "a shape of text": (lambda h, d: h["tensors"]["weight"].__setitem__("shape", "ab"), "not \\[rows, dim\\]"),
    "a table named ../../x": (lambda h, d: h["tensors"].__setitem__("../../x", h["tensors"]["weight"]),
                           "not a file inside its folder"),
}


@pytest.mark.parametrize("change,why", HEADERS.values(), ids=HEADERS.keys())
def test_a_table_parts_header_from_someone_else_is_refused_in_one_line(change, why, tmp_path):
    from embcache.distributed.table_checkpoint import full_tables

    checkpoint, manifest = _tables(tmp_path)
    header = tmp_path / manifest["dir"] / "t.0-2" / "header.json"
    shutil.copy(header.parent / "weight.bin", tmp_path / "x.bin")  # outside the checkpoint, its CRC in the header
    h = json.loads(header.read_text())
    text = change(h, header.parent)
    header.write_text(text if isinstance(text, str) else json.dumps(h))
    with pytest.raises(UserFacingError, match=f"header.json: .*{why}"):
        full_tables(tmp_path / "dlrm-last.pt", manifest)


# ----------------------------------------------------------------- a verification .bin
class _HugeArray:
    """Unpickled, numpy's `_reconstruct` (an allowed type) makes an empty array of 10^12 bytes."""

    def __reduce__(self):
        return (np.core.multiarray._reconstruct, (np.ndarray, (10 ** 12,), b"b"))


def test_a_verification_bin_cannot_ask_numpy_for_an_array_larger_than_itself(face_files, tmp_path):
    import pickle

    from embcache.face.data.verification import load_verification_bin

    path = tmp_path / "lfw.bin"
    path.write_bytes(pickle.dumps(([_HugeArray(), _HugeArray()], [True]), protocol=4))
    assert path.stat().st_size < 200
    with pytest.raises(UserFacingError, match="lfw.bin: not a verification .bin .* more than the file's"):
        load_verification_bin(path, 24)
    # numpy arrays a real file holds (is-same flags as an array) still load
    images = [(face_files / n).read_bytes() for n in ("a.jpg", "b.jpg")]
    path.write_bytes(pickle.dumps((images, np.array([True])), protocol=4))
    first, second, same = load_verification_bin(path, 24)
    assert first.shape == second.shape == (1, 3, 24, 24) and same.tolist() == [True]
