"""The compiled step's rules against the kernel's array forms, value for value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diloco_gym.envs import kernel
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_step
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import step_layout as layout
from diloco_gym.sim.sidecar import SidecarParams

N = 517


def _gain_numpy(gap, tokens, thr, lp, power=np.power):
    """The learner model's merge gain as NumPy over arrays (the form the envs used before
    the rule was compiled), with ``power`` as the loss law's power function."""
    if lp.merge_overhead_s:
        eff = 1.0 / (1.0 + gap / lp.drift_s + lp.merge_overhead_s / gap)
    else:
        eff = 1.0 / (1.0 + gap / lp.drift_s)
    added = eff * gap * np.sum(thr, axis=-1)

    def loss(t):
        return lp.loss_floor + lp.loss_scale * power(1.0 + t / lp.tokens_scale, -lp.loss_exponent)

    return added, loss(tokens) - loss(tokens + added)


def _libm_power(x, e):
    """``x ** e`` elementwise through the C library's ``pow`` (Python's ``math.pow``), which
    the compiled step calls. NumPy's ``np.power`` on arrays may instead take a vectorised
    implementation (AVX-512, NumPy's ``X86_V4`` builds) that differs in the last bit."""
    return np.array([math.pow(v, e) for v in np.ravel(x)]).reshape(np.shape(x))


@pytest.mark.parametrize("overhead", [0.0, 3.5])
def test_gain_equals_the_numpy_learner_model_bit_for_bit(overhead):
    lp = lrn.LearnerParams(merge_overhead_s=overhead)
    _, fp = kernel.step_params(EnvParams(), lp, SidecarParams(), 1)
    rng = np.random.default_rng(3)
    gaps = rng.integers(1, 200, 3000) * EnvParams().decision_seconds
    tokens = rng.random(3000) * 1e9 + lp.initial_tokens
    thr = np.stack([lp.draw_throughputs(rng) for _ in range(3000)])
    added, gain = _gain_numpy(gaps, tokens, thr, lp, _libm_power)
    # NumPy's own array power: equal where it is the C library's, else within a few units in
    # the last place of the losses whose difference the gain is (1e-12 of the largest loss)
    numpy_gain = _gain_numpy(gaps, tokens, thr, lp)[1]
    np.testing.assert_allclose(
        numpy_gain, gain, rtol=0, atol=1e-12 * (lp.loss_floor + lp.loss_scale)
    )
    jit = compiled_step()
    for k in range(0, 3000, 7):
        got = jit.gain_one(gaps[k], tokens[k], float(np.sum(thr[k])), fp)
        assert got == (added[k], gain[k]), k
    np.testing.assert_array_equal(lrn.merge_gain(gaps, tokens, thr, lp), (added, gain))
    one = lrn.merge_gain(float(gaps[5]), float(tokens[5]), thr[5], lp)
    assert one == (added[5], gain[5])


def test_step_params_follow_the_documented_order():
    p, lp, sc = EnvParams(merge_budget=9), lrn.LearnerParams(), SidecarParams()
    ints, floats = kernel.step_params(p, lp, sc, 8)
    assert len(ints) == len(layout.INT_PARAMS) and len(floats) == len(layout.FLOAT_PARAMS)
    named = dict(zip(layout.INT_PARAMS, ints.tolist(), strict=True))
    assert named["h_min"] == p.h_min and named["budget"] == 9 and named["m0_bins"] == 8
    f = dict(zip(layout.FLOAT_PARAMS, floats.tolist(), strict=True))
    assert f["sigma1"] == 1.0 + sc.sync_slowdown and f["slo_s"] == sc.slo_s
    assert f["loss_exponent"] == lp.loss_exponent and f["excess_weight"] == p.excess_weight
