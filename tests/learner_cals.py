"""Learner calibrations the tests share: small surrogates whose losses move with the
placement of merges (a short drift), so that schedules differ well above rounding."""

from __future__ import annotations

from diloco_gym.sim.learner_calibration import LearnerCalibration

#: A short drift (8 inner steps) and an 8-bit payload efficiency.
SHORT_DRIFT = LearnerCalibration(
    loss_floor=1.5,
    loss_scale=4.0,
    loss_exponent=0.6,
    work_scale_steps=6.0,
    drift_steps=8.0,
    quant_efficiency={8: 0.97},
)

#: The same drift with a merge overhead (half an inner step): the learner model of the
#: training and evaluation envs' tests.
SHORT_DRIFT_OVERHEAD = LearnerCalibration(
    loss_floor=1.5,
    loss_scale=4.0,
    loss_exponent=0.6,
    work_scale_steps=6.0,
    drift_steps=8.0,
    merge_overhead_steps=0.5,
)
