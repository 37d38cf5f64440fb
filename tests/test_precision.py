"""`--precision` (`embcache.train.precision`): the flag lands in each config; on the CPU auto
and tf32 are fp32; the CUDA switches are set for a run and put back after it; bf16 runs the
dense part's products in bfloat16 while weights, optimizer state, loss and embedding rows
stay float32; the checkpoint records it, a resume across bf16 is refused, and evaluate /
export say what the model was trained with (the export scoring in float32)."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from embcache.checkpoint import load_checkpoint
from embcache.cli import main
from embcache.dlrm.config import DLRMConfig
from embcache.dlrm.trainer import DLRMTrainer
from embcache.errors import CheckpointError
from embcache.face.config import FaceConfig
from embcache.settings_fields import config_values
from embcache.train import precision

PRODUCTS = {"addmm", "mm", "bmm", "matmul", "linear"}


def _config(**kw) -> DLRMConfig:
    return DLRMConfig(**{**dict(batch_size=256, embedding_dim=4, dense_arch=[8], over_arch=[8], max_steps=2,
                                device="cpu", progress=False, arch="torch", cache_ratio=0.2), **kw})


# --- the flag -------------------------------------------------------------------------------

@pytest.mark.parametrize("words,cls", [("dlrm", DLRMConfig), ("face", FaceConfig)])
def test_the_flag_lands_in_the_config(words, cls):
    import importlib

    from embcache.cli import COMMANDS

    parser = importlib.import_module(COMMANDS[words][0]).build_parser(f"embcache {words}")
    assert config_values(parser.parse_args(["train"]), cls)["precision"] == "auto" == cls().precision
    assert config_values(parser.parse_args(["train", "--precision", "bf16"]), cls)["precision"] == "bf16"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--precision", "fp16"])


def test_bench_gpu_takes_the_flag():
    from embcache.bench.gpu_cli import build_parser

    assert build_parser("embcache bench gpu").parse_args([]).precision == "auto"
    assert build_parser("embcache bench gpu").parse_args(["--precision", "bf16"]).precision == "bf16"


def test_cpu_resolves_to_fp32_and_cuda_to_tf32():
    assert [precision.resolve(p, "cpu") for p in precision.PRECISIONS] == ["fp32", "fp32", "fp32", "bf16"]
    assert [precision.resolve(p, "cuda:0") for p in precision.PRECISIONS] == ["tf32", "fp32", "tf32", "bf16"]
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.resolve("fp16", "cpu")


# --- the CUDA switches: set for the run, put back after it -----------------------------------

@pytest.fixture
def switches():
    """The two TF32 switches, put back after the test whatever it did."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_tf32_is_set_for_the_run_and_put_back(switches):
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    with precision.precision_scope("tf32", "cuda"):
        assert switches() == (True, True)
    assert switches() == (False, True)
    for p in ("fp32", "bf16"):
        with precision.precision_scope(p, torch.device("cuda", 0)):
            assert switches() == (False, False)
        assert switches() == (False, True)
    with pytest.raises(KeyError), precision.precision_scope("tf32", "cuda"):
        raise KeyError("a run that fails")
    assert switches() == (False, True)


def test_the_cpu_changes_no_switch_and_importing_changes_none(switches):
    import subprocess
    import sys

    torch.backends.cuda.matmul.allow_tf32 = False
    with precision.precision_scope("tf32", "cpu"):
        assert switches()[0] is False
    show = "import torch; print(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)"
    bare, imported = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
                      for code in (show, "import embcache, embcache.dlrm.trainer, embcache.face.trainer; " + show))
    assert bare == imported  # a fresh process: importing the trainers turned nothing on


def test_a_run_on_the_cpu_leaves_the_switches(small_synthetic, switches, one_torch_thread):
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    summary = DLRMTrainer(_config(precision="tf32"), small_synthetic).fit()
    assert summary["precision"] == "fp32" and switches() == (False, True)


# --- bf16 on the CPU -------------------------------------------------------------------------

class ProductDtypes(TorchDispatchMode):
    """The dtypes of every matrix product dispatched (after autocast cast its inputs)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in PRODUCTS:
            self.seen.add(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["torch", "auto"])
def test_bf16_runs_the_dense_products_in_bfloat16_with_float32_weights(small_synthetic, arch, one_torch_thread):
    trainer = DLRMTrainer(_config(precision="bf16", arch=arch, row_dtype="bfloat16"), small_synthetic)
    outputs = []
    for m in trainer.model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda mod, i, o: outputs.append((i[0].dtype, o.dtype)))
    batch = next(iter(trainer._batches("train", 256)))
    with ProductDtypes() as products:
        loss = trainer.train_step(batch)
    assert products.seen and all(set(dtypes) == {torch.bfloat16} for dtypes in products.seen), products.seen
    assert outputs and {o for _, o in outputs} == {torch.bfloat16}
    assert loss.dtype == torch.float32
    dense = [p for n, p in trainer.model.named_parameters() if not n.startswith("sparse_arch")]
    assert dense and all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in dense)
    state = [t for s in trainer.dense_opt.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1]
    assert state and all(t.dtype == torch.float32 for t in state)
    assert trainer.sparse.local.table_weight("t_sparse_0").dtype == torch.bfloat16  # the rows keep row_dtype
    logits = trainer.model(batch.dense, batch.sparse)
    assert logits.dtype == torch.float32


def test_fp32_runs_no_product_in_bfloat16(small_synthetic, one_torch_thread):
    trainer = DLRMTrainer(_config(precision="fp32"), small_synthetic)
    with ProductDtypes() as products:
        trainer.train_step(next(iter(trainer._batches("train", 256))))
    assert products.seen and all(set(d) == {torch.float32} for d in products.seen)


def test_bf16_trains_close_to_fp32(small_synthetic, one_torch_thread):
    """The same steps: the losses agree to bfloat16's rounding, not to the bit."""
    losses = {}
    for p in ("fp32", "bf16"):
        trainer = DLRMTrainer(_config(precision=p, max_steps=4), small_synthetic)
        losses[p] = torch.stack([trainer.train_step(b) for _, b in zip(range(4), trainer._batches("train", 256))])
    assert not torch.equal(losses["fp32"], losses["bf16"])
    assert torch.allclose(losses["fp32"], losses["bf16"], atol=2e-2)


