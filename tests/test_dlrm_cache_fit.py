"""`dlrm train`'s default cache size (`--cache-ratio fit`): small data gets a cache that holds
its batches (no overflow, no warning), large data keeps 1.5 %, an explicit ratio is kept, and
the Python defaults stay 0.015."""
from __future__ import annotations

import inspect
import json
import math

import pytest

from embcache import CachedEmbeddingBag
from embcache.cache.planning.planner import table_frequencies
from embcache.cli import main
from embcache.data.synthetic import generate_synthetic
from embcache.dlrm.config import DLRMConfig

COMMON = ["--embedding-dim", "4", "--dense-arch", "8", "--over-arch", "8", "--batch-size", "512",
          "--max-steps", "4", "--device", "cpu", "--no-progress"]
FIT = dict(batch_size=512, prefetch_depth=1, embedding_dim=4, optimizer="adagrad", eviction="freq",
           bookkeeping="host")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """8,000 rows over 6,781 ids: 1.5 % is 102 rows, a batch of 512 needs several hundred."""
    d = tmp_path_factory.mktemp("fit") / "syn"
    generate_synthetic(d, rows=8_000, scale=0.0002, seed=1, progress=False)
    return d


def run(args, capsys) -> tuple[dict, str]:
    assert main(["dlrm", "train", *args]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.out + captured.err


def test_default_cache_holds_small_datas_batches_and_says_so(small, capsys):
    summary, text = run(["--data", str(small), *COMMON], capsys)
    assert "a batch needs" not in text, text  # the too-small-cache warning
    assert summary["overflow_rows"] == 0 and summary["hit_rate"] > 0.5, summary
    assert summary["cache_rows"] > math.ceil(0.015 * summary["table_rows"])
    assert text.count("cache ratio fit: ") == 1, text
    from embcache.dlrm.cache_fit import fit_cache_ratio

    want, why = fit_cache_ratio(small, device_memory=16 * 2**30, **FIT)
    assert summary["cache_ratio"] == want and why in text


def test_an_explicit_ratio_is_kept(small, capsys):
    summary, text = run(["--data", str(small), *COMMON, "--cache-ratio", "0.015"], capsys)
    assert summary["cache_ratio"] == 0.015
    assert summary["cache_rows"] == math.ceil(0.015 * summary["table_rows"])
    assert "a batch needs" in text and "cache ratio fit" not in text  # the user's choice, with its warning


def test_fit_keeps_the_default_where_it_holds_the_batches(tmp_path):
    """Larger tables (the built-in data's shape, scaled down): 1.5 % already holds the
    batches in flight twice over, so the default run is unchanged."""
    from embcache.dlrm.cache_fit import DEFAULT_RATIO, fit_cache_ratio

    d = tmp_path / "large"
    generate_synthetic(d, rows=4_000, scale=0.02, seed=0, progress=False)
    ratio, why = fit_cache_ratio(d, device_memory=16 * 2**30, **{**FIT, "batch_size": 128})
    assert ratio == DEFAULT_RATIO and why.startswith(f"cache ratio fit: {DEFAULT_RATIO} ("), why


def test_fit_is_capped_by_device_memory(small):
    """The memory given bounds the cache: a 64 KiB device holds 64 KiB / (4 floats and 4
    Adagrad states) = 2,048 rows, fewer than the batches need."""
    from embcache.dlrm.cache_fit import fit_cache_ratio

    ratio, why = fit_cache_ratio(small, device_memory=64 * 2**10, **FIT)
    rows = math.ceil(ratio * table_frequencies(small)[0].size)
    assert 2_040 <= rows <= 2_049 and "holds no more" in why, (ratio, why)


def test_python_defaults_stay_0_015():
    """The rule is the command's: the Python classes keep their documented default."""
    assert DLRMConfig().cache_ratio == 0.015
    assert inspect.signature(CachedEmbeddingBag.__init__).parameters["cache_ratio"].default == 0.015


def test_the_readmes_movielens_run_trains_without_the_cache_warning(tmp_path, capsys):
    """README's `embcache dlrm train --data ml-100k` (3,056 rows; 1.5 % is 46, a batch of
    2,048 ratings needs about 1,800): the default cache now holds its batches."""
    from embcache.data.movielens_ctr import prepare_ml100k_ctr
    from tests.offline_data import load_or_skip

    load_or_skip(prepare_ml100k_ctr, tmp_path / "ml-100k-ctr")
    summary, text = run(["--data", "ml-100k", "--data-cache", str(tmp_path), "--max-steps", "5", "--device", "cpu",
                         "--no-progress"], capsys)
    assert "a batch needs" not in text and summary["overflow_rows"] == 0, text  # the row cache's warning
    assert summary["cache_rows"] == summary["table_rows"] == 3_056 and summary["hit_rate"] > 0.9, summary
