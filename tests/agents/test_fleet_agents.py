"""The single-host agents on a fleet (agents/fleet.py): the aggregations of the sites'
pressure blocks on hand-made observations, the fragment scaling of the learner block,
:class:`FleetView` / :class:`FleetOracleView` and their refusals, :func:`fleet_agent`'s
dispatch, and the wrapped heuristics' determinism and actions on ``DiLoCoFleet-v0``."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.agents.fleet import (
    AGGREGATIONS,
    FLEET_AGGREGATION,
    FleetOracleView,
    FleetView,
    aggregate_obs,
    fleet_agent,
)
from diloco_gym.agents.heuristics import (
    FixedInterval,
    OfflineCalibratedOracle,
    OnlineForecastBudget,
    OnlineForecastWA,
    PressureGate,
)
from diloco_gym.agents.registry import HEURISTICS, make_agent
from diloco_gym.envs.fleet import DiLoCoFleetEnv, fleet_obs_features
from diloco_gym.envs.observation import (
    EXO_SLICE,
    LEARNER_SLICE,
    OBS_DIM,
    OBS_INDEX,
    squash_rate,
    unsquash_rate,
)
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.rollout import attach_agent, run_episode
from diloco_gym.sim.fleet import FleetParams, SiteConfig


def _obs(sites_exo, prefix=None):
    o = np.zeros(OBS_DIM + 7 * (len(sites_exo) - 1), dtype=np.float32)
    if prefix is not None:
        o[:OBS_DIM] = prefix
    o[OBS_INDEX["network"] : OBS_INDEX["rate_trend"] + 1] = sites_exo[0]
    for k, b in enumerate(sites_exo[1:]):
        o[OBS_DIM + 7 * k : OBS_DIM + 7 * (k + 1)] = b
    return o


def test_aggregations():
    norm = 8.0
    r = lambda x: squash_rate(x, norm)  # noqa: E731
    a = [0.2, 0.5, 0.1, r(4.0), r(5.0), r(2.0), 0.1]
    b = [0.7, 0.1, 0.3, r(8.0), r(6.0), r(6.0), 0.0]
    o = _obs([a, b])
    mx = aggregate_obs(o, 2, "max", norm)
    assert mx[OBS_INDEX["network"]] == pytest.approx(0.7)
    assert mx[OBS_INDEX["checkpoint"]] == pytest.approx(0.3)
    wt = aggregate_obs(o, 2, "weighted", norm)
    # weights: baselines 2 and 6 -> 0.25, 0.75
    assert wt[OBS_INDEX["network"]] == pytest.approx(0.25 * 0.2 + 0.75 * 0.7, rel=1e-5)
    assert unsquash_rate(wt[OBS_INDEX["rate_now"]], norm) == pytest.approx(7.0, rel=1e-4)
    sm = aggregate_obs(o, 2, "sum", norm)
    assert unsquash_rate(sm[OBS_INDEX["rate_forecast"]], norm) == pytest.approx(11.0, rel=1e-4)
    assert sm[OBS_INDEX["rate_trend"]] == pytest.approx((11.0 - 8.0) / 8.0, rel=1e-5)
    assert sm.shape == (OBS_DIM,)
    # one site: the observation itself
    assert np.array_equal(aggregate_obs(o[:OBS_DIM], 1, "sum", norm), o[:OBS_DIM])


def test_fleet_view_one_site_acts_as_the_agent():
    env = DiLoCoFleetEnv(fleet=FleetParams(sites=(SiteConfig(name="b"),), merge_seconds=8.0))
    a = run_episode(env, fleet_agent(OnlineForecastWA()), 4)
    from diloco_gym.envs.env import DiLoCoSyncEnv

    b = run_episode(DiLoCoSyncEnv(), OnlineForecastWA(), 4)
    assert a["merge_decisions"] == b["merge_decisions"]


def test_gate_is_the_busiest_site():
    gate = FleetView(PressureGate(0.6))
    env = DiLoCoFleetEnv()
    env.reset(seed=0)
    from diloco_gym.eval.rollout import attach_agent

    attach_agent(env, gate, 0)
    quiet = [0.1] * 3 + [0.3] * 4
    busy = [0.9] + [0.1] * 2 + [0.3] * 4
    assert gate.act(_obs([quiet, quiet, quiet, quiet])[None])[0] == 1
    assert gate.act(_obs([quiet, quiet, busy, quiet])[None])[0] == 0


def test_oracle_view_is_non_deployable_and_plans_on_summed_costs():
    v = fleet_agent(OfflineCalibratedOracle())
    assert isinstance(v, FleetOracleView) and not v.deployable
    env = DiLoCoFleetEnv()
    res = run_episode(env, v, 5)
    from diloco_gym.sim.schedules import optimal_schedule

    p = env.params
    best, _ = optimal_schedule(env.oracle_costs(), p.h_min, p.h_max, None)
    assert res["merge_decisions"] == list(best)


def test_deployable_view_refuses_an_oracle():
    with pytest.raises(ValueError, match="non-deployable"):
        FleetView(OfflineCalibratedOracle())


class _Recorder(Agent):
    """Defers always; keeps the single-host observations it is given."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []
        self.attached: list[AgentContext] = []

    def attach(self, context: AgentContext) -> None:
        self.attached.append(context)

    def act(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(np.array(obs))
        return np.zeros(len(obs), dtype=np.int64)


def _fleet_context(n_sites: int, fragments: int = 1, norm: float = 8.0) -> AgentContext:
    table = fleet_obs_features([f"s{s}" for s in range(n_sites)], fragments)
    names = tuple(f[0] for f in table)
    return AgentContext(params=EnvParams(rate_norm_rps=norm), regime="bursty", features=names)


def test_every_aggregation_passes_the_non_pressure_features_through():
    rng = np.random.default_rng(0)
    o = rng.uniform(0.0, 0.9, OBS_DIM + 7 * 2).astype(np.float32)
    before = o.copy()
    for how in AGGREGATIONS:
        out = aggregate_obs(o, 3, how, 8.0)
        assert out.shape == (OBS_DIM,) and out.dtype == np.float32
        keep = np.r_[0 : EXO_SLICE.start, EXO_SLICE.stop : OBS_DIM]
        assert np.array_equal(out[keep], o[keep]), how
    assert np.array_equal(o, before)  # the input is not modified


def test_max_is_the_per_feature_maximum_over_sites():
    a = [0.2, 0.5, 0.1, 0.3, 0.4, 0.2, -0.3]
    b = [0.7, 0.1, 0.3, 0.1, 0.6, 0.1, 0.2]
    c = [0.1, 0.2, 0.9, 0.5, 0.0, 0.0, -0.9]
    out = aggregate_obs(_obs([a, b, c]), 3, "max", 8.0)
    assert out[EXO_SLICE] == pytest.approx(np.max([a, b, c], axis=0))


def test_weighted_falls_back_to_equal_weights_without_traffic():
    a = [0.2, 0.4, 0.0, 0.0, 0.0, 0.0, 0.5]
    b = [0.6, 0.0, 0.8, 0.0, 0.0, 0.0, -0.1]
    out = aggregate_obs(_obs([a, b]), 2, "weighted", 8.0)
    assert out[OBS_INDEX["network"]] == pytest.approx(0.4)
    assert out[OBS_INDEX["serving"]] == pytest.approx(0.2)
    assert out[OBS_INDEX["checkpoint"]] == pytest.approx(0.4)
    assert out[OBS_INDEX["rate_trend"]] == pytest.approx(0.2)
    assert out[OBS_INDEX["rate_now"]] == 0.0


def test_sum_clips_the_trend_and_keeps_the_pressure_maximum():
    norm = 2.0
    r = lambda x: squash_rate(x, norm)  # noqa: E731
    a = [0.2, 0.1, 0.3, r(1.0), r(9.0), r(1.0), 0.9]
    b = [0.1, 0.8, 0.0, r(2.0), r(6.0), r(1.0), 0.9]
    out = aggregate_obs(_obs([a, b]), 2, "sum", norm)
    assert unsquash_rate(out[OBS_INDEX["rate_now"]], norm) == pytest.approx(3.0, rel=1e-4)
    assert unsquash_rate(out[OBS_INDEX["rate_baseline"]], norm) == pytest.approx(2.0, rel=1e-4)
    assert out[OBS_INDEX["rate_trend"]] == 1.0  # (15 - 2) / 2, clipped
    assert out[OBS_INDEX["serving"]] == pytest.approx(0.8)
    assert out[OBS_INDEX["network"]] == pytest.approx(0.2)


def test_a_batch_is_aggregated_row_by_row():
    rng = np.random.default_rng(1)
    batch = rng.uniform(0.0, 0.9, (5, OBS_DIM + 7 * 3)).astype(np.float32)
    for how in AGGREGATIONS:
        out = aggregate_obs(batch, 4, how, 8.0)
        assert out.shape == (5, OBS_DIM)
        rows = np.stack([aggregate_obs(row, 4, how, 8.0) for row in batch])
        assert np.allclose(out, rows, atol=1e-6), how


def test_fragments_scale_the_learner_block_clipped_at_one():
    o = np.zeros(OBS_DIM, dtype=np.float32)
    o[LEARNER_SLICE] = [0.1, 0.2, 0.3, 0.4, 0.6]
    o[OBS_INDEX["gap"]] = 0.25
    out = aggregate_obs(o, 1, "max", 8.0, fragments=2)
    assert out[LEARNER_SLICE] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert out[OBS_INDEX["gap"]] == pytest.approx(0.25)  # the gap is the fleet's, unscaled
    assert np.array_equal(aggregate_obs(o, 1, "max", 8.0, fragments=1), o)


def test_an_unknown_aggregation_is_refused():
    with pytest.raises(
        ValueError, match=r"aggregation must be one of \('max', 'weighted', 'sum'\)"
    ):
        aggregate_obs(np.zeros(OBS_DIM), 1, "mean", 8.0)
    with pytest.raises(ValueError, match="got 'median'"):
        FleetView(PressureGate(), how="median")


def test_each_agent_gets_its_documented_aggregation():
    for name, how in FLEET_AGGREGATION.items():
        assert FleetView(make_agent(name)).how == how
    assert FleetView(FixedInterval()).how == "max"
    assert FleetView(PressureGate(), how="sum").how == "sum"
    view = FleetView(OnlineForecastBudget())
    assert view.name == "online-forecast-budget" and view.budget_aware and view.deployable


def test_a_view_needs_the_fleets_feature_table_before_it_acts():
    view = FleetView(PressureGate())
    with pytest.raises(RuntimeError, match="pressure-gate: attach it to a fleet env first"):
        view.act(np.zeros((1, OBS_DIM), dtype=np.float32))
    with pytest.raises(ValueError, match="needs the fleet's observation table"):
        view.attach(AgentContext(params=EnvParams(), regime="bursty"))


def test_attach_counts_sites_and_fragments_and_scales_what_the_agent_sees():
    inner = _Recorder()
    view = FleetView(inner)
    ctx = _fleet_context(n_sites=3, fragments=2)
    view.attach(ctx)
    assert inner.attached == [ctx]  # the wrapped agent gets the context too
    o = np.zeros(OBS_DIM + 7 * 2 + 2, dtype=np.float32)
    o[LEARNER_SLICE] = 0.3
    o[OBS_DIM + 7 : OBS_DIM + 14] = 0.5  # the third site's block
    action, _ = view.predict(o)
    assert action.shape == () and action.dtype == np.int64 and int(action) == 0
    seen = inner.seen[0]
    assert seen.shape == (1, OBS_DIM)
    assert seen[0, LEARNER_SLICE] == pytest.approx([0.6] * 5)
    assert seen[0, OBS_INDEX["network"]] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="expected fleet observations with 33 features"):
        view.predict(np.zeros(OBS_DIM + 14, dtype=np.float32))


