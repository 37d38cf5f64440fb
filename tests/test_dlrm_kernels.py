"""A short cached DLRM training with `kernels="triton"` (the device bookkeeper's lookup and its
fused backward + optimizer, under Triton's interpreter on the CPU) against `kernels="torch"`
on the same data: the same losses, AUC and tables (SGD to the bit; Adagrad within the CPU's
inexact square root, which torch's `sqrt_` rounds one unit in the last place off now and then:
tests/test_kernels_fused.py)."""
import json

import pytest
import torch

from embcache.dlrm.config import DLRMConfig
from embcache.dlrm.trainer import DLRMTrainer

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A Criteo-shaped set small enough for the interpreter (it runs each program in Python):
    800 rows at 0.02 % of Kaggle's cardinalities."""
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("tiny_synthetic")
    generate_synthetic(out, rows=800, scale=0.0002, seed=0)
    return out


def _train(data, tmp_path, optimizer: str, kernels: str):
    log = tmp_path / f"{optimizer}-{kernels}.jsonl"
    cfg = DLRMConfig(batch_size=16, eval_batch_size=256, embedding_dim=4, dense_arch=[8], over_arch=[8],
                     device="cpu", progress=False, epochs=1, max_steps=12, log_every=2, cache_ratio=0.02,
                     bookkeeping="device", kernels=kernels, sparse_optimizer=optimizer, metrics_out=str(log))
    trainer = DLRMTrainer(cfg, data)
    assert {bag.cache.kernels for bag in trainer.sparse.local.bags} == {kernels}
    summary = trainer.fit()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("event") == "step"]
    tables = [bag.full_weight() for bag in trainer.sparse.local.bags]
    return losses, summary, tables


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_cached_dlrm_trains_alike_with_triton_and_torch_kernels(tiny, tmp_path, optimizer):
    torch_losses, torch_summary, torch_tables = _train(tiny, tmp_path, optimizer, "torch")
    triton_losses, triton_summary, triton_tables = _train(tiny, tmp_path, optimizer, "triton")
    assert len(torch_losses) >= 5 and len(set(torch_losses)) > 1  # it logged, and the loss moved
    if optimizer == "sgd":
        assert triton_losses == torch_losses
        assert triton_summary["val_auc"] == torch_summary["val_auc"]
        assert all(torch.equal(a, b) for a, b in zip(torch_tables, triton_tables))
    else:
        assert triton_losses == pytest.approx(torch_losses, rel=1e-5)
        assert triton_summary["val_auc"] == pytest.approx(torch_summary["val_auc"], abs=1e-4)
        assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(torch_tables, triton_tables))
