"""Tests of :mod:`diloco_gym.rl.wrappers`: the training wrapper and the loaded agent see the
same budget features."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")


from diloco_gym.agents.learned import LearnedAgent, load_learned_agent  # noqa: E402
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402
from diloco_gym.rl.wrappers import BudgetFeatures  # noqa: E402


def test_budget_features_need_a_budget() -> None:
    with pytest.raises(ValueError, match="merge budget"):
        BudgetFeatures(DiLoCoSyncEnv("bursty"))


def test_the_loaded_agent_sees_what_the_training_wrapper_saw(tiny_run: Path) -> None:
    """The agent rebuilds the wrapper's features from meta.json: same inputs, same actions."""
    agent = load_learned_agent(tiny_run / "model.zip")
    assert agent.obs_transform == "budget" and agent.budget_aware
    env = BudgetFeatures(DiLoCoSyncEnv("bursty", merge_budget=10))
    res = run_episode(DiLoCoSyncEnv("bursty", merge_budget=10), agent, seed=7)
    obs, _ = env.reset(seed=7)
    actions, done = [], False
    while not done:
        a, _ = agent.model.predict(obs, deterministic=True, action_masks=env.action_masks())
        actions.append(int(a))
        obs, _, _, done, info = env.step(int(a))
    assert list(info["episode_summary"]["merge_decisions"]) == list(res["merge_decisions"])
    assert res["merges"] == 10


def test_a_budget_conditioned_agent_refuses_to_run_without_a_budget(tiny_run: Path) -> None:
    agent = load_learned_agent(tiny_run / "model.zip")
    with pytest.raises(ValueError, match="budget-conditioned"):
        run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)


def test_a_model_and_a_wrong_transform_are_refused(tiny_run: Path) -> None:
    agent = load_learned_agent(tiny_run / "model.zip")
    with pytest.raises(ValueError, match=r"shape \(20,\)"):
        LearnedAgent(agent.model, obs_transform=None)


@pytest.mark.slow
def test_frontier_runs_a_budget_conditioned_agent_on_the_grid_only(tiny_run, tmp_path) -> None:
    """``--agent`` adds to both lists; a budget-conditioned model runs on the grid only,
    marked budget-aware, with exactly the budget's merges."""
    import pandas as pd

    from diloco_gym.agents.registry import is_budget_aware_spec

    model = str(tiny_run / "model.zip")
    assert is_budget_aware_spec(model) and is_budget_aware_spec(str(tiny_run))
    assert is_budget_aware_spec("fixed-budget") and not is_budget_aware_spec("wa-diloco")
    out = tmp_path / "fr"
    argv = ["frontier", "--regimes", "bursty", "--budgets", "60", "96", "--seeds", "2"]
    argv += ["--draws", "20", "--budget-agents", "fixed-budget", "--free-agents", "fixed-512"]
    assert main([*argv, "--agent", model, "--out", str(out), "--no-progress"]) == 0
    rows = pd.read_csv(out / "frontier.csv")
    mine = rows[rows["agent"] == "maskable-ppo:model"]
    assert set(mine["mode"]) == {"budget"} and set(mine["held"]) == {"budget-aware"}
    assert (mine["merges"] == mine["budget"]).all()
    assert sorted(set(mine["budget"])) == [10, 16]
