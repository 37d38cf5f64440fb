"""`dlrm train --cuda-graphs`: the step a graph would hold (`dlrm.captured`), its choice and
its one line, proved on the CPU; the capture itself on a GPU (the `cuda` test)."""
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import embcache.device

from embcache.cli import main
from embcache.dlrm.captured import GraphedSteps, HostCounters, graph_choice
from embcache.dlrm.config import DLRMConfig
from embcache.cache.bookkeeping.lookup import Prefetched
from embcache.dlrm.trainer import DLRMTrainer
from embcache.nn.fixed_capacity import pad_features
from embcache.sparse_types import KeyedJaggedTensorLite
from embcache.train.step_graph import CUDA_GRAPHS, row_caches
from tests.cpu_graph import ReplayedStep


def _config(**kw):
    base = DLRMConfig(batch_size=128, eval_batch_size=2048, embedding_dim=8, dense_arch=[16], over_arch=[16],
                      device="cpu", progress=False, epochs=1, cache_ratio=0.05, bookkeeping="device", kernels="torch")
    return replace(base, **kw)


def test_the_flag_and_its_choices(capsys):
    assert DLRMConfig().cuda_graphs == "auto" and CUDA_GRAPHS == ("auto", "on", "off")
    with pytest.raises(SystemExit):
        main(["dlrm", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--cuda-graphs {auto,on,off}" in text and "one CUDA graph" in text
    with pytest.raises(SystemExit) as err:
        main(["dlrm", "train", "--cuda-graphs", "always"])
    assert err.value.code == 2 and "invalid choice: 'always'" in capsys.readouterr().err


def test_why_a_step_is_not_captured_in_the_order_a_user_fixes_it():
    cuda = torch.device("cuda")  # a device object: no GPU needed to ask
    cfg = SimpleNamespace(arch="torch", sparse="cached", sparse_optimizer="adagrad")
    run = SimpleNamespace(world=SimpleNamespace(distributed=False), sparse_opt=None, device=cuda, model=None,
                          meta={"sparse": [{"name": "a", "multi_hot": False}]}, cfg=cfg)
    assert graph_choice(run, "auto").capture and graph_choice(run, "on").capture
    assert graph_choice(run, "off").reason == "turned off"
    multi_hot = replace_ns(run, meta={"sparse": [{"multi_hot": True}]})
    assert graph_choice(multi_hot, "on").capture  # padded to fixed capacities
    assert "--arch torch" in graph_choice(replace_ns(multi_hot, cfg=replace_ns(cfg, arch="torchrec")), "on").reason
    whole = replace_ns(run, sparse_opt=object(), cfg=replace_ns(cfg, sparse="device"))
    assert graph_choice(whole, "auto").capture  # trained in their backward once captured (nn.in_backward)
    adam = replace_ns(whole, cfg=replace_ns(cfg, sparse="device", sparse_optimizer="adam"))
    assert graph_choice(adam, "auto").capture  # its step size read from the count on the device
    assert "--sparse host" in graph_choice(replace_ns(whole, cfg=replace_ns(cfg, sparse="host")), "auto").reason
    assert "torchrun" in graph_choice(replace_ns(run, world=SimpleNamespace(distributed=True)), "auto").reason
    assert graph_choice(replace_ns(run, device=torch.device("cpu")), "auto").reason == "not on CUDA"
    on_cpu = replace_ns(multi_hot, device=torch.device("cpu"), cfg=replace_ns(cfg, arch="torchrec"))
    assert graph_choice(on_cpu, "auto").reason == "not on CUDA"  # not advice that would change nothing there


def replace_ns(ns, **kw):
    return SimpleNamespace(**{**vars(ns), **kw})


def test_a_batch_carrying_its_split_is_grouped_without_reading_the_device(small_synthetic):
    """The collection takes the per-feature split a batch carries instead of summing the
    lengths on the host (a sync): on `meta`, where no value can be read, it groups the batch."""
    trainer = DLRMTrainer(_config(), small_synthetic)
    keys = [f["name"] for f in trainer.meta["sparse"]]
    values = torch.zeros(len(keys) * 4, dtype=torch.long, device="meta")
    lengths = torch.ones(len(keys) * 4, dtype=torch.long, device="meta")
    carried = KeyedJaggedTensorLite(keys, values, lengths=lengths, stride=4, length_per_key=[4] * len(keys))
    collection = trainer.sparse.local
    groups = collection._group_inputs(carried)
    assert len(groups) == len(collection.bags) and all(g.ids.device.type == "meta" for g in groups)
    with pytest.raises((RuntimeError, NotImplementedError)):  # without it the lengths are read
        collection._group_inputs(KeyedJaggedTensorLite(keys, values, lengths=lengths, stride=4))


def test_the_step_a_graph_holds_trains_as_train_step_to_the_bit(small_synthetic):
    """Run eagerly here, the captured step's function (the sparse batch rebuilt from static
    tensors with its split given, no prefetch) gives `train_step`'s losses, dense weights and
    table rows, bit for bit, over a few batches of a cached run with the device bookkeeper."""
    runs = []
    for captured in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(prefetch_depth=0), small_synthetic)
        graphs = GraphedSteps(trainer, "off", lambda line: None)
        losses = []
        for i, batch in enumerate(trainer._batches("train", 128)):
            if i == 6:
                break
            if captured:
                graphs.layout = (type(batch.sparse), batch.sparse.keys(), batch.sparse.stride())
                losses.append(graphs._step(batch.dense, batch.labels, batch.sparse.values(), batch.sparse.lengths()))
            else:
                losses.append(trainer.train_step(batch, ()))
        collection = trainer.sparse.local
        collection.flush()  # the cached rows written back: every row current
        tables = {t.name: collection.table_weight(t.name).clone() for t in collection.embedding_bag_configs()}
        runs.append(([float(v) for v in losses], {k: v.clone() for k, v in trainer.model.state_dict().items()
                                                 if "sparse" not in k}, tables))
    (want_losses, want_dense, want_tables), (got_losses, got_dense, got_tables) = runs
    assert got_losses == want_losses and len(set(got_losses)) > 1
    assert all(torch.equal(got_dense[k], want_dense[k]) for k in want_dense)
    assert all(torch.equal(got_tables[k], want_tables[k]) for k in want_tables)


def _losses_of(trainer, monkeypatch) -> list[float]:
    """The losses `trainer`'s run hands `after_step`, filled as it trains (read at once)."""
    losses, after_step = [], trainer.after_step
    monkeypatch.setattr(trainer, "after_step", lambda loss, n: losses.append(float(loss)) or after_step(loss, n))
    return losses


def test_on_the_cpu_every_setting_trains_eagerly_the_same_and_the_summary_says_why(small_synthetic, caplog,
                                                                                   monkeypatch):
    caplog.set_level("INFO")
    runs = {}
    for setting in ("off", "auto", "on"):
        caplog.clear()
        trainer = DLRMTrainer(_config(cuda_graphs=setting, max_steps=3), small_synthetic)
        assert not trainer.graphs.active
        runs[setting] = _losses_of(trainer, monkeypatch)
        trainer.fit()
        assert trainer.summary_fields()["cuda_graphs"] == ("off: turned off" if setting == "off" else "off: not on CUDA")
        said = [r.getMessage() for r in caplog.records if "cuda graphs" in r.getMessage()]
        assert said == (["cuda graphs on: the step runs eagerly (not on CUDA)"] if setting == "on" else [])
    assert len(runs["off"]) == 3 and runs["auto"] == runs["off"] and runs["on"] == runs["off"]  # to the bit


class _Replaying:
    """A step already captured: its replay trains nothing here (the host's side stays put)."""
    captured = True

    def __call__(self, *inputs):
        return torch.zeros(())


def test_a_replay_counts_on_the_host_what_the_eager_step_counts(small_synthetic):
    """A replay runs none of the step's Python: the caches' step counts, eviction clocks and
    batch counts and the dense Adagrad's step counts are added after it, as much as the
    captured step's function added (measured on the capture), which is what `train_step` adds."""
    trainer = DLRMTrainer(_config(prefetch_depth=0), small_synthetic)
    graphs = GraphedSteps(trainer, "off", lambda line: None)
    counters = graphs.counters
    assert counters.caches and len(counters.steps) == len(trainer.dense_opt.state) > 0  # Adagrad's state, made eagerly
    batches = [b for _, b in zip(range(3), trainer._batches("train", 128))]
    before = counters.read()
    trainer.train_step(batches[0], ())
    eager = HostCounters.difference(counters.read(), before)
    assert all(d > 0 for d in eager)
    graphs.layout = (type(batches[1].sparse), batches[1].sparse.keys(), batches[1].sparse.stride())
    before = counters.read()
    graphs._step(batches[1].dense, batches[1].labels, batches[1].sparse.values(), batches[1].sparse.lengths())
    assert HostCounters.difference(counters.read(), before) == eager
    graphs.per_step, graphs.step = eager, _Replaying()
    graphs.shape = (tuple(batches[2].dense.shape), tuple(batches[2].sparse.values().shape), batches[2].sparse.stride())
    before = counters.read()
    graphs(batches[2])
    assert HostCounters.difference(counters.read(), before) == eager
    trainer.dense_opt.load_state_dict(trainer.dense_opt.state_dict())  # as a resume does: new state dicts
    before = counters.read()
    graphs(batches[2])
    assert HostCounters.difference(counters.read(), before) == eager


def _trained(trainer, monkeypatch, replayed_on_cpu: bool = False, warmup: int = 3):
    """What a run trains to: its summary's cuda_graphs, losses, host counts, dense weights,
    table rows and each cache's residency (resident ids and recency stamps). With
    `replayed_on_cpu`, its step is captured and replayed by `tests.cpu_graph.ReplayedStep`."""
    if replayed_on_cpu:
        graphs = trainer.graphs
        graphs.capture_with(lambda step_fn: ReplayedStep(step_fn, warmup=warmup, host=lambda: [
            st["step"] for st in graphs.counters.steps]))
    losses = _losses_of(trainer, monkeypatch)
    trainer.fit()
    counts = trainer.graphs.counters.read()
    collection = trainer.sparse.local
    collection.flush()
    tables = {t.name: collection.table_weight(t.name).clone() for t in collection.embedding_bag_configs()}
    dense = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items() if "sparse" not in k}
    residency = [(c.slots.slot_to_id.cpu().clone(), c.policy.slot_last.cpu().clone())
                 for c in row_caches(trainer.model)]
    return trainer.graphs.describe(), losses, counts, dense, tables, residency


