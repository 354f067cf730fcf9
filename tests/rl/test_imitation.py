"""Tests of :mod:`diloco_gym.rl.imitation`: the behaviour-cloning warm start."""

from __future__ import annotations

import pytest

pytest.importorskip("sb3_contrib")


@pytest.mark.slow
def test_behaviour_cloning_imitates_the_teacher() -> None:
    """Enough cloning makes the policy act as the teacher on most decisions of its own
    training episodes (a fit that cannot pass by chance: merges are rare)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from diloco_gym.rl.env_specs import EnvSpec
    from diloco_gym.rl.imitation import behaviour_clone
    from diloco_gym.rl.wrappers import BudgetFeatures

    spec = EnvSpec("bursty", "bursty", None, 12, 72.0)
    venv = DummyVecEnv([lambda: BudgetFeatures(spec.make())])
    model = MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=64, batch_size=64)
    rec = behaviour_clone(model, [spec], "online-forecast-budget", 8, 80, 0, None, "budget")
    assert rec["train_accuracy"] > 0.9 and rec["merge_recall"] > 0.5
    assert rec["train_accuracy"] > 1 - rec["merge_share"]  # better than "never merge"


@pytest.mark.slow
def test_behaviour_cloning_on_a_rounds_fleet_imitates_each_sites_action() -> None:
    """On a rounds fleet the teacher (``online-forecast+own``: it opens the rounds, each
    site joins at its own quiet moment) gives one action per site; the fitted policy gets
    every site right on most decisions and recalls most of the teacher's sends (which a
    policy that never sends, right on most decisions too, does not)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from diloco_gym.rl.env_specs import FleetEnvSpec
    from diloco_gym.rl.imitation import behaviour_clone

    spec = FleetEnvSpec("docs/examples/fleet-rounds.toml", None)
    venv = DummyVecEnv([spec.make])
    model = MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=64, batch_size=64)
    rec = behaviour_clone(model, [spec], "online-forecast+own", 4, 60, 0)
    assert rec["teacher"] == "online-forecast+own" and rec["samples"] > 500
    assert 0 < rec["merge_share"] < 0.5
    assert rec["train_accuracy"] > 0.8 and rec["merge_recall"] > 0.5
