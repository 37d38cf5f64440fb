"""The "unseen" negative rule (issue 23) in both engines: no negative drawn is one of the
user's training items, redraws come from the same tile, a user who owns every item cannot
make a draw loop (redraws are bounded and what is kept is counted exactly), the old "all"
rule still draws the user's items, and one thread with a seed stays reproducible."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_kernels.heat import KERNELS, HeatEngine, HeatOptions, seen_items
from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.torch_reference import TorchEngine, TorchOptions, sample_negatives
from embcache.cf.data.interactions import from_pairs
from embcache.cf.data.synthetic import power_law_interactions

K = 16


@pytest.fixture(scope="module")
def small():
    return power_law_interactions(num_users=400, num_items=600, interactions=12_000, communities=8, seed=3)


def _owned(data, users, trace) -> np.ndarray:
    """Per traced negative: is it one of its pair's user's training items?"""
    owned = np.zeros((data.num_users, data.num_items), bool)
    tu, ti = data.train_pairs()
    owned[tu, ti] = True
    return owned[np.asarray(users)[:, None], np.asarray(trace)]


def _heat_epoch(data, rule, seed=0, model="simplex", **opts):
    config = CFConfig(model=model, negatives=K, negatives_from=rule, seed=seed)
    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    users, items = data.train_pairs()
    engine = HeatEngine(params, users, items, HeatOptions(**{"threads": 1, **opts}))
    trace = np.full((len(users), K), -1, np.int32)
    stats = engine.epoch(0, trace=trace)
    return params, stats, trace, users


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("tile", [0, 64])
def test_heat_unseen_negatives_are_never_the_users_items(small, kernel, tile):
    _, stats, trace, users = _heat_epoch(small, "unseen", kernel=kernel, tile=tile, refresh=32)
    assert (trace >= 0).all() and (trace < small.num_items).all()  # every pair traced
    assert not _owned(small, users, trace).any()
    assert stats["seen_negatives"] == 0 and stats["redraws"] > 0
    # the old rule draws the user's own items about as often as they are in the table
    _, old, old_trace, _ = _heat_epoch(small, "all", kernel=kernel, tile=tile, refresh=32)
    hit = _owned(small, users, old_trace).mean()
    assert hit > 0.01 and old["redraws"] == 0
    # each redraw replaced one such candidate: as many redraws as the old rule's hits, roughly
    assert 0.5 < stats["redraws"] / _owned(small, users, old_trace).sum() < 2


@pytest.mark.parametrize("kernel", KERNELS)
def test_heat_redraws_come_from_the_same_tile(small, kernel):
    """The K negatives of a sample lie in one window of `tile` consecutive items (wrapping
    around the table): a redraw from the whole table would fall outside it."""
    tile, ni = 64, small.num_items
    _, stats, trace, _ = _heat_epoch(small, "unseen", kernel=kernel, tile=tile, refresh=32)
    assert stats["redraws"] > 100
    s = np.sort(trace, axis=1).astype(np.int64)
    gaps = np.diff(np.concatenate([s, s[:, :1] + ni], axis=1), axis=1)  # circular gaps between sorted negatives
    assert (ni - gaps.max(axis=1) < tile).all()


def _owners_data(num_items=12):
    """User 0 owns every item, user 1 all but item 5, users 2 and 3 two items each."""
    pairs = [(0, i) for i in range(num_items)] + [(1, i) for i in range(num_items) if i != 5]
    pairs += [(2, 0), (2, 1), (3, 7), (3, 9)]
    users, items = np.array(pairs).T
    return from_pairs(users, items, users[:0], items[:0], num_users=4, num_items=num_items)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("tile", [0, 4, 12])
def test_heat_redraws_are_bounded_and_what_is_kept_is_counted(kernel, tile):
    data = _owners_data()
    redraws = 3
    _, stats, trace, users = _heat_epoch(data, "unseen", kernel=kernel, tile=tile, refresh=3, max_redraws=redraws,
                                         user_run=4)
    owned = _owned(data, users, trace)
    assert owned[users == 0].all()  # nothing else to draw: kept, and counted
    assert stats["seen_negatives"] == owned.sum()  # the kernel's count is exact
    # a user owning all of the window draws no redraws; the others at most `redraws` per negative
    n_other = int((users != 0).sum())
    assert 0 < stats["redraws"] <= redraws * K * n_other
    # user 1 owns 11 of 12 items: most of its negatives are item 5 all the same
    assert (trace[users == 1] == 5).mean() > 0.1


def test_heat_with_no_redraw_rounds_draws_once_more_and_counts_what_it_keeps():
    """max_redraws 0: an own-item candidate gets one more draw, kept whatever it is; the
    count of kept own items is exact, and a user owning all items costs no redraw."""
    data = _owners_data()
    _, stats, trace, users = _heat_epoch(data, "unseen", kernel="runs", tile=0, max_redraws=0)
    owned = _owned(data, users, trace)
    assert owned[users == 0].all() and stats["seen_negatives"] == owned.sum()
    assert 0 < stats["redraws"] <= K * int((users != 0).sum())
    assert owned[users == 1].mean() > 0.5  # 11 of 12 items, twice: 84 % kept


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rule", ["unseen", "all"])
def test_heat_one_thread_with_a_seed_is_reproducible_under_either_rule(small, kernel, rule):
    runs = [_heat_epoch(small, rule, seed=seed, kernel=kernel, tile=64, refresh=32) for seed in (4, 4, 5)]
    (a, sa, ta, _), (b, sb, tb, _), (c, _, tc, _) = runs
    assert sa == sb and np.array_equal(ta, tb) and not np.array_equal(ta, tc)
    for name in "UIW":
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_mf_ccl_excludes_the_users_items_too(small):
    _, stats, trace, users = _heat_epoch(small, "unseen", model="mf-ccl", tile=64, refresh=32)
    assert not _owned(small, users, trace).any() and stats["redraws"] > 0


def test_seen_items_is_each_users_distinct_sorted_items():
    users = np.array([2, 0, 2, 2, 0], np.int32)
    items = np.array([7, 3, 1, 7, 3], np.int32)  # (2, 7) and (0, 3) twice
    ptr, seen = seen_items(users, items, 4, 9)
    assert ptr.tolist() == [0, 1, 1, 3, 3] and seen.tolist() == [3, 1, 7]


# --------------------------------------------------------------------------- the torch engine
def _torch_epoch(data, rule, seed=0, **opts):
    config = CFConfig(negatives=K, negatives_from=rule, seed=seed, dim=16)
    params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
    users, items = data.train_pairs()
    # one intra-op thread: torch's reductions are then in a fixed order (reproducible rows)
    engine = TorchEngine(params, users, items, TorchOptions(**{"batch_size": 512, "threads": 1, **opts}))
    trace = torch.full((len(users), K), -1, dtype=torch.int64)
    stats = engine.epoch(0, trace=trace)
    return params, stats, trace.numpy(), users


def test_torch_unseen_negatives_are_never_the_users_items(small):
    a, stats, trace, users = _torch_epoch(small, "unseen")
    assert (trace >= 0).all()
    assert not _owned(small, users, trace).any()
    assert stats["seen_negatives"] == 0 and stats["redraws"] > 0
    _, old, old_trace, _ = _torch_epoch(small, "all")
    assert _owned(small, users, old_trace).mean() > 0.01 and old["redraws"] == 0
    b, again, trace_again, _ = _torch_epoch(small, "unseen")  # same seed, same draws and rows
    assert again == stats and np.array_equal(trace, trace_again) and np.array_equal(a.I, b.I)


def test_torch_redraws_are_bounded_and_what_is_kept_is_counted():
    data = _owners_data()
    _, stats, trace, users = _torch_epoch(data, "unseen", max_redraws=3, batch_size=8)
    owned = _owned(data, users, trace)
    assert owned[users == 0].all() and not owned[users >= 2].any()
    assert stats["seen_negatives"] == owned.sum() > 0
    # user 0's negatives are redrawn every round (3 per negative), the others' at most as often
    assert int((users == 0).sum()) * K * 3 <= stats["redraws"] <= len(users) * K * 3


def test_sample_negatives_without_keys_is_the_plain_draw():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    negs, redraws, kept = sample_negatives(torch.tensor([0, 1]), 50, 8, g1)
    assert torch.equal(negs, torch.randint(0, 50, (2, 8), generator=g2)) and (redraws, kept) == (0, 0)


# --------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("args, message", [
    (["--negatives-from", "foo"], "argument --negatives-from: invalid choice: 'foo' (choose from 'unseen', 'all')"),
    (["--negatives", "all"], "argument --negatives: is the number K of negatives; for the rule write "
                             "--negatives-from all"),
])
def test_a_bad_rule_is_one_line(args, message, capsys):
    from embcache.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["cf", "train", "--no-progress", *args])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.strip().splitlines()[-1] == f"embcache cf train: error: {message}"
    with pytest.raises(ValueError, match="negatives_from must be one of"):
        CFConfig(negatives_from="foo")


def test_the_rule_is_part_of_a_checkpoint_and_old_checkpoints_resume_with_all(tmp_path, capsys):
    """A run resumes only under its own rule; a checkpoint written before the rule existed
    was trained with negatives from all items and resumes so, bit for bit."""
    from embcache.checkpoint import load_checkpoint, save_checkpoint
    from embcache.cli import main

    common = ["cf", "train", "--no-progress", "--data", "synthetic", "--synthetic-users", "60", "--synthetic-items",
              "80", "--synthetic-interactions", "1000", "--negatives", "4", "--threads", "1"]

    def run(*args):
        rc = main([*common, *map(str, args)])
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, out, _ = run("--epochs", 2, "--negatives-from", "all", "--checkpoint-dir", tmp_path / "whole",
                     "--save", tmp_path / "whole.npz")
    assert rc == 0 and "K=4 (all)" in out
    assert run("--epochs", 1, "--negatives-from", "all", "--checkpoint-dir", tmp_path / "cut")[0] == 0
    rc, _, err = run("--epochs", 2, "--negatives-from", "unseen", "--checkpoint-dir", tmp_path / "cut", "--resume")
    assert rc == 1 and "--negatives-from 'all' in the checkpoint, 'unseen' now" in err
    path = tmp_path / "cut" / "cf-last.pt"
    ck = load_checkpoint(path, "cf")
    del ck["config"]["negatives_from"]  # as written before issue 23
    save_checkpoint(ck, path, "cf")
    rc, out, err = run("--epochs", 2, "--checkpoint-dir", tmp_path / "cut", "--resume", "--save", tmp_path / "cut.npz")
    assert rc == 0 and "K=4 (all)" in out, err
    from embcache.cf.data.embeddings_file import load

    for a, b in zip(load(tmp_path / "whole.npz")[:3], load(tmp_path / "cut.npz")[:3]):
        assert np.array_equal(a, b)


def test_bench_reports_both_rules_and_the_cost_of_the_exclusion(tmp_path, capsys):
    import json

    from embcache.cli import main

    rc = main(["bench", "cf", "--datasets", "synthetic", "--synthetic-users", "300", "--synthetic-items", "500",
               "--synthetic-interactions", "9000", "--synthetic-negatives", "8", "--synthetic-epochs", "2",
               "--threads", "1", "--no-baseline", "--cost-epochs", "2", "--copy-mib", "16", "--out-dir", str(tmp_path),
               "--no-plot"])
    out = capsys.readouterr().out
    assert rc == 0 and "exclusion cost" in out
    (case,) = json.loads((tmp_path / "cf.json").read_text())["cases"]
    assert {r["negatives_from"] for r in case["rows"]} == {"unseen"}
    # the set is small enough that torch runs whole epochs (its accuracy is measured): both engines
    assert [r["variant"] for r in case["old_rule_rows"]] == ["torch", "heat, tiling"]
    old = case["old_rule_rows"][1]
    new = next(r for r in case["rows"] if r["variant"] == old["variant"])
    assert old["negatives_from"] == "all" and old["redraws_per_epoch"] == 0
    assert new["redraws_per_epoch"] > 0 and old["recall_unseen_vs_all"] == new["recall_at_20"] / old["recall_at_20"]
    (cost,) = case["exclusion_cost"]
    assert cost["threads"] == 1 and len(cost["epoch_s_unseen_all"]) == len(cost["epoch_s_all_all"]) == 2
    assert cost["time_ratio_unseen_vs_all"] == cost["epoch_s_unseen"] / cost["epoch_s_all"] > 0
    assert cost["redraws_per_sample"] > 0 and cost["seen_negatives_per_sample"] == 0
