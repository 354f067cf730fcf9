"""The native vector env against the single env, its Gymnasium/SB3 interfaces, the fast
paths it relies on (against the slow versions they replaced), and the benchmark script."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym import ENV_IDS
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import build_episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.vector import DiLoCoSyncVectorEnv
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import regimes
from diloco_gym.sim import sidecar as sc

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- lockstep harness
def lockstep(
    num_envs: int,
    seed: int,
    steps: int,
    actions,
    *,
    autoreset_mode=AutoresetMode.NEXT_STEP,
    **kwargs,
) -> dict:
    """Step a vector env and ``num_envs`` single envs with the same actions; assert that
    every observation, reward, flag and mask agrees exactly. Returns counters."""
    venv = DiLoCoSyncVectorEnv(num_envs, autoreset_mode=autoreset_mode, **kwargs)
    singles = [
        DiLoCoSyncEnv(**{k: v for k, v in kwargs.items() if k != "episode_pool"})
        for _ in range(num_envs)
    ]
    pooled = kwargs.get("episode_pool") is not None

    vobs, vinfo = venv.reset(seed=seed)
    for i, env in enumerate(singles):
        # Env i starts on the single env's episode of seed + i (a pool of K starts env i
        # on its episode i % K, the episode of seed + i % K).
        k = kwargs.get("episode_pool") or num_envs
        obs, info = env.reset(seed=seed + i % k)
        assert info["episode_seed"] == vinfo["episode_seed"][i]
        np.testing.assert_array_equal(vobs[i], obs)

    def next_episode(i: int, env: DiLoCoSyncEnv):
        # Fresh episodes: the single env's own next seed; a pool: the pool's episode.
        obs, info = env.reset(seed=int(venv.episode_seeds[i])) if pooled else env.reset()
        assert info["episode_seed"] == venv.episode_seeds[i]
        return obs

    pending = np.zeros(num_envs, dtype=bool)
    counts = {"episodes_ended": 0, "merges": 0, "overridden": 0}
    for t in range(steps):
        a = actions(t)
        masks = venv.action_masks()
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(a)
        assert not vterm.any()
        for i, env in enumerate(singles):
            if pending[i]:  # NEXT_STEP: this step restarted env i
                obs = next_episode(i, env)
                rew, trunc = 0.0, False
                assert vinfo["_episode_seed"][i]
            else:
                np.testing.assert_array_equal(masks[i], env.action_masks())
                obs, rew, term, trunc, info = env.step(int(a[i]))
                assert not term
                assert vinfo["merged"][i] == info["merged"]
                assert vinfo["action_overridden"][i] == info["action_overridden"]
                assert vinfo["sync_excess"][i] == info["reward_terms"]["sync_excess"]
                assert vinfo["progress"][i] == info["reward_terms"]["progress"]
                if not (trunc and autoreset_mode is AutoresetMode.SAME_STEP):  # not restarted
                    np.testing.assert_array_equal(vinfo["action_mask"][i], info["action_mask"])
                counts["merges"] += int(info["merged"])
                counts["overridden"] += int(info["action_overridden"])
                if trunc:
                    counts["episodes_ended"] += 1
                    ep = vinfo["episode_end"]
                    assert ep["_merges"][i]
                    assert ep["merges"][i] == info["episode_summary"]["merges"]
                    assert ep["seed"][i] == info["episode_summary"]["episode_seed"]
                    assert ep["sync_excess_pct"][i] == pytest.approx(
                        info["episode_summary"]["additive_excess_pct"], rel=1e-12, abs=1e-12
                    )
                    if autoreset_mode is AutoresetMode.SAME_STEP:
                        np.testing.assert_array_equal(vinfo["final_obs"][i], obs)
                        obs = next_episode(i, env)
            assert vrew[i] == rew, (t, i)
            assert vtrunc[i] == (trunc and autoreset_mode is AutoresetMode.NEXT_STEP) or (
                autoreset_mode is AutoresetMode.SAME_STEP and vtrunc[i] == trunc
            )
            np.testing.assert_array_equal(vobs[i], obs, err_msg=f"step {t}, env {i}")
        pending = vtrunc.copy() if autoreset_mode is AutoresetMode.NEXT_STEP else pending
    return counts


def _random_actions(num_envs: int, seed: int, p_merge: float = 0.5):
    table = (np.random.default_rng(seed).random((100_000, num_envs)) < p_merge).astype(np.int64)
    return lambda t: table[t]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_matches_single_env_every_decision(mode):
    # skip_forced=False: one step per decision (517 per episode), so this crosses an
    # autoreset with a fixed random action sequence, overrides included.
    counts = lockstep(3, 11, 1100, _random_actions(3, 0), autoreset_mode=mode, skip_forced=False)
    assert counts["episodes_ended"] >= 6 and counts["merges"] > 50 and counts["overridden"] > 50


def test_matches_single_env_skip_forced_with_progress():
    counts = lockstep(4, 5, 300, _random_actions(4, 1, 0.3), progress_weight=0.5)
    assert counts["episodes_ended"] >= 8 and counts["merges"] > 100


@pytest.mark.parametrize("skip_forced", [True, False])
@pytest.mark.parametrize("budget", [8, 9, 30])  # 8 and 30: near the feasible extremes
def test_matches_single_env_with_merge_budget(skip_forced, budget):
    steps = 150 if skip_forced else 1050
    counts = lockstep(
        3, 21, steps, _random_actions(3, budget, 0.2), merge_budget=budget, skip_forced=skip_forced
    )
    assert counts["episodes_ended"] >= 6


def test_matches_single_env_other_regime_and_learners():
    counts = lockstep(
        2,
        99,
        150,
        _random_actions(2, 3),
        regime="sync-heavy",
        learners=lrn.LearnerParams(num_learners=3, initial_tokens=1e6),
    )
    assert counts["episodes_ended"] >= 2


def test_matches_single_env_with_episode_pool():
    # Pool of 3 for 4 envs: env 3 starts on pool episode 0, autoresets cycle the pool.
    counts = lockstep(4, 40, 200, _random_actions(4, 4), episode_pool=3)
    assert counts["episodes_ended"] >= 8


def test_fixed_action_sequences():
    always = np.ones(3, dtype=np.int64)
    lockstep(3, 7, 120, lambda t: always)
    lockstep(3, 7, 60, lambda t: np.zeros(3, dtype=np.int64), merge_budget=10)


# --------------------------------------------------------------------------- seeding
def test_seed_contract_and_autoreset_seeds_are_deterministic():
    def episode_seeds(seed):
        env = DiLoCoSyncVectorEnv(4)
        _, info = env.reset(seed=seed)
        seen = [info["episode_seed"].copy()]
        for _ in range(150):
            _, _, _, _, info = env.step(np.ones(4, dtype=np.int64))
            if "episode_seed" in info:
                seen.append(info["episode_seed"][info["_episode_seed"]])
        return np.concatenate(seen)

    a, b = episode_seeds(123), episode_seeds(123)
    np.testing.assert_array_equal(a, b)
    assert list(a[:4]) == [123, 124, 125, 126]
    assert a.size > 8 and len(set(a.tolist())) == a.size  # new episodes, not repeats
    # The autoreset seed of env i is the single env's next seed after reset(seed=123 + i).
    single = DiLoCoSyncEnv()
    single.reset(seed=125)
    _, info = single.reset()
    env = DiLoCoSyncVectorEnv(4)
    env.reset(seed=123)
    while True:
        _, _, _, trunc, info_v = env.step(np.ones(4, dtype=np.int64))
        if "episode_seed" in info_v and info_v["_episode_seed"][2]:
            assert info_v["episode_seed"][2] == info["episode_seed"]
            break


def test_reset_seed_forms():
    env = DiLoCoSyncVectorEnv(3)
    obs_list, info = env.reset(seed=[5, 9, 2])
    assert list(info["episode_seed"]) == [5, 9, 2]
    _, info = env.reset()  # no seed: continues each env's generator
    assert len(set(info["episode_seed"].tolist()) & {5, 9, 2}) == 0
    fresh = DiLoCoSyncVectorEnv(2)
    obs, info = fresh.reset()
    assert fresh.observation_space.contains(obs)
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=[1, 2])
    pooled = DiLoCoSyncVectorEnv(3, episode_pool=2)
    with pytest.raises(ValueError, match="consecutive"):
        pooled.reset(seed=[5, 9, 2])
    _, info = pooled.reset(seed=[4, 5, 6])
    assert list(info["episode_seed"]) == [4, 5, 4]


def test_episode_pool_reuses_episodes_round_robin():
    env = DiLoCoSyncVectorEnv(2, episode_pool=3)
    _, info = env.reset(seed=10)
    assert list(info["episode_seed"]) == [10, 11]
    seen = []
    for _ in range(200):
        _, _, _, _, info = env.step(np.ones(2, dtype=np.int64))
        if "episode_seed" in info:
            seen += info["episode_seed"][info["_episode_seed"]].tolist()
    # Round-robin over the pool, in env order: (12, 10), then (11, 12), then (10, 11), ...
    assert len(seen) >= 6 and seen[:6] == [12, 10, 11, 12, 10, 11]


# --------------------------------------------------------------------------- Gymnasium API
@pytest.mark.parametrize("env_id", ["DiLoCoSync-v0", *ENV_IDS.values()])
def test_make_vec_every_id(env_id):
    env = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point")
    assert isinstance(env, DiLoCoSyncVectorEnv)
    obs, info = env.reset(seed=0)
    assert obs.shape == (3, 17) and obs.dtype == np.float32
    assert env.observation_space.contains(obs)
    for _ in range(5):
        obs, rew, term, trunc, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert rew.shape == (3,) and rew.dtype == np.float64
        assert term.dtype == np.bool_ and trunc.dtype == np.bool_
    env.close()


def test_make_vec_passes_env_kwargs():
    env = gym.make_vec(
        "DiLoCoSync-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        merge_budget=8,
        skip_forced=False,
        episode_pool=2,
    )
    assert env.num_envs == 2 and env.params.merge_budget == 8 and not env.params.skip_forced
    assert env.episode_pool == 2
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'merge_budjet'"):
        DiLoCoSyncVectorEnv(2, merge_budjet=8)


def test_spaces_and_metadata():
    env = DiLoCoSyncVectorEnv(5)
    assert env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert env.single_observation_space == DiLoCoSyncEnv().observation_space
    assert env.single_action_space == gym.spaces.Discrete(2)
    assert env.observation_space.shape == (5, 17)
    assert isinstance(env.action_space, gym.spaces.MultiDiscrete)
    assert list(env.action_space.nvec) == [2] * 5
    same = DiLoCoSyncVectorEnv(2, autoreset_mode="SameStep")
    assert same.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    with pytest.raises(ValueError, match="autoreset_mode"):
        DiLoCoSyncVectorEnv(2, autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(ValueError, match="num_envs"):
        DiLoCoSyncVectorEnv(0)
    with pytest.raises(ValueError, match="episode_pool"):
        DiLoCoSyncVectorEnv(2, episode_pool=0)
    assert DiLoCoSyncVectorEnv(2).parallel is False  # the default: serial
    with pytest.raises(ValueError, match="parallel must be True or False, got 'yes'"):
        DiLoCoSyncVectorEnv(2, parallel="yes")


def test_bad_use_is_reported():
    env = DiLoCoSyncVectorEnv(2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="0 \\(defer\\) or 1"):
        env.step(np.array([0, 2]))


def test_determinism_and_vector_sanity():
    """A vector-env version of ``check_env``'s checks: same seed, same rollout; obs inside
    the space; infos carry Gymnasium's ``_key`` masks; wrappers that need NEXT_STEP work."""

    def rollout():
        env = gym.wrappers.vector.RecordEpisodeStatistics(DiLoCoSyncVectorEnv(3))
        obs, info = env.reset(seed=3)
        out = [obs]
        rng = np.random.default_rng(0)
        returns = []
        for _ in range(120):
            obs, rew, term, trunc, info = env.step(rng.integers(0, 2, 3))
            assert env.observation_space.contains(obs)
            for key, value in info.items():
                if not key.startswith("_") and isinstance(value, np.ndarray):
                    assert value.shape[0] == 3 and info[f"_{key}"].shape == (3,)
            if "episode" in info:
                returns += list(info["episode"]["r"][info["_episode"]])
            out += [obs, rew, trunc]
        return out, returns

    a, ra = rollout()
    b, rb = rollout()
    assert len(ra) >= 3 and ra == rb
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # Returned arrays are not reused by later calls (check_env's "data not reused").
    env = DiLoCoSyncVectorEnv(3)
    obs0, _ = env.reset(seed=0)
    kept = obs0.copy()
    first = env.step(np.ones(3, dtype=np.int64))
    kept_step = [x.copy() for x in first[:4]]
    env.step(np.zeros(3, dtype=np.int64))
    np.testing.assert_array_equal(obs0, kept)
    for x, y in zip(first[:4], kept_step, strict=True):
        np.testing.assert_array_equal(x, y)


