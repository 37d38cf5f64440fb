"""On MovieLens-100k, HEAT and the PyTorch reference reach the same accuracy in the same
epochs, far above the popularity baseline."""
from __future__ import annotations

import dataclasses

import pytest

from cpu_kernels.model import CFConfig
from embcache.data.cf.ratings import load_ml100k
from embcache.train import cf_eval as metrics
from embcache.train.cf import CFTrainConfig, CFTrainer
from tests.offline_data import load_or_skip

EPOCHS = 10


@pytest.fixture(scope="module")
def ml100k():
    return load_or_skip(load_ml100k)


def test_ml100k_split(ml100k):
    assert (ml100k.num_users, ml100k.num_items) == (943, 1682)
    assert ml100k.num_train + ml100k.num_test == 100_000
    assert ml100k.num_test == pytest.approx(20_000, rel=0.01)


def _recall(data, engine: str, config: CFConfig) -> float:
    trainer = CFTrainer(CFTrainConfig.for_model(config, engine=engine, epochs=EPOCHS, eval_every=EPOCHS,
                                                progress=False), data)
    trainer.fit()
    return trainer.history[-1]["recall@20"]


def test_heat_matches_torch_and_beats_popularity(ml100k):
    # K=32 keeps the torch engine at ~2 s an epoch on 2 cores; default learning rates
    config = dataclasses.replace(CFConfig(), negatives=32)
    heat, ref = _recall(ml100k, "heat", config), _recall(ml100k, "torch", config)
    u, v = metrics.popularity_scores(ml100k.train_indices, ml100k.num_users, ml100k.num_items)
    pop = metrics.evaluate(u, v, ml100k.train_indptr, ml100k.train_indices, ml100k.test_indptr,
                           ml100k.test_indices, cosine=False)["recall@20"]
    assert abs(heat - ref) <= 0.05 * ref, (heat, ref)
    assert heat > 1.4 * pop and ref > 1.4 * pop, (heat, ref, pop)
