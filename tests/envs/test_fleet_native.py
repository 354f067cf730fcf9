"""The compiled fleet vector env (envs/fleet_native.py): env ``i`` runs the fleet env's
episodes, observations, rewards and masks of ``reset(seed=s + i)`` and its later
``reset()`` calls, bit for bit, across autoresets; the fleets it does not run are refused
with the reason, or stepped by the fleet vector env of fleet envs."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.fleet_native import DiLoCoFleetNativeVectorEnv
from diloco_gym.envs.fleet_vector import DiLoCoFleetVectorEnv
from diloco_gym.sim import fleet as fl

ROOT = Path(__file__).resolve().parents[2]
VEC = {"vectorization_mode": "vector_entry_point"}


def make_vec(num_envs, **kw):
    return gym.make_vec("DiLoCoFleet-v1", num_envs=num_envs, **VEC, **kw)


def _trace_fleet() -> fl.FleetParams:
    names = ("bursty", "ordinary", "sync-heavy")
    return fl.FleetParams(
        sites=tuple(
            fl.SiteConfig(
                name=n, regime=None, trace=str(ROOT / "traces" / f"{n}.csv"), target_rate_rps=0.55
            )
            for n in names
        )  # fmt: skip
    )


def _compare(v, envs, seed, actions):
    """Step ``v`` and the fleet envs ``envs`` (NEXT_STEP autoreset by hand) with the same
    actions; every observation, reward, flag and mask equal. Returns the episodes ended."""
    k = len(envs)
    obs, info = v.reset(seed=seed)
    np.testing.assert_array_equal(obs, np.stack([e.reset(seed=seed + i)[0]
                                                 for i, e in enumerate(envs)]))  # fmt: skip
    np.testing.assert_array_equal(v.action_masks(), np.stack([e.action_masks() for e in envs]))
    pending = [False] * k
    ended = 0
    for a in actions:
        got = v.step(a)
        rows, rewards, truncs = [], [], []
        for i, e in enumerate(envs):
            if pending[i]:
                o, _ = e.reset()
                r, t = 0.0, False
            else:
                o, r, _, t, _ = e.step(int(a[i]))
            pending[i] = t
            rows.append(o)
            rewards.append(r)
            truncs.append(t)
        np.testing.assert_array_equal(got[0], np.stack(rows))
        np.testing.assert_array_equal(got[1], np.array(rewards))
        np.testing.assert_array_equal(got[3], np.array(truncs))
        assert not got[2].any()
        live = ~np.array(pending)  # an ended env allows both until it restarts
        masks = np.stack([e.action_masks() for e in envs])
        np.testing.assert_array_equal(v.action_masks()[live], masks[live])
        np.testing.assert_array_equal(v.episode_seeds, [e.episode.seed for e in envs])
        ended += int(got[3].sum())
    return ended


def test_make_vec_gives_the_compiled_env_for_the_default_fleet_and_fragments():
    assert type(make_vec(2, fragments=4)) is DiLoCoFleetNativeVectorEnv
    v = make_vec(3)
    single = DiLoCoFleetEnv(model_version=1)
    assert type(v) is DiLoCoFleetNativeVectorEnv and v.num_envs == 3
    assert v.single_observation_space == single.observation_space
    assert v.obs_features == single.obs_features
    assert v.action_space == gym.spaces.MultiDiscrete([2, 2, 2])
    obs, info = v.reset(seed=0)
    assert obs.shape == v.observation_space.shape and obs.dtype == np.float32
    assert v.observation_space.contains(obs)
    assert info["episode_seed"].tolist() == [0, 1, 2]
    assert v.action_masks().shape == (3, 2)


@pytest.mark.parametrize(
    "kw",
    [
        {"model_version": 1},
        {"model_version": 0},  # no learner stall
        {"model_version": 1, "merge_budget": 9},  # masks from the budget
        {"model_version": 1, "fleet": fl.FleetParams(sites=(fl.SiteConfig(name="solo"),))},
        {"model_version": 1, "fleet": _trace_fleet()},  # each episode's windows
        {"model_version": 1, "fragments": 2},  # the fragment credit and staleness
        {"model_version": 0, "fragments": 4},
        {"model_version": 1, "fragments": 4, "mode": "streamed"},  # no stall
        {"model_version": 1, "fragments": 2, "bits": 8, "merge_budget": 40},
        {"fleet": str(ROOT / "docs/examples/fleet.toml")},  # model v0: one cost group
        # model v1: each site's slowdown at its own link share (four cost groups), F = 4
        {"fleet": str(ROOT / "docs/examples/fleet.toml"), "model_version": 1},
        {"fleet": str(ROOT / "docs/examples/fleet-v1.toml")},
    ],
    ids=[
        "v1",
        "v0",
        "budget",
        "one-site",
        "trace-sites",
        "F2",
        "F4-v0",
        "F4-streamed",
        "F2-8bit-budget",
        "file-v0",
        "file-as-v1",
        "file-v1",
    ],  # fmt: skip
)
def test_each_env_is_the_fleet_env_with_its_seed_across_autoresets(kw):
    k = 3
    v = DiLoCoFleetNativeVectorEnv(k, **kw)
    envs = [DiLoCoFleetEnv(**kw) for _ in range(k)]
    steps = 200 * v.fleet.fragments if v.fleet.fragments < 4 else 500  # longer episodes
    actions = np.random.default_rng(5).integers(0, 2, (steps, k))
    assert _compare(v, envs, 40, actions) >= 2 * k  # every env restarted at least twice


def test_the_episode_end_info_is_the_fleet_envs_summary():
    v = make_vec(2)
    env = DiLoCoFleetEnv(model_version=1)
    v.reset(seed=3)
    env.reset(seed=4)
    for a in np.random.default_rng(1).integers(0, 2, (300, 2)):
        _, _, _, trunc, info = v.step(a)
        _, _, _, t, inf = env.step(int(a[1]))
        assert t == trunc[1]
        if t:
            end, summ = info["episode_end"], inf["episode_summary"]
            assert end["_merges"][1] and end["merges"][1] == summ["merges"]
            assert end["seed"][1] == summ["episode_seed"]
            assert end["sync_excess_pct"][1] == pytest.approx(summ["additive_excess_pct"], 1e-12)
            assert end["progress"][1] == pytest.approx(summ["progress"], 1e-12)
            return
    raise AssertionError("no episode ended")


def test_same_step_autoreset_returns_the_final_observation():
    v = make_vec(2, autoreset_mode=AutoresetMode.SAME_STEP)
    v.reset(seed=2)
    for _ in range(200):
        obs, _, _, trunc, info = v.step(np.array([1, 1]))
        if trunc.any():
            i = int(np.flatnonzero(trunc)[0])
            assert info["_final_obs"][i] and info["final_obs"][i].shape == obs[i].shape
            fresh = DiLoCoFleetEnv(model_version=1).reset(seed=int(v.episode_seeds[i]))[0]
            np.testing.assert_array_equal(obs[i], fresh)  # the next episode's first
            return
    raise AssertionError("no episode ended")


def test_stable_baselines3_steps_it():
    from stable_baselines3.common.env_checker import check_env  # noqa: F401  (sb3 present)

    from diloco_gym.rl.sb3 import SB3VecEnv

    v = SB3VecEnv(make_vec(2, autoreset_mode=AutoresetMode.SAME_STEP))
    v.seed(0)
    obs = v.reset()
    assert obs.shape == (2, len(DiLoCoFleetEnv().obs_features))
    for _ in range(70):
        obs, rewards, dones, infos = v.step(np.array([1, 0]))
    assert rewards.shape == (2,) and len(infos) == 2


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"traffic_correlation": 0.5}, "traffic_correlation"),
        ({"bits_options": (32, 8)}, "bits_options"),
        ({"worst_site_weight": 0.5}, "worst_site_weight"),
        ({"timing": "rounds", "grace_s": 4.5, "h_min_steps": 256}, "timing = 'rounds'"),
    ],
)
def test_fleets_it_does_not_run_are_refused_or_stepped_by_fleet_envs(kw, why):
    with pytest.raises(ValueError, match=why) as exc:
        make_vec(2, native=True, **kw)
    assert "\n" not in str(exc.value)
    if "timing" not in kw:
        assert type(make_vec(2, **kw)) is DiLoCoFleetVectorEnv
        with pytest.raises(ValueError, match="does not run this fleet: " + why):
            DiLoCoFleetNativeVectorEnv(2, **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"native": "yes"}, "native must be None, True or False"),
        ({"episode_pool": 4}, "takes no episode_pool"),
        ({"render_mode": "ansi"}, "does not render"),  # the fleet envs' vector env renders
        ({"num_envs": 0}, "num_envs must be an int >= 1"),
    ],
)
def test_bad_arguments_are_refused(kw, match):
    n = kw.pop("num_envs", 2)
    with pytest.raises(ValueError, match=match):
        make_vec(n, native=kw.pop("native", True), **kw)


def test_bad_actions_and_seeds_are_one_line_errors():
    v = make_vec(2)
    with pytest.raises(RuntimeError, match="reset"):
        v.step(np.array([0, 1]))
    v.reset(seed=0)
    for bad in (np.array([0, 1, 1]), np.array([2, 0]), "x"):
        with pytest.raises(ValueError, match="actions") as exc:
            v.step(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="seed"):
        v.reset(seed=[1, 2, 3])


def test_rendering_asks_for_the_fleet_envs_vector_env():
    v = make_vec(2, render_mode="ansi")
    assert type(v) is DiLoCoFleetVectorEnv
    v.reset(seed=0)
    assert all(isinstance(r, str) for r in v.render())