def test_action_masks_batched():
    env = DiLoCoSyncVectorEnv(4, skip_forced=False)
    env.reset(seed=0)
    masks = env.action_masks()
    assert masks.shape == (4, 2) and masks.dtype == np.bool_
    assert masks[:, 0].all() and not masks[:, 1].any()  # gap 0: defer only


# --------------------------------------------------------------------------- SB3 adapter
@pytest.mark.slow
def test_sb3_adapter_ppo_smoke():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor

    from diloco_gym.rl.sb3 import SB3VecEnv

    venv = SB3VecEnv(num_envs=4, skip_forced=False)
    assert isinstance(venv, VecEnv)
    venv.reset()
    masks = venv.env_method("action_masks")
    assert len(masks) == 4 and masks[0].shape == (2,)
    model = PPO(
        "MlpPolicy", VecMonitor(venv), n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu"
    )
    model.learn(64)
    assert model.num_timesteps >= 64
    # Terminal observations and truncation flags follow SB3's conventions.
    venv.seed(7)
    obs = venv.reset()
    assert venv.reset_infos[2]["episode_seed"] == 9
    ones = np.ones(4, dtype=np.int64)
    for _ in range(600):
        obs, rew, done, infos = venv.step(ones)
        if done.any():
            i = int(np.flatnonzero(done)[0])
            assert infos[i]["TimeLimit.truncated"] is True
            assert infos[i]["terminal_observation"].shape == (17,)
            assert obs[i][0] == 0.0  # the next episode starts at gap 0
            break
    else:
        raise AssertionError("no episode ended")
    with pytest.raises(ValueError, match="SAME_STEP"):
        SB3VecEnv(DiLoCoSyncVectorEnv(2))


