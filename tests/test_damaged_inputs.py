"""Damaged inputs against the real commands, seeded and fast: byte flips in payload and
structure, truncations, zero length, foreign files and binary garbage of every file kind the
project writes (run and face checkpoints, CF models, prepared shards, exports), and bad ids
and garbage in the text a user brings. For each: the command fails with one line naming the
file (no traceback), or skips and counts; nothing damaged is used without a word; the input
is the same on disk afterwards. Each test refuses every case it generates, as many as `PLANNED`
says for it (counted from the generator, not from which tests ran before), and the plan
holds at least 80 cases."""
import shutil

import pytest

from embcache.cli import main
from tests.damage import damaged_variants

FLIPS = 8  # single-byte flips a file kind (plus the seal's own bytes, a run of 16, cuts, foreign files)
CF_TEXT = [
    (b"", "no interactions"),
    (b"0 1 2\n1 2 x\n", "non-integer token 'x'"),
    (b"0 1 2\n1 -4 2\n", "negative id -4"),
    (b"0 1 2\n1 2 3\n2 99999999999999999999999\n", "beyond any 64-bit id"),
    (b"0 1 2\n1 2 3\n2 3 4\n3 4 5\n5 1000000000000\n", "far beyond the ids of train.txt"),
    (bytes(range(256)) * 8, "non-integer token"),
    (b"user_id,item_id\nu1,i1\n", "non-integer token"),
]


def _variants(good: bytes, seed: int, flips: int, every: int = 1) -> list[tuple[str, bytes]]:
    """The damaged variants a test feeds a command, distinct by name."""
    cases = list(damaged_variants(good, seed=seed, flips=flips))[::every]
    assert len({name for name, _ in cases}) == len(cases), [name for name, _ in cases]
    return cases


def _planned(flips: int, every: int = 1) -> int:
    """How many variants `damaged_variants` makes for `flips` (whatever the file's bytes)."""
    return len(list(damaged_variants(bytes(4096), flips=flips))[::every])


PLANNED = {"cf models": _planned(FLIPS), "cf text": len(CF_TEXT), "run checkpoints": _planned(FLIPS),
           "export files": 2 * _planned(FLIPS // 2), "prepared shards": _planned(FLIPS, every=2),
           "face checkpoints": _planned(FLIPS)}


def _refused(argv, capsys, path, data, name):
    """The command on damaged `data` at `path`: exit 1, one line naming the file, file unchanged."""
    path.write_bytes(data)
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith("warning:")]
    assert rc == 1, (name, err)
    assert len(lines) == 1 and "Traceback" not in "\n".join(err) and path.name in lines[0], (name, err)
    assert path.read_bytes() == data, name
    return lines[0]


@pytest.fixture(scope="module")
def cf_model(tmp_path_factory):
    from embcache.cf.data.synthetic import power_law_interactions
    from tests.test_cf_cli import write_lightgcn

    data = power_law_interactions(num_users=120, num_items=200, interactions=2400, communities=4, seed=3)
    d = write_lightgcn(tmp_path_factory.mktemp("cfd"), data)
    assert main(["cf", "train", "--data", str(d), "--epochs", "1", "--negatives", "4", "--threads", "1",
                 "--no-progress", "--save", str(d / "model.npz")]) == 0
    return d


def test_cf_models(cf_model, capsys, tmp_path):
    good = (cf_model / "model.npz").read_bytes()
    path = tmp_path / "model.npz"
    cases = _variants(good, seed=11, flips=FLIPS)
    for name, data in cases:
        _refused(["cf", "recommend", str(path), "--users", "0"], capsys, path, data, name)
    assert len(cases) == PLANNED["cf models"]


@pytest.mark.parametrize("text,why", CF_TEXT)
def test_cf_text_a_user_brings(cf_model, capsys, tmp_path, text, why):
    d = tmp_path / "lg"
    d.mkdir()
    (d / "test.txt").write_bytes((cf_model / "test.txt").read_bytes())
    path = d / "train.txt"
    line = _refused(["cf", "train", "--data", str(d), "--epochs", "1", "--no-progress"], capsys, path, text,
                    f"{why} ({text[:12]!r})")
    assert why in line


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    from tests.small_runs import trained_dlrm_run

    return trained_dlrm_run(tmp_path_factory.mktemp("dlrm_damage"), rows=3000, steps=3)


def test_run_checkpoints(dlrm_run, capsys, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(dlrm_run / "ck", ck)
    path = ck / "dlrm-last.pt"
    good = path.read_bytes()
    cases = _variants(good, seed=12, flips=FLIPS)
    for name, data in cases:
        _refused(["dlrm", "evaluate", str(path), "--data", str(dlrm_run / "data")], capsys, path, data, name)
    assert len(cases) == PLANNED["run checkpoints"]


def test_export_files(dlrm_run, capsys, tmp_path):
    import json

    export = tmp_path / "export"
    shutil.copytree(dlrm_run / "export", export)
    rows = tmp_path / "rows.txt"
    rows.write_text("0\t" + "\t".join(["1"] * 13 + ["68fd1e64"] * 26) + "\n")
    manifest = json.loads((export / "manifest.json").read_text())
    files = [export / manifest["tables"][0]["file"], export / manifest["dense_model"]["file"]]
    refused = 0
    for k, path in enumerate(files):
        good = path.read_bytes()
        for name, data in _variants(good, seed=20 + k, flips=FLIPS // 2):
            _refused(["dlrm", "predict", str(export), "--input", str(rows), "--out", str(tmp_path / "p.csv"),
                      "--no-progress"], capsys, path, data, name)
            refused += 1
        path.write_bytes(good)
    assert refused == PLANNED["export files"]
    assert not (tmp_path / "p.csv").exists()


def test_prepared_shards(dlrm_run, capsys, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(dlrm_run / "data", data_dir)
    path = next((data_dir / "val").glob("*.parquet"))
    good = path.read_bytes()
    cases = _variants(good, seed=13, flips=FLIPS, every=2)
    for name, data in cases:
        _refused(["dlrm", "evaluate", str(dlrm_run / "ck"), "--data", str(data_dir), "--split", "val"], capsys, path,
                 data, name)
    assert len(cases) == PLANNED["prepared shards"]


def test_face_checkpoints(capsys, tmp_path):
    ck = tmp_path / "ck"
    assert main(["face", "train", "--num-classes", "40", "--batch-size", "16", "--epochs", "1", "--eval-classes", "20",
                 "--no-progress", "--checkpoint-dir", str(ck)]) == 0
    capsys.readouterr()
    path = ck / "face-last.pt"
    good = path.read_bytes()
    cases = _variants(good, seed=14, flips=FLIPS)
    for name, data in cases:
        _refused(["face", "evaluate", str(path)], capsys, path, data, name)
    assert len(cases) == PLANNED["face checkpoints"]


def test_at_least_eighty_damaged_inputs_are_refused():
    """The cases the tests above generate, counted from the generator: as many whichever
    tests run, in whatever order (each test asserts it refused its `PLANNED` share)."""
    assert sum(PLANNED.values()) >= 80, PLANNED