def _same_training(eager, captured, steps: int, multi_hot: bool) -> None:
    (off, want_losses, want_counts, want_dense, want_tables, want_res), \
        (on, got_losses, got_counts, got_dense, got_tables, got_res) = eager, captured
    assert all(torch.equal(a, b) for pair in zip(got_res, want_res) for a, b in zip(*pair))
    assert off.startswith("off") and on.startswith("on")
    assert len(got_losses) == steps and got_losses == want_losses and got_counts == want_counts
    assert len(set(got_losses)) > 1
    assert ("multi-hot padded" in on) == multi_hot
    assert all(torch.equal(got_dense[k], want_dense[k]) for k in want_dense)
    assert all(torch.equal(got_tables[k], want_tables[k]) for k in want_tables)


@pytest.fixture
def cpu_as_device(monkeypatch):
    """Batches on the CPU take the device's path (checked and grouped by tensor operations),
    the path a graph holds on CUDA."""
    monkeypatch.setattr(embcache.device, "CPU_ACTS_AS_DEVICE", True)


@pytest.mark.parametrize("depth, kernels", [(0, "torch"), (1, "torch"), (1, "triton")])
@pytest.mark.parametrize("data, steps", [("small_synthetic", 12), ("multi_hot_data", 20)])
def test_a_replayed_dlrm_step_trains_as_the_eager_one(data, steps, depth, kernels, request, monkeypatch,
                                                      cpu_as_device):
    """The captured step replayed as CUDA would replay it (`tests.cpu_graph`: none of its
    Python runs after the capture, every tensor it wrote rewritten in place) trains as the
    eager step at the same `prefetch_depth`, bit for bit: the same losses, dense weights,
    table rows, host counts, resident rows and recency stamps. Any state the step kept in
    Python rather than on the device would show here. With depth 1 the graph prefetches the
    next batch, whose ticket the next replay takes from fixed tensors; the epoch's first
    batch (no ticket yet) runs eagerly, as do multi-hot's first 8 (they set the capacities)
    and, with depth 1, the one after (the pipeline prefetched it). With the project's Triton
    kernels, interpreted here as on a GPU: batches of 16 and one warm-up step, for time."""
    multi_hot, triton = data == "multi_hot_data", kernels == "triton"
    batch, warmup = (16, 1) if triton else (64, 3)
    steps -= 4 if triton else 0  # 5 replays are enough where the interpreter is slow
    runs = []
    for replayed in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(max_steps=steps, sparse_optimizer="sgd", batch_size=batch, arch="torch",
                                      prefetch_depth=depth, kernels=kernels), request.getfixturevalue(data))
        runs.append(_trained(trainer, monkeypatch, replayed_on_cpu=replayed, warmup=warmup))
    eager = depth + (8 if multi_hot else 0)
    assert trainer.graphs.step.replays == steps - eager - warmup - 1 > 0
    _same_training(*runs, steps, multi_hot=multi_hot)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("depth", [1, 0])
