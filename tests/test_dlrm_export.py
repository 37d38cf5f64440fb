"""`embcache dlrm export` and `embcache.serve`: raw rows scored through the export equal the
trainer's predictions, tables equal the checkpoint's, every id maps back to its raw value,
and bad input is one line with nothing half-written."""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embcache.cli import main
from embcache.data.criteo import convert_criteo_kaggle, kaggle_split
from embcache.data.delimited import parse_count_feature
from embcache.distributed.table_checkpoint import full_tables
from embcache.checkpoint import load_checkpoint
from embcache.serve import load_export
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from embcache.dlrm.export import export_checkpoint
from embcache.train.run import checkpoint_to_evaluate

ROWS = 700
HASHED, LONG = 2, 4  # C3 has more distinct values than MAX_IDS allows; C5 has values over 8 bytes
MAX_IDS = 64


def _raw_columns(rng: np.random.Generator) -> list[list[str]]:
    """Criteo-layout columns (label, I1-I13, C1-C26) as strings: hex values from small
    pools, some missing, one hashed feature, one with long values."""
    label = rng.integers(0, 2, ROWS).astype(str).tolist()
    counts = [[("" if rng.random() < 0.1 else str(int(rng.integers(-2, 50)))) for _ in range(ROWS)]
              for _ in range(13)]
    cats = []
    for c in range(26):
        pool = [f"{int(x):08x}" for x in rng.integers(0, 2**32, 200 if c == HASHED else 12)]
        if c == LONG:
            pool += ["a-value-longer-than-eight", "ünï"]
        cats.append(["" if rng.random() < 0.05 else pool[int(rng.zipf(1.5)) % len(pool)] for _ in range(ROWS)])
    return [label, *counts, *cats]


def data_without_raw_values(run, dest):
    """The run's data copied to `dest` as a directory prepared before raw values were
    recorded (its ids are the values)."""
    shutil.copytree(run["root"] / "data", dest)
    meta = json.loads((dest / "meta.json").read_text())
    del meta["raw_values"]
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny Criteo file converted, trained for a few steps and exported (npy)."""
    root = tmp_path_factory.mktemp("export")
    columns = _raw_columns(np.random.default_rng(7))
    (root / "train.txt").write_text("".join("\t".join(row) + "\n" for row in zip(*columns)))
    convert_criteo_kaggle(root / "train.txt", root / "data", min_count=2, max_ids=MAX_IDS, progress=False)
    cfg = DLRMConfig(batch_size=64, eval_batch_size=4096, embedding_dim=4, dense_arch=[8], over_arch=[8],
                     max_steps=6, device="cpu", progress=False, checkpoint_dir=str(root / "ck"), cache_ratio=0.3)
    DLRMTrainer(cfg, root / "data").fit()
    export_checkpoint(root / "ck", root / "out")
    return {"root": root, "columns": columns, "ck": root / "ck" / "dlrm-last.pt", "out": root / "out"}


def trainer_logits(ck: Path, split: str, batch_size: int = 4096, batches: int | None = None) -> torch.Tensor:
    """The trainer's own logits on a split, as `dlrm evaluate` computes them (its first
    `batches` batches of `batch_size` rows where given). Compared bit for bit, both sides
    score batches of the same shape: a matrix product's rounding may depend on how many
    rows it multiplies (one row and two take different kernels on some CPUs)."""
    path, saved, cfg = checkpoint_to_evaluate(ck, "dlrm", DLRMConfig, "cpu")
    trainer = DLRMTrainer(cfg, saved["data_dir"])
    trainer.restore(path)
    trainer.model.eval()
    with torch.no_grad():
        scored = zip(range(batches or 1 << 62), trainer._batches(split, batch_size))
        return torch.cat([trainer.model(b.dense, b.sparse).reshape(-1) for _, b in scored])


def one_row_at_a_time(model, sparse: dict, dense) -> torch.Tensor:
    """An export's logits scored one row a batch: the shapes of a split of one row."""
    n = len(dense)
    return torch.cat([model.logits({f: v[i:i + 1] for f, v in sparse.items()}, dense[i:i + 1]) for i in range(n)])


def raw_val_rows(columns: list[list[str]]) -> tuple[dict, np.ndarray]:
    """The val split's raw rows (Kaggle protocol: the first half of the last seventh), the
    dense features as `data prepare` stored them."""
    start, stop = kaggle_split(ROWS)
    sparse = {f"sparse_{c}": [v or None for v in columns[14 + c][start:stop]] for c in range(26)}
    dense = np.stack([parse_count_feature(pa.array(columns[1 + j][start:stop]))[0] for j in range(13)], 1)
    return sparse, dense


