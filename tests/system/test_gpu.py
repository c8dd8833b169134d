"""The GPU suite (`make test-gpu`; skipped without CUDA): NCCL training with validation loss
and BLEU, bf16 and fp16, resume, averaging and translation on the GPU, torchrun over every
GPU present, fused attention kernels for padded batches, and updates that never wait for the
device."""

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train import config

import nmt.commands.train
import nmt.training.run
from nmt.commands.train import train
from nmt.errors import NmtError
from nmt.training.checkpoint import load_checkpoint

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BIN = Path(sys.executable).parent
GPU = ["train.device=cuda", "train.max_tokens=1024"]
BF16 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def cli(*args: str, gpus: int = 0) -> subprocess.CompletedProcess:
    """Run an nmt console script (under torchrun over `gpus` processes when gpus > 0)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    launcher = ([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(gpus),
                 "--no-python"] if gpus else [])
    out = subprocess.run([*launcher, str(BIN / args[0]), *args[1:]], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def records(run: Path, kind: str) -> list[dict]:
    """The metrics.jsonl records of one kind."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def tiny_args(data: Path, run: Path) -> list[str]:
    """The command-line form of test_train's tiny model, on the GPU."""
    return ["+model=small", f"data_dir={data}", f"run_dir={run}", "model.N=1",
            "model.d_model=32", "model.d_ff=64", "model.h=4", "train.log_interval=2", *GPU]


def test_one_gpu_nccl_training_with_valid_loss_and_bleu(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    out = cli("nmt-train", *tiny_args(tiny_data_dir, run), "train.max_updates=6",
              "train.valid_interval_updates=3", "train.valid_bleu=true", gpus=1)
    valid = records(run, "valid")
    assert [r["update"] for r in valid] == [3, 6]
    assert all(math.isfinite(r["loss"]) and 0 <= r["bleu"] <= 100 for r in valid)
    assert "device cuda:0 x 1" in out.stdout and f"amp {'bf16' if BF16 else 'fp16'}" in out.stdout


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_trains(tiny_data_dir, tmp_path, amp):
    if amp == "bf16" and not BF16:
        pytest.skip("this GPU has no bf16")
    out = train(config(tiny_data_dir, tmp_path / "run", *GPU, f"train.amp={amp}",
                       "train.max_updates=8"))
    assert out["update"] == 8 and math.isfinite(out["valid"]["loss"]) and out["nonfinite"] == 0
    scaler = load_checkpoint(tmp_path / "run/checkpoint_last.pt")["scaler"]
    assert (scaler["scale"] > 0) if amp == "fp16" else scaler == {}


def test_bf16_on_a_gpu_without_it_is_one_line(tiny_data_dir, tmp_path):
    if BF16:
        pytest.skip("this GPU has bf16")
    with pytest.raises(NmtError, match="has no bfloat16 support"):
        train(config(tiny_data_dir, tmp_path / "run", *GPU, "train.amp=bf16"))


def test_resume_on_the_gpu(tiny_data_dir, tmp_path):
    opts = [*GPU, "train.save_interval_updates=4", "model.dropout=0.1", "train.ema_decay=0.9"]
    train(config(tiny_data_dir, tmp_path / "straight", *opts, "train.max_updates=8"))
    train(config(tiny_data_dir, tmp_path / "resumed", *opts, "train.max_updates=4"))
    train(config(tiny_data_dir, tmp_path / "resumed", *opts, "train.max_updates=8"))
    a, b = (load_checkpoint(tmp_path / run / "checkpoint_last.pt")
            for run in ("straight", "resumed"))
    assert a["iterator"] == b["iterator"] and a["scheduler"] == b["scheduler"]
    for key in ("model", "ema"):  # CUDA's atomic adds (embedding backward) are not bitwise
        for name, w in a[key].items():
            torch.testing.assert_close(b[key][name], w, rtol=0, atol=1e-4, msg=name)


def test_average_and_translate_on_the_gpu(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    cli("nmt-train", *tiny_args(tiny_data_dir, run), "train.max_updates=6",
        "train.save_interval_updates=2")
    cli("nmt-average", f"run_dir={run}", "last=3", f"output={run}/averaged.pt")
    hyp = tmp_path / "hyp.de"
    out = cli("nmt-translate", f"checkpoint={run}/averaged.pt", "device=cuda",
              f"input={tiny_data_dir}/test.clean.en", f"output={hyp}", "search.beam_size=4",
              f"ref={tiny_data_dir}/test.clean.de")
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 40
    assert "BLEU" in out.stderr


def test_torchrun_over_every_gpu(tiny_data_dir, tmp_path):
    run, gpus = tmp_path / "run", torch.cuda.device_count()
    out = cli("nmt-train", *tiny_args(tiny_data_dir, run), "train.max_updates=6",
              "train.log_interval=1", gpus=gpus)
    assert [r["update"] for r in records(run, "train")] == list(range(1, 7))
    assert f"x {gpus} |" in out.stdout


def test_fused_attention_runs_for_padded_batches(tiny_data_dir):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from nmt.config import ModelConfig
    from nmt.data.arrays import ParallelData
    from nmt.data.batches import EpochBatchIterator
    from nmt.model import make_model

    itr = EpochBatchIterator(ParallelData(tiny_data_dir, "train"), 1024, 1, 0)
    batch = next(b for _, b in itr if b.padded_tokens > b.src_tokens + b.tgt_tokens)
    batch = batch.to(torch.device("cuda"))
    cfg = ModelConfig(N=1, d_model=64, d_ff=128, h=4, dropout=0.1)
    model = make_model(cfg, 120, 120, 0, True).cuda()
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        fused.append(SDPBackend.CUDNN_ATTENTION)
    dtype = torch.bfloat16 if BF16 else torch.float16
    with sdpa_kernel(fused), torch.autocast("cuda", dtype=dtype):  # no unfused fallback
        loss, _ = nmt.training.run.batch_loss(model, batch, 0.1, 0, contextlib.nullcontext)
    loss.backward()
    assert math.isfinite(loss.item())


def test_an_update_never_waits_for_the_gpu(tiny_data_dir, tmp_path, monkeypatch):
    """After two warm-up updates, train_step runs under CUDA's sync debug mode "error" (any
    synchronising call raises), backward passes excepted: PyTorch's embedding backward
    synchronises inside."""
    real_step, real_backward, steps = nmt.commands.train.train_step, torch.Tensor.backward, []

    def backward(self, *args, **kwargs):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return real_backward(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    def train_step(*args, **kwargs):
        steps.append(1)
        torch.cuda.set_sync_debug_mode("error" if len(steps) > 2 else 0)
        try:
            return real_step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    monkeypatch.setattr(nmt.commands.train, "train_step", train_step)
    out = train(config(tiny_data_dir, tmp_path / "run", *GPU, "train.max_updates=6",
                       "train.log_interval=6", "train.valid_interval_updates=100",
                       "train.ema_decay=0.9"))
    assert out["update"] == 6 and len(steps) == 6
