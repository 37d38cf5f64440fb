"""`dlrm train --sparse device --cuda-graphs`: whole tables, which torch trains through a
sparse gradient no graph can hold, trained inside their backward once the step is captured
(`nn.in_backward`), proved on the CPU by a replay as CUDA would replay it
(`tests.cpu_graph`) against torch's own sparse optimizer, to the bit; their checkpoints in
torch's form, moving between an eager run and a captured one."""
import copy
import weakref
from dataclasses import replace

import pytest
import torch
from torch import nn

from embcache.checkpoint import load_checkpoint
from embcache.dlrm.captured import GraphedSteps
from embcache.dlrm.trainer import DLRMTrainer
from embcache.nn.fixed_capacity import pad_features
from embcache.nn.in_backward import InBackwardOptimizer, train_in_backward
from embcache.nn.torch_collection import TorchEmbeddingBagCollection
from embcache.nn.whole_table import WholeTableBag
from embcache.sparse_types import HAVE_TORCHREC, EmbeddingBagConfig
from tests.cpu_graph import ReplayedStep
from tests.test_dlrm_graphs import _config, _losses_of, cpu_as_device  # noqa: F401 (a fixture)


def _whole(**kw):
    return _config(**{"sparse": "device", "arch": "torch", **kw})


def _run(trainer, monkeypatch, replayed: bool, warmup: int = 3):
    """What a whole-table run trains to: its summary's cuda_graphs, losses, model state
    (dense weights and every table) and the sparse optimizer's state dict (torch's form)."""
    graphs, said = trainer.graphs, []
    graphs.say = said.append
    if replayed:
        graphs.capture_with(lambda step_fn: ReplayedStep(step_fn, warmup=warmup, host=lambda: [
            st["step"] for st in graphs.counters.steps]))
    assert said == (["cuda graphs: the whole tables train inside their backward, as torch's sparse optimizer "
                     "trains them (its checkpoint form kept)"] if replayed else [])
    losses = _losses_of(trainer, monkeypatch)
    trainer.fit()
    model = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return graphs.describe(), losses, model, trainer.sparse_opt.state_dict()


def _same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        if torch.is_tensor(want[k]):
            assert got[k].shape == want[k].shape and torch.equal(got[k], want[k]), k
        else:
            assert got[k] == want[k], k


