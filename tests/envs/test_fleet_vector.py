"""The fleet vector env of fleet envs (envs/fleet_vector.py, ``native=False``, and what
``make_vec`` gives a fleet the compiled one does not run): K fleet envs stepped as one
Gymnasium vector env, equal to K fleet envs stepped one by one with the same seeds. The
compiled fleet vector env: tests/envs/test_fleet_native.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.fleet_vector import DiLoCoFleetVectorEnv

VEC = {"vectorization_mode": "vector_entry_point"}


def make_vec(num_envs, **kw):
    return gym.make_vec("DiLoCoFleet-v1", num_envs=num_envs, **VEC, native=False, **kw)


def reference(num_envs, seed, actions, **kw):
    """K fleet envs of the id's model (v1) stepped one by one, NEXT_STEP autoreset by hand."""
    envs = [DiLoCoFleetEnv(model_version=1, **kw) for _ in range(num_envs)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    pending = [False] * num_envs
    out = [(np.stack(obs), None, None)]
    for a in actions:
        rows, rewards, truncs = [], [], []
        for i, e in enumerate(envs):
            if pending[i]:
                o, info = e.reset()
                r, trunc = 0.0, False
            else:
                o, r, _, trunc, info = e.step(a[i])
            pending[i] = trunc
            rows.append(o)
            rewards.append(r)
            truncs.append(trunc)
        out.append((np.stack(rows), np.array(rewards), np.array(truncs)))
    return out


def test_make_vec_gives_the_fleet_vector_env_with_batched_spaces():
    # a fleet the compiled env does not run gets this one without asking
    assert type(gym.make_vec("DiLoCoFleet-v1", num_envs=2, worst_site_weight=0.5, **VEC)) is (
        DiLoCoFleetVectorEnv
    )
    v = make_vec(3)
    single = DiLoCoFleetEnv(model_version=1)
    assert type(v) is DiLoCoFleetVectorEnv and v.num_envs == 3
    assert v.single_observation_space == single.observation_space
    assert v.single_action_space == single.action_space
    assert v.observation_space.shape == (3, single.observation_space.shape[0])
    assert v.action_space == gym.spaces.MultiDiscrete([2, 2, 2])
    assert all(e.fleet.model_version == 1 for e in v.envs)
    obs, info = v.reset(seed=0)
    assert obs.shape == v.observation_space.shape and obs.dtype == np.float32
    assert v.observation_space.contains(obs)
    assert info["episode_seed"].tolist() == [0, 1, 2]
    assert v.action_masks().shape == (3, 2)


@pytest.mark.parametrize("kw", [{}, {"fragments": 2, "worst_site_weight": 0.5}])
def test_each_env_steps_as_a_fleet_env_with_its_seed_across_autoresets(kw):
    k, steps = 3, 320  # 58 (default) to ~120 decisions per episode: each env restarts twice
    actions = np.random.default_rng(5).integers(0, 2, (steps, k))
    v = make_vec(k, **kw)
    ref = reference(k, 40, actions, **kw)
    obs, _ = v.reset(seed=40)
    np.testing.assert_array_equal(obs, ref[0][0])
    restarts = 0
    for t, a in enumerate(actions):
        obs, reward, term, trunc, info = v.step(a)
        r_obs, r_reward, r_trunc = ref[t + 1]
        np.testing.assert_array_equal(obs, r_obs)
        np.testing.assert_array_equal(reward, r_reward)
        np.testing.assert_array_equal(trunc, r_trunc)
        assert not term.any()
        restarts += int(info.get("_episode_seed", np.zeros(k, bool)).sum())
        if trunc.any():  # the ending step carries each ending env's summary
            assert info["_episode_summary"].tolist() == trunc.tolist()
    assert restarts >= 2 * k


def test_an_ended_env_restarts_on_the_next_step_with_reward_zero():
    v = make_vec(2)
    v.reset(seed=1)
    ended = None
    for _ in range(200):
        _, reward, _, trunc, info = v.step(np.array([0, 1]))
        if ended is not None:
            assert reward[ended] == 0.0 and not trunc[ended]
            assert info["_episode_seed"][ended]
            assert info["episode_seed"][ended] == v.envs[ended].episode.seed
            break
        if trunc.any():
            ended = int(np.flatnonzero(trunc)[0])
    assert ended is not None


def test_same_step_autoreset_returns_the_final_observation():
    v = make_vec(2, autoreset_mode=AutoresetMode.SAME_STEP)
    v.reset(seed=2)
    for _ in range(200):
        obs, _, _, trunc, info = v.step(np.array([1, 1]))
        if trunc.any():
            i = int(np.flatnonzero(trunc)[0])
            assert info["_final_obs"][i] and info["final_obs"][i].shape == obs[i].shape
            fresh = DiLoCoFleetEnv(model_version=1).reset(seed=v.envs[i].episode.seed)[0]
            np.testing.assert_array_equal(obs[i], fresh)  # the next episode's first
            return
    raise AssertionError("no episode ended")


def test_the_precision_action_batches_as_multidiscrete():
    v = make_vec(2, bits_options=(32, 8))
    assert v.action_space.shape == (2, 2)
    v.reset(seed=0)
    assert v.action_masks().shape == (2, 4)
    _, reward, _, _, _ = v.step(np.array([[1, 1], [0, 0]]))
    assert reward.shape == (2,)


def test_seeds_may_be_a_sequence():
    v = make_vec(2)
    obs, info = v.reset(seed=[7, None])
    assert info["episode_seed"][0] == 7
    single = DiLoCoFleetEnv(model_version=1)
    np.testing.assert_array_equal(obs[0], single.reset(seed=7)[0])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"num_envs": 0}, "num_envs must be an int >= 1"),
        ({"num_envs": True}, "num_envs must be an int >= 1"),
        ({"num_envs": 2, "autoreset_mode": "sometimes"}, "autoreset_mode must be"),
        (
            {"num_envs": 2, "timing": "rounds", "grace_s": 4.5, "h_min_steps": 256},
            "does not support fleets with timing = 'rounds'",
        ),
    ],
)
def test_bad_arguments_are_refused(kw, match):
    n = kw.pop("num_envs")
    with pytest.raises(ValueError, match=match):
        gym.make_vec("DiLoCoFleet-v1", num_envs=n, **VEC, **kw)
    with pytest.raises(ValueError, match=match):
        gym.make_vec("DiLoCoFleet-v1", num_envs=n, **VEC, native=False, **kw)


