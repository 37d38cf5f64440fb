"""`embcache bench projection`: the per-rank bytes are bench scaling's traffic model (which
measured runs confirm), one GPU projects to itself, and the binding term is named right."""
import numpy as np
import pytest

from embcache.bench.projection import project, send_matrix
from embcache.bench.scaling import dlrm_traffic_model
from embcache.distributed import placement

CARDINALITIES = [1_460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_bytes_are_bench_scalings_traffic_model(world):
    batch, dim = 4096, 16
    meta = {"sparse": [{"name": f"f{i}", "cardinality": c} for i, c in enumerate(CARDINALITIES)]}
    freq = {f"f{i}": np.array([batch]) for i in range(len(CARDINALITIES))}
    model = dlrm_traffic_model(meta, freq, dim, batch, world, dense_params=0)
    tables = [placement.TableLoad(f"t_f{i}", (f"f{i}",), c, float(batch)) for i, c in enumerate(CARDINALITIES)]
    sent = np.array(send_matrix(placement.plan(tables, world), world, batch, dim))
    assert np.trace(sent) == 0
    assert sent.sum() == pytest.approx(model["ids"] + model["pooled"] + model["pooled_grad"], rel=1e-12)


def test_one_gpu_projects_to_itself():
    r = project(CARDINALITIES, 1, 8, 65_536, 128, 2_000_000, 1e6, 450.0, 50.0)
    assert (r["speedup_no_overlap"], r["speedup_full_overlap"], r["link_ms"], r["bytes_per_rank_mib"]) == (1, 1, 0, 0)


@pytest.mark.parametrize("world", [2, 8, 16])
def test_the_binding_term(world):
    kw = dict(per_node=8, batch=65_536, dim=128, dense_params=2_000_000, rate=1e6)
    fast = project(CARDINALITIES, world, node_gbps=1e12, nic_gbps=1e12, **kw)
    assert fast["binds"] == "compute"
    assert fast["speedup_full_overlap"] == pytest.approx(world / fast["imbalance"], rel=1e-9)
    assert fast["speedup_no_overlap"] <= fast["speedup_full_overlap"] <= world
    slow_nic = project(CARDINALITIES, world, node_gbps=1e12, nic_gbps=1e-3, **kw)
    slow_node = project(CARDINALITIES, world, node_gbps=1e-3, nic_gbps=1e12, **kw)
    assert slow_nic["binds"] == ("NIC" if world > 8 else "compute")
    assert slow_node["binds"] == "NVLink"  # a node's GPUs exchange most of the bytes at 16 too


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_best_split_is_the_fastest_threshold_and_never_slower_than_the_default(world):
    from embcache.bench.projection import best_split

    args = (8, 65_536, 128, 2_000_000, 1e6, 450.0, 50.0)
    best = best_split(CARDINALITIES, world, *args)
    default = project(CARDINALITIES, world, *args)
    assert best["speedup_no_overlap"] >= default["speedup_no_overlap"]
    # its threshold, given to the trainer's placement, projects the same
    assert project(CARDINALITIES, world, *args, row_wise_rows=best["row_wise_rows"]) == best
    for threshold in (None, 1_000, 100_000, 5_000_000):
        assert project(CARDINALITIES, world, *args, row_wise_rows=threshold)["speedup_no_overlap"] <= \
            best["speedup_no_overlap"] + 1e-12
    # 13 one-hot tables on 4 ranks do not balance whole: splitting more evens the lookups
    if world == 4:
        assert default["imbalance"] > 1.05 and best["imbalance"] < default["imbalance"]
