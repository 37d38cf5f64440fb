"""An open table too large for one rank, split over 2 gloo ranks by key hash (forced here by
a small `--row-wise-rows`): no bound reached, the ranks train what one process trains (the
same keys, rows within the 2-rank tolerance of tests/test_open_vocab_distributed.py, the
same next-day AUCs to 1e-5); each rank holds only the keys it owns, together every key once;
a checkpoint moves between 1 process and 2 split ranks with its keys and values."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from embcache.checkpoint import load_checkpoint
from embcache.distributed import placement
from embcache.distributed.sharded_collection import open_shard_settings, shard_config
from embcache.distributed.table_checkpoint import _open_rows, _read_open_part
from embcache.errors import CheckpointError
from embcache.sparse_types import EmbeddingBagConfig
from tests.test_open_vocab_distributed import TOLERANCE, keyed_tables
from tests.torchrun_helpers import embcache, torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
SPLIT = ["--row-wise-rows", "150"]  # open tables of more keys expected are split by key hash


def test_an_open_table_over_the_threshold_becomes_one_key_hash_shard_per_rank():
    tables = [placement.TableLoad("big", ("fb",), 1000, 5.0, open=True),
              placement.TableLoad("closed", ("fc",), 1000, 5.0),
              placement.TableLoad("small", ("fs",), 50, 1.0, open=True)]
    shards = placement.plan(tables, 2, row_wise_rows=100)
    big = [s for s in shards if s.table == "big"]
    assert [(s.rank, s.kind, s.parts, s.name, s.feature_key("fb")) for s in big] == \
        [(0, "key_hash", 2, "big", "fb"), (1, "key_hash", 2, "big", "fb")]
    assert not any(s.whole for s in big) and sum(s.rows for s in big) == 1000
    closed = [s for s in shards if s.table == "closed"]  # as before: row ranges, shifted names
    assert [(s.name, s.row_start, s.row_stop, s.kind, s.whole) for s in closed] == \
        [("closed@0", 0, 500, "rows", False), ("closed@500", 500, 1000, "rows", False)]
    assert [(s.name, s.kind, s.whole) for s in shards if s.table == "small"] == [("small", "rows", True)]
    assert all(s.whole for s in placement.plan(tables, 2, row_wise_rows=10**6))
    assert all(s.whole for s in placement.plan(tables, 1, row_wise_rows=100))
    keys = torch.arange(-5000, 5000) * 7919
    owner = placement.key_owner(keys, 2)
    assert torch.equal(big[0].owns(keys), owner == 0) and torch.equal(big[1].owns(keys), owner == 1)
    assert 0.45 < float((owner == 0).float().mean()) < 0.55
    config = EmbeddingBagConfig(name="big", embedding_dim=4, num_embeddings=1000, feature_names=["fb"])
    settings = {"max_rows": 101, "retire": "lru", "seed": 7}
    assert open_shard_settings(settings, config, big[1]) == {**settings, "max_rows": 51, "init_bound": 1000 ** -0.5}
    assert open_shard_settings({**settings, "max_rows": None}, config, big[0])["max_rows"] is None
    assert shard_config(config, big[1]) == replace(config, num_embeddings=500)  # its name and features kept


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("days") / "d"
    generate_synthetic(out, rows=3000, scale=0.002, seed=0, days=3, drift=0.2, keys="raw")
    return out


def args(data, ckdir):  # no --max-rows: nothing retires; row-wise Adagrad (test_open_vocab_distributed: why)
    return ["dlrm", "train", "--data", str(data), "--days", "0-1", "--eval-next-day",
            "--batch-size", "256", "--embedding-dim", "8", "--dense-arch", "16", "--over-arch", "16",
            "--device", "cpu", "--no-progress", "--cache-ratio", "0.2", "--sparse-optimizer", "rowwise_adagrad",
            "--checkpoint-dir", str(ckdir)]


@pytest.fixture(scope="module")
def one(days, tmp_path_factory):
    """One process, uninterrupted: (its summary, its tables by key)."""
    ckdir = tmp_path_factory.mktemp("one")
    run = embcache(*args(days, ckdir))
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), keyed_tables(ckdir)[1]


def same_tables(t1, t2):
    assert t1.keys() == t2.keys()
    for name in t1:
        assert t1[name].keys() == t2[name].keys(), name
        a = torch.stack([t1[name][k] for k in t1[name]])
        b = torch.stack([t2[name][k] for k in t1[name]])
        assert torch.allclose(a, b, rtol=0, atol=TOLERANCE), (name, float((a - b).abs().max()))


def test_two_ranks_split_by_key_hash_train_what_one_process_does(days, one, tmp_path):
    s1, t1 = one
    two = torchrun(2, *args(days, tmp_path), *SPLIT)
    assert two.returncode == 0, two.stderr[-2000:]
    s2 = json.loads(two.stdout.strip().splitlines()[-1])
    assert s1["retired_keys"] == s2["retired_keys"] == 0
    for k in ("live_keys", "new_keys"):
        assert s1[k] == s2[k], k
    assert [r["auc"] for r in s2["next_day"]] == pytest.approx([r["auc"] for r in s1["next_day"]], abs=1e-5)
    ck, t2 = keyed_tables(tmp_path)
    manifest = ck["tables"]
    split = [n for n, t in manifest["tables"].items() if t.get("key_hash")]
    assert split and len(split) < len(manifest["tables"])  # some tables split, the small ones whole
    for name in split:
        table = manifest["tables"][name]
        assert table["open"] and table["key_hash"] == 2 and len(table["parts"]) == 2
        held = []
        for rank, (_, _, file) in enumerate(table["parts"]):
            keys = _read_open_part(tmp_path / manifest["dir"] / file)["open.keys"].reshape(-1)
            assert bool((placement.key_owner(keys, 2) == rank).all()), (name, rank)  # only the keys it owns
            held += keys.tolist()
        assert len(held) == len(set(held)) and set(held) == set(t1[name]), name  # every key, once
    same_tables(t1, t2)
    refused_when_inconsistent(tmp_path / manifest["dir"], manifest["tables"][split[0]], split[0])


def refused_when_inconsistent(directory, table, name):
    """A split table's parts swapped (each holds the other rank's keys), or a key in both:
    a one-line CheckpointError naming the file or the table."""
    shard = placement.Shard(name, (), 0, 0, 1, table["rows"], kind="key_hash", parts=2)
    (a, b) = (directory / file for _, _, file in table["parts"])
    a.rename(directory / "swap")
    b.rename(a)
    (directory / "swap").rename(b)
    with pytest.raises(CheckpointError, match=rf"{a.name}: holds keys that are not shard 0's of 2"):
        _open_rows(directory, table, shard)
    three = placement.Shard(name, (), 0, 0, 1, table["rows"], kind="key_hash", parts=3)
    both = {**table, "parts": [table["parts"][0], table["parts"][0]]}
    with pytest.raises(CheckpointError, match=rf"open table '{name}' has a key saved in two parts"):
        _open_rows(directory, both, three)
    (a / "open.keys.bin").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        _open_rows(directory, table, three)
    assert a.name in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_moves_between_one_process_and_two_split_ranks(days, one, tmp_path):
    """1 process -> 2 ranks split by key hash -> the same 2 ranks -> 1 process: each resume
    gives every key to its owner, values and optimizer state unchanged, and the run ends as
    the uninterrupted one."""
    s1, t1 = one
    first = embcache(*args(days, tmp_path), "--max-steps", "14")  # 2 steps into day 1
    assert first.returncode == 0, first.stderr[-2000:]
    split = torchrun(2, *args(days, tmp_path), *SPLIT, "--resume", "--max-steps", "17")
    assert split.returncode == 0, split.stderr[-2000:]
    ck = load_checkpoint(tmp_path / "dlrm-last.pt", "dlrm")
    assert ck["tables"]["world_size"] == 2 and any(t.get("key_hash") for t in ck["tables"]["tables"].values())
    again = torchrun(2, *args(days, tmp_path), *SPLIT, "--resume", "--max-steps", "19")  # each shard its own part
    assert again.returncode == 0, again.stderr[-2000:]
    assert "the caches start cold" in split.stdout + split.stderr  # another placement: keys in new rows
    assert "the caches start cold" not in again.stdout + again.stderr  # its own parts: every key in its row, warm
    last = embcache(*args(days, tmp_path), "--resume")
    assert last.returncode == 0, last.stderr[-2000:]
    s3 = json.loads(last.stdout.strip().splitlines()[-1])
    for k in ("live_keys", "new_keys", "retired_keys"):
        assert s1[k] == s3[k], k
    assert [r["auc"] for r in s3["next_day"]] == pytest.approx([r["auc"] for r in s1["next_day"]], abs=1e-5)
    same_tables(t1, keyed_tables(tmp_path)[1])


def test_a_split_tables_bound_is_divided_over_its_shards(days, tmp_path):
    """`--max-rows first-day` over a table split by key hash: each shard retires its own
    coldest keys past its share of the bound (ceil), so no shard holds much more than that
    (a step's keys stay for their step)."""
    run = torchrun(2, *args(days, tmp_path), *SPLIT, "--max-rows", "first-day", "--days", "0-0",
                   "--batch-size", "64")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["retired_keys"] > 0
    manifest = load_checkpoint(tmp_path / "dlrm-last.pt", "dlrm")["tables"]
    split = {n: t for n, t in manifest["tables"].items() if t.get("key_hash")}
    assert split
    for name, table in split.items():
        share = -(-table["rows"] // 2)
        for _, _, file in table["parts"]:
            held = _read_open_part(tmp_path / manifest["dir"] / file)["open.keys"].shape[0]
            assert held <= share + 64, (name, file, held, share)  # the last batch's keys may stay