def _same_optimizer(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"] and got["state"].keys() == want["state"].keys()
    for i in want["state"]:
        _same_state(got["state"][i], want["state"][i])


ONE_HOT, MULTI_HOT = ("small_synthetic", 12), ("multi_hot_data", 20)


@pytest.mark.parametrize("data, steps, optimizer, kernels", [
    (*ONE_HOT, "sgd", "torch"), (*ONE_HOT, "adagrad", "torch"), (*ONE_HOT, "adam", "torch"),
    (*ONE_HOT, "sgd", "triton"),
    (*MULTI_HOT, "sgd", "torch"), (*MULTI_HOT, "sgd", "triton")])
def test_a_replayed_whole_table_run_trains_as_torchs_sparse_optimizer(data, steps, optimizer, kernels, request,
                                                                     monkeypatch):
    """The eager run: `nn.EmbeddingBag(sparse=True)` trained by torch's optimizer. The
    captured one: the same tables moved into their backward at the capture, replayed as CUDA
    would. Losses, dense weights, every table row and the optimizer's state (its step counts
    too, counted on the host after each replay; Adam's step size read from the count on the
    device, which each replay advances) are equal to the bit; multi-hot batches are
    padded to fixed capacities after 8 eager ones (the pad lookups set aside on the spare
    row). The Triton kernels are interpreted here: batches of 16, one warm-up step (SGD: the
    same bits as torch's; Adagrad's square root differs in the CPU interpreter's last bits).
    Multi-hot Adagrad: the next test."""
    runs, steps = _eager_and_replayed(request.getfixturevalue(data), steps, optimizer, kernels, monkeypatch)
    _same_training(runs, steps, optimizer, multi_hot=data == "multi_hot_data")


@pytest.mark.skipif(not HAVE_TORCHREC, reason="torchrec is not installed")
def test_torchrecs_tables_move_into_their_backward_too(small_synthetic, monkeypatch):
    """`--arch torchrec`: torchrec's `EmbeddingBagCollection` keeps its own forward, its bags
    replaced; the replayed run equals torchrec's eager one with torch's Adagrad, to the bit."""
    runs, steps = _eager_and_replayed(small_synthetic, 10, "adagrad", "torch", monkeypatch, arch="torchrec")
    _same_training(runs, steps, "adagrad", multi_hot=False)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_a_replayed_padded_whole_table_run_sums_each_row_as_the_unpadded_one(kernels, multi_hot_data, monkeypatch,
                                                                              cpu_as_device):
    """Adagrad sums a row's terms in coalesce's order, which the pads must not change. On a
    GPU that is a stable sort, where pads that sort last leave the real terms' order as it
    was; the CPU's own sort is not stable, so torch's CPU order cannot be kept by any padding.
    Here the CPU sorts as the device does (`cpu_as_device`), and the captured run, padded,
    equals the same tables trained in their backward eagerly, unpadded, to the bit."""
    runs, steps = _eager_and_replayed(multi_hot_data, 20, "adagrad", kernels, monkeypatch, eager_in_backward=True)
    _same_training(runs, steps, "adagrad", multi_hot=True)


def _eager_and_replayed(data, steps, optimizer, kernels, monkeypatch, eager_in_backward=False, arch="torch"):
    """An eager run (torch's bags and optimizer, or with `eager_in_backward` the tables moved
    into their backward) and a replayed one, as `_run` gives them, and the steps run. With the Triton kernels
    (interpreted here): batches of 16, one warm-up step and 4 steps fewer, for time."""
    triton = kernels == "triton"
    batch, warmup = (16, 1) if triton else (64, 3)
    steps -= 4 if triton else 0
    runs = []
    for replayed in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_whole(max_steps=steps, sparse_optimizer=optimizer, batch_size=batch, kernels=kernels,
                                     arch=arch), data)
        if eager_in_backward and not replayed:
            trainer.sparse_opt = train_in_backward(trainer.sparse, trainer.sparse_opt, kernels)
        runs.append(_run(trainer, monkeypatch, replayed, warmup))
    eager = 8 if trainer.graphs.multi_hot else 0
    assert trainer.graphs.step.replays == steps - eager - warmup - 1 > 0
    assert isinstance(trainer.sparse_opt, InBackwardOptimizer)
    assert all(isinstance(b, WholeTableBag) for b in trainer.sparse.embedding_bags.values())
    return runs, steps


def _same_training(runs, steps: int, optimizer: str, multi_hot: bool) -> None:
    (off, want_losses, want_model, want_opt), (on, got_losses, got_model, got_opt) = runs
    assert off.startswith("off") and on.startswith("on") and ("multi-hot padded" in on) == multi_hot
    assert len(got_losses) == steps and got_losses == want_losses and len(set(got_losses)) > 1
    _same_state(got_model, want_model)
    _same_optimizer(got_opt, want_opt)
    if optimizer != "sgd":
        assert [float(s["step"]) for s in got_opt["state"].values()] == [float(steps)] * len(got_opt["state"])


