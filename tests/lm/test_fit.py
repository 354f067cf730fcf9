"""The surrogate fit: it recovers known parameters from synthetic runs, its bootstrap
intervals cover them, and the held-out validation measures what it says."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.lm.calibrate import design
from diloco_gym.lm.fit import bootstrap_intervals, fit_surrogate, validate
from diloco_gym.sim.learner_calibration import LearnerCalibration, predict_losses

TRUE = LearnerCalibration(
    loss_floor=1.8,
    loss_scale=3.6,
    loss_exponent=0.7,
    work_scale_steps=5.0,
    drift_steps=10.0,
    fragment_penalty=0.3,
    quant_efficiency={16: 1.0, 8: 0.95, 4: 0.7},
)
ENV = {"env_steps_per_inner_step": 32.0, "step_seconds": 0.14}


def _runs(noise: float, seeds: int = 4) -> list[dict]:
    plan = design(48, 4, 16, agent_schedules={"x": [5, 9, 16, 4, 12]})
    out = []
    for s in range(seeds):
        rng = np.random.default_rng(s)
        for item in plan:
            pred = predict_losses(item["schedule"], TRUE, item["fragments"], item["bits"])
            out.append(
                {
                    **item,
                    "seed": s,
                    "initial_loss": TRUE.loss_floor + TRUE.loss_scale + rng.normal(0, noise),
                    "merge_losses": list(pred + rng.normal(0, noise, len(pred))),
                }
            )
    return out


@pytest.mark.slow
def test_fit_recovers_known_parameters():
    runs = [r for r in _runs(noise=0.0, seeds=1) if r["role"] == "fit"]
    cal, rms = fit_surrogate(runs, ENV)
    assert rms < 1e-6
    for name in ("loss_floor", "loss_scale", "loss_exponent", "drift_steps", "fragment_penalty"):
        assert getattr(cal, name) == pytest.approx(getattr(TRUE, name), rel=1e-3), name
    for b in (8, 4):
        assert cal.quant_efficiency[b] == pytest.approx(TRUE.quant_efficiency[b], rel=1e-3)


@pytest.mark.slow
def test_bootstrap_intervals_cover_the_truth_and_validation_ranks():
    runs = _runs(noise=0.01)
    fit = [r for r in runs if r["role"] == "fit"]
    cal, _ = fit_surrogate(fit, ENV)
    iv = bootstrap_intervals(fit, cal, ENV, reps=30)
    for name in ("loss_exponent", "drift_steps"):
        lo, hi = iv[name]
        assert lo < hi
        assert lo * 0.9 <= getattr(TRUE, name) <= hi * 1.1, (name, iv[name])
    val = validate([r for r in runs if r["role"] == "heldout"], cal)
    assert val["spearman_rho"] > 0.9
    assert val["mae"] < 0.02
    assert val["per_seed_mae_sd"] is not None


def test_validation_detects_a_wrong_surrogate():
    runs = [r for r in _runs(noise=0.0, seeds=2) if r["role"] == "heldout"]
    wrong = LearnerCalibration(
        loss_floor=1.8,
        loss_scale=3.6,
        loss_exponent=0.7,
        work_scale_steps=5.0,
        drift_steps=1e5,  # no drift: ranks merging rarely as well as merging often
        fragment_penalty=0.0,
        quant_efficiency={8: 1.0, 4: 1.0},
    )
    right = validate(runs, TRUE)
    bad = validate(runs, wrong)
    assert right["mae"] < 1e-9 and right["spearman_rho"] == pytest.approx(1.0)
    assert bad["mae"] > 0.05