def raw_dense(columns: list[list[str]], i: int) -> list:
    """Val row i's dense fields as the raw file has them: counts, None where empty."""
    start, _ = kaggle_split(ROWS)
    return [float(columns[1 + j][start + i]) if columns[1 + j][start + i] else None for j in range(13)]


def test_raw_rows_score_bit_for_bit_as_the_trainer(run):
    model = load_export(run["out"])
    sparse, dense = raw_val_rows(run["columns"])
    got = model.logits(sparse, dense)
    want = trainer_logits(run["ck"], "val")
    assert len(got) == kaggle_split(ROWS)[1] - kaggle_split(ROWS)[0]
    assert torch.equal(got, want)
    rows = [{**{f: sparse[f][i] for f in sparse}, "dense": raw_dense(run["columns"], i)} for i in range(3)]
    want3 = torch.sigmoid(trainer_logits(run["ck"], "val", batch_size=3, batches=1)).numpy()  # a batch of 3 rows
    assert np.array_equal(model.predict(rows), want3)  # raw counts, as the file has them
    prepared = [{**row, "dense": dense[i]} for i, row in enumerate(rows)]
    assert np.array_equal(model.predict(prepared, dense_prepared=True), want3)


def test_dlrm_predict_scores_raw_criteo_lines_as_the_trainer(run, tmp_path):
    """The val split's raw lines (with their labels, and again without) through `dlrm predict`:
    every probability equals sigmoid of the trainer's logit on that row, to the bit when the
    batch is the trainer's (all the val rows: matrix products of other batch sizes may take
    other kernels, equal to rounding)."""
    start, stop = kaggle_split(ROWS)
    lines = ["\t".join(row) for row in list(zip(*run["columns"]))[start:stop]]
    with_label, without = tmp_path / "val.txt", tmp_path / "unlabelled.txt"
    with_label.write_text("\n".join(lines) + "\n")
    without.write_text("\n".join(line.split("\t", 1)[1] for line in lines) + "\n")
    want = torch.sigmoid(trainer_logits(run["ck"], "val")).numpy()
    import pyarrow.csv as pcsv

    for source, out, rows in ((with_label, tmp_path / "p.parquet", "4096"), (without, tmp_path / "p.csv", "37")):
        assert main(["dlrm", "predict", str(run["out"]), "--input", str(source), "--out", str(out),
                     "--batch-rows", rows, "--no-progress"]) == 0
        got = pq.read_table(out) if out.suffix == ".parquet" else pcsv.read_csv(out)
        probability = got.column("probability").to_numpy()
        if rows == "4096":
            assert np.array_equal(probability, want)
        else:
            np.testing.assert_allclose(probability, want, rtol=1e-6)
        assert ("label" in got.column_names) == (source == with_label)
    bad = tmp_path / "bad.txt"
    bad.write_text(lines[0] + "\n" + lines[1].rsplit("\t", 1)[0] + "\n")
    assert main(["dlrm", "predict", str(run["out"]), "--input", str(bad), "--out", str(tmp_path / "b.csv"),
                 "--no-progress"]) != 0
    assert not (tmp_path / "b.csv").exists()


def test_unknown_feature_names_are_refused_by_name(run):
    """A row keyed by the raw file's column names (`C1`) would score as if every feature
    were missing: refused, naming the keys and the export's features."""
    model = load_export(run["out"])
    assert model.manifest["dense_transform"] == "log1p(max(x, 0))"
    row = {"C1": "68fd1e64", "dense": [0.0] * 13}
    with pytest.raises(ValueError, match=r"^row 0: unknown feature\(s\) 'C1'; the export's are sparse_0 .. sparse_25"):
        model.predict([row])


