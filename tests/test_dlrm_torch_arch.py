"""The DLRM trainer without torchrec: the plain-torch model (`--arch torch`) and its sparse
types against torchrec's, to the bit; a run with torchrec blocked; checkpoints across the two."""
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from embcache import sparse_types as st
from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
from tests.test_dlrm import assert_same_checkpoint

needs_torchrec = pytest.mark.skipif(not st.HAVE_TORCHREC, reason="compares with torchrec, not installed here")


@pytest.fixture(scope="module")
def synthetic(small_synthetic):
    return small_synthetic


def small_config(**kw):
    base = DLRMConfig(batch_size=256, eval_batch_size=4096, embedding_dim=8, dense_arch=[16],
                      over_arch=[16], device="cpu", progress=False, epochs=1, cache_ratio=0.02)
    return replace(base, **kw)


def train_recording_losses(cfg, data):
    trainer = DLRMTrainer(cfg, data)
    losses, step = [], trainer.train_step
    trainer.train_step = lambda *a: losses.append(step(*a)) or losses[-1]
    trainer.fit()
    return trainer, losses


def sparse_rows(trainer) -> dict:
    """Every table row (and, cached, its optimizer state) by name."""
    if trainer.cfg.sparse == "cached":
        local = trainer.sparse.local
        return {f"{t.name}.{k}": v.clone() for t in local.embedding_bag_configs()
                for k, v in local.table_rows(t.name).items()}
    return {k: v for k, v in trainer.model.state_dict().items() if k.startswith("sparse_arch.")}


# ------------------------------------------------------------------ the model
@needs_torchrec
@pytest.mark.parametrize("sparse", ["cached", "device"])
def test_torch_arch_trains_what_torchrec_trains_to_the_bit(synthetic, sparse):
    cfg = small_config(max_steps=12, sparse=sparse)
    ours, our_losses = train_recording_losses(replace(cfg, arch="torch"), synthetic)
    theirs, their_losses = train_recording_losses(replace(cfg, arch="torchrec"), synthetic)
    assert type(ours.model).__module__ == "embcache.dlrm.arch"
    assert type(theirs.model).__module__ == "torchrec.models.dlrm"
    assert our_losses == their_losses and len(our_losses) == 12
    a, b = ours.model.state_dict(), theirs.model.state_dict()
    assert a.keys() == b.keys()  # the same names: checkpoints are interchangeable
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows_a, rows_b = sparse_rows(ours), sparse_rows(theirs)
    assert rows_a.keys() == rows_b.keys() and rows_a
    for k in rows_a:
        assert torch.equal(rows_a[k], rows_b[k]), k
    if sparse == "cached":
        assert ours.sparse.cache_stats() == theirs.sparse.cache_stats()
        assert ours.sparse.cache_stats()["evictions"] > 0
    else:
        assert str(ours.sparse_opt.state_dict()) == str(theirs.sparse_opt.state_dict())


