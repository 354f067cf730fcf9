"""The link-aware fleet agent (agents/fleet_links.py): registered as fleet-only and
deployable, its launches only on links at their nominal rate or late in the corridor, its
actions a function of what it is handed, the same sealed and in process, and refused on a
fleet of fixed links."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fleet_agent_helpers import recording, sealed_rows_match_in_process

import diloco_gym
from diloco_gym.agents.base import AgentContext
from diloco_gym.agents.fleet import fleet_agent
from diloco_gym.agents.fleet_links import LinkAwareForecast, link_columns
from diloco_gym.agents.registry import FLEET_ONLY, HEURISTICS, make_agent
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.observation import OBS_INDEX
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval import bench
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim import schedules
from diloco_gym.sim.fleet_toml import load_fleet_toml

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-links.toml"


def _env(example: Path = EXAMPLE) -> DiLoCoFleetEnv:
    fleet, env_kw = load_fleet_toml(example)
    return DiLoCoFleetEnv(fleet=fleet, params=EnvParams(**env_kw))


_Recorder = recording(LinkAwareForecast)


def test_registered_as_fleet_only_and_deployable():
    agent = make_agent("link-aware-forecast")
    assert isinstance(agent, LinkAwareForecast) and agent.deployable
    assert "link-aware-forecast" in FLEET_ONLY and "link-aware-forecast" not in HEURISTICS
    assert fleet_agent(agent) is agent  # reads the fleet observation itself: no view
    assert bench.entrant_kinds("link-aware-forecast") == set()  # the bench fleet's links are fixed


def test_it_launches_on_nominal_links_or_late_and_is_deterministic():
    env = _env()
    rec = _Recorder()
    res = run_episode(env, rec, 4)
    p = env.params
    assert schedules.is_feasible(res["merge_decisions"], env.episode.n_decisions, p.h_min, p.h_max)
    cols = link_columns(tuple(f[0] for f in env.obs_features))
    launched = [(obs[0], mask) for obs, mask, a in rec.seen if a == 1]
    assert len(launched) >= 5
    gap = OBS_INDEX["gap"]
    for obs, _ in launched:
        late = round(float(obs[gap]) * p.h_max) >= p.h_max - rec.window
        assert late or np.all(obs[cols] == 1.0)
    assert res == run_episode(_env(), make_agent("link-aware-forecast"), 4)


def test_its_actions_are_a_function_of_what_it_is_handed():
    env = _env()
    names = tuple(f[0] for f in env.obs_features)
    rec = _Recorder()
    run_episode(env, rec, 1)
    fresh = LinkAwareForecast()
    ctx = AgentContext(params=env.params, regime="fleet", features=names)
    fresh.attach(ctx)
    for obs, mask, action in rec.seen:
        ctx._set_mask(mask)
        assert int(fresh.act(obs)[0]) == action


def test_slow_links_hold_back_a_launch_the_forecaster_takes():
    """Where the online forecaster launches early in the corridor, the agent launches with
    every link nominal and defers with one link at half its rate."""
    env = _env()
    names = tuple(f[0] for f in env.obs_features)
    rec = _Recorder()
    run_episode(env, rec, 2)
    cols = link_columns(names)
    gap = OBS_INDEX["gap"]
    h_max = env.params.h_max
    early = [
        (o, m)
        for o, m, _ in rec.seen
        if m[1] and round(float(o[0, gap]) * h_max) < h_max - rec.window
    ]
    agent = LinkAwareForecast()
    ctx = AgentContext(params=env.params, regime="fleet", features=names)
    agent.attach(ctx)
    quiet = []
    for o, m in early:
        ctx._set_mask(m)
        nominal = o.copy()
        nominal[0, cols] = 1.0
        if agent.act(nominal)[0] == 1:
            quiet.append(nominal)
    assert quiet
    for o in quiet:
        slow = o.copy()
        slow[0, cols[0]] = 0.5
        assert agent.act(slow)[0] == 0


def test_refused_with_fixed_links():
    for env in (
        _env(EXAMPLE.with_name("fleet-v1.toml")),
        diloco_gym.DiLoCoSyncEnv(regime="bursty"),
    ):
        with pytest.raises(ValueError) as exc:
            run_episode(env, make_agent("link-aware-forecast"), 0)
        msg = str(exc.value)
        assert "\n" not in msg and "link_levels" in msg and "link_rate" in msg


@pytest.mark.slow
def test_sealed_and_in_process_give_the_same_rows():
    """Sealed in its worker process (the report's default) the agent decides as in process.
    Sealed agents cannot start from a git worktree (Landlock): run from a plain checkout."""
    inproc = sealed_rows_match_in_process(str(EXAMPLE), "link-aware-forecast")
    assert inproc["fleet"]["link_levels"] == [1.0, 0.75, 0.5]


def test_the_budget_aware_link_rule_holds_the_budget_and_defers_on_slow_links():
    """``link-aware-forecast-budget``: budget-aware (run at every budget of the frontier,
    refused free), exactly the budget's syncs, and none of its own launches early in the
    corridor on a slow link."""
    from diloco_gym.agents.fleet_links import LinkAwareForecastBudget
    from diloco_gym.agents.registry import is_budget_aware_spec

    assert is_budget_aware_spec("link-aware-forecast-budget")
    assert not is_budget_aware_spec("link-aware-forecast")
    fleet, env_kw = load_fleet_toml(EXAMPLE)
    env = DiLoCoFleetEnv(fleet=fleet, params=EnvParams(**{**env_kw, "merge_budget": 50}))
    rec = recording(LinkAwareForecastBudget)()
    res = run_episode(env, rec, 3)
    assert res["merges"] == 50 and rec.budget_aware
    cols = link_columns(tuple(f[0] for f in env.obs_features))
    h_max = env.params.h_max
    asked = [o[0] for o, _, a in rec.seen if a == 1]
    assert asked
    for o in asked:
        late = round(float(o[OBS_INDEX["gap"]]) * h_max) >= h_max - rec.window
        assert late or np.all(o[cols] == 1.0)
