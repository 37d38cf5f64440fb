"""`embcache bench kernels` at toy sizes on the CPU (Triton's interpreter): the run's
structure and its agreement check; its speeds mean nothing here."""
import json

import pytest

from embcache.cli import main

pytest.importorskip("triton")


def test_bench_kernels_compares_both_paths_from_the_same_start(tmp_path, capsys):
    rc = main(["bench", "kernels", "--scale", "0.0002", "--dim", "4", "--batch-sizes", "4", "--steps", "1",
               "--warmup-steps", "0", "--copy-mib", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert data["copy_gbps"] > 0 and data["device_name"].startswith("cpu")
    rows = data["rows"]
    assert [(r["shape"], r["batch_size"]) for r in rows] == [("one-hot", 4), ("multi-hot", 4)]
    assert [r["lookups"] for r in rows] == [4 * 26, 4 * 214]
    for r in rows:
        assert 0 < r["distinct_rows"] <= r["lookups"]
        # the same steps through both: Adagrad's rows agree to the last bits (the CPU's sqrt, docs)
        assert r["max_table_diff_after_one_step"] < 1e-6
        for path in ("torch", "triton"):
            assert r[path]["forward_gbps"] > 0 and r[path]["forward_share_of_copy"] > 0
        for timed in ("masked_write_ms", "lookup_ms"):
            assert set(r[timed]) == {"torch", "triton"} and all(v > 0 for v in r[timed].values())
        tiles = r["triton"]["forward_share_by_bags_per_program"]
        assert list(tiles) == ["1", "4", "16"] and all(v > 0 for v in tiles.values())
    assert "bench kernels: one-hot batch 4" in capsys.readouterr().out


def test_a_bench_kernels_run_cut_short_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    import embcache.bench.kernels as kernels

    real = kernels.measure

    def measure(shape, *args, **kwargs):
        if shape == "multi-hot":
            raise KeyboardInterrupt  # the step's time limit, after the first row
        return real(shape, *args, **kwargs)

    monkeypatch.setattr(kernels, "measure", measure)
    assert main(["bench", "kernels", "--scale", "0.0002", "--dim", "4", "--batch-sizes", "4", "--steps", "1",
                 "--warmup-steps", "0", "--copy-mib", "1", "--device", "cpu", "--out", str(tmp_path)]) == 130
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert [(r["shape"], r["batch_size"]) for r in rows] == [("one-hot", 4)]