@needs_torchrec
@pytest.mark.parametrize("pooling, weighted", [("SUM", False), ("MEAN", False), ("SUM", True)])
def test_torch_collection_pools_and_gradients_like_torchrecs(pooling, weighted):
    from torchrec import EmbeddingBagCollection

    from embcache.nn.torch_collection import TorchEmbeddingBagCollection

    def tables():
        return [st.EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=30, feature_names=["fa", "fa2"],
                                      pooling=st.PoolingType[pooling]),
                st.EmbeddingBagConfig(name="b", embedding_dim=3, num_embeddings=20, feature_names=["fb"],
                                      pooling=st.PoolingType[pooling])]

    torch.manual_seed(5)
    theirs = EmbeddingBagCollection(tables(), is_weighted=weighted)
    for bag in theirs.embedding_bags.values():
        bag.sparse = True  # as the trainer makes them
    torch.manual_seed(5)
    ours = TorchEmbeddingBagCollection(tables(), is_weighted=weighted)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k  # init_fn used the global generator alike
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 4, (3 * 5,), generator=gen)
    values = torch.randint(0, 20, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    kjt = st.KeyedJaggedTensor(keys=["fa", "fa2", "fb"], values=values, lengths=lengths, weights=weights)
    got, want = ours(kjt), theirs(kjt)
    assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
    assert torch.equal(got.values(), want.values())
    upstream = torch.randn(want.values().shape, generator=gen)
    (got.values() * upstream).sum().backward()
    (want.values() * upstream).sum().backward()
    for name, bag in theirs.embedding_bags.items():
        got_grad, want_grad = ours.embedding_bags[name].weight.grad, bag.weight.grad
        assert got_grad.is_sparse and want_grad.is_sparse
        assert torch.equal(got_grad._indices(), want_grad._indices()), name  # the same terms, same order
        assert torch.equal(got_grad._values(), want_grad._values()), name


def test_the_sparse_types_old_home_offers_the_same_names():
    """`embcache.nn.sparse_types` (their home before the ground floor) is the same names."""
    from embcache.nn import sparse_types as old

    assert all(getattr(old, name) is getattr(st, name) for name in [*st.__all__, "CollectionInterface"])


@needs_torchrec
def test_the_stand_in_sparse_types_answer_as_torchrecs():
    from torchrec import KeyedJaggedTensor, KeyedTensor

    values, lengths = torch.tensor([5, 6, 7, 8, 9, 1]), torch.tensor([2, 0, 1, 1, 0, 2])
    weights = torch.arange(6, dtype=torch.float32)
    lite = st.KeyedJaggedTensorLite(keys=["x", "y", "z"], values=values, lengths=lengths, weights=weights)
    real = KeyedJaggedTensor(keys=["x", "y", "z"], values=values, lengths=lengths, weights=weights)
    assert lite.stride() == real.stride() == 2 and lite.keys() == real.keys()
    assert lite.length_per_key() == real.length_per_key()
    assert torch.equal(lite.offsets(), real.offsets())
    for key, jt in real.to_dict().items():
        for part in ("values", "lengths", "offsets", "weights"):
            assert torch.equal(getattr(lite[key], part)(), getattr(jt, part)()), (key, part)
    by_offsets = st.KeyedJaggedTensorLite.from_offsets_sync(["x", "y", "z"], values, real.offsets())
    assert torch.equal(by_offsets.lengths(), lengths) and by_offsets.weights_or_none() is None
    pooled = torch.randn(2, 7)
    lite_kt, real_kt = st.KeyedTensorLite(["p", "q"], [3, 4], pooled), KeyedTensor(["p", "q"], [3, 4], pooled)
    assert lite_kt.offset_per_key() == real_kt.offset_per_key()
    assert all(torch.equal(lite_kt[k], v) for k, v in real_kt.to_dict().items())
    cfg = st.EmbeddingBagConfigLite(num_embeddings=100, embedding_dim=4, name="t")
    table = torch.empty(100, 4)
    cfg.init_fn(table)
    assert table.abs().max() <= 0.1 and cfg.pooling.name == "SUM"  # torchrec's default: +-sqrt(1/N)


def test_the_plain_torch_model_refuses_mismatched_sizes():
    from embcache.dlrm.arch import DLRM
    from embcache.nn.torch_collection import TorchEmbeddingBagCollection

    tables = [st.EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])]
    with pytest.raises(ValueError, match="must match"):
        DLRM(TorchEmbeddingBagCollection(tables), dense_in_features=3, dense_arch_layer_sizes=[8, 5],
             over_arch_layer_sizes=[8, 1])
    two = tables + [st.EmbeddingBagConfig(name="u", embedding_dim=2, num_embeddings=10, feature_names=["g"])]
    with pytest.raises(ValueError, match="one embedding dimension"):
        DLRM(TorchEmbeddingBagCollection(two), dense_in_features=3, dense_arch_layer_sizes=[8, 4],
             over_arch_layer_sizes=[8, 1])


# ------------------------------------------------------------------ checkpoints across the two
@needs_torchrec
@pytest.mark.parametrize("sparse, first, then", [("cached", "torchrec", "torch"), ("device", "torch", "torchrec")])
def test_a_checkpoint_of_one_arch_resumes_exactly_under_the_other(synthetic, tmp_path, sparse, first, then):
    whole = DLRMTrainer(small_config(sparse=sparse, max_steps=10, arch=first, checkpoint_dir=str(tmp_path / "w")),
                        synthetic)
    whole.fit()
    part = small_config(sparse=sparse, max_steps=4, arch=first, checkpoint_dir=str(tmp_path / "p"))
    DLRMTrainer(part, synthetic).fit()
    resumed = DLRMTrainer(replace(part, max_steps=10, arch=then, resume=True), synthetic)
    assert resumed.fit()["steps"] == 10
    assert type(resumed.model).__module__ != type(whole.model).__module__
    if sparse == "cached":
        assert_same_checkpoint(tmp_path / "w" / "dlrm-last.pt", tmp_path / "p" / "dlrm-last.pt", residency=True)
        return
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert str(whole.sparse_opt.state_dict()) == str(resumed.sparse_opt.state_dict())


# ------------------------------------------------------------------ no torchrec at all
BLOCKED = """
import sys
sys.modules["torchrec"] = None  # `import torchrec` now raises ImportError, as where it is not installed
from embcache.cli import main
common = sys.argv[2:]
train = main(["dlrm", "train", *common, "--checkpoint-dir", sys.argv[1], "--prefetch-depth", "2"])
evaluate = main(["dlrm", "evaluate", sys.argv[1], "--device", "cpu"])
device = main(["dlrm", "train", *common, "--sparse", "device", "--sparse-optimizer", "sgd"])
assert not any(m == "torchrec" or m.startswith("torchrec.") for m, mod in sys.modules.items() if mod is not None)
sys.exit(train or evaluate or device or main(["dlrm", "train", *common, "--arch", "torchrec"]) != 1)
"""


def test_train_and_evaluate_with_torchrec_blocked(tmp_path):
    common = ["--data", "synthetic", "--data-cache", str(tmp_path / "data"), "--synthetic-rows", "2000",
              "--synthetic-scale", "0.0005", "--batch-size", "256", "--embedding-dim", "4", "--dense-arch", "8",
              "--over-arch", "8", "--device", "cpu", "--no-progress", "--cache-ratio", "0.02"]
    proc = subprocess.run([sys.executable, "-c", BLOCKED, str(tmp_path / "ck"), *common],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("validation AUC") == 2 and "sparse part          cached on cpu" in out
    assert "model                DLRM in plain torch" in out and "sparse part          device on cpu" in out
    assert "test: AUC" in out
    assert "--arch torchrec: torchrec does not import here (" in proc.stderr and "Traceback" not in proc.stderr
