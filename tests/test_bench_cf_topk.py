"""`bench cf` times each top-k back-end that imports; a missing faiss (as on the GPU
machines) is named in the results, and the run goes on."""
import sys

from cpu_kernels.model import CFConfig
from embcache.cf.bench import fmt_topk, topk_backends
from embcache.cf.data.synthetic import power_law_interactions


def test_a_missing_faiss_is_named_not_fatal(monkeypatch):
    data = power_law_interactions(num_users=40, num_items=60, interactions=500, communities=2, seed=1)
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now raises ImportError
    out = topk_backends(data, CFConfig())
    assert out["missing"] == ["faiss"] and "faiss_s" not in out and out["faster"] == "torch"
    assert 0.0 <= out["torch_recall@20"] <= 1.0
    assert fmt_topk(out).endswith("(faster: torch); faiss not installed")


def test_both_back_ends_rank_alike_where_faiss_is_there():
    data = power_law_interactions(num_users=40, num_items=60, interactions=500, communities=2, seed=1)
    out = topk_backends(data, CFConfig())
    assert out["missing"] == [] and out["faiss_recall@20"] == out["torch_recall@20"]
