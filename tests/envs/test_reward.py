"""The reward's sync-excess term (diloco_gym/envs/reward.py): the nominal rate of the
reward scale against a hand computation for each kind of generator, the scale's formula,
the mode checks, and the exact credit's marginals (in launch order, paid once, summing to
the exact replay's excess)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import (
    REWARD_MODES,
    REWARD_NOMINAL_REQUESTS,
    ExactCredit,
    check_reward_mode,
    nominal_rate_rps,
    require_additive,
    reward_per_request,
)
from diloco_gym.envs.schedule import replay_schedule
from diloco_gym.sim.regimes import REGIMES, ReplayRegime


def _synthetic(**kw):
    return dataclasses.replace(REGIMES["bursty"], **kw)


def test_the_scale_counts_violations_per_1000_nominal_requests():
    assert REWARD_NOMINAL_REQUESTS == 1000.0
    assert reward_per_request(8.0, 600.0) == 1000.0 / 4800.0
    assert reward_per_request(2, 250) == 2.0  # ints are fine: 1000 / 500
    assert reward_per_request(0.5, 100.0) == 20.0


@pytest.mark.parametrize(
    ("kw", "rate"),
    [
        # quiet + (busy - quiet) * (burst + ramp / 2) / period = 2 + 8 * 25 / 100
        ({"quiet_rate_rps": 2.0, "busy_rate_rps": 10.0, "burst_s": 20.0, "ramp_s": 10.0,
          "burst_period_s": 100.0}, 4.0),
        # the duty cycle is capped at 1: the busy rate
        ({"quiet_rate_rps": 2.0, "busy_rate_rps": 10.0, "burst_s": 90.0, "ramp_s": 40.0,
          "burst_period_s": 100.0}, 10.0),
        # no bursts, or bursts no busier than the quiet rate: the quiet rate
        ({"quiet_rate_rps": 3.0, "busy_rate_rps": 10.0, "burst_period_s": 0.0}, 3.0),
        ({"quiet_rate_rps": 3.0, "busy_rate_rps": 3.0, "burst_period_s": 50.0}, 3.0),
    ],
)  # fmt: skip
def test_a_synthetic_regimes_nominal_rate_is_its_long_run_mean(kw, rate):
    assert nominal_rate_rps(_synthetic(**kw)) == pytest.approx(rate, rel=1e-12)


def test_the_shipped_bursty_regime_has_8_requests_per_second():
    assert nominal_rate_rps(REGIMES["bursty"]) == pytest.approx(8.0, rel=1e-12)


def test_params_then_a_declared_rate_win_over_the_regimes_own():
    gen = _synthetic(quiet_rate_rps=2.0, busy_rate_rps=2.0)
    assert nominal_rate_rps(gen, EnvParams(reward_rate_rps=5.0)) == 5.0
    assert nominal_rate_rps(gen, EnvParams()) == 2.0  # reward_rate_rps None: the regime's
    declared = types.SimpleNamespace(name="x", nominal_rate_rps="7.5")
    assert nominal_rate_rps(declared) == 7.5
    assert nominal_rate_rps(declared, EnvParams(reward_rate_rps=1.0)) == 1.0


def test_a_replays_nominal_rate_is_its_target_else_its_source_traces_mean():
    src = REGIMES["sync-heavy"](np.random.default_rng(0))
    assert nominal_rate_rps(ReplayRegime(src, duration_s=300.0)) == src.mean_rate_rps
    assert nominal_rate_rps(ReplayRegime(src, 300.0, target_rate_rps=3.0)) == 3.0


def test_a_generator_without_a_rate_is_refused_by_name():
    unknown = types.SimpleNamespace(name="mystery")
    with pytest.raises(ValueError) as err:
        nominal_rate_rps(unknown)
    assert str(err.value) == (
        "cannot fix a reward scale for the generator 'mystery': give it a "
        "nominal_rate_rps attribute (requests/s) or pass reward_rate_rps"
    )
    with pytest.raises(ValueError, match="generator 'function'"):
        nominal_rate_rps(lambda rng: None)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_rate_that_is_not_positive_and_finite_is_refused(bad):
    with pytest.raises(ValueError, match="nominal request rate of the reward scale must be > 0"):
        nominal_rate_rps(types.SimpleNamespace(name="x", nominal_rate_rps=bad))


def test_reward_modes():
    assert REWARD_MODES == ("additive", "exact")
    for mode in REWARD_MODES:
        assert check_reward_mode(mode) == mode
    for bad in ("Exact", "", None, 1):
        with pytest.raises(ValueError) as err:
            check_reward_mode(bad)
        assert str(err.value) == (
            f"EnvParams.reward_mode must be one of 'additive', 'exact', got {bad!r}"
        )


def test_require_additive_names_the_env_that_refuses_exact():
    assert require_additive(EnvParams(), "DiLoCoSyncVectorEnv") is None
    with pytest.raises(ValueError, match=r"^DiLoCoFleetEnv supports reward_mode='additive' only"):
        require_additive(EnvParams(reward_mode="exact"), "DiLoCoFleetEnv")


@pytest.fixture(scope="module")
def env():
    e = DiLoCoSyncEnv("bursty")
    e.reset(seed=0)
    return e


def _credit(env) -> ExactCredit:
    return ExactCredit(env.episode, env.params, env.sidecar)


def _exact_excess(env, merges) -> int:
    res = replay_schedule(env.episode, merges, env.params, env.sidecar)
    return int((res.violated & ~env.episode.baseline.violated).sum())


@pytest.mark.parametrize("merges", [[100], [40, 60, 100, 300], [20, 36, 52, 68, 84]])
def test_the_marginals_sum_to_the_exact_replays_excess(env, merges):
    credit = _credit(env)
    marginals = [credit.add(d) for d in merges]
    assert credit.marginals == marginals
    assert sum(marginals) == pytest.approx(_exact_excess(env, merges), abs=1e-9)
    assert credit.ready_bins == sorted(credit.ready_bins)


def test_one_isolated_merge_is_credited_its_isolated_cost(env):
    credit = _credit(env)
    assert credit.add(300) == env.episode.merge_cost_at(300) > 0


def test_credits_are_paid_once_after_they_are_due(env):
    credit = _credit(env)
    cost = credit.add(100)
    (ready,) = credit.ready_bins
    interval = env.params.decision_interval
    first_paid = ready // interval + 1  # the first decision whose start bin is after ready
    assert credit.due(first_paid - 1) == 0.0
    assert credit.due(first_paid) == cost
    assert credit.due(first_paid + 10) == 0.0  # paid once
    assert credit.credited == cost
    credit.add(400)
    assert credit.due(401, final=True) == credit.marginals[1]
    assert credit.credited == sum(credit.marginals)


def test_merges_must_be_added_in_launch_order(env):
    credit = _credit(env)
    credit.add(100)
    with pytest.raises(ValueError, match="merges must be added in launch order, got 100"):
        credit.add(100)
    with pytest.raises(ValueError, match="got 50 after"):
        credit.add(50)
