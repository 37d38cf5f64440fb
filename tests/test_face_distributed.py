"""Face training on 2 ranks (gloo, one CPU thread each) against one process with the same
global batch: the dcp pool and its LRU table stay identical on every rank (and equal to the
one-process table), accuracy agrees, a checkpoint moves between world sizes, and fc / pfc
with class-sharded centres follow the one-process loss trajectory (compared in float64, where
rounding cannot flip a ReLU: see LOSS_TOLERANCE).

Ranks are spawned here and enter `embcache.distributed.world.launch()` themselves (each
writes what the test compares to a file), except for the command-line test, which goes
through torchrun as users do."""
import contextlib
import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from embcache.face.trainer import FaceConfig, FaceTrainer
from tests.torchrun_helpers import embcache, free_port, torchrun

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# fc / pfc are compared in float64. 2 ranks compute the same sums as one process in another
# order (the all-reduced gradients, the batch-norm statistics, the sharded softmax's
# normaliser), so the weights differ by rounding, and in float32 that is not small enough: the
# MLP's ReLUs make the trajectory discontinuous. Measured (pfc, AVX-512 CPU): the weights
# drift ~1e-6 apart in 9 steps, then one pre-ReLU activation is -1.07e-6 in one process and
# +1.11e-6 on 2 ranks, that sample's gradient through the channel is switched on in one run
# only (the channel's bias gradient differs by 5.4e-3, every other by < 5e-7), and training at
# scale 64 amplifies it to a loss gap of 1.6e-2 (whether and when a flip happens depends on
# the CPU's rounding). In float64 the same 30 steps agree to 2e-14 in the loss and 1e-14 in
# the tables (fc and pfc): 1e-9 leaves five orders of magnitude, and any real difference
# (another sample of classes, a gradient scaled by the world size) is O(1e-3) or more.
LOSS_TOLERANCE = 1e-9
EXACT = torch.float64


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype (the synthetic data's and the nets') set for the block."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def config(**kw) -> FaceConfig:
    base = dict(num_classes=120, batch_size=32, epochs=1, eval_pairs=400, eval_classes=40, progress=False,
                checkpoint_every=1000, dist_timeout=60.0)
    return FaceConfig(**{**base, **kw})


# ----------------------------------------------------------------------- running ranks
def _rank(rank: int, size: int, port: int, kw: dict, out: str, resume_only: bool, dtype) -> None:
    """One spawned rank: train (or only resume) under `launch()` in default dtype `dtype`
    and dump what tests compare."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.set_default_dtype(dtype)
    from embcache.distributed.world import launch

    with launch(torch.device("cpu"), 60.0):
        trainer = FaceTrainer(config(**kw))
        losses = _record_losses(trainer)
        summary = None
        if resume_only:
            trainer.resume()
        else:
            summary = trainer.fit()
        torch.save({**_dump(trainer, losses), "summary": summary}, os.path.join(out, f"rank{rank}.pt"))
        del trainer  # before the process group goes (a DDP reducer outliving it can hang the exit)


def _record_losses(trainer) -> list:
    """The global batch's loss of every step, as the trainer reads it (one process: at each
    step; several ranks: every `log_every` steps, the ranks' shares summed)."""
    losses, read = [], trainer._read_unread

    def recorded():
        out = read()
        losses.extend(out[0])
        return out

    trainer._read_unread = recorded
    return losses


def _dump(trainer, losses: list) -> dict:
    """Everything compared: losses, the (gathered) trainer state and this rank's own tables."""
    out = {"losses": losses, "history": trainer.history, "state": trainer.trainer_state(),
           "own_head": {k: v.clone() for k, v in trainer.head.state_dict().items() if torch.is_tensor(v)}}
    if trainer.cfg.head == "dcp":
        pool = trainer.head.pool
        out["pool"] = {"features": pool.features, "writes": pool.writes, "slot_to_id": pool.slots.slot_to_id,
                       "lru": pool.lru.keys(), "stats": dict(pool.stats)}
    else:
        out["range"] = (getattr(trainer.head, "lo", 0), getattr(trainer.head, "hi", trainer.num_classes))
    return out