@pytest.mark.parametrize("data, steps", [("small_synthetic", 12), ("multi_hot_data", 20)])
def test_a_captured_dlrm_run_trains_as_the_eager_one(data, steps, depth, request, monkeypatch):
    """A cached run with the device bookkeeper (SGD rows: nothing reads the step count),
    captured and replayed, against the same run eager: bit-equal losses, dense weights and
    table rows (expected to the bit: the graph replays the kernels the eager step launches,
    on the same tensors), the same counts on the host (steps, clock, batches, Adagrad's
    steps), the same recency stamps and resident rows (a replay stamps the device's own
    clock), and the summary saying it captured. Multi-hot: the first 8 batches eager, then
    padded to fixed capacities (the pads set aside: the padded sums are the unpadded ones).
    `prefetch_depth` 1 (the default): the graph prefetches the next batch on the caches' side
    stream, as the eager run does; 0: neither prefetches."""
    runs = []
    for setting in ("off", "on"):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(device="cuda", cuda_graphs=setting, max_steps=steps, sparse_optimizer="sgd",
                                      kernels="triton", precision="fp32", batch_size=64, arch="torch",
                                      prefetch_depth=depth), request.getfixturevalue(data))
        runs.append(_trained(trainer, monkeypatch))
    assert runs[1][0].startswith("on"), runs[1][0]  # else: why the capture failed
    assert trainer.graphs.ahead == (depth == 1) and trainer.graphs.step.captured
    _same_training(*runs, steps, multi_hot=data == "multi_hot_data")


