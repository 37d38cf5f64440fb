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
