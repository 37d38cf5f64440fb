"""Opening a file from someone else runs no code (docs/integrity.md, "Opening files from
others"). A crafted pickle whose reduction would create a marker file is written, with a
valid CRC seal, into every kind of pickled file the project opens (run checkpoints of dlrm,
face and cf, the table checkpoint's and a bag's cache state, an export's files), and goes
through every command that opens it and the Python API: each is one line naming the file,
and the marker never appears. Legitimate files still load; a file that needs more than plain
data loads once with --trust-checkpoint and needs no trust after `embcache upgrade`. A
manifest naming a file outside its folder and an image-bomb header are refused in one line."""
import io
import json
import pathlib
import shutil
import struct
import zipfile
import zlib

import numpy as np
import pytest
import torch

from embcache.cli import main
from embcache.errors import UserFacingError
from embcache.integrity import file_crc32, seal_zip


class Marker:
    """Unpickled, it creates `path` (as `os.system` or anything else could run)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(path: pathlib.Path, marker, **extra) -> None:
    """`path`'s own payload with a `Marker` (and `extra`) added, sealed as embcache seals it."""
    payload = torch.load(path, weights_only=False)
    payload.update(extra)
    if marker is not None:
        payload["x"] = Marker(marker)
    path.unlink()
    torch.save(payload, path)
    seal_zip(path)


def _one_line(argv, capsys, name, marker=None, rc=1):
    """Run the command: exit `rc`, one line (warnings aside) naming `name`, no marker."""
    got = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith("warning:")]
    assert got == rc, (argv, err)
    assert "Traceback" not in "\n".join(err), err
    if rc:
        assert len(lines) == 1 and name in lines[0], (argv, err)
    assert marker is None or not marker.exists(), argv
    return lines[0] if lines else ""


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    from tests.small_runs import trained_dlrm_run

    return trained_dlrm_run(tmp_path_factory.mktemp("safe_dlrm"), rows=2000, steps=2)


DLRM_TRAIN = ["dlrm", "train", "--batch-size", "128", "--embedding-dim", "4", "--max-steps", "3", "--no-progress"]


@pytest.mark.parametrize("which", ["dlrm-last.pt", "table checkpoint"])
def test_dlrm_checkpoint_and_its_table_checkpoint_run_no_code(dlrm_run, which, tmp_path, capsys):
    from embcache.checkpoint import load_checkpoint
    from embcache.dlrm.export import export_checkpoint

    ck, data, marker = tmp_path / "ck", dlrm_run / "data", tmp_path / "MARKER"
    shutil.copytree(dlrm_run / "ck", ck)
    path = ck / "dlrm-last.pt" if which == "dlrm-last.pt" else next(ck.glob("dlrm-tables-*/cache.rank0.pt"))
    _plant(path, marker)
    commands = [["dlrm", "evaluate", ck, "--data", data], ["dlrm", "evaluate", ck, "--data", data, "--split", "val"],
                [*DLRM_TRAIN, "--data", data, "--checkpoint-dir", ck, "--resume"]]
    if which == "dlrm-last.pt":  # export reads the table checkpoint's rows, not its cache state
        commands.append(["dlrm", "export", ck, "--data", data, "--out", tmp_path / "out"])
    for argv in commands:
        line = _one_line(argv, capsys, path.name, marker)
        assert "io.open" in line and "--trust-checkpoint" in line, line
    if which == "dlrm-last.pt":
        # a run started afresh in its directory reads the checkpoint's position: refused, named
        _one_line([*DLRM_TRAIN, "--data", data, "--checkpoint-dir", ck], capsys, path.name, marker)
        for load in (lambda: export_checkpoint(ck, tmp_path / "out2"), lambda: load_checkpoint(path, "dlrm")):
            with pytest.raises(UserFacingError, match=f"{path.name}.*io.open"):
                load()
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def face_run(tmp_path_factory):
    from tests.small_runs import trained_face_run

    return trained_face_run(tmp_path_factory.mktemp("safe_face"), "--head", "fc")