def run_ranks(tmp_path, size: int = 2, resume_only: bool = False, dtype=torch.float32, **kw) -> list[dict]:
    """Each rank's dump after running `config(**kw)` on `size` spawned ranks."""
    out = tmp_path / f"ranks-{os.urandom(4).hex()}"
    out.mkdir()
    mp.start_processes(_rank, args=(size, free_port(), kw, str(out), resume_only, dtype), nprocs=size,
                       start_method="spawn", join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(size)]


def run_one(**kw) -> tuple[FaceTrainer, list]:
    trainer = FaceTrainer(config(**kw))
    losses = _record_losses(trainer)
    trainer.fit()
    return trainer, losses


def assert_tensors_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k, v in a.items():
        if torch.is_tensor(v):
            assert torch.equal(v, b[k]), f"{what}: {k} differs"


# ------------------------------------------------------------------------------- tests
def test_dcp_pool_and_lru_table_are_identical_on_every_rank(tmp_path):
    # 120 identities, 8 pairs a step, a pool of 12: 45 steps with evictions at nearly every one
    kw = dict(head="dcp", epochs=3)
    ranks = run_ranks(tmp_path, **kw)
    one, losses = run_one(**kw)
    pool0, pool1 = ranks[0]["pool"], ranks[1]["pool"]
    assert pool0["stats"] == pool1["stats"] and pool0["stats"]["evicted"] > 100
    assert_tensors_equal(pool0, pool1, "pool of rank 1 vs rank 0")
    assert_tensors_equal(ranks[0]["state"]["probe"], ranks[1]["state"]["probe"], "probe")
    assert_tensors_equal(ranks[0]["state"]["gallery"], ranks[1]["state"]["gallery"], "gallery")
    # which identity sits where, and when it was last used, depends on labels alone: it is
    # the one-process table exactly
    pool = one.head.pool
    assert torch.equal(pool0["slot_to_id"], pool.slots.slot_to_id) and torch.equal(pool0["lru"], pool.lru.keys())
    assert torch.equal(pool0["writes"], pool.writes) and pool0["stats"] == pool.stats
    assert len(ranks[0]["losses"]) == len(losses) == 45
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the reported loss is the global batch's
    # Against one process the numbers differ by rounding (the global batch is summed in
    # another order), and training amplifies it: measured, the loss gap starts at 2e-7 and
    # roughly doubles a step until it saturates near 1e-2 (which pairs of steps, depends on
    # the trajectory). So: rounding-sized at first, bounded after.
    gaps = [abs(a - b) for a, b in zip(ranks[0]["losses"], losses)]
    print(f"dcp: loss gap 2 ranks vs 1, first 5 steps {max(gaps[:5]):.1e}, all 45 {max(gaps):.1e}")
    assert max(gaps[:5]) < 1e-5 and max(gaps) < 0.1
    assert torch.allclose(pool0["features"], pool.features, atol=0.05)


@pytest.mark.parametrize("head", ["fc", "pfc"])
def test_class_sharded_heads_follow_the_one_process_loss_trajectory(tmp_path, head):
    kw = dict(head=head, epochs=2, sample_rate=0.2)  # 30 steps
    ranks = run_ranks(tmp_path, dtype=EXACT, **kw)
    with default_dtype(EXACT):
        one, losses = run_one(**kw)
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(losses) == 30
    gap = max(abs(a - b) for a, b in zip(ranks[0]["losses"], losses))
    print(f"{head}: largest loss gap 2 ranks vs 1 over 30 steps: {gap:.2e}")
    assert gap < LOSS_TOLERANCE, f"2 ranks vs 1: loss differs by {gap:.2e}"
    assert max(losses) - min(losses) > 0.5  # a trajectory that moved, not a constant
    # each rank held only its class range; gathered, the table is the one-process table
    (lo0, hi0), (lo1, hi1) = ranks[0]["range"], ranks[1]["range"]
    assert (lo0, hi0, lo1, hi1) == (0, 60, 60, 120) and ranks[0]["own_head"]["weight"].shape[0] == 60
    whole = ranks[0]["state"]["head"]["weight"]
    assert torch.equal(whole[lo1:hi1], ranks[1]["own_head"]["weight"])
    assert whole.dtype == EXACT and torch.allclose(whole, one.head.weight.detach(), atol=LOSS_TOLERANCE)
    assert torch.allclose(ranks[0]["state"]["probe"]["net.0.weight"], one.probe.net[0].weight, atol=LOSS_TOLERANCE)