def test_sb3_adapter_maskable_ppo_smoke():
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO

    from diloco_gym.rl.sb3 import SB3VecEnv

    model = MaskablePPO(
        "MlpPolicy",
        SB3VecEnv(num_envs=4),
        n_steps=16,
        batch_size=32,
        n_epochs=1,
        seed=0,
        device="cpu",
    )
    model.learn(64)


# --------------------------------------------------------------------------- fast paths
def _merge_costs_reference(base_s, req_bin, pressure_bin, p, bin_s, starts, merge_bins, violated0):
    """The slow, obvious version: replay each candidate merge alone over its horizon."""
    n_bins = pressure_bin.size
    horizon = merge_bins + int(round(p.tail_s / bin_s))
    out = np.zeros(len(starts))
    base_v = np.asarray(violated0).astype(bool)
    for c, s0 in enumerate(starts):
        sync = np.zeros(n_bins)
        sync[s0 : s0 + merge_bins] = 1.0
        res = sc.replay(base_s, req_bin, pressure_bin, sync, p, bin_s)
        inside = (req_bin >= s0) & (req_bin < s0 + horizon)
        out[c] = np.sum(res.violated & inside & ~base_v)
    return out


def test_merge_costs_matches_slow_replay():
    reg = regimes.get_regime("bursty")
    params = EnvParams()
    tr = reg(np.random.default_rng(4))
    ep = build_episode(tr, params, reg.sidecar, lrn.LearnerParams(), np.random.default_rng(4))
    starts = np.arange(0, ep.n_decisions, 7) * params.decision_interval
    fast = sc.merge_costs(
        ep.base_s,
        ep.req_bin,
        ep.pressure_bin,
        reg.sidecar,
        params.step_seconds,
        starts,
        params.merge_steps,
        ep.baseline.violated,
    )
    slow = _merge_costs_reference(
        ep.base_s,
        ep.req_bin,
        ep.pressure_bin,
        reg.sidecar,
        params.step_seconds,
        starts,
        params.merge_steps,
        ep.baseline.violated,
    )
    # The isolated replay is the same model; the closed form differs only by rounding
    # right at a latency threshold, so allow a request or two in the whole episode.
    assert np.abs(fast - slow).sum() <= 2
    assert fast.sum() > 100
    np.testing.assert_array_equal(ep.merge_cost[::7], fast)


