"""`train.step_graph`: the choice of `cuda_graphs` (auto | on | off), which on the CPU
always runs the step eagerly and says why in one line; and, on a GPU, a captured step of a
cached bag (device bookkeeper) and a small MLP replayed against the same step run eagerly."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.train.step_graph import GraphChoice, bookkeepers, choose_graphs, make_step, step_count_readers

HAVE_CUDA = torch.cuda.is_available()


def _model(bookkeeping: str, device: str = "cpu", seed: int = 0):
    torch.manual_seed(seed)
    bag = CachedEmbeddingBag(500, 8, cache_ratio=0.1, optimizer="adagrad", lr=0.1, device=device,
                             bookkeeping=bookkeeping)
    return torch.nn.ModuleDict({"bag": bag, "mlp": torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(),
                                                                         torch.nn.Linear(4, 1)).to(device)})


@pytest.mark.parametrize("setting", ["auto", "on", "off"])
def test_on_the_cpu_every_setting_runs_eagerly_and_says_why(setting):
    said = []
    step, choice = make_step(lambda x: x + 1, setting, "cpu", _model("device"), say=said.append)
    assert not choice.capture and choice.reason == ("turned off" if setting == "off" else "not on CUDA")
    assert said == [f"cuda graphs {setting}: the step runs eagerly ({choice.reason})"]
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))  # the step itself, uncaptured


def test_what_keeps_a_cuda_step_eager():
    """The decision for a step on CUDA, made without a GPU (it only reads the settings)."""
    host, device = _model("host"), _model("device")
    assert bookkeepers(host) == {"host"} and bookkeepers(device) == {"device"} and bookkeepers(None) == set()
    assert choose_graphs("auto", "cuda", host) == GraphChoice(False, "host bookkeeper syncs: use bookkeeping='device'")
    assert "batch shapes vary" in choose_graphs("on", "cuda", device, fixed_shapes=False).reason
    assert choose_graphs("auto", "cuda", device) == GraphChoice(True)
    assert choose_graphs("on", torch.device("cuda", 0), device).line("on") == \
        "cuda graphs: the training step is captured and replayed"
    assert choose_graphs("off", "cuda", device).reason == "turned off"
    adam = CachedEmbeddingBag(50, 4, optimizer="adam", device="cpu", bookkeeping="device", row_dtype="bfloat16")
    assert choose_graphs("auto", "cuda", adam) == GraphChoice(True)  # its step size from the device's count
    host_adam = CachedEmbeddingBag(50, 4, optimizer="adam", device="cpu", bookkeeping="host")
    assert step_count_readers(host_adam) == ["Adam's bias correction"]
    slow = CachedEmbeddingBag(50, 4, optimizer="adam", device="cpu", bookkeeping="device", betas=(0.9, 0.9999999))
    assert choose_graphs("auto", "cuda", slow).reason == "Adam's bias correction read the step count on the host"
    half = CachedEmbeddingBag(50, 4, optimizer="adagrad", device="cpu", bookkeeping="device", row_dtype="bfloat16")
    assert half.cache.rounding.mode == "stochastic" and choose_graphs("auto", "cuda", half) == GraphChoice(True)
    host_half = CachedEmbeddingBag(50, 4, optimizer="adagrad", device="cpu", bookkeeping="host", row_dtype="bfloat16")
    assert step_count_readers(host_half) == ["stochastic rounding of half-precision rows"]  # its hash reads the host's
    aging = CachedEmbeddingBag(50, 4, optimizer="sgd", device="cpu", bookkeeping="device", half_life=3)
    assert choose_graphs("auto", "cuda", aging).reason == "the eviction half-life's aging read the step count on the host"
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        choose_graphs("yes", "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")
def test_a_captured_cached_step_replays_as_the_eager_step():
    """Eight steps of a cached bag (device bookkeeper, SGD rows) and an MLP (SGD), one-hot
    batches from the host: the captured run (3 eager warm-up steps, then replays) gives
    the eager run's losses, table rows, recency stamps and resident rows."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 500, (64, 1), generator=g), torch.rand(64, 1, generator=g).round())
               for _ in range(8)]
    runs = []
    for setting in ("off", "on"):
        torch.manual_seed(0)
        bag = CachedEmbeddingBag(500, 8, cache_ratio=0.2, optimizer="sgd", lr=0.1, device="cuda",
                                 bookkeeping="device")
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).cuda()
        opt = torch.optim.SGD(mlp.parameters(), lr=0.1)

        def train_step(ids, labels):
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(bag(ids)), labels)
            loss.backward()
            opt.step()
            return loss.detach()

        if setting == "off":
            step = lambda ids, labels: train_step(ids.cuda(), labels.cuda())  # noqa: E731
        else:
            step, choice = make_step(train_step, setting, "cuda", torch.nn.ModuleList([bag, mlp]), say=print)
            assert choice.capture
        losses = [step(*b) for b in batches]
        torch.cuda.synchronize()
        residency = (bag.cache.slots.slot_to_id.cpu().clone(), bag.cache.policy.slot_last.cpu().clone())
        runs.append((torch.stack(losses).cpu(), bag.full_weight(), [p.detach().cpu() for p in mlp.parameters()],
                     residency))
    (want_loss, want_rows, want_mlp, want_res), (got_loss, got_rows, got_mlp, got_res) = runs
    assert torch.equal(got_loss, want_loss)
    assert torch.equal(got_rows, want_rows)
    # the clock a replay stamps is the device's own: the same recency stamps, the same rows resident
    assert torch.equal(got_res[0], want_res[0]) and torch.equal(got_res[1], want_res[1])
    assert all(torch.equal(a, b) for a, b in zip(got_mlp, want_mlp))
    assert step.captured and step.steps == 8


def test_a_capture_cuda_refuses_ends_in_one_line_naming_the_way_round(monkeypatch):
    """The capture itself is CUDA's: here its context fails as CUDA does on an operation it
    cannot record (as a side stream's uncaptured work did on the first GPU run)."""
    import contextlib

    from embcache.train import step_graph

    modes = []

    @contextlib.contextmanager
    def refusing_graph(graph, capture_error_mode="global"):
        modes.append(capture_error_mode)  # thread_local: the loader's reader threads pin memory meanwhile
        yield
        raise RuntimeError("CUDA error: dependency created on uncaptured work in another stream\nmore detail")

    monkeypatch.setattr(step_graph.torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(step_graph.torch.cuda, "graph", refusing_graph)
    calls = []
    step = step_graph.CapturedStep(lambda x: calls.append(x) or x, "cpu", warmup=1)
    with pytest.raises(RuntimeError, match=r"could not be captured \(CUDA error: dependency created on uncaptured "
                                           r"work in another stream\); run it eagerly with cuda_graphs='off'") as info:
        step._capture([torch.ones(1)])
    assert "\n" not in str(info.value) and not step.captured and len(calls) == 1 and modes == ["thread_local"]