def test_a_capture_cuda_refuses_is_said_and_every_batch_then_trains_eagerly(small_synthetic, monkeypatch):
    """The capture fails (as CUDA refuses an operation it cannot record): that batch and every
    later one train eagerly through `train_step`, none lost or trained twice, and it is said."""
    trainer = DLRMTrainer(_config(), small_synthetic)
    said, eager = [], []
    graphs = GraphedSteps(trainer, "off", said.append)

    class Refusing:
        captured = False

        def __call__(self, *inputs):  # the capture's Python ran (counting on the host), then CUDA refused
            graphs.counters.add([1] * len(graphs.counters.read()))
            raise RuntimeError("cuda graphs: the training step could not be captured (CUDA error: x)")

    graphs.step = Refusing()
    monkeypatch.setattr(trainer, "train_step", lambda batch, upcoming: eager.append(batch) or torch.zeros(()))
    batches = [b for _, b in zip(range(3), trainer._batches("train", 128))]
    counted = graphs.counters.read()
    for b in batches:
        graphs(b)
    assert graphs.counters.read() == counted  # as before the capture: the eager steps count from there
    assert eager == batches and not graphs.active and graphs.describe() == "off: the capture failed"
    assert said == ["cuda graphs: the training step could not be captured (CUDA error: x); the run goes on eagerly"]


