"""The Noam schedule against its closed form, and the optimizer it drives."""

import math

import pytest
import torch

from nmt.config import OptimConfig
from nmt.schedule import build_optimizer, noam_lr


@pytest.mark.parametrize("step", [1, 10, 3999, 4000, 4001, 100_000])
def test_noam_closed_form(step):
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    assert math.isclose(noam_lr(step, 512, 4000), expected, rel_tol=1e-12)


def test_noam_peaks_at_warmup():
    peak = noam_lr(4000, 512, 4000)
    assert math.isclose(peak, 512 ** -0.5 * 4000 ** -0.5)
    assert noam_lr(3999, 512, 4000) < peak > noam_lr(4001, 512, 4000)
    assert math.isclose(noam_lr(2000, 512, 4000) * 2, peak)  # linear warmup
    assert math.isclose(noam_lr(16000, 512, 4000) * 2, peak)  # inverse square root decay


def test_factor_scales_and_step_zero_is_step_one():
    assert math.isclose(noam_lr(100, 256, 1000, factor=2.0), 2 * noam_lr(100, 256, 1000))
    assert noam_lr(0, 512, 4000) == noam_lr(1, 512, 4000)


def test_optimizer_follows_the_schedule():
    cfg = OptimConfig(lr_factor=1.0, warmup=10, beta1=0.9, beta2=0.98, eps=1e-9,
                      label_smoothing=0.1)
    model = torch.nn.Linear(2, 2)
    opt, sched = build_optimizer(model, cfg, d_model=16)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98) and opt.param_groups[0]["eps"] == 1e-9
    for update in range(1, 25):
        assert math.isclose(opt.param_groups[0]["lr"], noam_lr(update, 16, 10))
        opt.step()
        sched.step()
