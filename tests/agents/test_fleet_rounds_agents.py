"""Fleet agents on a rounds fleet (agents/fleet_rounds.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401
from diloco_gym.agents.fleet import fleet_agent
from diloco_gym.agents.fleet_rounds import RoundsView, rounds_agent, split_rule
from diloco_gym.agents.registry import make_agents
from diloco_gym.eval.rollout import run_episode


class Always:
    name = "always"

    def act(self, obs):
        return np.array([1])


def env_of():
    return gym.make("DiLoCoFleet-v1", timing="rounds", grace_s=9.0, h_min_steps=256).unwrapped


def test_split_rule():
    assert split_rule("online-forecast+own") == ("online-forecast", "own-forecast")
    assert split_rule("pressure-gate") == ("pressure-gate", "together")
    with pytest.raises(ValueError, match="site rule must be one of"):
        RoundsView(Always(), "alone")


def test_together_sends_every_site_and_own_opens_with_the_quietest():
    env = env_of()
    obs, _ = env.reset(seed=0)
    together = RoundsView(Always())
    own = RoundsView(Always(), "own-forecast")
    from diloco_gym.eval.rollout import attach_agent

    attach_agent(env, together, 0)
    attach_agent(env, own, 0)
    assert together.act(obs).tolist() == [1, 1, 1, 1]
    a = own.act(obs)
    quiet, margin = own._quiet(obs)
    assert a.any()
    if quiet.any():
        assert a.tolist() == quiet.astype(int).tolist()
    else:
        assert a.tolist() == np.eye(4, dtype=int)[int(np.argmin(margin))].tolist()
    assert own.name == "always+own" and together.name == "always"


def test_a_rounds_agent_needs_a_rounds_fleet():
    env = gym.make("DiLoCoFleet-v1").unwrapped
    with pytest.raises(ValueError, match="needs a fleet with timing = 'rounds'"):
        run_episode(env, RoundsView(fleet_agent(make_agents(["pressure-gate"])[0])), 0)


def test_own_forecast_sites_wait_for_their_quiet_moments():
    env = env_of()
    agent = rounds_agent(fleet_agent(make_agents(["pressure-gate"])[0]), "own-forecast")
    res = run_episode(env, agent, 5)
    together = run_episode(env, rounds_agent(fleet_agent(make_agents(["pressure-gate"])[0])), 5)
    opens = res["round_openings"]
    late = sum(
        1 for name, sends in res["site_sync_decisions"].items() for d in sends if d not in opens
    )
    assert late > 0  # some sites joined after the opening
    assert all(x == [0, 1, 2, 3] for x in res["round_sites"])  # the quorum is every site
    assert all(
        set(sends) <= set(together["round_openings"])
        for sends in together["site_sync_decisions"].values()
    )


class _PerSite:
    """An agent that chooses each site's contribution itself (as a model trained on a
    rounds fleet does)."""

    name = "per-site"
    per_site = True
    deployable = True


def test_a_per_site_agent_runs_as_it_is_and_takes_no_site_rule():
    from diloco_gym.agents.fleet_rounds import check_per_site, rounds_agent

    agent = _PerSite()
    assert rounds_agent(agent) is agent  # not wrapped in a view that would open rounds
    with pytest.raises(ValueError, match="per-site chooses each site's contribution itself"):
        rounds_agent(agent, "own-forecast")
    check_per_site([agent], rounds=True)
    with pytest.raises(ValueError, match=r"\['per-site'\] were trained on a fleet with timing"):
        check_per_site([agent], rounds=False)
    check_per_site([object()], rounds=False)  # an agent without the flag is not one
