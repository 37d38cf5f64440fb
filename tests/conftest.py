"""Fixtures shared by several test modules."""
import os

import pytest
import torch

# Without a GPU, Triton's interpreter runs the embedding kernels (embcache.kernels) on CPU
# tensors: set before anything imports triton, which reads it when a kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_torch_thread():
    """Run on one torch thread (bit-identical reruns, no oversubscription on 2 cores), and
    put the thread count back afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def small_synthetic(tmp_path_factory):
    """A small synthetic CTR data set (6,000 rows, 26 features at 0.05 % of Kaggle's
    cardinalities), made once for the DLRM tests that need only a few dozen batches."""
    from embcache.data.synthetic import generate_synthetic

    out = tmp_path_factory.mktemp("small_synthetic")
    generate_synthetic(out, rows=6000, scale=0.0005, seed=0)
    return out


@pytest.fixture(scope="session")
def multi_hot_data(tmp_path_factory):
    """A small CTR data set with one one-hot and two multi-hot features (0-6 and 1-3 ids a row)."""
    import numpy as np

    from embcache.data.ctr_format import CTRDatasetWriter, SparseFeature, multi_hot

    out = tmp_path_factory.mktemp("multi_hot")
    features = [SparseFeature("sparse_0", 300), SparseFeature("sparse_1", 120, multi_hot=True),
                SparseFeature("sparse_2", 40, multi_hot=True)]
    writer = CTRDatasetWriter(out, 2, features, source="test: multi-hot")
    rng = np.random.default_rng(0)
    for split, n in (("train", 1500), ("val", 200), ("test", 200)):
        columns = [rng.zipf(1.3, n) % 300]
        for card, low, high in ((120, 0, 7), (40, 1, 4)):
            counts = rng.integers(low, high, n)
            offsets = np.concatenate([[0], np.cumsum(counts)])
            columns.append(multi_hot(offsets, rng.zipf(1.3, int(offsets[-1])) % card))
        writer.write(split, rng.integers(0, 2, n), rng.random((n, 2)), columns)
    writer.finish()
    return out
