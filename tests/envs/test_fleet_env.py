"""DiLoCoFleet-v0: the special case is DiLoCoSync-v0 bit for bit; checkers; fleet rules."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv, site_seed
from diloco_gym.sim.fleet import FleetConfigError, FleetParams, SiteConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _real_traces_dir() -> Path:
    if os.environ.get("DILOCO_GYM_REAL_TRACES"):
        return Path(os.environ["DILOCO_GYM_REAL_TRACES"])
    for parent in Path(__file__).resolve().parents[3:5]:
        if (parent / "shared" / "traces" / "real").is_dir():
            return parent / "shared" / "traces" / "real"
    return Path(__file__).resolve().parents[3] / "shared" / "traces" / "real"


REAL = _real_traces_dir()
REAL_FILES = (
    "AzureLLMInferenceTrace_code.csv",
    "AzureLLMInferenceTrace_conv.csv",
    "mooncake_conversation_trace.jsonl",
)
needs_real = pytest.mark.skipif(
    not all((REAL / f).is_file() for f in REAL_FILES), reason=f"real traces not found in {REAL}"
)


def _one_site(**kw):
    return FleetParams(sites=(SiteConfig(name="bursty"),), merge_seconds=8.0, **kw)


def _rollout(env, seed, policy_seed):
    rng = np.random.default_rng(policy_seed)
    obs, info = env.reset(seed=seed)
    out = [(obs.tobytes(), None, None)]
    while True:
        a = int(rng.integers(2))
        obs, r, term, trunc, info = env.step(a)
        out.append((obs.tobytes(), r, info["reward_terms"]))
        if trunc:
            return out, info["episode_summary"]


@pytest.mark.slow
@pytest.mark.parametrize("env_kw", [{}, {"merge_budget": 20}])
@pytest.mark.parametrize("fleet_id", ["DiLoCoFleet-v0", "DiLoCoFleet-v1"])
def test_special_case_is_the_single_env_bit_for_bit(env_kw, fleet_id):
    """A one-site fleet is the single env, under either fleet model (one site has no
    collective: no link share, no stall, no ring latency)."""
    single = gym.make("DiLoCoSync-v0", **env_kw).unwrapped
    fleet = gym.make(fleet_id, fleet=_one_site(), **env_kw).unwrapped
    assert fleet.fleet.model_version == int(fleet_id[-1])
    assert fleet.setup.plan.stall_s == 0.0
    assert fleet.observation_space == single.observation_space
    for seed in (0, 7, 123):
        a, sa = _rollout(single, seed, seed)
        b, sb = _rollout(fleet, seed, seed)
        assert a == b  # observations (bytes), rewards and reward terms, every step
        for k, v in sa.items():
            assert sb[k] == v or (v != v and sb[k] != sb[k]), k


def test_special_case_oracle_costs_equal():
    single = gym.make("DiLoCoSync-v0").unwrapped
    fleet = gym.make("DiLoCoFleet-v0", fleet=_one_site()).unwrapped
    single.reset(seed=3)
    fleet.reset(seed=3)
    assert np.array_equal(single.oracle_costs(), fleet.oracle_costs())


@pytest.mark.slow
def test_gymnasium_and_sb3_checkers_default():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        check_env(gym.make("DiLoCoFleet-v0").unwrapped, skip_render_check=True)
        sb3_check(gym.make("DiLoCoFleet-v0", fragments=4, bits=4, mode="streamed"))


@needs_real
@pytest.mark.slow
def test_checkers_real_trace_fleet(monkeypatch):
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    monkeypatch.setenv("DILOCO_GYM_REAL_TRACES", str(REAL))
    env = gym.make("DiLoCoFleet-v0", fleet=EXAMPLES / "fleet-real.toml")
    check_env(env.unwrapped, skip_render_check=True)
    sb3_check(env)
    assert env.unwrapped.setup.independent_episodes >= 6
    # seeds below the tile count replay disjoint windows: different traffic per seed
    u = env.unwrapped
    u.reset(seed=0)
    a = u.episode.sites[1].trace.arrival_s.copy()
    u.reset(seed=1)
    assert not np.array_equal(a, u.episode.sites[1].trace.arrival_s)


def test_observation_layout_and_names():
    env = DiLoCoFleetEnv(fleet=FleetParams(fragments=4))
    names = [f[0] for f in env.obs_features]
    assert len(names) == 17 + 7 * 3 + 4 == env.observation_space.shape[0]
    assert names[7] == "site0.network" and "site3.rate_trend" in names
    assert names[-4:] == [f"fragment{j}_staleness" for j in range(4)]
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    # the second site's block is that site's own episode features
    i = env.obs_index["site1.network"]
    d = env.decision
    assert np.array_equal(obs[i : i + 7], env.episode.sites[1].exo[d])


def test_sites_are_independent_and_seeded():
    env = DiLoCoFleetEnv()
    env.reset(seed=5)
    arr = [s.trace.arrival_s for s in env.episode.sites]
    assert not np.array_equal(arr[0][:50], arr[1][:50])
    assert site_seed(5, 0) == 5 and site_seed(5, 1) != site_seed(6, 1)
    env2 = DiLoCoFleetEnv()
    env2.reset(seed=5)
    assert all(np.array_equal(a.trace.arrival_s, b.trace.arrival_s)
               for a, b in zip(env.episode.sites, env2.episode.sites, strict=True))  # fmt: skip


def test_cost_is_the_sum_over_sites_and_summary_shares():
    env = DiLoCoFleetEnv()
    env.reset(seed=2)
    ep = env.episode
    total = sum(e.merge_cost for e in ep.sites)
    assert np.allclose(env.oracle_costs(), total)
    while True:
        _, _, _, trunc, info = env.step(1)
        if trunc:
            break
    s = info["episode_summary"]
    assert s["sync_excess_requests"] == sum(x["sync_excess_requests"] for x in s["sites"])
    assert s["requests"] == sum(x["requests"] for x in s["sites"])
    assert sum(x["share_of_excess"] for x in s["sites"]) == pytest.approx(1.0)
    assert s["worst_site_sync_excess_pct"] == max(x["sync_excess_pct"] for x in s["sites"])
    assert s["additive_excess_requests"] == pytest.approx(
        sum(ep.sites[i].merge_cost[s["merge_decisions"]].sum() for i in range(4))
    )


def test_worst_site_weight_adds_the_normalised_max():
    plain = DiLoCoFleetEnv()
    weighted = DiLoCoFleetEnv(worst_site_weight=2.0)
    plain.reset(seed=4)
    weighted.reset(seed=4)
    c = np.stack([e.merge_cost for e in weighted.episode.sites])
    norm = np.asarray(weighted.setup.norm)[:, None]
    expect = plain.oracle_costs() + 2.0 * (c * norm).max(axis=0)
    assert np.allclose(weighted.oracle_costs(), expect)
    assert weighted.episode.merge_cost_at(10) == pytest.approx(expect[10])


@pytest.mark.parametrize("f", [2, 4, 8])
def test_no_fragment_starves_and_none_syncs_early(f):
    env = DiLoCoFleetEnv(fragments=f, bits=4)
    rng = np.random.default_rng(f)
    env.reset(seed=f)
    while True:
        _, _, _, trunc, info = env.step(int(rng.integers(2)))
        st = env.fragment_staleness()
        assert st.max() <= f * env.params.h_max  # within the full-model H_max
        if trunc:
            break
    merges = info["episode_summary"]["merge_decisions"]
    h_full_min = env.params.h_min * f
    own = np.diff(merges[::1])
    assert np.all(own >= env.params.h_min) and np.all(own <= env.params.h_max)
    # each fragment's own gaps (every F-th sync) stay in the full-model corridor
    for j in range(f):
        g = np.diff(merges[j::f])
        assert np.all(g >= h_full_min) and np.all(g <= env.params.h_max * f)


def test_quantisation_charges_progress():
    full = DiLoCoFleetEnv(bits=32, progress_weight=1.0)
    q4 = DiLoCoFleetEnv(bits=4, progress_weight=1.0)
    for e in (full, q4):
        e.reset(seed=0)
        while True:
            _, _, _, trunc, info = e.step(1)
            if trunc:
                break
    sf, sq = full.episode_summary(), q4.episode_summary()
    assert sq["merge_decisions"] == sf["merge_decisions"]
    assert sq["progress"] == pytest.approx(sf["progress"] * (1 - 0.01 * 3))
    assert sq["sync_window_s"] < sf["sync_window_s"]


def test_determinism_same_seed_same_everything():
    a, sa = _rollout(DiLoCoFleetEnv(fragments=2), 11, 0)
    b, sb = _rollout(DiLoCoFleetEnv(fragments=2), 11, 0)
    assert a == b and sa == sb


def test_observation_is_causal():
    """Two fleets whose site traces agree up to t give equal observations up to t."""
    env = DiLoCoFleetEnv()
    env.reset(seed=8)
    ep = env.episode
    d = 30
    cut = d * env.params.decision_seconds
    for e in ep.sites:
        assert np.all(np.isfinite(e.exo[:d]))
    # exo rows are computed from arrivals strictly before each decision: truncating the
    # site traces after ``cut`` leaves the first d rows unchanged
    from diloco_gym.envs.episode import build_episode
    from diloco_gym.sim.traces import window

    for e in ep.sites:
        tr = window(e.trace, 0.0, e.trace.duration_s)
        keep = tr.arrival_s < cut
        short = type(tr)(
            tr.arrival_s[keep], tr.prompt_tokens[keep], tr.output_tokens[keep], tr.duration_s,
            network=tr.network, checkpoint=tr.checkpoint, name=tr.name,
        )  # fmt: skip
        e2 = build_episode(
            short, env.params, e.sidecar, env.learner_params, np.random.default_rng(0)
        )
        assert np.array_equal(e2.exo[:d], e.exo[:d])


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(TypeError, match="unknown DiLoCoFleetEnv argument"):
        DiLoCoFleetEnv(fragmentz=2)
    with pytest.raises(FleetConfigError, match="empty gap range"):
        DiLoCoFleetEnv(fragments=80)
    with pytest.raises(FleetConfigError, match="does not fit the fragment corridor"):
        DiLoCoFleetEnv(fragments=16, model_params=1e11)
    with pytest.raises(ValueError, match="not in the action space Discrete"):
        env = DiLoCoFleetEnv()
        env.reset(seed=0)
        env.step(3)