def test_face_checkpoint_runs_no_code(face_run, tmp_path, capsys):
    from embcache.checkpoint import load_checkpoint
    from embcache.face.use import load_probe

    ck, marker, images = tmp_path / "ck", tmp_path / "MARKER", face_run / "data" / "p0"
    shutil.copytree(face_run / "ck", ck)
    path = ck / "face-last.pt"
    _plant(path, marker)
    for argv in (["face", "evaluate", ck],
                 ["face", "embed", ck, images, "--out", tmp_path / "e.npy", "--no-progress"],
                 ["face", "verify", ck, images / "0.jpg", images / "1.jpg"],
                 ["face", "search", ck, "--gallery", face_run / "data", "--query", images, "--no-progress"],
                 ["face", "export", ck, "--onnx", tmp_path / "m.onnx"],
                 ["face", "train", "--data", face_run / "data", "--image-size", "24", "--backbone", "cnn", "--head",
                  "fc", "--batch-size", "8", "--epochs", "2", "--no-progress", "--checkpoint-dir", ck, "--resume"]):
        assert "io.open" in _one_line(argv, capsys, path.name, marker)
    for load in (lambda: load_checkpoint(path, "face"), lambda: load_probe(ck)):
        with pytest.raises(UserFacingError, match="face-last.pt"):
            load()
    assert not marker.exists()


@pytest.fixture(scope="module")
def cf_run(tmp_path_factory):
    from embcache.cf.data.synthetic import power_law_interactions
    from tests.test_cf_cli import write_lightgcn

    root = tmp_path_factory.mktemp("safe_cf")
    data = power_law_interactions(num_users=80, num_items=120, interactions=1500, communities=4, seed=3)
    write_lightgcn(root, data)
    assert main(["cf", "train", "--data", str(root), "--epochs", "1", "--negatives", "4", "--threads", "1",
                 "--no-progress", "--checkpoint-dir", str(root / "ck")]) == 0
    return root


def test_cf_checkpoint_runs_no_code_and_its_numpy_arrays_load_without_trust(cf_run, tmp_path, capsys):
    from embcache.cf.trainer import params_from_checkpoint

    # the checkpoints CF writes hold numpy arrays: plain data, loaded with no word
    assert main(["cf", "evaluate", str(cf_run / "ck"), "--data", str(cf_run)]) == 0
    assert "warning" not in capsys.readouterr().err
    ck, marker = tmp_path / "ck", tmp_path / "MARKER"
    shutil.copytree(cf_run / "ck", ck)
    path = ck / "cf-last.pt"
    _plant(path, marker)
    for argv in (["cf", "evaluate", ck, "--data", cf_run],
                 ["cf", "train", "--data", cf_run, "--epochs", "2", "--negatives", "4", "--threads", "1",
                  "--no-progress", "--checkpoint-dir", ck, "--resume"]):
        assert "io.open" in _one_line(argv, capsys, path.name, marker)
    with pytest.raises(UserFacingError, match="cf-last.pt"):
        params_from_checkpoint(path, None)
    assert not marker.exists()


def test_a_bags_cache_state_runs_no_code(tmp_path):
    from embcache import CachedEmbeddingBag

    bag = CachedEmbeddingBag(200, 4, cache_ratio=0.1, optimizer="adagrad", device="cpu")
    bag.save_checkpoint(tmp_path / "bag")
    marker, path = tmp_path / "MARKER", tmp_path / "bag" / "cache.pt"
    _plant(path, marker)
    with pytest.raises(UserFacingError, match="cache.pt.*io.open"):
        CachedEmbeddingBag(200, 4, cache_ratio=0.1, optimizer="adagrad", device="cpu").load_checkpoint(path.parent)
    assert not marker.exists()


