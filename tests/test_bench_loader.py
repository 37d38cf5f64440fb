"""`embcache bench loader` and `bench gpu --from-shards` at tiny sizes: the JSON's structure,
rates above zero, the step's batches equal to the loader's, a mismatching directory refused
in one line. No timing is asserted."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from embcache.bench.shard_feed import FlatIds, ShardSteps
from embcache.cli import main
from embcache.data.loader import CTRBatches
from embcache.data.synthetic import generate_synthetic


@pytest.fixture(scope="module")
def criteo_shaped(tmp_path_factory):
    out = tmp_path_factory.mktemp("criteo_shaped")
    generate_synthetic(out, rows=3000, scale=0.0005, seed=2, chunk_rows=500, rows_per_shard=1200)
    return out


def test_bench_loader_writes_rates_per_reader_count(criteo_shaped, tmp_path, capsys):
    rc = main(["bench", "loader", str(criteo_shaped), "--readers", "2", "1", "--batch-size", "128", "--batches", "12",
               "--repeats", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "loader.json").read_text())
    assert data["benchmark"] == "loader" and data["batch_size"] == 128 and "hardware" in data
    assert [r["readers"] for r in data["rates"]] == [1, 2]
    for r in data["rates"]:
        assert r["batches"] == 12 and r["rows"] == 12 * 128 and len(r["seconds"]) == 2
        assert r["rows_per_s"] > 0 and r["same_batches_as_one_thread"] is True
    assert data["background_one_thread_rows_per_s"] > 0
    assert "2 reader(s):" in capsys.readouterr().out
    assert not [t for t in threading.enumerate() if t.name.startswith("embcache-reader")]


def test_the_step_is_fed_the_loaders_batches(criteo_shaped):
    """`ShardSteps[i]` is batch i of the one-thread loader, ids moved into the one id space,
    however it is asked for (forward, again from the start, ahead for a prefetch)."""
    loader = CTRBatches(criteo_shaped, "train", 100, drop_last=True)
    want = [FlatIds(ShardSteps(criteo_shaped, 100, 1, 1, False).cardinalities, False)(b) for b in loader]
    steps = ShardSteps(criteo_shaped, 100, 9, readers=2, pin=False, keep=2)
    assert len(steps) == 9 and steps.num_rows == sum(steps.cardinalities)
    for order in (range(9), [0, 2, 1, 3, 5, 4], [7, 8]):
        for i in order:
            (ids,), dense, labels = steps[i]
            assert ids.shape == (100, 26) and ids.is_contiguous()
            assert torch.equal(ids, want[i][0][0]) and torch.equal(dense, want[i][1])
            assert torch.equal(labels, want[i][2])
    first = loader.host_batches().__next__()
    cards = torch.tensor([0] + steps.cardinalities[:-1]).cumsum(0)
    assert torch.equal(want[0][0][0][:, 3], first.sparse.values()[300:400] + cards[3])
    with pytest.raises(IndexError):
        steps[9]
    steps.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("embcache-reader")]


def test_bench_gpu_from_shards_reports_the_loader_beside_the_step(criteo_shaped, tmp_path):
    rc = main(["bench", "gpu", "--from-shards", str(criteo_shaped), "--dims", "4", "--batch-size", "64", "--steps",
               "3", "--warmup-steps", "1", "--ratios", "0.3", "--device", "cpu", "--out", str(tmp_path),
               "--link-table-mib", "1", "--bookkeeping", "host", "--no-price-prefetch", "--readers", "1", "2"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["config"]["from_shards"] == str(criteo_shaped)
    assert [b["shape"] for b in data["blocks"]] == ["one-hot"]  # the data's shape, whatever --shapes says
    loader = data["loader"]
    assert loader["readers_feeding_the_step"] == 2 and [r["readers"] for r in loader["rates"]] == [1, 2]
    assert all(r["rows_per_s"] > 0 and r["same_batches_as_one_thread"] for r in loader["rates"])
    for row in data["rows"]:
        assert row["loader_rows_per_s"] == loader["rates"][1]["rows_per_s"]
        assert row["loader_vs_step"] == pytest.approx(row["loader_rows_per_s"] / row["samples_per_s"])
    whole, cached = data["blocks"][0]["results"]
    assert cached["max_loss_diff_vs_gpu_tables"] == 0.0 and len(set(whole["losses"])) > 1
    assert data["num_rows"] == sum(ShardSteps(criteo_shaped, 64, 1, 1, False).cardinalities)


def test_a_directory_not_shaped_as_the_model_is_refused_in_one_line(tmp_path, capsys):
    other = tmp_path / "small"
    generate_synthetic(other, rows=500, scale=0.0005, seed=0)
    meta = json.loads((other / "meta.json").read_text())
    meta["num_dense"] = 12
    (other / "meta.json").write_text(json.dumps(meta))
    assert main(["bench", "loader", str(other), "--batch-size", "64", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has 12 dense and 26 sparse features, the model 13 and 26" in err
    rc = main(["bench", "gpu", "--from-shards", str(other), "--dims", "4", "--device", "cpu", "--out", str(tmp_path)])
    assert rc != 0 and "the model 13 and 26" in capsys.readouterr().err