def test_the_oracle_view_refuses_a_deployable_agent():
    with pytest.raises(ValueError, match="pressure-gate is deployable: use FleetView"):
        FleetOracleView(PressureGate())


def test_fleet_agent_wraps_heuristics_and_leaves_other_agents_alone():
    gate = PressureGate()
    view = fleet_agent(gate)
    assert type(view) is FleetView and view.agent is gate
    assert type(fleet_agent(OfflineCalibratedOracle())) is FleetOracleView
    other = _Recorder()  # not a heuristic (e.g. a learned agent): it reads the fleet obs
    assert fleet_agent(other) is other


@pytest.mark.parametrize("name", HEURISTICS)
def test_wrapped_heuristics_are_deterministic_and_act_in_the_action_space(name):
    env = DiLoCoFleetEnv()
    agent = fleet_agent(make_agent(name))
    obs, _ = env.reset(seed=3)
    attach_agent(env, agent, 3)
    actions = []
    done = False
    while not done:
        action, _ = agent.predict(obs)
        assert env.action_space.contains(int(action))
        actions.append(int(action))
        obs, _, term, trunc, _ = env.step(int(action))
        done = term or trunc
    again = run_episode(DiLoCoFleetEnv(), fleet_agent(make_agent(name)), 3)
    first = run_episode(env, agent, 3)
    assert first["merge_decisions"] == again["merge_decisions"]
    assert set(actions) <= {0, 1}
