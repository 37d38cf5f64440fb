"""What the benchmarks say as they run: the side-by-side ratios the JSON holds, skipped
variants with their reasons, a drifting trace that cannot drift, warnings said once, and no
stray library warnings. Toy sizes; the figures themselves mean nothing here."""
import json
import logging
import subprocess
import sys
import warnings

import pytest

from embcache.bench.cli import COMMANDS as BENCHES
from embcache.cli import main


def test_bench_dlrm_prints_each_variant_s_ratio_to_all_on_device_and_its_auc(tmp_path, monkeypatch, capsys):
    from embcache.dlrm import bench

    rates = {"cached": 9_000.0, "device": 12_000.0, "host": 6_000.0}

    def variant(args, data_dir, sparse, ratio):  # a train run's summary, without training
        return {"sparse": sparse, "ratio": ratio, "train_samples_per_s": rates[sparse], "peak_host_mib": 10.0,
                "hit_rate": 0.5, "bytes_h2d": 2**20, "bytes_d2h": 0, "steps": 1,
                "val_auc": {"cached": 0.7512, "device": 0.7513, "host": None}[sparse]}

    monkeypatch.setattr(bench, "_variant", variant)
    monkeypatch.setattr(bench, "checksum_costs", lambda *a: {
        "shards_seconds": 0.0, "shards_fraction_of_epoch": 0.0, "verify_seconds": 0.0, "verify_fraction_of_load": 0.0})
    data = tmp_path / "bench-dlrm-r400000-s0.1"
    data.mkdir()
    (data / "meta.json").write_text("{}")
    assert main(["bench", "dlrm", "--ratios", "0.015", "--data-cache", str(tmp_path), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("side by side"):]
    assert "cached 1.5%     0.75x  AUC 0.7512" in table
    assert "all on device   1.00x  AUC 0.7513" in table
    assert "all on host     0.50x  AUC n/a" in table
    saved = json.loads((tmp_path / "dlrm.json").read_text())["results"]
    assert [r["throughput_vs_all_on_device"] for r in saved] == [0.75, 1.0, 0.5]


def test_bench_face_says_the_skipped_accuracy_runs_and_the_fc_over_dcp_ratio(tmp_path, capsys):
    assert main(["bench", "face", "--classes", "1000", "--batch-size", "32", "--repeats", "1",
                 "--accuracy-classes", "50", "--accuracy-epochs", "1", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "face.json").read_text())
    for name, result in data["accuracy"]["results"].items():
        if "skipped" in result:
            assert f"accuracy {name:8s} skipped ({result['skipped']})" in out
    assert "skipped" in data["accuracy"]["results"]["dcp 1%"]
    ratio = data["fc_over_dcp1_step_time"]["1000"]
    assert f"fc / dcp 1% head step time: 1,000 classes {ratio:.2f}x" in out


def test_bench_face_s_plot_keeps_matplotlib_s_font_fallbacks_to_itself(tmp_path, monkeypatch, caplog):
    import matplotlib.figure
    import torch

    from embcache.face import bench

    save = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):  # where matplotlib looks its math fonts up, and logs the missing ones
        logging.getLogger("matplotlib.font_manager").warning("findfont: Font family ['cmr10'] not found.")
        return save(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    rows = [{"head": "fc", "classes": 1000, "step_ms": 1.0, "head_peak_bytes": 2**20}]
    with caplog.at_level(logging.WARNING):
        bench.plot(rows, tmp_path / "face.png", torch.device("cpu"))
    assert (tmp_path / "face.png").stat().st_size > 0
    assert not [r for r in caplog.records if "findfont" in r.getMessage()]
    assert logging.getLogger("matplotlib.font_manager").level == logging.NOTSET  # put back


def test_bench_cache_skips_a_drifting_trace_that_never_drifts_and_says_overflow_once(tmp_path, capsys):
    assert main(["bench", "cache", "--batches", "8", "--scale", "0.005", "--ratios", "0.005", "0.015",
                 "--parts", "hit-rate", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "drifting trace skipped: 8 batches never reach a day boundary (--day-batches 50)" in captured.out
    assert "drifting trace (" not in captured.out
    data = json.loads((tmp_path / "cache.json").read_text())["hit_rate"]
    assert "drifting" not in data and "day boundary" in data["drifting_skipped"]
    assert captured.err.count("warning: the cache holds ") == 1
    assert "came from 8 of the caches built here, said once" in captured.out  # 4 policies x 2 ratios


def test_bench_cache_still_measures_a_trace_long_enough_to_drift(tmp_path, capsys):
    assert main(["bench", "cache", "--batches", "6", "--day-batches", "3", "--scale", "0.005", "--ratios", "0.05",
                 "--parts", "hit-rate", "--out", str(tmp_path)]) == 0
    assert "drifting trace (3 batches a day), ratio" in capsys.readouterr().out
    assert "drifting" in json.loads((tmp_path / "cache.json").read_text())["hit_rate"]


def test_bench_gpu_on_the_cpu_does_not_call_its_table_the_docs_gpu_table(tmp_path, capsys):
    assert main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "16", "--steps", "2",
                 "--warmup-steps", "1", "--ratios", "0.3", "--device", "cpu", "--out", str(tmp_path),
                 "--shapes", "one-hot", "--link-table-mib", "1", "--bookkeeping", "host"]) == 0
    out = capsys.readouterr().out
    assert "(on the CPU: a check of the run, not the docs' GPU figures)" in out
    assert "docs/cache.md's" not in out


def test_bench_kernels_on_the_cpu_says_it_is_interpreted_and_each_row_before_measuring(tmp_path, capsys):
    pytest.importorskip("triton")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["bench", "kernels", "--scale", "0.0002", "--dim", "4", "--batch-sizes", "4", "--steps", "1",
                     "--warmup-steps", "0", "--copy-mib", "1", "--device", "cpu", "--shapes", "one-hot",
                     "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bench kernels: the kernels run under Triton's interpreter")
    assert "not a speed (minutes even at small sizes)" in lines[0]
    assert lines[1] == "bench kernels: measuring one-hot batch 4 ..."
    assert lines[2].startswith("bench kernels: one-hot batch 4:")
    assert not [w for w in caught if "Sparse invariant checks" in str(w.message)]


def test_embcache_help_lists_every_registered_benchmark(capsys):
    main(["--help"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("bench "))
    listed = line[line.index("(") + 1:line.index(")")].split(", ")
    assert listed == list(BENCHES)


def test_a_keyed_jagged_tensor_built_through_embcache_logs_no_fx_tracing_warning():
    pytest.importorskip("torchrec")
    code = ("import torch\nfrom embcache.sparse_types import KeyedJaggedTensor\n"
            "KeyedJaggedTensor(keys=['f'], values=torch.tensor([1]), lengths=torch.tensor([1]))\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert "is_fx_tracing" not in out.stderr + out.stdout