def test_a_rounds_fleet_file_is_refused(tmp_path):
    path = tmp_path / "rounds.toml"
    path.write_text(
        '[fleet]\nmodel_version = 1\ntiming = "rounds"\ngrace_s = 4.5\n\n[env]\n'
        'h_min_steps = 256\n\n[[site]]\nname = "a"\n\n[[site]]\nname = "b"\n'
    )
    with pytest.raises(ValueError, match="timing = 'rounds'"):
        DiLoCoFleetVectorEnv(2, fleet=str(path))


@pytest.mark.parametrize(
    "actions",
    [np.array([0, 1, 1]), np.array([0.5, 1.0]), np.array([2, 0]), np.array([True, False]), "x"],
)
def test_bad_actions_are_one_line_errors(actions):
    v = make_vec(2)
    v.reset(seed=0)
    with pytest.raises(ValueError, match="not in the action space") as exc:
        v.step(actions)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("seed", "match"), [([1, 2, 3], "3 seeds for 2 envs"), (-1, "seed"), ("a", "seed must be")]
)
def test_bad_seeds_are_refused(seed, match):
    v = make_vec(2)
    with pytest.raises(ValueError, match=match):
        v.reset(seed=seed)


def _same_info(a, b, where="info"):
    assert a.keys() == b.keys(), where
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            _same_info(x, y, f"{where}[{k}]")
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, f"{where}[{k}]"
            if x.dtype == object:
                assert [repr(v) for v in x] == [repr(v) for v in y], f"{where}[{k}]"
            else:
                np.testing.assert_array_equal(x, y, err_msg=f"{where}[{k}]")


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_infos_are_gymnasiums_sync_vector_env_infos(mode):
    k = 2
    v = make_vec(k, autoreset_mode=mode)
    stock = gym.vector.SyncVectorEnv(
        [lambda: DiLoCoFleetEnv(model_version=1) for _ in range(k)], autoreset_mode=mode
    )
    _same_info(v.reset(seed=9)[1], stock.reset(seed=9)[1])
    ends = 0
    for a in np.random.default_rng(2).integers(0, 2, (130, k)):
        got, want = v.step(a), stock.step(a)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        _same_info(got[4], want[4])
        ends += int(got[3].sum())
    assert ends >= k  # the episode ends' infos (summaries, final observations) compared


def test_the_refusals_advice_works_for_a_rounds_fleet():
    kw = {"timing": "rounds", "grace_s": 4.5, "h_min_steps": 256}
    v = gym.make_vec("DiLoCoFleet-v1", num_envs=2, vectorization_mode="sync", **kw)
    obs, _ = v.reset(seed=0)
    _, reward, _, _, _ = v.step(np.ones((2, 4), dtype=np.int8))
    assert obs.shape[0] == 2 and reward.shape == (2,)