@pytest.mark.parametrize("head", ["fc", "pfc"])
def test_a_checkpoint_moves_from_2_ranks_to_1_process_and_back(tmp_path, head):
    kw = dict(head=head, epochs=2, sample_rate=0.2, checkpoint_dir=str(tmp_path / "ck"))
    first = run_ranks(tmp_path, dtype=EXACT, **kw, max_steps=11)  # stops mid-epoch 1 and checkpoints
    ck = torch.load(tmp_path / "ck" / "face-last.pt", weights_only=False)
    assert ck["world_size"] == 2 and ck["step"] == 11 and ck["head"]["weight"].shape[0] == 120
    assert ck["head"]["weight"].dtype == EXACT
    # 2 -> 1: one process holds exactly what the 2 ranks held, and goes on as one process would
    with default_dtype(EXACT):
        one = FaceTrainer(config(**kw, resume=True))
        continued = _record_losses(one)
        one.resume()
        state = one.trainer_state()
        for part in ("probe", "head"):
            assert_tensors_equal(state[part], ck[part], f"{part} after 2 -> 1")
        assert_tensors_equal(state["optimizer"]["state"], ck["optimizer"]["state"], "optimizer after 2 -> 1")
        one.fit()
        _, whole = run_one(**{**kw, "checkpoint_dir": None})
    gap = max(abs(a - b) for a, b in zip(first[0]["losses"] + continued, whole))
    assert len(first[0]["losses"] + continued) == len(whole) == 30 and gap < LOSS_TOLERANCE, f"loss gap {gap:.2e}"
    # 1 -> 2: each rank loads its rows; gathered again they are the checkpoint, bit for bit
    ck = torch.load(tmp_path / "ck" / "face-last.pt", weights_only=False)
    assert ck["world_size"] == 1 and ck["step"] == 30
    ranks = run_ranks(tmp_path, resume_only=True, dtype=EXACT, **{**kw, "resume": True})
    for part in ("probe", "head"):
        assert_tensors_equal(ranks[0]["state"][part], ck[part], f"{part} after 1 -> 2")
    assert_tensors_equal(ranks[0]["state"]["optimizer"]["state"], ck["optimizer"]["state"], "optimizer after 1 -> 2")
    assert torch.equal(ranks[1]["own_head"]["weight"], ck["head"]["weight"][60:])


def test_every_rank_reports_the_samples_any_rank_found_unreadable(tmp_path):
    import numpy as np

    from embcache.face.data.images import encode_jpeg
    from embcache.face.data.recordio import write_recordio

    rng = np.random.default_rng(0)
    items = [(y, encode_jpeg(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))) for y in range(12) for _ in range(3)]
    for i in (5, 13, 20, 30, 34):
        items[i] = (items[i][0], b"garbage")
    write_recordio(tmp_path / "train.rec", items)
    kw = dict(data=str(tmp_path), num_classes=0, image_size=16, backbone="cnn", batch_size=8, epochs=2)
    ranks = run_ranks(tmp_path, **kw, checkpoint_dir=str(tmp_path / "ck"))
    one, _ = run_one(**kw)
    # each rank read only its slices, yet every rank's list, and the checkpoint's, is the whole
    # run's: the one-process list (each sample once, however many ranks or steps drew it)
    expected = one.source.bad.to_json()
    assert one.source.bad.total == len(one.source.unreadable) >= 4
    for r in ranks:
        assert r["state"]["bad_samples"] == expected
        assert r["state"]["unreadable_samples"] == sorted(one.source.unreadable)
        assert r["state"]["dropped"] == one.dropped
    ck = torch.load(tmp_path / "ck" / "face-last.pt", weights_only=False)
    assert ck["bad_samples"] == expected and ck["unreadable_samples"] == sorted(one.source.unreadable)


# ------------------------------------------------------------------- batch-norm modes
def _norm_nets():
    """The nets the batch-norm test compares, seeded (the same on every rank): the MLP and
    the small CNN, whose batch norms see 2-D and 4-D inputs."""
    from embcache.nn.backbones import build_backbone

    torch.manual_seed(0)
    return {"mlp": build_backbone("mlp", 8, (12,)), "cnn": build_backbone("cnn", 8, (3, 8, 8))}