def test_merge_costs_blocks_chunks_and_unsorted_requests(monkeypatch):
    reg = regimes.get_regime("sync-heavy")
    params = EnvParams()
    ep = build_episode(
        reg(np.random.default_rng(1)),
        params,
        reg.sidecar,
        lrn.LearnerParams(),
        np.random.default_rng(1),
    )
    args = (ep.base_s, ep.req_bin, ep.pressure_bin, reg.sidecar, params.step_seconds)
    starts = np.arange(ep.n_decisions) * params.decision_interval
    whole = sc.merge_costs(*args, starts, params.merge_steps, ep.baseline.violated)
    monkeypatch.setattr(sc, "_COST_BLOCK", 37)
    monkeypatch.setattr(sc, "_PAIR_CHUNK", 101)
    np.testing.assert_array_equal(
        sc.merge_costs(*args, starts, params.merge_steps, ep.baseline.violated), whole
    )
    perm = np.random.default_rng(0).permutation(ep.req_bin.size)
    np.testing.assert_array_equal(
        sc.merge_costs(
            ep.base_s[perm],
            ep.req_bin[perm],
            *args[2:],
            starts,
            params.merge_steps,
            ep.baseline.violated[perm],
        ),
        whole,
    )
    # Strides, offsets and candidates past the end of the trace.
    for first, stride in [(3, 5), (0, 1), (ep.pressure_bin.size - 20, 9)]:
        st = first + stride * np.arange(40)
        got = sc.merge_costs(*args, st, params.merge_steps, ep.baseline.violated)
        ref = _merge_costs_reference(*args, st, params.merge_steps, ep.baseline.violated)
        assert np.abs(got - ref).sum() <= 2


