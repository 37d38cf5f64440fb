"""torch.compile over the cache: torchrec's DLRM, DLRM_DCN and DLRM_Projection compiled whole
around a `CachedEmbeddingBagCollection` (a compile boundary) train as the eager models do,
to rounding, with the same cache residency; `embcache dlrm train --compile` trains.

The three models compile with backend "aot_eager" (dynamo and AOTAutograd: the graph
breaks at the collection, the guards and the backward through the compiled graph, which
is where compiling a model over the cache used to crash) so that the test stays fast;
DLRM_DCN and the trainer also compile with inductor (generated C++: needs a C++ compiler).
"""
import shutil
from dataclasses import replace

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from torchrec import EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection  # noqa: E402

from embcache.nn.cached_collection import CachedEmbeddingBagCollection  # noqa: E402

D, FEATURES, ROWS, BATCH, NUM_DENSE = 8, 3, 200, 32, 4
RTOL = ATOL = 1e-5  # float32 rounding: fused kernels sum in other orders than eager ones


def model(kind: str) -> torch.nn.Module:
    """A small model of `kind` over a cache of 60 of its 600 rows (a batch asks for up to
    96, so it evicts at every step); the same parameters at every call."""
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=ROWS, feature_names=[f"f{i}"])
              for i in range(FEATURES)]
    ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.1, device=torch.device("cpu"), optimizer="adagrad",
                                       lr=0.1)
    kw = dict(embedding_bag_collection=ebc, dense_in_features=NUM_DENSE, dense_arch_layer_sizes=[16, D],
              over_arch_layer_sizes=[16, 1])
    if kind == "DLRM_DCN":
        return DLRM_DCN(**kw, dcn_num_layers=2, dcn_low_rank_dim=4)
    if kind == "DLRM_Projection":
        width = (FEATURES + 1) * D
        return DLRM_Projection(**kw, interaction_branch1_layer_sizes=[width, 2 * D],
                               interaction_branch2_layer_sizes=[width, 2 * D])
    return DLRM(**kw)


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        # skewed ids: some rows come back (hits), most are new (misses, evictions)
        ids = (torch.rand(FEATURES * BATCH, generator=g) ** 2 * ROWS).long()
        yield (torch.randn(BATCH, NUM_DENSE, generator=g),
               KeyedJaggedTensor(keys=[f"f{i}" for i in range(FEATURES)], values=ids,
                                 lengths=torch.ones(FEATURES * BATCH, dtype=torch.long)),
               (torch.rand(BATCH, generator=g) < 0.3).float())


class Run:
    """One model trained step by step: dense part by Adagrad, rows by the cache."""

    def __init__(self, kind: str, backend: str | None):
        self.model = model(kind)
        self.cache = self.model.sparse_arch.embedding_bag_collection
        self.forward = self.model if backend is None else torch.compile(self.model, backend=backend)
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("sparse_arch.")]
        self.opt = torch.optim.Adagrad(dense, lr=0.05)
        self.ticket, self.taken = None, []  # the prefetch's ticket for the next batch; whether each forward took one
        ticket_for = self.cache._ticket_for
        self.cache._ticket_for = lambda kjt, ticket=None: self._took(ticket_for(kjt, ticket))

    def _took(self, ticket):
        self.taken.append(ticket is not None)
        return ticket

    def step(self, batch, upcoming) -> torch.Tensor:
        dense, kjt, labels = batch
        with self.cache.taking(self.ticket):  # as the trainer hands a batch its prefetch's ticket
            logits = self.forward(dense, kjt).squeeze(-1)
        if upcoming is not None:
            self.ticket = self.cache.prefetch(upcoming[1])  # a boundary too, called as the trainer does
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        self.opt.zero_grad()
        loss.backward()  # the cache updates its rows here
        self.opt.step()
        return logits.detach()


@pytest.mark.parametrize("kind, backend", [("DLRM", "aot_eager"), ("DLRM_DCN", "aot_eager"),
                                           ("DLRM_Projection", "aot_eager"), ("DLRM_DCN", "inductor")])
def test_compiled_model_over_the_cache_trains_as_the_eager_one(kind, backend):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = Run(kind, None), Run(kind, backend)
    data = list(batches(7))
    for i, batch in enumerate(data):
        upcoming = data[i + 1] if i + 1 < len(data) else None
        want, got = eager.step(batch, upcoming), compiled.step(batch, upcoming)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{kind} step {i}: {m}")
        a, b = eager.cache.residency_state(), compiled.cache.residency_state()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), f"{kind} step {i}: residency differs"
    stats = compiled.cache.cache_stats()
    assert stats == eager.cache.cache_stats()
    assert stats["evictions"] > 0 and stats["hits"] > 0
    assert counters["stats"]["unique_graphs"] >= 1  # the dense part did compile
    # the compiled model hands the collection the very batch it was given: every prefetched
    # batch's forward took its ticket, compiled as eager
    assert compiled.taken == eager.taken == [False] + [True] * (len(data) - 1)
    for t in compiled.cache.embedding_bag_configs():  # rows trained through the compiled graph's gradients
        torch.testing.assert_close(compiled.cache.table_weight(t.name), eager.cache.table_weight(t.name),
                                   rtol=RTOL, atol=ATOL)


def test_the_trainer_with_compile_trains(tmp_path):
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor needs a C++ compiler")
    torch._dynamo.reset()
    generate_synthetic(tmp_path / "syn", rows=2_000, scale=0.0005, seed=0)
    cfg = DLRMConfig(batch_size=256, eval_batch_size=1024, embedding_dim=4, dense_arch=[8], over_arch=[8],
                     device="cpu", progress=False, max_steps=6, cache_ratio=0.05)
    compiled = DLRMTrainer(replace(cfg, compile=True), tmp_path / "syn")
    assert all(hasattr(getattr(compiled.model, n), "_compiled_call_impl") for n in ("dense_arch", "over_arch"))
    eager = DLRMTrainer(cfg, tmp_path / "syn")
    got, want = compiled.fit(), eager.fit()
    assert got["steps"] == want["steps"] == 6
    assert got["hit_rate"] == want["hit_rate"]  # residency does not depend on the dense part
    assert abs(compiled.evaluate("val")["auc"] - eager.evaluate("val")["auc"]) < 1e-4
    state = lambda t: {k: v for k, v in t.model.state_dict().items() if not k.startswith("sparse_arch")}  # noqa
    assert state(compiled).keys() == state(eager).keys()  # compiled in place: the names a checkpoint holds
    for k, v in state(eager).items():
        torch.testing.assert_close(state(compiled)[k], v, rtol=1e-4, atol=1e-5)
