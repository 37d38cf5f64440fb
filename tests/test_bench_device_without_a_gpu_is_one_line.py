"""`embcache bench cache|kernels|probe|gpu --device cuda` on a machine without a GPU printed a
ValueError traceback; it is now the command's one-line error, before any work."""
from __future__ import annotations

import pytest
import torch

from embcache.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")


@pytest.mark.parametrize("command", ["cache", "kernels", "probe", "gpu"])
def test_cuda_without_a_gpu_is_one_line(command, tmp_path, capsys):
    assert main(["bench", command, "--device", "cuda", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"embcache bench {command}: error: --device: device 'cuda': no CUDA device is available on this "
                   "machine"]
    assert not list(tmp_path.iterdir())


def test_a_name_that_is_no_device_is_one_line(tmp_path, capsys):
    assert main(["bench", "cache", "--device", "gpu0", "--out", str(tmp_path)]) == 1
    assert "error: --device: device 'gpu0' is not a device" in capsys.readouterr().err
