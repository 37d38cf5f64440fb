"""Claims of the docs tested as broadly as the docs state them, where the tests beside the
code covered only part of what is stated (an outside reviewer's audit)."""
import pytest
import torch

from embcache.face.trainer import FaceTrainer
from tests.test_face_train import small
from tests.test_row_dtype import CASES, OPTIMIZERS, train_both

EVERY_CASE = [(opt, dtype, rounding) for opt in OPTIMIZERS for dtype in ("bfloat16", "float16")
              for rounding in ("nearest", "stochastic")]


@pytest.mark.parametrize("optimizer,dtype,rounding", [c for c in EVERY_CASE if c not in CASES])
def test_every_optimizer_row_type_and_rounding_trains_as_the_uncached_arithmetic(optimizer, dtype, rounding):
    """docs/cache.md, "Row precision": equal to the uncached arithmetic bit for bit for all
    four optimizers, both types and both roundings, under eviction; tests/test_row_dtype.py
    holds the other ten of the sixteen."""
    bag, ref = train_both(optimizer, dtype, rounding, steps=30)
    assert bag.cache_stats()["evictions"] > 0.9 * 30 * 32
    assert torch.equal(bag.full_weight(), ref.weight)
    bag.flush()
    for k, v in bag.cache.host.state.items():
        assert v.dtype == torch.float32 and torch.equal(v, ref.state[k]), k


@pytest.mark.parametrize("optimizer,dtype,rounding", [("sgd", "float16", "nearest"),
                                                      ("rowwise_adagrad", "float16", "stochastic"),
                                                      ("adam", "bfloat16", "nearest")])
def test_half_rows_on_a_mapped_store_for_each_optimizer(optimizer, dtype, rounding, tmp_path):
    """... and on a mapped store: with tests/test_row_dtype.py's Adagrad case, each optimizer,
    each type and each rounding once."""
    bag, ref = train_both(optimizer, dtype, rounding, steps=30, host_store=f"mmap:{tmp_path}")
    assert torch.equal(bag.full_weight(), ref.weight)
    assert (tmp_path / "weight.bin").stat().st_size == ref.weight.numel() * 2


def test_a_full_fc_face_run_resumes_bit_for_bit(tmp_path):
    """docs/class-pool.md: `--resume` equals an uninterrupted run, for every head;
    tests/test_face_train.py resumes DCP and Partial FC, this the full-FC baseline (its
    weight matrix and momentum in the checkpoint)."""
    kw = dict(num_classes=60, batch_size=16, epochs=2, head="fc", eval_pairs=100, eval_classes=20,
              checkpoint_every=5)
    whole = FaceTrainer(small(**kw))
    whole.fit()
    assert FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path), max_steps=7)).fit()["stopped_early"]
    resumed = FaceTrainer(small(**kw, checkpoint_dir=str(tmp_path), resume=True))
    assert resumed.fit()["steps"] == whole.step
    a, b = whole.state(), resumed.state()
    compared = 0
    for part in ("probe", "gallery", "head"):
        for k, v in (a[part] or {}).items():
            if torch.is_tensor(v):
                assert torch.equal(v, b[part][k]), f"{part}.{k} differs after resume"
                compared += part == "head"
    assert compared, "the full-FC head's state was compared"
    for i, state in a["optimizer"]["state"].items():  # SGD's momentum, the head's weight's among them
        for k, v in state.items():
            assert not torch.is_tensor(v) or torch.equal(v, b["optimizer"]["state"][i][k]), f"optimizer {i}.{k}"
    assert [r for r in b["history"] if not r.get("partial")] == a["history"]