# --- the checkpoint, resume, evaluate, export ----------------------------------------------

@pytest.fixture(scope="module")
def bf16_run(small_synthetic, tmp_path_factory):
    ck = tmp_path_factory.mktemp("bf16") / "ck"
    DLRMTrainer(_config(precision="bf16", checkpoint_dir=str(ck)), small_synthetic).fit()
    return ck


def test_the_checkpoint_records_the_precision(bf16_run):
    ck = load_checkpoint(bf16_run / "dlrm-last.pt", kind="dlrm")
    assert ck["precision"] == "bf16" and ck["config"]["precision"] == "bf16"


def test_a_resume_with_another_precision_is_refused(bf16_run, small_synthetic):
    cfg = _config(precision="fp32", checkpoint_dir=str(bf16_run), resume=True, max_steps=3)
    with pytest.raises(CheckpointError, match=r"--precision 'bf16' in the checkpoint, 'fp32' now"):
        DLRMTrainer(cfg, small_synthetic).fit()


def test_a_resume_with_the_same_precision_goes_on(bf16_run, small_synthetic, tmp_path, one_torch_thread):
    import shutil

    shutil.copytree(bf16_run, tmp_path / "ck")
    cfg = _config(precision="bf16", checkpoint_dir=str(tmp_path / "ck"), resume=True, max_steps=3)
    assert DLRMTrainer(cfg, small_synthetic).fit()["steps"] == 3


def test_fp32_and_tf32_follow_the_device_and_an_old_checkpoint_was_fp32(caplog):
    with caplog.at_level(logging.INFO, logger="embcache.train.precision"):
        assert precision.resume_mismatch("tf32", "fp32") == []
    assert "trained with precision tf32" in caplog.text
    assert precision.resume_mismatch(None, "fp32") == []
    assert precision.resume_mismatch(None, "bf16") == [
        "--precision 'fp32' in the checkpoint, 'bf16' now (bf16 computes the dense part in bfloat16; resume with "
        "--precision fp32)"]
    assert DLRMConfig.settings_added_later["precision"] == "fp32"


def test_evaluate_says_the_precision(bf16_run, capsys):
    assert main(["dlrm", "evaluate", str(bf16_run), "--split", "val", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "trained with precision bf16 (bfloat16 autocast over the dense part, float32 weights); evaluated in " \
           "bf16" in out
    assert json.loads(out.strip().splitlines()[-1])["trained_precision"] == "bf16"


def test_export_says_it_and_scores_in_float32(bf16_run, tmp_path, capsys):
    assert main(["dlrm", "export", str(bf16_run), "--out", str(tmp_path / "out"), "--verify", "val"]) == 0
    out = capsys.readouterr().out
    assert "trained with precision bf16; the export scores in float32" in out
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["trained_precision"] == "bf16"
    assert json.loads(out.strip().splitlines()[-1])["bit_for_bit"]  # against the model in float32


def test_bench_gpu_runs_bf16_and_says_so(tmp_path):
    rc = main(["bench", "gpu", "--scale", "0.0005", "--dims", "4", "--batch-size", "32", "--steps", "2",
               "--warmup-steps", "1", "--ratios", "0.3", "--device", "cpu", "--out", str(tmp_path), "--shapes",
               "one-hot", "--link-table-mib", "1", "--bookkeeping", "host", "--no-price-prefetch", "--precision", "bf16"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["config"]["precision"] == "bf16" and {r["precision"] for r in data["rows"]} == {"bf16"}
    assert all(r["max_loss_diff_vs_gpu_tables"] == 0.0 for r in data["blocks"][0]["results"])


def test_face_bf16_autocasts_the_nets_and_records_it(tmp_path, one_torch_thread):
    from embcache.face.trainer import FaceTrainer

    cfg = FaceConfig(num_classes=40, max_steps=2, batch_size=16, device="cpu", progress=False, precision="bf16",
                     eval_classes=10, checkpoint_dir=str(tmp_path / "ck"))
    trainer = FaceTrainer(cfg)
    outputs = []
    for net in (trainer.probe, trainer.gallery):
        net.register_forward_hook(lambda mod, i, o: outputs.append(o.dtype))
        next(m for m in net.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(
            lambda mod, i, o: outputs.append(("linear", o.dtype)))
    assert trainer.fit()["precision"] == "bf16"
    assert {torch.float32, ("linear", torch.bfloat16)} == set(outputs)  # bf16 inside, float32 out
    assert all(p.dtype == torch.float32 for p in trainer.probe.parameters())
    assert load_checkpoint(tmp_path / "ck" / "face-last.pt", kind="face")["precision"] == "bf16"
    again = FaceConfig(**{**cfg.__dict__, "precision": "fp32", "resume": True, "max_steps": 3})
    with pytest.raises(CheckpointError, match="--precision 'bf16' in the checkpoint, 'fp32' now"):
        FaceTrainer(again).fit()