@pytest.mark.parametrize("settings", [dict(sparse_optimizer="adagrad"), dict(sparse_optimizer="rowwise_adagrad"),
                                      dict(sparse_optimizer="adam"),
                                      dict(sparse_optimizer="adam", row_dtype="bfloat16"),
                                      dict(sparse_optimizer="adam", kernels="triton", batch_size=16, max_steps=8),
                                      dict(sparse_optimizer="sgd", precision="bf16"),
                                      dict(sparse_optimizer="adagrad", row_dtype="bfloat16", row_rounding="nearest"),
                                      dict(sparse_optimizer="adagrad", row_dtype="bfloat16"),
                                      dict(sparse_optimizer="sgd", row_dtype="float16", kernels="triton",
                                           batch_size=16, max_steps=8)])
def test_a_replayed_step_trains_as_the_eager_one_at_other_settings(settings, small_synthetic, monkeypatch,
                                                                   cpu_as_device):
    """The row optimizers (Adam's step size read from the step count on the device, advanced
    inside the graph; torch's path and the fused kernel), the dense part autocast to
    bf16, and half-precision rows rounded to nearest or stochastically (the hash's step count
    on the device too; torch's path and the fused kernel): replayed
    (the prefetch in the graph) as the eager run, to the bit, over 7 replays (3 where the
    Triton kernels are interpreted)."""
    runs = []
    for replayed in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(**{"max_steps": 12, "batch_size": 64, "arch": "torch", **settings}),
                              small_synthetic)
        runs.append(_trained(trainer, monkeypatch, replayed_on_cpu=replayed))
    steps = settings.get("max_steps", 12)
    assert trainer.graphs.step.replays == steps - 5  # the first eager, 3 warm-up, the capture
    _same_training(*runs, steps, multi_hot=False)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("data", ["small_synthetic", "multi_hot_data"])
def test_the_step_a_graph_holds_with_its_prefetch_runs_on_meta(data, kernels, request):
    """The captured step's function with the next batch's prefetch in it, every device tensor
    on `meta` (shapes, no values): the forward from the fixed tensors' ticket (multi-hot:
    padded, its pads set aside), the prefetch, the backward with the cache's update and the
    dense step. On meta any operation that hands a value to the host raises, and one whose
    size is the data's has no meta kernel, so none is made, `.numpy()` included (which the CPU
    replay cannot see)."""
    trainer = DLRMTrainer(_config(device="meta", batch_size=64, arch="torch", kernels=kernels),
                          request.getfixturevalue(data))
    graphs = GraphedSteps(trainer, "off", lambda line: None)
    b0, b1, b2 = [b for _, b in zip(range(3), trainer._batches("train", 64))]
    graphs.layout = (type(b0.sparse), b0.sparse.keys(), b0.sparse.stride())
    if data == "multi_hot_data":  # capacities as the sampling batches would set them
        graphs.capacities = [64, 448, 192]

    def following(b):
        values, lengths = b.sparse.values(), b.sparse.lengths()
        if graphs.capacities is not None:
            values, lengths = pad_features(values, lengths, graphs.capacities)
        return values.to("meta"), lengths.to("meta")

    on_meta = [lambda b: b.dense.to("meta"), lambda b: b.labels.to("meta")]
    # the batch before: eager, from its own ids, its prefetch of the next one into the fixed tensors
    graphs._step_of(*(f(b0) for f in on_meta), b0.sparse, None, following(b1))
    made = graphs._ticket
    steps = [c.step for c in graphs.counters.caches]
    loss = graphs._step_ahead(*(f(b1) for f in on_meta), *following(b2))
    assert loss.device.type == "meta" and graphs._ticket is not made  # it took the one ticket, made the next
    assert [c.step for c in graphs.counters.caches] == [n + 1 for n in steps]  # every cache updated
    group = graphs._ticket.local.groups[0]
    assert group.ids.device.type == "meta" and group.ids is graphs._ticket.local.bags[0].ids  # re-homed, one tensor


