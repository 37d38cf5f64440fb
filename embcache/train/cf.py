"""The CF training loop both `embcache cf train` and `embcache bench cf` run: build the
engine (heat or torch), train epoch by epoch with a progress bar, evaluate, and hand each
epoch's record (seconds, samples/s, loss, Recall@k, NDCG@k) to the caller.

Example:
    >>> from cpu_kernels.model import CFConfig, CFParams
    >>> from cpu_kernels.heat import HeatOptions
    >>> from embcache.data.cf.synthetic import power_law_interactions
    >>> data = power_law_interactions(100, 150, 2000, communities=4, seed=1)
    >>> params = CFParams.init(CFConfig(negatives=4), data.num_users, data.num_items,
    ...                        data.train_indptr, data.train_indices)
    >>> engine = make_engine("heat", params, data, HeatOptions(threads=1))
    >>> records = fit(engine, params, data, epochs=2, progress=False)
    >>> [r["epoch"] for r in records], sorted(records[-1])[:3]
    ([1, 2], ['active_negatives', 'epoch', 'eval_seconds'])
"""
from __future__ import annotations

import time
from typing import Callable

from tqdm import tqdm

from cpu_kernels.heat import HeatEngine, HeatOptions
from cpu_kernels.model import CFParams
from cpu_kernels.torch_reference import TorchEngine, TorchOptions
from embcache.data.cf.interactions import Interactions
from embcache.train.cf_eval import evaluate_params
from embcache.train.diverged import check_loss

ENGINES = ("heat", "torch")


def make_engine(engine: str, params: CFParams, data: Interactions,
                heat: HeatOptions = HeatOptions(), torch_opts: TorchOptions = TorchOptions()):
    users, items = data.train_pairs()
    if engine == "heat":
        return HeatEngine(params, users, items, heat)
    if engine == "torch":
        return TorchEngine(params, users, items, torch_opts)
    raise ValueError(f"engine must be one of {ENGINES}")


def fit(engine, params: CFParams, data: Interactions, epochs: int, ks=(20,),
        eval_every: int = 1, backend: str = "auto", progress: bool = True,
        on_epoch: Callable[[dict], None] | None = None, label: str = "",
        start_epoch: int = 0) -> list[dict]:
    """Train epochs start_epoch+1 .. `epochs`; evaluate every `eval_every` epochs and after
    the last one. A run resumed from a checkpoint passes the epochs it has done.

    Returns one record per epoch: epoch, seconds (training only), samples_per_s, loss, and
    recall@k / ndcg@k / eval_seconds where it was evaluated.
    """
    records = []
    n = data.num_train
    for epoch in range(start_epoch, epochs):
        bar = tqdm(total=n, unit="pair", unit_scale=True, disable=not progress, leave=False,
                   desc=f"{label}epoch {epoch + 1}/{epochs}")

        def tick(done, loss):
            bar.update(done)
            bar.set_postfix(loss=f"{loss:.4f}")

        t0 = time.perf_counter()
        stats = engine.epoch(epoch, chunks=20 if progress else 1, progress=tick if progress else None)
        seconds = time.perf_counter() - t0
        bar.close()
        check_loss(stats["loss"], f"epoch {epoch + 1}")
        rec = {"epoch": epoch + 1, "seconds": seconds, "samples_per_s": n / seconds,
               "loss": stats["loss"]}
        if "active_negatives" in stats:
            rec["active_negatives"] = stats["active_negatives"]
        if (epoch + 1) % max(eval_every, 1) == 0 or epoch + 1 == epochs:
            t1 = time.perf_counter()
            rec.update(evaluate_params(params, data, ks, backend))
            rec["eval_seconds"] = time.perf_counter() - t1
        records.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
    return records
