"""The Noam schedule against its closed form, and the optimizer it drives."""

import math

import pytest
import torch

from nmt.config import OptimConfig
from nmt.training.schedule import (
    NoamSchedule,
    build_optimizer,
    cooldown_factor,
    noam_lr,
    noam_lr_tensor,
)


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


@pytest.mark.parametrize("step", [0, 1, 10, 3999, 4000, 4001, 100_000])
def test_the_tensor_schedule_is_the_closed_form(step):
    rate = noam_lr_tensor(torch.tensor(float(step), dtype=torch.float64), 512, 4000, 2.0)
    assert rate.dtype == torch.float64
    assert math.isclose(rate.item(), noam_lr(step, 512, 4000, 2.0), rel_tol=1e-12)


@pytest.mark.parametrize("fused", [True, False])
def test_a_skipped_update_leaves_the_rate_where_it_was(fused):
    """Updates skipped on the device (fused: Adam told through found_inf, as on a GPU) are not
    counted: the rate of the next update is noam_lr(applied + 1), as Adam's step count."""
    from nmt.commands.train import optimizer_step

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, fused=fused)
    schedule = NoamSchedule(optimizer, 16, 10, 1.0)
    assert schedule.lr.dtype == (torch.float32 if fused else torch.float64)
    applied = 0
    for skip in (False, True, True, False, True, False):
        assert optimizer.param_groups[0]["lr"] is schedule.lr
        assert math.isclose(schedule.get_last_lr()[0], noam_lr(applied + 1, 16, 10),
                            rel_tol=1e-6 if fused else 1e-12)
        before = model.weight.detach().clone()
        model(torch.ones(1, 2)).sum().backward()
        optimizer_step(optimizer, torch.tensor(skip))
        schedule.step(torch.tensor(skip))
        assert torch.equal(model.weight.detach(), before) == skip
        applied += not skip
    assert schedule.state_dict() == {"applied": 3, "updates": 6, "cooldown": None}
    assert all(s["step"].item() == 3 for s in optimizer.state.values())


def test_the_schedule_resumes_from_its_state_and_from_an_older_lambdalr_state():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    schedule = NoamSchedule(optimizer, 16, 10, 1.0)
    saved = optimizer.state_dict()
    for state, applied in (({"applied": 4}, 4), ({"last_epoch": 7, "base_lrs": [1.0]}, 7)):
        optimizer.load_state_dict(saved)  # replaces the groups' lr
        schedule.load_state_dict(state)
        assert optimizer.param_groups[0]["lr"] is schedule.lr
        assert math.isclose(schedule.get_last_lr()[0], noam_lr(applied + 1, 16, 10))
        assert schedule.state_dict() == {"applied": applied, "updates": applied,
                                         "cooldown": None}


@pytest.mark.parametrize("update", [1, 5, 6, 7, 9, 10, 11, 50])
def test_cooldown_factor_closed_form(update):
    """Start 5, length 5: 1 through update 6, then 4/5 ... 1/5 at update 10, 0 after."""
    expected = {7: 0.8, 9: 0.4, 10: 0.2, 11: 0.0, 50: 0.0}.get(update, 1.0)
    assert math.isclose(cooldown_factor(update, 5, 5), expected, rel_tol=1e-12)


def test_the_cooldown_multiplies_the_rate_counts_every_update_and_resumes():
    """Skipped updates count for the cooldown (as for max_updates) but not for the Noam rate;
    the cooldown's plan travels in the state."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    schedule = NoamSchedule(optimizer, 16, 10, 1.0)
    for _ in range(3):
        schedule.step()
    schedule.start_cooldown(4)  # updates 4..7 decay; cooled after update 7
    applied = 3
    for update in range(4, 9):
        assert math.isclose(schedule.get_last_lr()[0],
                            noam_lr(applied + 1, 16, 10) * cooldown_factor(update, 3, 4))
        assert schedule.cooled() == (update > 7)
        skip = update == 5
        schedule.step(torch.tensor(skip))
        applied += not skip
    assert schedule.get_last_lr()[0] == 0.0 and schedule.cooled()
    state = schedule.state_dict()
    assert state == {"applied": 7, "updates": 8, "cooldown": [3, 4]}
    again = NoamSchedule(torch.optim.Adam(model.parameters(), lr=1.0), 16, 10, 1.0)
    again.load_state_dict(state)
    assert again.state_dict() == state and again.get_last_lr()[0] == 0.0
