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