def test_a_replayed_run_stopped_and_resumed_trains_as_one_eager_run(small_synthetic, tmp_path, monkeypatch,
                                                                    cpu_as_device):
    """A captured run (the prefetch in its graph, replayed as CUDA would) stopped after 10
    steps, its checkpoint holding the pending prefetch the last replay wrote into the fixed
    tensors, then resumed and captured again to 16: its last 6 losses, tables, dense weights,
    host counts and residency equal one eager run of 16 steps, to the bit."""
    base = _config(max_steps=16, sparse_optimizer="sgd", batch_size=64, arch="torch", checkpoint_every=1000)
    torch.manual_seed(0)
    eager = _trained(DLRMTrainer(replace(base, checkpoint_dir=str(tmp_path / "e")), small_synthetic), monkeypatch)
    torch.manual_seed(0)
    first = DLRMTrainer(replace(base, max_steps=10, checkpoint_dir=str(tmp_path / "r")), small_synthetic)
    _trained(first, monkeypatch, replayed_on_cpu=True)
    assert first.graphs.step.replays == 5 and first.sparse.local.pending_prefetches() == 1
    resumed = DLRMTrainer(replace(base, checkpoint_dir=str(tmp_path / "r"), resume=True), small_synthetic)
    got = _trained(resumed, monkeypatch, replayed_on_cpu=True)
    assert resumed.graphs.step.replays == 1  # its first batch eager (the restored prefetch), 3 warm-up, the capture
    assert got[1] == eager[1][10:] and got[2] == eager[2]
    for g, w in zip(got[3:5], eager[3:5]):
        assert all(torch.equal(g[k], w[k]) for k in w)
    assert all(torch.equal(a, b) for pair in zip(got[5], eager[5]) for a, b in zip(*pair))


class _RefusedAtCapture(ReplayedStep):
    """Warm-up steps as `CapturedStep`'s; at the capture, the step's Python runs as a
    capture's does (it takes the batch's prefetch and makes the next one, counting on the
    host) but CUDA never runs its work, then CUDA refuses. Acted out here by the Python
    effects alone: each cache's pending prefetch replaced by one that was never made."""

    def __init__(self, step_fn, graphs):
        super().__init__(step_fn, warmup=2)
        self.graphs = graphs

    def __call__(self, *batch):
        if self.steps < self.warmup:
            return super().__call__(*batch)
        for cache in self.graphs.counters.caches:
            cache._prefetched.popleft()
            cache._prefetched.append(Prefetched(torch.zeros(1), torch.ones(cache.num_slots + 1, dtype=torch.bool),
                                                7, 7))
        self.graphs._ticket = object()
        self.graphs.counters.add([1] * len(self.graphs.counters.read()))
        raise RuntimeError("cuda graphs: the training step could not be captured (CUDA error: x)")


def test_a_failed_capture_with_the_prefetch_in_it_loses_nothing(small_synthetic, monkeypatch, cpu_as_device):
    """The capture of a step that prefetches the next batch fails: the caches' pending
    prefetches and the graph's ticket are set back to what the capture found, that batch
    trains eagerly taking its prefetch, and every later one through `train_step`. The run
    equals an eager one to the bit (losses, weights, tables, host counts, residency)."""
    runs, said = [], []
    for refused in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(max_steps=8, sparse_optimizer="sgd", batch_size=64, arch="torch"),
                              small_synthetic)
        if refused:
            trainer.graphs.say = said.append
            trainer.graphs.capture_with(lambda step_fn: _RefusedAtCapture(step_fn, trainer.graphs))
            assert trainer.graphs.ahead
        runs.append(_trained(trainer, monkeypatch))
    assert said == ["cuda graphs: the training step could not be captured (CUDA error: x); the run goes on eagerly"]
    assert runs[1][0] == "off: the capture failed"
    (_, *want), (_, *got) = runs
    assert got[0] == want[0] and len(set(got[0])) > 1 and got[1] == want[1]
    for g, w in zip(got[2:4], want[2:4]):
        assert all(torch.equal(g[k], w[k]) for k in w)
    assert all(torch.equal(a, b) for pair in zip(got[4], want[4]) for a, b in zip(*pair))


