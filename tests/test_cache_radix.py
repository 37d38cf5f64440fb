"""The radix sorts of the compiled admission give numpy's stable order, ties included."""
import numpy as np
import pytest

from embcache.cache.bookkeeping._radix import stable_order_f64, stable_order_i64


@pytest.mark.parametrize("seed", range(6))
def test_float_order_is_numpys_stable_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    # eviction keys: integer counts plus clock fractions, many ties; infinities for slots
    # that may not be evicted; negatives and both zeros for the general case
    keys = rng.integers(0, 30, n) + rng.integers(0, 7, n) / 7.0
    keys[rng.random(n) < 0.05] = np.inf
    keys[rng.random(n) < 0.05] *= -1
    keys[rng.random(n) < 0.03] = -0.0
    keys[rng.random(n) < 0.03] = -np.inf
    np.testing.assert_array_equal(stable_order_f64(keys), np.argsort(keys, kind="mergesort"))


@pytest.mark.parametrize("high", [40, 33_800_000, 2**62])
def test_int_order_is_numpys_stable_order(high):
    rng = np.random.default_rng(high % 1000)
    values = rng.integers(-high, high, 3000)
    np.testing.assert_array_equal(stable_order_i64(values), np.argsort(values, kind="mergesort"))


def test_empty_and_single():
    assert stable_order_f64(np.zeros(0)).shape == (0,)
    assert stable_order_i64(np.array([7])).tolist() == [0]