def _reseal_export(export: pathlib.Path) -> None:
    """The manifest's CRC-32s made to match the files again (as anyone can)."""
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["files_crc32"] = {name: file_crc32(export / name) for name in manifest["files_crc32"]}
    (export / "manifest.json").write_text(json.dumps(manifest))


def _rewrite_zip(path: pathlib.Path, replace) -> None:
    """`path` (a zip) with each member's bytes passed through `replace(name, data)`."""
    with zipfile.ZipFile(path) as old:
        members = [(info, old.read(info.filename)) for info in old.infolist()]
    with zipfile.ZipFile(path, "w") as new:
        for info, data in members:
            new.writestr(info, replace(info.filename, data))


def _pickled(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _sample_inputs(marker):
    return lambda name, data: _pickled(Marker(marker)) if name.endswith("sample_inputs/model.pt") else data


def _pickled_weight(marker):
    def replace(name, data):
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        if name.endswith("weights/weight_0"):
            return _pickled(Marker(marker))
        return data
    return replace


@pytest.mark.parametrize("damage", ["sample inputs", "pickled weight", "object table", "object keys"])
def test_an_exports_files_run_no_code(dlrm_run, damage, tmp_path, capsys):
    from embcache.serve import load_export

    export, marker = tmp_path / "export", tmp_path / "MARKER"
    shutil.copytree(dlrm_run / "export", export)
    manifest = json.loads((export / "manifest.json").read_text())
    if damage in ("sample inputs", "pickled weight"):
        path = export / manifest["dense_model"]["file"]
        _rewrite_zip(path, _sample_inputs(marker) if damage == "sample inputs" else _pickled_weight(marker))
    else:
        table = manifest["tables"][0]
        path = export / (table["file"] if damage == "object table" else "vocab/keys.npy")
        np.save(path, np.array([Marker(marker)] * table["rows"], dtype=object), allow_pickle=True)
        if damage == "object keys":
            table["vocabulary"]["keys_file"] = "vocab/keys.npy"
            manifest["files_crc32"]["vocab/keys.npy"] = 0
            (export / "manifest.json").write_text(json.dumps(manifest))
    _reseal_export(export)
    rows = tmp_path / "rows.txt"
    rows.write_text("0\t" + "\t".join(["1"] * 13 + ["68fd1e64"] * 26) + "\n")
    _one_line(["dlrm", "predict", export, "--input", rows, "--out", tmp_path / "p.csv", "--no-progress"], capsys,
              path.name, marker)
    with pytest.raises(UserFacingError, match=path.name):
        load_export(export)
    assert not marker.exists() and not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("name", ["../outside.npy", "/tmp/outside.npy"])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(dlrm_run, name, tmp_path, capsys):
    export = tmp_path / "export"
    shutil.copytree(dlrm_run / "export", export)
    manifest = json.loads((export / "manifest.json").read_text())
    first = manifest["tables"][0]["file"]
    outside = (export / name).resolve() if not name.startswith("/") else tmp_path / "abs.npy"
    shutil.copy(export / first, outside)  # a valid table there: the old reader used it as the table
    name = name if not name.startswith("/") else str(outside)
    manifest["tables"][0]["file"] = name
    manifest["files_crc32"][name] = manifest["files_crc32"].pop(first)
    (export / "manifest.json").write_text(json.dumps(manifest))
    rows = tmp_path / "rows.txt"
    rows.write_text("0\t" + "\t".join(["1"] * 13 + ["68fd1e64"] * 26) + "\n")
    line = _one_line(["dlrm", "predict", export, "--input", rows, "--out", tmp_path / "p.csv", "--no-progress"],
                     capsys, "manifest.json")
    assert name in line and "outside" in line, line
    assert not (tmp_path / "p.csv").exists()


def test_a_checkpoint_that_needs_trust_loads_once_with_it_and_upgrade_makes_it_plain(dlrm_run, tmp_path, capsys):
    """A checkpoint of an earlier version that pickled a path: refused in one line naming
    the type, loaded with --trust-checkpoint (one warning line saying what that means),
    resaved as plain data by `embcache upgrade`, then loaded with no trust and no word."""
    from embcache.checkpoint import load_checkpoint
    from embcache.safe_load import needed_types, trusting

    ck, data = tmp_path / "ck", dlrm_run / "data"
    shutil.copytree(dlrm_run / "ck", ck)
    path = ck / "dlrm-last.pt"
    _plant(path, None, data_dir=pathlib.Path(data).resolve())
    evaluate = ["dlrm", "evaluate", ck, "--data", data, "--split", "val"]
    line = _one_line(evaluate, capsys, path.name)
    assert "pathlib.PosixPath" in line and "--trust-checkpoint" in line, line
    assert main([str(a) for a in evaluate] + ["--trust-checkpoint"]) == 0
    warned = [w for w in capsys.readouterr().err.splitlines() if "trust" in w]
    assert len(warned) == 1 and path.name in warned[0] and "Python code" in warned[0]
    assert isinstance(load_checkpoint(path, "dlrm", trust=True)["data_dir"], pathlib.Path)
    with trusting():
        load_checkpoint(path, "dlrm")
    assert "pathlib.PosixPath" in _one_line(["upgrade", path], capsys, path.name)
    import embcache.safe_load

    embcache.safe_load._warned.clear()  # warned once a file per process: warned again here
    assert main(["upgrade", str(path), "--trust-checkpoint"]) == 0
    said = capsys.readouterr()
    assert "resaved as plain data" in said.out
    warned = [w for w in said.err.splitlines() if "trust" in w]  # not advice to run the command running
    assert len(warned) == 1 and "resaved as plain data now" in warned[0] and "embcache upgrade" not in warned[0]
    assert needed_types(path) == []
    assert load_checkpoint(path, "dlrm")["data_dir"] == str(pathlib.Path(data).resolve())
    assert main([str(a) for a in evaluate]) == 0
    assert "trust" not in capsys.readouterr().err


class _GoneType:
    """A type an earlier version pickled and this one no longer has (its module is gone)."""


def test_upgrading_a_checkpoint_that_names_a_type_no_longer_there_is_one_line(tmp_path, capsys):
    import sys
    import types

    from embcache.integrity import save_torch

    old = types.ModuleType("embcache_removed_module")
    _GoneType.__module__ = old.__name__
    old._GoneType = _GoneType
    sys.modules[old.__name__] = old
    try:
        save_torch({"step": 1, "setting": _GoneType()}, tmp_path / "old.pt")
    finally:
        del sys.modules[old.__name__]
        _GoneType.__module__ = __name__
    line = _one_line(["upgrade", tmp_path / "old.pt", "--trust-checkpoint"], capsys, "old.pt")
    assert "cannot be loaded" in line and "embcache_removed_module" in line, line


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels, with one pixel of data."""
    buf = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


@pytest.mark.parametrize("side", [10_000, 20_000])  # Pillow's limit ~89 M pixels: it warned below twice that
def test_an_image_bomb_is_refused_before_decoding(face_run, side, tmp_path, capsys):
    from embcache.face.data.recordio import RecordIOFaces, write_recordio
    from embcache.face.data.images import encode_jpeg

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_header(side, side))
    line = _one_line(["face", "embed", face_run / "ck", bomb, "--out", tmp_path / "e.npy", "--no-progress"], capsys,
                     "bomb.png")
    assert "decompression bomb" in line and "refused before decoding" in line, line
    good = encode_jpeg(np.zeros((16, 16, 3), dtype=np.uint8))
    write_recordio(tmp_path / "train.rec", [(0, good), (0, _png_header(side, side)), (1, good), (1, good)])
    faces = RecordIOFaces(tmp_path / "train.rec", image_size=16, progress=False)
    _, ok = faces.load(torch.tensor([0, 1, 2]))
    assert ok.tolist() == [True, False, True]
    assert "decompression bomb" in faces.take_fresh_unreadable()[0][3]