# ---------------------------------------------------------------------- multi-hot, padded
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_padded_multi_hot_steps_train_as_train_step_to_the_bit(multi_hot_data, optimizer):
    """The captured step's function on multi-hot batches padded to fixed capacities (after
    the eager batches that set them) against `train_step` on the same batches unpadded: the
    same cache statistics (pad lookups repeat an id the batch has), and with SGD the same
    losses, dense weights and table rows, bit for bit. Adagrad sums a row's terms after a sort
    of its keys, which on the CPU is not stable (as torch's CPU `coalesce`): how it orders a
    row's tied terms depends on the whole array it sorts, which holds the pad lookups too, so
    the rows move by rounding (within 1e-6 here); CUDA's sort is stable, and there the sum is
    unchanged (the replayed test below checks the Triton kernels' stable path to the bit)."""
    runs, said = [], []
    for padded in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_config(prefetch_depth=0, arch="torch", sparse_optimizer=optimizer, batch_size=64),
                              multi_hot_data)
        graphs = GraphedSteps(trainer, "off", said.append)
        graphs.multi_hot = True  # as a captured run on CUDA would
        losses, padded_steps = [], 0
        for i, batch in enumerate(trainer._batches("train", 64)):
            if i == 16:
                break
            values_lengths = graphs._padded(batch.sparse) if padded else None
            if values_lengths is None:
                losses.append(trainer.train_step(batch, ()))
                continue
            graphs.layout = (type(batch.sparse), batch.sparse.keys(), batch.sparse.stride())
            losses.append(graphs._step(batch.dense, batch.labels, *values_lengths))
            padded_steps += 1
        collection = trainer.sparse.local
        collection.flush()
        tables = {t.name: collection.table_weight(t.name).clone() for t in collection.embedding_bag_configs()}
        dense = {k: v.clone() for k, v in trainer.model.state_dict().items() if "sparse" not in k}
        runs.append(([float(v) for v in losses], dense, tables, collection.cache_stats(), padded_steps))
    (want_losses, want_dense, want_tables, want_stats, _), (got_losses, got_dense, got_tables, got_stats, n) = runs
    assert n == 16 - 8 and len(graphs.capacities) == 3 and graphs.capacities[0] == 64  # one-hot: kept as it is
    most = [max(col) for col in zip(*graphs._sampled)]
    assert all(most[f] * 1.25 <= graphs.capacities[f] < most[f] * 1.25 + 64 for f in (1, 2))
    assert said == [f"cuda graphs: multi-hot batches padded to {sum(graphs.capacities):,} ids (each feature's most "
                    f"in the first 8 batches, which ran eagerly, x1.25)"]
    assert got_stats == want_stats  # pad lookups repeat an id the batch has: the same decisions
    assert len(set(got_losses)) > 1
    if optimizer == "sgd":
        assert got_losses == want_losses
        assert all(torch.equal(got_dense[k], want_dense[k]) for k in want_dense)
        assert all(torch.equal(got_tables[k], want_tables[k]) for k in want_tables)
    else:
        torch.testing.assert_close(got_losses, want_losses, rtol=1e-6, atol=0)
        for got, want in ((got_dense, want_dense), (got_tables, want_tables)):
            assert all(torch.allclose(got[k], want[k], rtol=1e-6, atol=1e-7) for k in want)


def test_a_multi_hot_batch_over_its_capacity_runs_eagerly_counted_and_said_once(multi_hot_data):
    trainer = DLRMTrainer(_config(arch="torch", batch_size=64), multi_hot_data)
    said = []
    graphs = GraphedSteps(trainer, "off", said.append)
    batches = [b for _, b in zip(range(9), trainer._batches("train", 64))]
    graphs.step = object()  # as if active
    assert [graphs._padded(b.sparse) for b in batches[:3]] == [None] * 3
    assert graphs.describe() == "on (multi-hot: all 3 batches eager, fewer than the 8 that set the padded capacities)"
    assert [graphs._padded(b.sparse) for b in batches[3:8]] == [None] * 5 and graphs.capacities is not None
    graphs.capacities = [64, 1, 1]  # far below what a batch holds
    assert graphs._padded(batches[8].sparse) is None and graphs._padded(batches[8].sparse) is None
    assert graphs.over_capacity == 2 and sum("a batch the padding cannot hold" in line for line in said) == 1
    assert graphs.describe() == "on (multi-hot padded to 66 ids after 8 eager batches, 2 over it eager)"
