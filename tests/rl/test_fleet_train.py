"""The fleet agent trainer (diloco_gym/rl/fleet.py) and loading a fleet model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")

from diloco_gym.agents.fleet import fleet_agent  # noqa: E402
from diloco_gym.agents.registry import make_agents  # noqa: E402
from diloco_gym.envs.fleet import DiLoCoFleetEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402
from diloco_gym.rl.fleet import train_fleet_agent  # noqa: E402
from diloco_gym.sim.fleet import FleetParams, SiteConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_tiny_fleet_agent_and_run_it(tmp_path):
    fleet = tmp_path / "f.toml"
    fleet.write_text('[fleet]\nfragments = 2\n[[site]]\nname = "a"\n[[site]]\nname = "b"\n')
    path = train_fleet_agent(
        str(fleet), [24, 32], timesteps=0, seed=0, out=tmp_path / "m", bc_episodes=1, bc_epochs=1
    )
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["observation"]["transform"] == "budget"
    assert meta["observation"]["base_size"] == 17 + 7 + 2
    assert meta["behaviour_cloning"]["samples"] > 0
    (agent,) = make_agents([str(path)])
    assert agent.budget_aware and fleet_agent(agent) is agent
    env = DiLoCoFleetEnv(fleet=str(fleet), merge_budget=32)
    res = run_episode(env, agent, 3)
    assert res["merges"] == 32  # the budget is kept exactly (the mask)


def test_shipped_fleet_agent_loads_and_keeps_its_budget():
    model = ROOT / "agents" / "reference" / "fleet-budget" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped fleet agent in this checkout")
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(fleet=str(ROOT / "docs" / "examples" / "fleet.toml"), merge_budget=64)
    res = run_episode(env, agent, 0)
    assert res["merges"] == 64


def test_fleet_model_refused_on_a_narrower_env():
    model = ROOT / "agents" / "reference" / "fleet-budget" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped fleet agent in this checkout")
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(
        fleet=FleetParams(sites=(SiteConfig(name="x"),), merge_seconds=8.0), merge_budget=8
    )
    with pytest.raises(ValueError):
        run_episode(env, agent, 0)


def test_shipped_v1_fleet_agent_loads_on_model_v1_and_keeps_its_budget():
    model = ROOT / "agents" / "reference" / "fleet-budget-v1" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped v1 fleet agent in this checkout")
    meta = json.loads((model.parent / "meta.json").read_text())
    assert meta["fleet"] == "docs/examples/fleet-v1.toml"
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(fleet=str(ROOT / "docs" / "examples" / "fleet-v1.toml"), merge_budget=48)
    assert env.fleet.model_version == 1
    res = run_episode(env, agent, 0)
    assert res["merges"] == 48 and res["model_version"] == 1
