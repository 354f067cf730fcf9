"""envs.core: the names that lived there before 0.6.0 are re-exported from their new homes."""

from __future__ import annotations

import importlib

import pytest

from diloco_gym.envs import core

HOMES = {
    "params": ["EnvParams"],
    "observation": [
        "OBS_FEATURES", "OBS_DIM", "OBS_INDEX", "OBS_LOW", "OBS_HIGH", "EXO_SLICE",
        "LEARNER_SLICE", "squash_rate", "unsquash_rate", "learner_features",
        "learner_features_k", "learner_table",
    ],
    "episode": [
        "Episode", "EpisodeCore", "decision_costs", "min_episode_seconds", "episode_length",
        "episode_core", "episode_core_batch", "build_episode", "episode_from_seed",
    ],
    "kernel": [
        "episode_draws", "episode_draws_batch", "synthetic_draws", "is_synthetic",
        "BudgetTables",
    ],
    "schedule": ["sync_mask", "replay_schedule", "schedule_summary"],
    "env": ["MAX_SEED", "check_seed", "check_reset_options", "check_env_sizes"],
    "reward": ["REWARD_NOMINAL_REQUESTS", "nominal_rate_rps", "reward_per_request"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(HOMES))
def test_old_names_are_the_objects_of_their_new_home(module):
    home = importlib.import_module(f"diloco_gym.envs.{module}")
    for name in HOMES[module]:
        assert getattr(core, name) is getattr(home, name), name


def test_options_is_the_kernels_options_at():
    from diloco_gym.envs import kernel

    assert core.options is kernel.options_at


def test_all_lists_exactly_the_re_exports():
    listed = {n for names in HOMES.values() for n in names} | {"options"}
    assert set(core.__all__) == listed
    assert len(core.__all__) == len(listed)
