"""The compiled step's rules against the kernel's array forms, value for value."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs import kernel
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_step
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import SidecarParams

N = 517


def _states(rng, n: int, budget: int | None, size: int = 4000):
    last = rng.integers(0, n, size)
    d = np.minimum(last + rng.integers(0, 80, size), n - 1)
    m_left = rng.integers(0, (budget or 0) + 1, size) if budget else np.zeros(size, np.int64)
    return d, last, m_left


@pytest.mark.parametrize("budget", [None, 8, 12, 32])
def test_options_and_forced_end_equal_the_kernel_rules(budget):
    p = EnvParams(merge_budget=budget)
    budgets = kernel.Budgets(p)
    tables = budgets.tables(N) if budget else None
    reach, prefix, nxt = kernel.budget_arrays(budgets, N)
    b = -1 if budget is None else budget
    jit = compiled_step()
    d, last, m_left = _states(np.random.default_rng(budget or 0), N, budget)
    cm, cd = kernel.options_at(d, last, m_left, p, N, tables)
    end = kernel.forced_deferral_end(
        d, last, np.full(d.size, N), m_left, p, budgets if budget else None
    )
    for k in range(d.size):
        args = (int(d[k]), int(last[k]), int(m_left[k]))
        got = jit.options_one(*args, N, p.h_min, p.h_max, b, reach, prefix)
        assert got == (bool(cm[k]), bool(cd[k])), (k, args)
        if not cm[k] or budget is None:  # forced deferrals only
            e = jit.forced_end_one(args[0], args[1], N, args[2], p.h_min, b, nxt)
            assert e == end[k], (k, args)


@pytest.mark.parametrize("overhead", [0.0, 3.5])
def test_gain_equals_the_learner_model_bit_for_bit(overhead):
    lp = lrn.LearnerParams(merge_overhead_s=overhead)
    _, fp = kernel.step_params(EnvParams(), lp, SidecarParams(), 1)
    rng = np.random.default_rng(3)
    gaps = rng.integers(1, 200, 3000) * EnvParams().decision_seconds
    tokens = rng.random(3000) * 1e9 + lp.initial_tokens
    thr = np.stack([lp.draw_throughputs(rng) for _ in range(3000)])
    added, gain = lrn.merge_gain(gaps, tokens, thr, lp)
    jit = compiled_step()
    for k in range(0, 3000, 7):
        got = jit.gain_one(gaps[k], tokens[k], float(np.sum(thr[k])), fp)
        assert got == (added[k], gain[k]), k


def test_step_params_follow_the_documented_order():
    p, lp, sc = EnvParams(merge_budget=9), lrn.LearnerParams(), SidecarParams()
    ints, floats = kernel.step_params(p, lp, sc, 8)
    jit = compiled_step()
    assert len(ints) == len(jit.INT_PARAMS) and len(floats) == len(jit.FLOAT_PARAMS)
    named = dict(zip(jit.INT_PARAMS, ints.tolist(), strict=True))
    assert named["h_min"] == p.h_min and named["budget"] == 9 and named["m0_bins"] == 8
    f = dict(zip(jit.FLOAT_PARAMS, floats.tolist(), strict=True))
    assert f["sigma1"] == 1.0 + sc.sync_slowdown and f["slo_s"] == sc.slo_s
    assert f["loss_exponent"] == lp.loss_exponent and f["excess_weight"] == p.excess_weight