def _norm_inputs(name: str) -> tuple:
    """(x, a, b, w): a batch of 24 far from zero mean, two more batches, and the weights
    of the loss `(net(x) * w).sum() / 24`."""
    g = torch.Generator().manual_seed(1)
    shape = (12,) if name == "mlp" else (3, 8, 8)
    x, a, b = (torch.randn(24, *shape, generator=g) * 3 + 5 for _ in range(3))
    return x, a, b, torch.randn(24, 8, generator=g)


def _norm_rank(rank: int, size: int, port: int, out: str) -> None:
    """One rank: each net in each batch-norm mode on this rank's slice, under DDP with
    summed gradients; dumps outputs, gradients and running statistics."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from embcache.distributed.data_parallel import data_parallel
    from embcache.distributed.global_norm import average_running_stats, forward_apart, global_batch_norm
    from embcache.distributed.world import launch
    from embcache.partition import slice_bounds

    dump = {}
    with launch(torch.device("cpu"), 60.0):
        for mode in ("global", "local"):
            for name, net in _norm_nets().items():
                if mode == "global":
                    net = global_batch_norm(net)
                model = data_parallel(net, torch.device("cpu"))
                x, a, b, w = _norm_inputs(name)
                lo, hi = slice_bounds(24, size, rank)
                y = model(x[lo:hi])
                ((y * w[lo:hi]).sum() / 24).backward()
                with torch.no_grad():
                    apart = forward_apart(net, [a[lo:hi], b[lo:hi]])
                own = {k: v.clone() for k, v in net.state_dict().items()}
                average_running_stats(net)
                dump[mode, name] = {"out": y.detach(), "grads": {k: p.grad for k, p in net.named_parameters()},
                                    "apart": apart, "own_state": own, "averaged_state": net.state_dict()}
                del model
    torch.save(dump, os.path.join(out, f"rank{rank}.pt"))


def _max_gap(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_global_batch_norm_is_the_whole_batch_and_local_each_rank_s_slice(tmp_path):
    out = tmp_path / "norm"
    out.mkdir()
    mp.start_processes(_norm_rank, args=(2, free_port(), str(out)), nprocs=2, start_method="spawn", join=True)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    slices = [(0, 12), (12, 24)]
    for name in ("mlp", "cnn"):
        x, a, b, w = _norm_inputs(name)
        # global: each rank's rows are the one-process net's on the whole batch, the summed
        # gradients the whole batch's, and the running statistics the whole batch's
        net = _norm_nets()[name]
        y = net(x)
        ((y * w).sum() / 24).backward()
        with torch.no_grad():
            ya, yb = net(a), net(b)  # each its own batch (the gallery's two views)
        whole_state = {k: v.clone() for k, v in net.state_dict().items()}
        grads = {k: p.grad for k, p in net.named_parameters()}
        for r, (lo, hi) in enumerate(slices):
            got = ranks[r]["global", name]
            assert torch.allclose(got["out"], y[lo:hi].detach(), atol=2e-5), name
            assert torch.allclose(got["apart"][0], ya[lo:hi], atol=2e-5) and torch.allclose(got["apart"][1], yb[lo:hi],
                                                                                               atol=2e-5), name
            assert _max_gap(got["grads"], grads) < 2e-5, name
            assert _max_gap(got["own_state"], whole_state) < 2e-5, name
        # local: each rank's batch norm is a one-process net's on that rank's slice alone; the
        # summed gradients are the sum of the slices' gradients; the averaged running
        # statistics are the mean of the slices' running statistics
        per_slice, summed = [], {}
        for r, (lo, hi) in enumerate(slices):
            net = _norm_nets()[name]
            y = net(x[lo:hi])
            ((y * w[lo:hi]).sum() / 24).backward()
            with torch.no_grad():
                ya, yb = net(a[lo:hi]), net(b[lo:hi])
            got = ranks[r]["local", name]
            assert torch.allclose(got["out"], y.detach(), atol=2e-5) and _max_gap(got["own_state"], net.state_dict()) < 2e-5
            assert torch.allclose(got["apart"][0], ya, atol=2e-5) and torch.allclose(got["apart"][1], yb, atol=2e-5)
            per_slice.append(net.state_dict())
            for k, p in net.named_parameters():
                summed[k] = summed.get(k, 0) + p.grad
        for r in range(2):
            assert _max_gap(ranks[r]["local", name]["grads"], summed) < 2e-5, name
            averaged = ranks[r]["local", name]["averaged_state"]
            for k in averaged:
                if "running" in k:
                    assert torch.allclose(averaged[k], (per_slice[0][k] + per_slice[1][k]) / 2, atol=1e-5), k
        # and the two modes differ (the slices' statistics are not the batch's)
        assert not torch.allclose(ranks[0]["local", name]["out"], ranks[0]["global", name]["out"], atol=1e-3)


def summary_of(result) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_torchrun_dcp_accuracy_matches_one_process_and_its_checkpoint_resumes_in_one(tmp_path):
    args = ["face", "train", "--num-classes", "1000", "--batch-size", "128", "--epochs", "4", "--eval-classes", "200",
            "--head", "dcp", "--no-progress", "--dist-timeout", "60"]
    two = torchrun(2, *args, "--checkpoint-dir", tmp_path / "two", "--metrics-out", tmp_path / "two.jsonl")
    s2 = summary_of(two)
    s1 = summary_of(embcache(*args))
    acc1, acc2 = s1["final"]["synthetic"]["accuracy"], s2["final"]["synthetic"]["accuracy"]
    print(f"dcp verification accuracy: 1 process {acc1:.4f}, 2 ranks {acc2:.4f}")
    assert s2["world_size"] == 2 and s1["world_size"] == 1 and s2["steps"] == s1["steps"]
    assert acc1 > 0.7 and abs(acc1 - acc2) <= 0.01
    assert s2["pool"] == s1["pool"]  # the same admissions and evictions
    assert two.stdout.count("\nsummary\n") == 1  # rank 0 alone prints
    records = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("summary") == 1 and records[-1]["world_size"] == 2
    # `face evaluate` under torchrun: each rank embeds its share, rank 0 scores and alone prints;
    # the scores are one process's, and the ones the run recorded for the same net
    ev2, ev1 = torchrun(2, "face", "evaluate", tmp_path / "two"), embcache("face", "evaluate", tmp_path / "two")
    m2, m1 = summary_of(ev2)["synthetic"], summary_of(ev1)["synthetic"]
    print(f"face evaluate of the 2-rank checkpoint: 2 ranks {m2['accuracy']:.4f} (top-1 "
          f"{m2['identification_top1']:.4f}), 1 process {m1['accuracy']:.4f} (top-1 {m1['identification_top1']:.4f})")
    assert ev2.stdout.count("epoch 4 | synthetic") == 1 and [line[0] for line in ev2.stdout.splitlines()].count("{") == 1
    for key in ("accuracy", "identification_top1", "tar@far=0.001"):
        assert abs(m2[key] - m1[key]) <= 1e-3 and abs(m2[key] - s2["final"]["synthetic"][key]) <= 1e-3, key
    # per-rank batch norm (each rank normalises its 64 samples alone) is not one process's
    # arithmetic, and learns this short task a little less well: measured with seeds 0, 1, 2,
    # 0.7833 / 0.8267 / 0.7817 against one process's 0.8037 / 0.8295 / 0.7978 (global batch
    # norm on 2 ranks: 0.8053 / 0.8270 / 0.8015), where the seed alone moves it by 0.03
    local = summary_of(torchrun(2, *args, "--batch-norm", "local"))
    acc_local = local["final"]["synthetic"]["accuracy"]
    print(f"dcp verification accuracy, 2 ranks with --batch-norm local: {acc_local:.4f}")
    assert local["steps"] == s1["steps"] and local["world_size"] == 2 and abs(acc_local - acc1) <= 0.03
    # the 2-rank checkpoint extends in one process without torchrun
    more = summary_of(embcache(*[a if a != "4" else "5" for a in args], "--checkpoint-dir", tmp_path / "two",
                               "--resume"))
    assert more["epochs_done"] == 5 and more["world_size"] == 1 and more["steps"] == s1["steps"] * 5 // 4