def test_none_and_a_left_out_feature_are_missing_and_a_bad_dense_row_is_one_line(run):
    """docs/export.md's row (`"sparse_25": None`): None and a feature left out both take the
    row of missing and unknown values (id 0), as an unseen value does; a dense vector of
    the wrong length is a ValueError naming it and the length expected."""
    model = load_export(run["out"])
    sparse, dense = raw_val_rows(run["columns"])
    row = {**{f: sparse[f][0] for f in sparse}, "dense": list(dense[0])}
    unseen = model.predict([{**row, "sparse_25": "never-seen"}])
    assert np.array_equal(model.predict([{**row, "sparse_25": None}]), unseen)
    assert np.array_equal(model.predict([{k: v for k, v in row.items() if k != "sparse_25"}]), unseen)
    # every feature left out: each takes the row of the data's empty field (a hashed feature
    # gives an unseen value a bucket, but a missing one id 0 too)
    assert np.array_equal(model.predict([{"dense": row["dense"]}]),
                          model.predict([{f: "" for f in sparse} | {"dense": row["dense"]}]))
    with pytest.raises(ValueError, match=r"^row 1: 'dense' has 12 values, expected 13 \(log\(max\(I1,0\)\+1\), missing -> 0 .. log\(max\(I13"):
        model.predict([row, {**row, "dense": row["dense"][:12]}])
    with pytest.raises(ValueError, match=r"^row 0: no 'dense' \(its 13 dense features"):
        model.predict([{"sparse_0": "x"}])
    with pytest.raises(ValueError, match=r"^dense: shape \[2, 12\], expected \[B, 13\]"):
        model.logits({f: v[:2] for f, v in sparse.items()}, dense[:2, :12])


def test_none_in_ids_scored_by_id_adds_nothing(run, tmp_path):
    """Data whose values are the ids (synthetic, the default run's data) has no row for a
    missing value: None or a feature left out adds nothing to the pooled embedding (an empty
    bag), where it raised `TypeError: int() argument ... 'NoneType'`."""
    old = data_without_raw_values(run, tmp_path / "old")
    export_checkpoint(run["ck"], tmp_path / "out", data=str(old))
    model = load_export(tmp_path / "out")
    row = {**{f: 1 for f in model.features}, "sparse_25": None, "dense": [0.0] * 13}
    pooled = model.pool_ids({f: (np.array([1]), [1]) if f != "sparse_25" else (np.array([], np.int64), [0])
                             for f in model.features})
    want = torch.sigmoid(model.logits_of_pooled(pooled, [row["dense"]])).numpy()
    assert np.array_equal(model.predict([row]), want)
    del row["sparse_25"]
    assert np.array_equal(model.predict([row]), want)
    assert torch.equal(pooled[0, 25], torch.zeros(4))
    with pytest.raises(ValueError, match=r"^sparse_3: ids are whole numbers \(the value is the id\), got 'a'$"):
        model.predict([{**row, "sparse_3": "a"}])


def test_tables_are_the_checkpoint_tables_in_both_formats(run, tmp_path):
    ck = load_checkpoint(run["ck"], "dlrm")
    saved = full_tables(run["ck"], ck["tables"])
    manifest = json.loads((run["out"] / "manifest.json").read_text())
    assert [t["name"] for t in manifest["tables"]] == [f"t_sparse_{c}" for c in range(26)]
    export_checkpoint(run["ck"], tmp_path / "pq", table_format="parquet")
    for t in manifest["tables"]:
        want = saved[t["name"]]["weight"]
        assert torch.equal(torch.from_numpy(np.load(run["out"] / t["file"])), want)
        table = pq.read_table(tmp_path / "pq" / f"tables/{t['name']}.parquet")
        assert table.column("id").to_pylist() == list(range(len(want)))
        rows = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        assert torch.equal(torch.from_numpy(rows), want)
    sparse, dense = raw_val_rows(run["columns"])
    assert torch.equal(load_export(tmp_path / "pq").logits(sparse, dense), load_export(run["out"]).logits(sparse, dense))


def test_every_id_maps_back_to_its_raw_value(run):
    model = load_export(run["out"])
    manifest = model.manifest
    assert [t["vocabulary"]["hashed"] for t in manifest["tables"]] == [c == HASHED for c in range(26)]
    for t, lookup in zip(manifest["tables"], model.lookups):
        vocab = t["vocabulary"]
        table = pq.read_table(run["out"] / vocab["file"])
        assert table.num_rows == t["rows"]
        if vocab["hashed"]:  # a bucket per id, never a value
            assert t["feature"] == f"sparse_{HASHED}" and table.column_names == ["bucket"]
            assert t["rows"] <= MAX_IDS
            continue
        values = table.column("value").to_pylist()
        assert values[0] is None  # id 0: missing or rarer than min_count
        assert lookup.ids(values[1:]).tolist() == list(range(1, t["rows"]))
        assert lookup.ids([None, "never-seen"]).tolist() == [0, 0]
    long_values = pq.read_table(run["out"] / f"vocab/sparse_{LONG}.parquet").column("value").to_pylist()
    assert {"a-value-longer-than-eight", "ünï"} <= set(long_values)