@pytest.mark.parametrize("captured_first", [True, False])
def test_a_checkpoint_moves_between_an_eager_and_a_captured_whole_table_run(captured_first, small_synthetic,
                                                                           tmp_path, monkeypatch):
    """Adagrad's tables stopped after 10 steps by one kind of run and resumed to 16 by the
    other (captured then eager, eager then captured): the last 6 losses, every table, the
    dense weights and the optimizer's state (torch's form) equal one eager run of 16, to the
    bit. The checkpoint holds torch's form either way."""
    base = _whole(max_steps=16, sparse_optimizer="adagrad", batch_size=64, checkpoint_every=1000)
    torch.manual_seed(0)
    eager = _run(DLRMTrainer(replace(base, checkpoint_dir=str(tmp_path / "e")), small_synthetic), monkeypatch, False)
    torch.manual_seed(0)
    first = DLRMTrainer(replace(base, max_steps=10, checkpoint_dir=str(tmp_path / "r")), small_synthetic)
    _run(first, monkeypatch, replayed=captured_first)
    saved = load_checkpoint(tmp_path / "r" / "dlrm-last.pt", "dlrm")
    assert set(saved["sparse_optimizer"]["state"][0]) == {"step", "sum"}
    assert saved["sparse_optimizer"]["state"][0]["sum"].shape == first.sparse.embedding_bags["t_sparse_0"].weight.shape
    resumed = DLRMTrainer(replace(base, checkpoint_dir=str(tmp_path / "r"), resume=True), small_synthetic)
    got = _run(resumed, monkeypatch, replayed=not captured_first)
    assert isinstance(resumed.sparse_opt, InBackwardOptimizer) != captured_first
    assert got[1] == eager[1][10:] and len(got[1]) == 6
    _same_state(got[2], eager[2])
    _same_optimizer(got[3], eager[3])


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("data", ["small_synthetic", "multi_hot_data"])
def test_the_whole_table_step_a_graph_holds_runs_on_meta(data, kernels, request):
    """The captured step's function over whole tables trained in their backward, every
    device tensor on `meta`: the forward (multi-hot: padded, the pads on the spare row), the
    backward with the tables' update and the dense step. On meta a value handed to the host
    raises and a size that is the data's has no kernel: nothing syncs."""
    path = request.getfixturevalue(data)
    batch = next(iter(DLRMTrainer(_whole(batch_size=64), path)._batches("train", 64)))  # on the host
    trainer = DLRMTrainer(_whole(device="meta", batch_size=64, kernels=kernels), path)
    graphs = GraphedSteps(trainer, "off", lambda line: None)
    trainer.sparse_opt = train_in_backward(trainer.sparse, trainer.sparse_opt, kernels)
    values, lengths = batch.sparse.values(), batch.sparse.lengths()
    graphs.layout = (type(batch.sparse), batch.sparse.keys(), batch.sparse.stride())
    if data == "multi_hot_data":
        graphs.capacities = [64, 448, 192]
        values, lengths = pad_features(values, lengths, graphs.capacities)
    loss = graphs._step(batch.dense.to("meta"), batch.labels.to("meta"), values.to("meta"), lengths.to("meta"))
    assert loss.device.type == "meta"
    assert [b.step for b in graphs.counters.bags] == [1] * len(trainer.sparse.embedding_bags)  # every table updated


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("data, steps", [ONE_HOT, MULTI_HOT])
def test_a_captured_whole_table_run_trains_as_the_eager_one(data, steps, request, monkeypatch):
    """On CUDA, with the Triton kernels: the captured run equals the same tables trained in
    their backward eagerly, to the bit (the graph replays the kernels the eager step
    launches), losses, tables, dense weights and the optimizer's state; and it equals torch's
    own sparse optimizer, eager, within 1e-5 (the fused kernel's square roots and products
    may round otherwise in the last bit). Adagrad: its state moves and is saved too (SGD's
    capture is the cached step's, in tests/test_dlrm_graphs.py)."""
    path, runs, optimizer = request.getfixturevalue(data), {}, "adagrad"
    for kind in ("torch", "in_backward", "captured"):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_whole(device="cuda", cuda_graphs="on" if kind == "captured" else "off",
                                     max_steps=steps, sparse_optimizer=optimizer, kernels="triton",
                                     precision="fp32", batch_size=64), path)
        if kind == "in_backward":
            trainer.sparse_opt = train_in_backward(trainer.sparse, trainer.sparse_opt, "triton")
        runs[kind] = _run(trainer, monkeypatch, replayed=False)
    assert runs["captured"][0].startswith("on"), runs["captured"][0]  # else: why the capture failed
    assert trainer.graphs.step.captured and trainer.graphs.step.replays > 0
    _same_training([runs["in_backward"], runs["captured"]], steps, optimizer, multi_hot=data == "multi_hot_data")
    (_, want_losses, want_model, _), (_, got_losses, got_model, _) = runs["torch"], runs["captured"]
    assert max(abs(a - b) for a, b in zip(got_losses, want_losses)) < 1e-5
    assert all(torch.allclose(got_model[k], want_model[k], rtol=0, atol=1e-5) for k in want_model)


