"""The env ids' versions: the deprecated ``-v0`` and ``-v1`` ids warn and keep their tasks,
``-v1`` differs from v0 only by its reward (``V1_KWARGS``), and ``-v2`` from v1 only by its
learner model (``V2_KWARGS``: the shipped learner calibration's)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym
from diloco_gym import DiLoCoSyncEnv, EnvParams
from diloco_gym.envs.versions import V1_KWARGS, V2_KWARGS


@pytest.mark.parametrize("env_id", ["DiLoCoSync-v0", *diloco_gym.ENV_IDS_V0.values()])
def test_v0_ids_warn_and_keep_the_v0_task_bit_for_bit(env_id, rollout):
    """The deprecated ids warn once made and are DiLoCoSyncEnv with EnvParams' defaults:
    the same rewards and observations as before; v1 differs only by its reward."""
    with pytest.warns(FutureWarning, match="DiLoCoSync-v0 ids are deprecated"):
        old = gym.make(env_id)
    regime = old.unwrapped.regime_name
    assert old.unwrapped.params == EnvParams()
    with pytest.warns(FutureWarning, match="DiLoCoSync-v1 ids are deprecated"):
        v1 = gym.make(env_id[:-1] + "1")
    assert v1.unwrapped.params == EnvParams(**V1_KWARGS)
    assert v1.unwrapped.learner_params == old.unwrapped.learner_params
    if regime != "bursty":
        return
    a = rollout(old.unwrapped, "random", seed=3, policy_seed=1)
    b = rollout(DiLoCoSyncEnv(regime), "random", seed=3, policy_seed=1)
    c = rollout(v1.unwrapped, "random", seed=3, policy_seed=1)
    assert a.rewards == b.rewards and a.actions == b.actions == c.actions
    for x, y, z in zip(a.observations, b.observations, c.observations, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    assert a.rewards != c.rewards


def test_v1_kwargs_are_the_packages_and_train_keeps_envparams_defaults():
    """``train`` does not change a config's reward behind its back: its env defaults are
    ``EnvParams``' (v0's reward); v1's reward is set in a config's ``[env]``."""
    from diloco_gym.rl.config import TrainConfig, parse_config

    assert diloco_gym.V1_KWARGS is V1_KWARGS
    assert TrainConfig().env_params == {}
    cfg = parse_config({"env": dict(V1_KWARGS)}, "v1.toml")
    assert EnvParams(**cfg.env_params) == gym.make("DiLoCoSync-v2").unwrapped.params


@pytest.mark.parametrize("env_id", ["DiLoCoSync-v2", *diloco_gym.ENV_IDS.values()])
def test_v2_is_v1_with_the_shipped_learner_calibrations_learners(env_id, rollout):
    """v2 has v1's parameters and reward; its learners are the shipped calibration's, so
    on the same seed and actions the traffic features, rewards and scores are v1's and only
    the learner-progress features differ. Making v2 does not warn."""
    import warnings

    from diloco_gym.sim.learner_calibration import (
        learner_params,
        load_learner_calibration,
        shipped_path,
    )

    assert V2_KWARGS == {**V1_KWARGS, "learner_calibration": "shipped"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v2 = gym.make(env_id)
    assert env_id in ("DiLoCoSync-v2", diloco_gym.ENV_IDS[v2.unwrapped.regime_name])
    assert v2.unwrapped.params == EnvParams(**V1_KWARGS)
    shipped = learner_params(load_learner_calibration(shipped_path()))
    assert v2.unwrapped.learner_params == shipped != DiLoCoSyncEnv().learner_params
    if v2.unwrapped.regime_name != "bursty":
        return
    with pytest.warns(FutureWarning):
        v1 = gym.make("DiLoCoSync-v1")
    a = rollout(v1.unwrapped, "random", seed=5, policy_seed=2)
    b = rollout(v2.unwrapped, "random", seed=5, policy_seed=2)
    assert a.actions == b.actions and a.rewards == b.rewards
    names = [f[0] for f in diloco_gym.OBS_FEATURES]
    learner_cols = [i for i, f in enumerate(names) if f.startswith("loss_progress")]
    assert learner_cols == [2, 3]
    other = [i for i in range(len(diloco_gym.OBS_FEATURES)) if i not in learner_cols]
    x, y = np.array(a.observations), np.array(b.observations)
    np.testing.assert_array_equal(x[:, other], y[:, other])
    assert not np.array_equal(x[:, learner_cols], y[:, learner_cols])


def test_v2_vector_entry_point_has_the_shipped_learners():
    from diloco_gym.sim.learner_calibration import learner_params, load_learner_calibration

    envs = gym.make_vec("DiLoCoSync-Bursty-v2", num_envs=2, vectorization_mode="vector_entry_point")
    try:
        assert envs.learner_params == learner_params(load_learner_calibration("shipped"))
    finally:
        envs.close()


def test_the_name_shipped_is_the_packaged_file_everywhere(tmp_path, monkeypatch):
    """``"shipped"`` names the packaged learner calibration in the env, a train config and
    the report's ``--learner-calibration``; a file called ``shipped`` is reached as
    ``./shipped``."""
    import json
    from pathlib import Path

    from diloco_gym.commands.options import _learner_calibration_file
    from diloco_gym.rl import learner_config
    from diloco_gym.sim.learner_calibration import resolve_path, shipped_path

    packaged = Path(shipped_path())
    assert packaged.is_file() and packaged.name == "learner_calibration_default.json"
    assert learner_config.learner_calibration_path("shipped") == str(packaged.resolve())
    rec = learner_config.record("shipped")["learner_calibration_file"]
    import hashlib

    # a shipped agent's meta.json rebuilds its env on any installation: the name is kept
    assert rec == {"path": "shipped", "sha256": hashlib.sha256(packaged.read_bytes()).hexdigest()}
    assert learner_config.train_env_kwargs({}, "shipped") == {"learner_calibration": "shipped"}
    other = learner_config.train_env_kwargs({}, str(packaged))["learner_calibration"]
    assert other == str(packaged.resolve())
    assert _learner_calibration_file("shipped") == str(packaged)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shipped").write_text(json.dumps({"not": "a calibration"}))
    assert resolve_path("./shipped") == "./shipped"
    assert learner_config.problem("./shipped") is not None  # the local file, refused
    assert learner_config.problem("shipped") is None


def test_v0_ids_keep_gymnasiums_render_wrappers():
    with pytest.warns(FutureWarning):
        env = gym.make("DiLoCoSync-v0", render_mode="rgb_array_list")
    assert env.unwrapped.render_mode == "rgb_array"
