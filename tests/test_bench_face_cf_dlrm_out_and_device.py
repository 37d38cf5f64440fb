"""`embcache bench face|dlrm|cf`: face and dlrm `--device cuda` without a GPU is one line before any
work (face: a traceback; dlrm: the child's error after generating its data set); face and cf take
`--out` as every other bench does (it was only argparse's prefix of `--out-dir`, which no --help
showed), and `--out-dir` still works; dlrm's `--out` has help. (Their impossible counts and ratios
are rows of tests/test_bench_bad_numbers_one_line.py.)"""
from __future__ import annotations

import importlib

import pytest
import torch

from embcache.bench.cli import COMMANDS
from embcache.cli import main


def _parser(command: str):
    return importlib.import_module(COMMANDS[command][0]).build_parser(f"embcache bench {command}")


def test_face_accuracy_classes_zero_still_skips_the_accuracy_task():
    """0 is documented as "skip it"."""
    assert _parser("face").parse_args(["--accuracy-classes", "0"]).accuracy_classes == 0


@pytest.mark.parametrize("command", ["face", "cf"])
@pytest.mark.parametrize("option", ["--out", "--out-dir"])
def test_out_and_the_old_out_dir_name_the_same_folder(command, option, tmp_path):
    assert _parser(command).parse_args([option, str(tmp_path)]).out_dir == str(tmp_path)


@pytest.mark.parametrize("command", ["face", "cf", "dlrm"])
def test_out_has_help_saying_it_is_the_results_folder(command):
    out = next(a for a in _parser(command)._actions if "--out" in a.option_strings)
    assert out.help and "results" in out.help


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("command", ["face", "dlrm"])
def test_cuda_without_a_gpu_is_one_line_before_any_work(command, tmp_path, capsys):
    """face: was a ValueError traceback; dlrm: generated the whole data set before its child refused."""
    data = ["--data-cache", str(tmp_path / "data"), "--rows", "2000"] if command == "dlrm" else []
    assert main(["bench", command, "--device", "cuda", "--out", str(tmp_path / "out"), *data]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"embcache bench {command}: error: --device: device 'cuda': no CUDA device is available on this "
                   "machine"]
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cf_torch_device_cuda_without_a_gpu_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """It was a ValueError traceback once the kernels were compiled and HEAT had run."""
    monkeypatch.setattr("cpu_kernels.heat.compile_kernels", lambda: pytest.fail("compiled before refusing"))
    assert main(["bench", "cf", "--torch-device", "cuda", "--no-plot", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().out.strip().splitlines() == [
        "bench cf: --torch-device: device 'cuda': no CUDA device is available on this machine"]
    assert not list(tmp_path.iterdir())