def cli(*args: str) -> int:
    return main(["dlrm", "export", *map(str, args)])


def test_a_non_empty_out_is_refused_unless_forced(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli(run["ck"], "--out", out) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{out}: exists and is not empty" in err
    assert (out / "keep.txt").read_text() == "mine"
    assert cli(run["ck"], "--out", out, "--force", "--format", "parquet") == 0
    assert not (out / "keep.txt").exists() and (out / "tables" / "t_sparse_0.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left beside it
    assert cli(run["ck"], "--out", run["ck"].parent, "--force") == 1  # never over its own checkpoint
    assert f"{run['ck'].parent}: holds {run['ck']}" in capsys.readouterr().err
    assert run["ck"].is_file()


def test_missing_and_truncated_checkpoints_are_one_line(run, tmp_path, capsys):
    assert cli(tmp_path / "nothing.pt", "--out", tmp_path / "a") == 1
    assert f"{tmp_path / 'nothing.pt'}: no such checkpoint file" in capsys.readouterr().err
    bad = tmp_path / "ck"
    shutil.copytree(run["ck"].parent, bad)
    blob = (bad / "dlrm-last.pt").read_bytes()
    (bad / "dlrm-last.pt").write_bytes(blob[: len(blob) // 2])
    assert cli(bad, "--out", tmp_path / "b") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad / 'dlrm-last.pt'}: corrupt or truncated" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_full_disk_leaves_the_old_export_and_no_temporary(run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(run["out"], out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    calls = []

    def full(path, array, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(path, array, *args, **kwargs)

    real_save = np.save
    monkeypatch.setattr(np, "save", full)
    assert cli(run["ck"], "--out", out, "--force") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "No space left on device" in err
    assert f"{out}/" in err and ".export-tmp" not in err  # names the file as it would be in --out
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.filterwarnings("ignore:No .* samples")  # a tiny split has one class only
def test_movielens_raw_rows_with_multi_hot_genres(tmp_path):
    """Exact lookups (raw user and item ids, names, age buckets, zip prefixes) and a
    multi-hot feature pooled by sum, against the trainer; rows in time order, so val and
    test are the last two ratings of the tiny copy."""
    from embcache.data.movielens_ctr import prepare_ml100k_ctr
    from tests.test_data_movielens import write_standard

    (tmp_path / "src").mkdir()
    prepare_ml100k_ctr(tmp_path / "data", write_standard(tmp_path / "src"), split="time", fractions=(0.6, 0.2, 0.2))
    cfg = DLRMConfig(batch_size=2, embedding_dim=4, dense_arch=[8], over_arch=[8], max_steps=3, device="cpu",
                     progress=False, checkpoint_dir=str(tmp_path / "ck"), cache_ratio=0.5, sparse_lr=0.5)
    DLRMTrainer(cfg, tmp_path / "data").fit()
    export_checkpoint(tmp_path / "ck", tmp_path / "out")
    # ratings 4 and 5 of u.data: user 2 (53, F, other, T8H1N) on item 9, user 10 (24, M, technician, 85711) on item 1
    sparse = {"sparse_0": ["2", "10"], "sparse_1": ["9", "1"], "sparse_2": ["50-55", "18-24"],
              "sparse_3": ["F", "M"], "sparse_4": ["other", "technician"], "sparse_5": ["T8H", "857"],
              "sparse_6": [["Action", "War", "Western"], ["Animation", "Comedy"]]}
    dense = [[0.53, 0.95], [0.24, 0.95]]
    got = load_export(tmp_path / "out").logits(sparse, dense)
    want = torch.cat([trainer_logits(tmp_path / "ck" / "dlrm-last.pt", s) for s in ("val", "test")])
    assert torch.equal(one_row_at_a_time(load_export(tmp_path / "out"), sparse, dense), want)  # the trainer's shapes
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)  # both rows in one batch: rounding only
    with pytest.raises(ValueError, match="sparse_0: value 99 is not in the vocabulary"):
        load_export(tmp_path / "out").logits({**sparse, "sparse_0": ["99", "2"]}, dense)
    # no row stands for a missing value here: None (or no genres) adds nothing
    no_genre = load_export(tmp_path / "out").logits({**sparse, "sparse_6": [[], ["Animation", "Comedy"]]}, dense)
    assert torch.equal(load_export(tmp_path / "out").logits({**sparse, "sparse_6": [None, ["Animation", "Comedy"]]},
                                                            dense), no_genre)
    assert torch.equal(load_export(tmp_path / "out").logits({**sparse, "sparse_2": [None, "18-24"]}, dense)[1], got[1])


def test_a_whole_table_checkpoint_exports_too(run, tmp_path):
    """`--sparse device` keeps torchrec tables and saves the whole model's state dict."""
    cfg = DLRMConfig(sparse="device", sparse_optimizer="sgd", batch_size=64, embedding_dim=4, dense_arch=[8],
                     over_arch=[8], max_steps=2, device="cpu", progress=False, checkpoint_dir=str(tmp_path / "ck"))
    DLRMTrainer(cfg, run["root"] / "data").fit()
    export_checkpoint(tmp_path / "ck", tmp_path / "out")
    sparse, dense = raw_val_rows(run["columns"])
    assert torch.equal(load_export(tmp_path / "out").logits(sparse, dense),
                       trainer_logits(tmp_path / "ck" / "dlrm-last.pt", "val"))


@pytest.mark.filterwarnings("ignore:No .* samples")
def test_avazu_hour_and_weekday_are_integers_behind_their_keys(tmp_path):
    """Avazu's hour of day and weekday are integers whose key is value + 1; the other
    columns are strings. Time split: the Wednesday 23h row is val, the Thursday 01h row test."""
    from embcache.data.avazu import CATEGORICAL, convert_avazu
    from tests.test_data_converters import AVAZU, TAIL_A, TAIL_C

    (tmp_path / "train.csv").write_text(AVAZU)
    convert_avazu(tmp_path / "train.csv", tmp_path / "data", split="time", progress=False)
    hours = pq.read_table(tmp_path / "data" / "raw_values" / "sparse_0.parquet").column("value").to_pylist()
    assert hours == [None, 0, 1, 23]
    cfg = DLRMConfig(batch_size=1, embedding_dim=4, dense_arch=[8], over_arch=[8], max_steps=1, device="cpu",
                     progress=False, checkpoint_dir=str(tmp_path / "ck"))
    DLRMTrainer(cfg, tmp_path / "data").fit()
    export_checkpoint(tmp_path / "ck", tmp_path / "out")
    tails = [t.split(",") for t in (TAIL_A, TAIL_C)]  # banner_pos .. C21: the columns after C1
    sparse = {"sparse_0": [23, 1], "sparse_1": [2, 3], "sparse_2": ["1005", "1002"],
              **{f"sparse_{3 + k}": [tails[0][k], tails[1][k]] for k in range(len(CATEGORICAL) - 1)}}
    dense = np.array([[23 / 23.0], [1 / 23.0]], dtype=np.float32)
    want = torch.cat([trainer_logits(tmp_path / "ck" / "dlrm-last.pt", s) for s in ("val", "test")])
    assert torch.equal(one_row_at_a_time(load_export(tmp_path / "out"), sparse, dense), want)  # batches of one, as trained


def test_verify_scores_a_split_through_the_export_and_the_trainer(run, tmp_path, capsys):
    assert cli(run["ck"], "--out", tmp_path / "out", "--verify", "test") == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    start, stop = kaggle_split(ROWS)
    assert report.pop("export_rows_per_s") > 0
    assert report == {"split": "test", "rows": ROWS - stop, "bit_for_bit": True, "max_abs_diff": 0.0}


def test_half_precision_rows_in_a_mapped_store_export_as_float32(run, tmp_path):
    """Rows stored as bfloat16 in an mmap host store come out as float32 (the exact values
    the bag pooled) and raw rows still score bit for bit as the trainer."""
    cfg = DLRMConfig(batch_size=64, embedding_dim=4, dense_arch=[8], over_arch=[8], max_steps=3, device="cpu",
                     progress=False, checkpoint_dir=str(tmp_path / "ck"), cache_ratio=0.3, row_dtype="bfloat16",
                     host_store=f"mmap:{tmp_path / 'store'}")
    DLRMTrainer(cfg, run["root"] / "data").fit()
    export_checkpoint(tmp_path / "ck", tmp_path / "out")
    model = load_export(tmp_path / "out")
    ck = load_checkpoint(tmp_path / "ck" / "dlrm-last.pt", "dlrm")
    saved = full_tables(tmp_path / "ck" / "dlrm-last.pt", ck["tables"])
    for entry, table in zip(model.manifest["tables"], model.tables):
        assert saved[entry["name"]]["weight"].dtype == torch.bfloat16 and table.dtype == torch.float32
        assert torch.equal(table, saved[entry["name"]]["weight"].float())
    sparse, dense = raw_val_rows(run["columns"])
    assert torch.equal(model.logits(sparse, dense), trainer_logits(tmp_path / "ck" / "dlrm-last.pt", "val"))


def test_data_without_raw_values_exports_ids_and_other_data_is_refused(run, tmp_path, capsys):
    """A directory prepared before raw values were recorded: the export says so and scores
    by id. A directory of other data (other cardinalities) is refused in one line."""
    old = data_without_raw_values(run, tmp_path / "old")
    export_checkpoint(run["ck"], tmp_path / "out", data=str(old))
    model = load_export(tmp_path / "out")
    assert {t["vocabulary"]["key"] for t in model.manifest["tables"]} == {"identity"}
    assert "no raw values" in model.manifest["tables"][0]["vocabulary"]["note"]
    val = pq.read_table(old / "val" / "part-00000.parquet").to_pydict()
    ids = {f: val[f] for f in model.features}
    dense = np.array([val[f"dense_{j}"] for j in range(13)], dtype=np.float32).T
    assert torch.equal(model.logits(ids, dense), trainer_logits(run["ck"], "val"))
    convert_criteo_kaggle(run["root"] / "train.txt", tmp_path / "other", min_count=1, progress=False)
    assert cli(run["ck"], "--out", tmp_path / "x", "--data", tmp_path / "other") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "other features, cardinalities or rows" in err
    assert not (tmp_path / "x").exists()


def test_a_table_saved_in_row_ranges_exports_whole(run, tmp_path):
    """The layout several ranks write: a table in parts by row range (here made by
    splitting a one-process checkpoint's part) exports as the same whole table."""
    from embcache.cache.stores.table_files import save_tensors
    from embcache.checkpoint import FORMAT_KEY, save_checkpoint

    ck_dir = tmp_path / "ck"
    shutil.copytree(run["ck"].parent, ck_dir)
    ck = load_checkpoint(ck_dir / "dlrm-last.pt", "dlrm")
    table = ck["tables"]["tables"]["t_sparse_1"]
    (start, stop, file), = table["parts"]
    cut = (start + stop) // 2
    tables_dir = ck_dir / ck["tables"]["dir"]
    whole = {k: v.clone() for k, v in full_tables(ck_dir / "dlrm-last.pt", ck["tables"])["t_sparse_1"].items()}
    table["parts"] = [[start, cut, "t_sparse_1.a"], [cut, stop, "t_sparse_1.b"]]
    for name, rows in (("t_sparse_1.a", slice(0, cut - start)), ("t_sparse_1.b", slice(cut - start, None))):
        (tables_dir / name).mkdir()
        save_tensors(tables_dir / name, {k: v[rows] for k, v in whole.items()})
    shutil.rmtree(tables_dir / file)
    save_checkpoint({k: v for k, v in ck.items() if k not in (FORMAT_KEY, "kind")}, ck_dir / "dlrm-last.pt", "dlrm")
    export_checkpoint(ck_dir, tmp_path / "out")
    split, one = load_export(tmp_path / "out"), load_export(run["out"])
    assert all(torch.equal(a, b) for a, b in zip(split.tables, one.tables))
    sparse, dense = raw_val_rows(run["columns"])
    assert torch.equal(split.logits(sparse, dense), one.logits(sparse, dense))


def test_a_damaged_export_file_is_refused_before_anything_is_scored(run, tmp_path):
    import shutil

    from embcache.errors import DataFormatError

    copy = tmp_path / "export"
    shutil.copytree(run["out"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    listed = set(manifest["files_crc32"])
    assert listed == {p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()} - {"manifest.json"}
    table = copy / manifest["tables"][0]["file"]
    data = bytearray(table.read_bytes())
    data[-5] ^= 0x20  # a weight of the table's last row
    table.write_bytes(bytes(data))
    with pytest.raises(DataFormatError, match=rf"{manifest['tables'][0]['file']}: corrupt export file: CRC-32"):
        load_export(copy)
