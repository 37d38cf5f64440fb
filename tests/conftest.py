"""Fixtures shared by several test modules."""
import pytest
import torch


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