# ---------------------------------------------------------------------- the move itself
def _collection():
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=12 + i, feature_names=[f"f{i}"])
              for i in range(2)]
    torch.manual_seed(3)
    return TorchEmbeddingBagCollection(tables)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_the_moved_optimizer_keeps_torchs_state_and_gives_it_back(optimizer):
    """Torch's optimizer after two steps, moved: the moved one's state dict is the torch
    one's (the same tensors' values, steps and settings), and a fresh torch optimizer loads
    it; the tables keep their rows and state-dict keys. The old tables and their torch state
    are freed by the move (no reference left)."""
    from embcache.cache.optimizers import torch_equivalent
    from embcache.sparse_types import KeyedJaggedTensor

    ebc = _collection()
    opt = torch_equivalent(optimizer, ebc.parameters(), 0.1)
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 1, 3, 0, 5]), lengths=torch.tensor([2, 1, 1, 1]))
    for _ in range(2):
        opt.zero_grad()
        ebc(kjt).values().pow(2).sum().backward()
        opt.step()
    want_model = {k: v.clone() for k, v in ebc.state_dict().items()}
    want_opt = copy.deepcopy(opt.state_dict())
    tables = [weakref.ref(b.weight) for b in ebc.embedding_bags.values()]
    moved = train_in_backward(ebc, opt, "torch")
    assert all(t() is None for t in tables) and not opt.state  # torch's tables and state let go of
    _same_state(ebc.state_dict(), want_model)
    _same_optimizer(moved.state_dict(), want_opt)
    fresh = torch_equivalent(optimizer, _collection().parameters(), 0.1)
    fresh.load_state_dict(moved.state_dict())
    _same_optimizer(fresh.state_dict(), want_opt)
    ebc(kjt).values().pow(2).sum().backward()  # and it trains on, in its backward
    assert not torch.equal(ebc.state_dict()["embedding_bags.t0.weight"], want_model["embedding_bags.t0.weight"])


def test_what_cannot_move_into_the_backward_is_refused_in_one_line():
    ebc = _collection()
    with pytest.raises(ValueError, match="weight_decay"):
        train_in_backward(ebc, torch.optim.Adagrad(ebc.parameters(), lr=0.1, weight_decay=0.01))
    with pytest.raises(ValueError, match="cannot move into their backward"):
        train_in_backward(ebc, torch.optim.RMSprop(ebc.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="does not train the collection's tables"):
        train_in_backward(ebc, torch.optim.SGD(_collection().parameters(), lr=0.1))
    assert all(isinstance(b, nn.EmbeddingBag) for b in ebc.embedding_bags.values())  # nothing moved
    held = InBackwardOptimizer([WholeTableBag(torch.zeros(3, 2), "sgd", kernels="torch")], "sgd", 0.1)
    with pytest.raises(ValueError, match="holds 2 tables, this model 1"):
        held.load_state_dict(torch.optim.SGD([torch.zeros(1), torch.zeros(1)], lr=0.1).state_dict())


def test_a_failed_whole_table_capture_loses_nothing(small_synthetic, monkeypatch):
    """The capture fails after its Python counted a step (each table's step count, the dense
    Adagrad's): the counts are set back, that batch and every later one train eagerly in
    their backward, and the run equals torch's eager one to the bit, Adagrad's step counts
    in its state dict included."""
    class RefusedAtCapture(ReplayedStep):  # the capture's Python counts a step; CUDA runs nothing, then refuses
        def __call__(self, *batch):
            if self.steps < self.warmup:
                return super().__call__(*batch)
            for bag in trainer.graphs.counters.bags:
                bag.step += 1
            for state in trainer.graphs.counters.steps:
                state["step"] += 1
            raise RuntimeError("cuda graphs: the training step could not be captured (CUDA error: x)")

    runs, said = [], []
    for refused in (False, True):
        torch.manual_seed(0)
        trainer = DLRMTrainer(_whole(max_steps=8, sparse_optimizer="adagrad", batch_size=64), small_synthetic)
        if refused:
            trainer.graphs.say = said.append
            trainer.graphs.capture_with(lambda step_fn: RefusedAtCapture(step_fn, warmup=2))
        losses = _losses_of(trainer, monkeypatch)
        trainer.fit()
        runs.append((trainer.graphs.describe(), losses, {k: v.clone() for k, v in trainer.model.state_dict().items()},
                     trainer.sparse_opt.state_dict()))
    assert said[-1] == "cuda graphs: the training step could not be captured (CUDA error: x); the run goes on eagerly"
    assert runs[1][0] == "off: the capture failed" and isinstance(trainer.sparse_opt, InBackwardOptimizer)
    (_, want_losses, want_model, want_opt), (_, got_losses, got_model, got_opt) = runs
    assert got_losses == want_losses and len(got_losses) == 8 and len(set(got_losses)) > 1
    _same_state(got_model, want_model)
    _same_optimizer(got_opt, want_opt)