def _pressure_series_loop(rng, n, mean, sd, spike_rate_per_s, spike_s, spike_level):
    """The scalar-loop AR(1) the filter replaced (same draws, same arithmetic)."""
    rho = 0.97
    noise = rng.normal(0.0, sd * np.sqrt(1 - rho**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0.0, sd)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + noise[i]
    series = mean + x
    onsets = np.flatnonzero(rng.random(n) < spike_rate_per_s)
    length = max(1, int(round(spike_s / 1.0)))
    for t in onsets:
        series[t : t + length] = np.maximum(series[t : t + length], spike_level)
    return np.clip(series, 0.0, 1.0)


@pytest.mark.parametrize("seed", range(5))
def test_pressure_series_filter_is_bit_identical_to_loop(seed):
    args = (600, 0.3, 0.12, 1 / 50, 20.0, 0.75)
    np.testing.assert_array_equal(
        regimes._pressure_series(np.random.default_rng(seed), *args),
        _pressure_series_loop(np.random.default_rng(seed), *args),
    )


def test_rate_function_spans_match_whole_grid():
    reg = replace(regimes.get_regime("non-periodic"), ramp_s=7.0)
    t_sorted = (np.arange(6000) + 0.5) * 0.1
    t_unsorted = t_sorted[np.random.default_rng(0).permutation(t_sorted.size)]
    a = reg.rate_rps(t_sorted, np.random.default_rng(3))
    b = reg.rate_rps(t_unsorted, np.random.default_rng(3))  # the whole-grid path
    np.testing.assert_array_equal(b[np.argsort(t_unsorted)], a)
    assert a.max() > reg.quiet_rate_rps


# --------------------------------------------------------------------------- benchmark script
@pytest.mark.slow
def test_benchmark_quick_runs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "benchmark" in proc.stdout and "ratio" in proc.stdout
    assert "fresh-episode ceiling" in proc.stdout
    assert "FLOOR (bursty episode" in proc.stdout  # the compiled kernel's floor row
    assert "DEFAULT fleet env: one episode, split" in proc.stdout  # where its time goes


def test_benchmark_ab_puts_a_side_without_a_floor_against_this_checkouts():
    """An A/B side whose tree has no compiled floor (0.4.0's) gets its vector env against
    this checkout's floor; a side with a floor of its own keeps only its own ratio."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def run(eps: float, floor: float) -> dict:
        single = {"diloco_steps_per_s": 1.0, "cartpole_steps_per_s": 2.0, "ratio": 0.5}
        vector = {
            **single,
            "diloco_episodes_per_s": eps,
            "floor_episodes_per_s": floor,
            "vs_floor": floor / eps,
        }
        return {"default_single": single, "default_vector": vector}

    runs = {
        "old": [run(100.0, float("nan")), run(200.0, float("nan")), run(300.0, float("nan"))],
        "this checkout": [run(1000.0, 1500.0), run(1000.0, 1700.0), run(1000.0, 1600.0)],
    }
    res = bench.ab_summary(runs)
    assert res["old"]["default_vector"]["vs_checkout_floor"] == 1600.0 / 200.0
    assert res["this checkout"]["default_vector"]["vs_floor"] == 1.6
    assert "vs_checkout_floor" not in res["this checkout"]["default_vector"]
    assert res["old"]["default_single"]["ratio"] == 0.5


def test_benchmark_draws_floor_makes_exactly_the_episodes_draws():
    """The fresh-episode floor times only the generator calls of an episode; they must be
    exactly the calls the single env makes (same generator state afterwards), or the floor
    would measure something else."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    reg = regimes.get_regime("bursty")
    lp = lrn.LearnerParams()
    sizes = [bench._draw_sizes(reg, lp, seed) for seed in range(20)]
    assert sum(s is None for s in sizes) <= 1  # a second exponentials batch is rare
    seed, (batch, m, n_p) = next((k, s) for k, s in enumerate(sizes) if s is not None)
    real = np.random.default_rng(seed)  # the single env's order: trace, then throughputs
    reg(real)
    lp.draw_throughputs(real)
    mirror = np.random.default_rng(seed)
    bench._random_draws_only(reg, lp, mirror, batch, m, n_p)
    assert mirror.bit_generator.state == real.bit_generator.state
    assert m == reg(np.random.default_rng(seed)).num_requests
    # A wrong size shows: the check cannot pass by construction.
    off = np.random.default_rng(seed)
    bench._random_draws_only(reg, lp, off, batch, m + 1, n_p)
    assert off.bit_generator.state != real.bit_generator.state


# --------------------------------------------------------------------------- lazy merge costs
@pytest.mark.parametrize("regime_kind", ["bursty", "replay", "pressure"])
def test_lazy_merge_costs_equal_the_single_env_costs(regime_kind):
    """The vector env costs merges lazily from its bank; every decision of every env must
    cost exactly ``Episode.merge_cost`` (the batched full computation)."""
    kwargs: dict = {}
    if regime_kind == "replay":
        tr = regimes.get_regime("non-periodic")(np.random.default_rng(5))
        kwargs["regime"] = regimes.ReplayRegime(tr, duration_s=300.0, name="rep")
    elif regime_kind == "pressure":  # a slowdown that varies per bin, and merges that hurt
        kwargs["regime"] = "pressure-heavy"
        kwargs["sidecar"] = replace(
            regimes.get_regime("bursty").sidecar, pressure_gain=0.9, slots=12.0
        )
    venv = DiLoCoSyncVectorEnv(4, **kwargs)
    venv.reset(seed=3)
    single = DiLoCoSyncEnv(**kwargs)
    total = 0.0
    for i in range(4):
        single.reset(seed=int(venv.episode_seeds[i]))
        want = single.unwrapped.episode.merge_cost
        d = np.arange(want.size)
        got = venv._merge_costs(np.full(d.size, i), d)
        np.testing.assert_array_equal(got, want)
        # Mixed envs and decisions in one call, in any order.
        pick = np.random.default_rng(i).permutation(d.size)[:50]
        idx = np.array([i, (i + 1) % 4] * 25)
        both = venv._merge_costs(idx, pick)
        np.testing.assert_array_equal(both[idx == i], want[pick[idx == i]])
        total += want.sum()
    assert total > 0


class _TwoLengths:
    """A generator whose traces have one of two durations (and sometimes no pressure)."""

    name = "two-lengths"
    nominal_rate_rps = 8.0  # bursty's: the reward scale of a generator must be declared

    def __init__(self) -> None:
        self.sidecar = regimes.get_regime("bursty").sidecar

    def __call__(self, rng):
        base = regimes.get_regime("bursty")(rng)
        if rng.random() < 0.5:
            return base
        cut = regimes.Trace(
            base.arrival_s[base.arrival_s < 400.0],
            base.prompt_tokens[base.arrival_s < 400.0],
            base.output_tokens[base.arrival_s < 400.0],
            400.0,
        )
        return cut


def test_matches_single_env_with_mixed_episode_lengths():
    """Episodes of different lengths (and with or without pressure series) restarting in
    the same step are built one by one, still exactly as the single env builds them."""
    counts = lockstep(6, 2, 200, _random_actions(6, 5), regime=_TwoLengths())
    assert counts["episodes_ended"] >= 6


@pytest.mark.parametrize(
    "actions",
    [
        [0, 1, 1],
        (1, 0, 0),
        np.array([1, 0, 1]),
        np.array([True, False, True]),
        np.array([1, 0, 1], dtype=np.int8),
        np.array([1, 0, 1], dtype=np.uint32),
        np.array([1.0, 0.0, 1.0]),
        [1.0, 0, 1],
        [2, 0, 0],
        [-1, 0, 0],
        np.array([1, 0]),
        np.array([[1, 0, 1]]),
        np.array([1, 0, 1], dtype=np.uint64),
        "101",
        None,
    ],
    ids=repr,
)
def test_actions_are_accepted_exactly_as_the_action_space_contains_them(actions):
    env = DiLoCoSyncVectorEnv(3)
    env.reset(seed=0)
    before = env.decisions
    if env.action_space.contains(actions):
        env.step(actions)
        assert (env.decisions > before).all()
    else:
        with pytest.raises(ValueError, match=r"not in the action space MultiDiscrete\(\[2 2 2\]\)"):
            env.step(actions)
        np.testing.assert_array_equal(env.decisions, before)


def test_info_action_mask_on_reset_and_every_step():
    env = DiLoCoSyncVectorEnv(3, skip_forced=False, autoreset_mode=AutoresetMode.SAME_STEP)
    _, info = env.reset(seed=1)
    env.single_action_space.seed(1)  # the same draws every run
    forced = 0
    for _ in range(300):
        mask = info["action_mask"]
        assert mask.dtype == np.int8 and mask.shape == (3, 2) and info["_action_mask"].all()
        np.testing.assert_array_equal(mask, env.action_masks())
        forced += int((mask.sum(axis=1) == 1).sum())
        _, _, _, _, info = env.step(np.array([env.single_action_space.sample(m) for m in mask]))
        assert not info["action_overridden"].any()
    assert forced > 0
