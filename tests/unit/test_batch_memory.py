"""train.gpu_memory: train.max_tokens fitted to a share of the GPU's memory from a probe of the
first steps (nmt/training/batch_memory.py), on the simulated CUDA device, whose live storages
stand in for the allocator's (nmt.testing.gpu_sim.DeviceProfile)."""

import contextlib
import json

import pytest
import torch
from test_train import config

import nmt.training.batch_memory as batch_memory
from nmt.commands.train import load_data, update_frequency
from nmt.config import TrainConfig, compose, to_object
from nmt.errors import NmtError
from nmt.system.distributed import DistInfo
from nmt.testing.gpu_cost import update_cost
from nmt.testing.gpu_sim import MISSING, DeviceProfile, fused_attention, profiled, simulated_cuda

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
CUDA = DistInfo(device=torch.device("cuda", 0))
GB = 10 ** 9


def simulated_peak(model, step) -> int:
    """peak_bytes on the simulated GPU: the live storages' peak, the model's included."""
    profile = DeviceProfile()
    with profiled(profile):
        profile.track(list(model.parameters()))
        step()
    return profile.peak


PEAKS: dict = {}  # probe_peaks' figures by model, loss and precision
PROBE_PEAKS = batch_memory.probe_peaks


def probe_peaks_once(model, epsilon: float, pad_id: int, precision) -> list[int]:
    """batch_memory.probe_peaks, measured once a model (its layers, which of them recompute
    their activations), loss and precision: the tests fit the same model to several GPUs,
    and the probe does not depend on the GPU's memory."""
    key = (repr(model), tuple(name for name, m in model.named_modules() if "forward" in vars(m)),
           epsilon, pad_id, precision.args)
    if key not in PEAKS:
        PEAKS[key] = PROBE_PEAKS(model, epsilon, pad_id, precision)
    return PEAKS[key]


@contextlib.contextmanager
def simulated_gpu(memory: int):
    """The simulated GPU with `memory` bytes, measured as the allocator would be."""
    with simulated_cuda(backward="graph"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", fused_attention)
        mp.setattr(batch_memory, "device_memory", lambda device: memory)
        mp.setattr(batch_memory, "peak_bytes", simulated_peak)
        mp.setattr(batch_memory, "probe_peaks", probe_peaks_once)
        yield


def wmt_config(tmp_path, model: str, *overrides: str) -> TrainConfig:
    """+model=`model` on a data directory whose manifest has WMT14's joint 37k vocabulary."""
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"src_lang": "en", "tgt_lang": "de", "joint": True,
         "spm": {"src": "spm.model", "tgt": "spm.model"}, "src_vocab_size": 37000,
         "tgt_vocab_size": 37000, "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3,
         "dtype": "uint16", "vocab_sha256": "", "splits": {}}))
    return to_object(compose("train", [f"+model={model}", f"data_dir={tmp_path}",
                                       f"run_dir={tmp_path / 'run'}", "train.amp=bf16",
                                       "train.ema_decay=0.9999", *overrides]), TrainConfig)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["base", pytest.param("big", marks=pytest.mark.long)])
def test_the_batch_fills_the_share_of_an_80_gb_gpu(tmp_path, model):
    """The fitted batch's whole update (Adam's state and the EMA included), counted on the
    simulated GPU as docs/gpu.md's cost model counts it, fills 90% of 80 GB: within it, and
    within 10% of it."""
    cfg = wmt_config(tmp_path, model, "train.gpu_memory=0.9", "train.max_tokens=1000000")
    with simulated_gpu(80 * GB):
        tokens = batch_memory.fit_to_memory(cfg, CUDA).train.max_tokens
    assert tokens % batch_memory.MULTIPLE == 0
    rows = tokens // batch_memory.PROBE_LENGTH
    peak = update_cost(model, 37000, rows, batch_memory.PROBE_LENGTH)["peak_bytes"]
    assert 0.9 * 0.9 * 80 * GB <= peak <= 0.9 * 80 * GB, (tokens, peak / GB)


@pytest.mark.slow
def test_the_recipes_ceiling_a_smaller_gpu_and_one_too_small(tmp_path):
    with simulated_gpu(80 * GB):  # the ceiling holds
        cfg = wmt_config(tmp_path, "base", "train.gpu_memory=0.9", "train.max_tokens=4096")
        assert batch_memory.fit_to_memory(cfg, CUDA).train.max_tokens == 4096
    big = wmt_config(tmp_path, "base", "train.gpu_memory=0.9", "train.max_tokens=1000000")
    fits = []
    for memory in (80 * GB, 16 * GB):
        with simulated_gpu(memory):
            fits.append(batch_memory.fit_to_memory(big, CUDA).train.max_tokens)
    assert fits[1] < fits[0] / 5  # 16 GB: a fifth of the memory, less the fixed part
    with simulated_gpu(GB), pytest.raises(NmtError, match=r"^train.gpu_memory=0.9: 0.8 GiB "
                                                          r"leave no room for a batch \("):
        batch_memory.fit_to_memory(big, CUDA)
    assert batch_memory.fit_to_memory(big, DistInfo()).train.max_tokens == 1000000  # a CPU


def test_global_tokens_keeps_the_update_when_the_gpu_sets_the_batch(tiny_data_dir, tmp_path):
    """A GPU that holds batches of about 1,000 tokens: max_tokens follows it, and
    train.global_tokens accumulates batches to keep the update's 4,000 target tokens."""
    cfg = config(tiny_data_dir, tmp_path / "run", "train.gpu_memory=0.5",
                 "train.max_tokens=100000", "train.global_tokens=4000", "train.amp=bf16")
    with simulated_gpu(0):  # sized below: the probe's fixed part and ~1,000 tokens
        fit = batch_memory.measure(cfg, (120, 120, 0, True), CUDA.device)
    memory = int(2 * (fit.fixed + fit.state + 1000 * fit.per_token))
    with simulated_gpu(memory):
        fitted = batch_memory.fit_to_memory(cfg, CUDA)
    assert 512 <= fitted.train.max_tokens <= 1024
    itr = load_data(fitted, DistInfo()).train
    batches = itr.global_batches(1)
    per_batch = sum(int(itr.tgt_len[b].sum()) for b in batches) / len(batches)
    assert update_frequency(fitted.train, itr, 1) * per_batch == pytest.approx(4000)
    assert per_batch < 1000  # so about 4 batches an update
