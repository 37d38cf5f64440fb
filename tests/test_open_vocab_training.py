"""`embcache dlrm train` on data with raw keys, day after day: open tables (rows made as
keys arrive, the coldest retired under --max-rows), hashing and a first-day vocabulary,
next-day evaluation, and a killed run resumed exactly."""
import json
from dataclasses import replace

import pytest
import numpy as np
import torch

from embcache.data.ctr_format import load_key_frequencies
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

from tests.test_dlrm import assert_same_checkpoint


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("days")
    generate_synthetic(out, rows=4000, scale=0.002, seed=0, days=3, drift=0.2, keys="raw")
    return out


def config(**kw):
    base = DLRMConfig(batch_size=256, eval_batch_size=4096, embedding_dim=8, dense_arch=[16], over_arch=[16],
                      device="cpu", progress=False, days="0-1", eval_next_day=True, cache_ratio=0.2)
    return replace(base, **kw)


def test_days_train_in_order_and_each_is_scored_on_the_next(days, tmp_path):
    trainer = DLRMTrainer(config(metrics_out=str(tmp_path / "m.jsonl")), days)
    summary = trainer.fit()
    assert [(r["day"], r["split"]) for r in summary["next_day"]] == [(0, "day_1"), (1, "day_2")]
    assert all(r["auc"] > 0.55 for r in summary["next_day"])
    assert summary["steps"] == 2 * -(-4000 // 256)  # two days of 16 batches each
    # no bound: every key seen keeps its row
    assert summary["retired_keys"] == 0 and summary["live_keys"] == summary["new_keys"] > 0
    first = load_key_frequencies(days, split="day_0")
    assert summary["live_keys"] > sum(k.numel() for k, _ in first.values())  # day 1 brought new keys
    epochs = [json.loads(line) for line in open(tmp_path / "m.jsonl") if '"epoch"' in line and '"event": "epoch"' in line]
    assert [e["split"] for e in epochs] == ["day_1", "day_2"]


def test_a_bounded_run_killed_mid_day_resumes_exactly(days, tmp_path):
    whole = DLRMTrainer(config(max_rows="first-day", checkpoint_dir=str(tmp_path / "w")), days)
    summary = whole.fit()
    assert summary["retired_keys"] > 0  # day 1's new keys retired day 0's cold ones
    part = DLRMTrainer(config(max_rows="first-day", checkpoint_dir=str(tmp_path / "p"), max_steps=21), days)
    part.fit()  # stops 5 steps into day 1
    resumed = DLRMTrainer(config(max_rows="first-day", checkpoint_dir=str(tmp_path / "p"), resume=True), days)
    again = resumed.fit()
    assert_same_checkpoint(tmp_path / "w" / "dlrm-last.pt", tmp_path / "p" / "dlrm-last.pt", residency=True)
    for k in ("retired_keys", "live_keys", "new_keys"):
        assert again[k] == summary[k], k
    assert again["next_day"][-1]["auc"] == summary["next_day"][-1]["auc"]


@pytest.mark.parametrize("mode", ["hash", "first-day"])
def test_closed_tables_take_the_first_day_sizes(days, mode):
    trainer = DLRMTrainer(config(raw_keys=mode, days="0", eval_next_day=True), days)
    first = load_key_frequencies(days, split="day_0")
    sizes = [t.num_embeddings for t in trainer.sparse.embedding_bag_configs()]
    want = [k.numel() + (mode == "first-day") for k, _ in first.values()]
    assert sizes == want
    summary = trainer.fit()
    assert summary["next_day"][0]["auc"] > 0.55 and "live_keys" not in summary


def test_settings_that_do_not_fit_the_data_are_one_line(days, tmp_path):
    with pytest.raises(ValueError, match="no split day_3, .*day_7"):
        DLRMTrainer(config(days="0-7"), days)
    with pytest.raises(ValueError, match="needs --days"):
        DLRMTrainer(config(days=None, eval_next_day=True), days)
    with pytest.raises(ValueError, match="cached sparse part"):
        DLRMTrainer(config(sparse="device"), days)
    from embcache.data.synthetic import generate_synthetic

    ids = tmp_path / "ids"
    generate_synthetic(ids, rows=1000, scale=0.001, seed=0)
    with pytest.raises(ValueError, match="vocabulary ids"):
        DLRMTrainer(config(days=None, eval_next_day=False, max_rows=100), ids)


def test_an_open_run_exports_and_serves_unseen_keys_with_the_zero_row(days, tmp_path):
    from embcache.serve import load_export
    from embcache.dlrm.export import export_checkpoint, verify_export

    ck = tmp_path / "ck"
    DLRMTrainer(config(days="0", max_rows="first-day", checkpoint_dir=str(ck)), days).fit()
    out = tmp_path / "export"
    manifest = export_checkpoint(ck, out)
    assert all(t["vocabulary"]["open"] and t["vocabulary"]["key"] == "raw" for t in manifest["tables"])
    checked = verify_export(ck, out, split="day_1")  # day 1 brings keys day 0 never trained
    assert checked["rows"] == 4000 and checked["bit_for_bit"], checked
    model = load_export(out)
    first = model.lookups[2]
    trained = int(first.keys.view(np.int64)[0])
    never = next(k for k in range(1, 100) if k not in set(first.keys.view(np.int64).tolist()))
    assert first.ids([trained, never]).tolist() == [1, 0]
    assert torch.equal(model.tables[2][0], torch.zeros(model.tables[2].shape[1]))


def test_cache_plan_predicts_from_per_key_counts(days):
    from embcache.cache.planning.planner import plan_cache
    from embcache.errors import UserFacingError

    plan = plan_cache(days, embedding_dim=8, optimizer="adagrad", device_memory=1 << 30, batch_size=256)
    counted = sum(k.numel() for k, _ in load_key_frequencies(days).values())
    assert plan.footprint.num_rows == counted  # every key counted is a row of its open table
    rates = plan.prediction.hit_rate("freq")
    assert rates[-1] > rates[0] and 0 < rates[-1] <= 1  # a larger cache holds more of the hot keys
    with pytest.raises(UserFacingError, match="per-key counts"):
        plan_cache(days, embedding_dim=8, optimizer="adagrad", device_memory=1 << 30, batch_size=256, trace=4)


def test_terabyte_days_with_raw_keys_train_and_score_the_next_day(tmp_path):
    """The converter's days (`data prepare criteo-terabyte --keys raw --day-splits`) train
    day by day as the synthetic ones do: day 0's keys get rows, day 1 is scored."""
    from embcache.data.criteo import convert_criteo_terabyte
    from tests.test_data_raw_keys import write_days

    out = tmp_path / "tb"
    convert_criteo_terabyte(write_days(tmp_path), out, days="0-1", progress=False, keys="raw", day_splits=True)
    trainer = DLRMTrainer(config(days="0", batch_size=2, eval_batch_size=8), out)
    summary = trainer.fit()
    assert summary["steps"] == 2 and summary["next_day"][0]["split"] == "day_1"
    assert trainer.history[-1]["samples"] == 4
    from embcache.data.loader import CTRBatches

    distinct = sum(len(set(b.sparse[f].values().tolist())) for b in CTRBatches(out, "day_0", 100)
                   for f in b.sparse.keys())
    assert summary["live_keys"] == summary["new_keys"] == distinct  # a row for each of day 0's keys


def test_the_held_out_day_is_refused_unless_asked_for(tmp_path):
    """Terabyte with --day-splits holds its last day out for val/test: --days over it would
    train on the rows `dlrm evaluate --split test` scores, so it is refused in one line
    naming the day and the flag; --allow-test-days trains on it. Data without day splits
    names the flag that writes them."""
    from embcache.data.criteo import convert_criteo_terabyte
    from tests.test_data_raw_keys import write_days

    out, raw_days = tmp_path / "tb", write_days(tmp_path)
    convert_criteo_terabyte(raw_days, out, days="0-1", progress=False, day_splits=True)
    with pytest.raises(ValueError, match=r"day_1 is the day .* holds out for val/test.*--allow-test-days"):
        DLRMTrainer(config(days="0-1", batch_size=2, eval_batch_size=8), out)
    trainer = DLRMTrainer(config(days="0-1", batch_size=2, eval_batch_size=8, allow_test_days=True), out)
    assert trainer.train_split(1) == "day_1"
    plain = tmp_path / "plain"
    convert_criteo_terabyte(raw_days, plain, days="0-1", progress=False)
    with pytest.raises(ValueError, match="--day-splits"):
        DLRMTrainer(config(days="0", batch_size=2), plain)


def test_ttl_in_days_retires_keys_unused_for_a_day(days):
    """--ttl-days 1 on days of 16 steps: a key of day 0 unused for 16 steps of day 1 retires."""
    trainer = DLRMTrainer(config(ttl_days=1), days)
    open_table = trainer.sparse.local.bags[-1].open
    assert open_table.ttl == 16
    summary = trainer.fit()
    assert summary["retired_keys"] > 0
    assert bool((open_table.clock - open_table.last_seen[open_table.live_index_rows()] <= 16).all())
    with pytest.raises(ValueError, match="instead of --ttl"):
        DLRMTrainer(config(ttl_days=1, ttl=5), days)
