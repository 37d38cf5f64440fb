"""`kernels="torch" | "triton" | "auto"`: chosen as the bookkeeper is, on every layer that
builds a cache (RowCache, CachedEmbeddingBag, the collection, `dlrm train`, `bench gpu`,
`bench host`), and refused in one line where it cannot apply."""
import json

import pytest
import torch

from embcache.cache.choices import resolve_cache_kernels
from embcache.cli import main
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag
from embcache.sparse_types import EmbeddingBagConfig


def test_auto_is_torch_off_cuda_and_for_the_host_bookkeeper():
    assert resolve_cache_kernels("auto", torch.device("cpu"), "device") == "torch"
    assert resolve_cache_kernels("auto", "cuda:0", "host") == "torch"  # no CUDA needed to decide that
    assert resolve_cache_kernels("torch", "cuda", "device") == "torch"


def test_triton_with_the_host_bookkeeper_and_unknown_names_are_one_line():
    with pytest.raises(ValueError, match="needs the device bookkeeper") as err:
        CachedEmbeddingBag(50, 4, cache_ratio=0.2, device="cpu", bookkeeping="host", kernels="triton")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"kernels must be one of \('torch', 'triton', 'auto'\), got 'cuda'"):
        CachedEmbeddingBag(50, 4, cache_ratio=0.2, device="cpu", bookkeeping="device", kernels="cuda")


def test_the_collection_passes_it_to_closed_groups_and_open_tables_keep_torch():
    tables = [EmbeddingBagConfig(name="ids", embedding_dim=4, num_embeddings=40, feature_names=["a"]),
              EmbeddingBagConfig(name="keys", embedding_dim=4, num_embeddings=40, feature_names=["b"])]
    ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.25, device="cpu", bookkeeping="host",
                                       open_tables={"keys": {}}, kernels="auto")
    assert [bag.cache.kernels for bag in ebc.bags] == ["torch", "torch"]
    with pytest.raises(ValueError, match="needs the device bookkeeper"):  # the closed group's own choice
        CachedEmbeddingBagCollection(tables[:1], cache_ratio=0.25, device="cpu", bookkeeping="host",
                                     kernels="triton")


def test_dlrm_train_takes_kernels_and_bench_rows_record_them(tmp_path, small_synthetic):
    from embcache.dlrm.cli import build_parser

    args = build_parser("embcache dlrm").parse_args(["train", "--kernels", "torch"])
    assert args.kernels == "torch"
    assert build_parser("embcache dlrm").parse_args(["train"]).kernels == "auto"
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "2",
               "--warmup-steps", "1", "--ratios", "0.3", "--device", "cpu", "--out", str(tmp_path),
               "--shapes", "one-hot", "--link-table-mib", "1", "--bookkeeping", "host", "device",
               "--no-price-prefetch", "--kernels", "torch"])
    assert rc == 0
    rows = json.loads((tmp_path / "gpu.json").read_text())["rows"]
    assert [(r["bookkeeping"], r["kernels"], r["batch_size"]) for r in rows] == [
        (None, "torch", 16), ("host", "torch", 16), ("device", "torch", 16)]


def test_bench_gpu_whole_table_with_triton_kernels_and_the_graph_choice(tmp_path):
    pytest.importorskip("triton")
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "8", "--steps", "2",
               "--warmup-steps", "1", "--device", "cpu", "--out", str(tmp_path), "--shapes", "one-hot",
               "--link-table-mib", "1", "--kernels", "triton", "--no-cached", "--cuda-graphs", "on"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    rows = data["blocks"][0]["results"]
    assert [(r["variant"], r["kernels"]) for r in rows] == [("gpu", "torch"), ("gpu", "triton")]
    assert rows[1]["max_loss_diff_vs_gpu_tables"] < 1e-6  # the same training, Adagrad's sqrt aside
    assert [r["cuda_graphs"] for r in data["rows"]] == ["off: torch's sparse optimizer is not capturable",
                                                        "off: not on CUDA"]


def test_a_capture_that_fails_is_said_and_the_step_runs_eagerly(capsys):
    from types import SimpleNamespace

    from embcache.bench.gpu import captured_step

    def failing(*_):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    sparse = SimpleNamespace(captured=failing)
    losses = []
    batch = ((torch.zeros(1),), torch.zeros(1), torch.zeros(1))
    assert not captured_step((sparse, None, None, None), [batch], 0, losses)
    assert sparse.captured is None and losses == []
    assert sparse.graph_failed == "RuntimeError: operation not permitted when stream is capturing"
    assert "could not be captured" in capsys.readouterr().out
