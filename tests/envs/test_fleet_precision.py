"""DiLoCoFleet-v0's optional per-sync precision action (``bits_options``)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.sim.fleet import FleetConfigError, FleetParams, progress_factor
from diloco_gym.sim.fleet_toml import fleet_from_dict


def _run(env, seed, actions):
    """Roll ``env`` out with ``actions(rng, step) -> action``; every step's bytes and reward."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = [obs.tobytes()]
    t = 0
    while True:
        obs, r, _, trunc, info = env.step(actions(rng, t))
        out.append((obs.tobytes(), r, info["reward_terms"]))
        t += 1
        if trunc:
            return out, info["episode_summary"]


def _same_summary(a, b, skip=()):
    for k, v in a.items():
        if k in skip:
            continue
        assert b[k] == v or (v != v and b[k] != b[k]), k


def test_one_option_is_the_discrete_env_bit_for_bit():
    plain = DiLoCoFleetEnv(fragments=2, bits=8)
    one = DiLoCoFleetEnv(fragments=2, bits=8, bits_options=(8,))
    assert one.action_space == gym.spaces.MultiDiscrete([2, 1])
    for seed in (0, 5):
        a, sa = _run(plain, seed, lambda rng, t: int(rng.integers(2)))
        b, sb = _run(one, seed, lambda rng, t: [int(rng.integers(2)), 0])
        assert a == b
        _same_summary(sa, sb)
        assert sb["sync_bits"] == [8] * len(sb["merge_decisions"])


def test_options_change_each_syncs_window_cost_and_credit():
    env = DiLoCoFleetEnv(fragments=2, bits=32, bits_options=(4, 32), progress_weight=1.0)
    s = env.setup
    assert s.option_bits == (4, 32) and s.default_option == 1
    w4, w32 = (pl.window_s for pl in s.option_plans)
    assert w4 < w32 and env.params.merge_seconds == w32  # the base window is the longest
    # alternate the precision on every launch; the summary records each sync's own
    _, summ = _run(env, 3, lambda rng, t: [1, t % 2])
    bits = summ["sync_bits"]
    assert len(bits) == len(summ["merge_decisions"]) > 4 and set(bits) == {4, 32}
    assert summ["sync_windows_s"] == [w4 if b == 4 else w32 for b in bits]
    # each sync's cost is that precision's isolated cost at its decision
    ep = env.episode
    for d, b, c in zip(summ["merge_decisions"], bits, summ["merge_costs_requests"], strict=True):
        assert c == ep.merge_cost_at(d, s.option_bits.index(b))
    # a shorter window costs no more than a longer one at the same decision, and less somewhere
    c4 = np.array([ep.merge_cost_at(d, 0) for d in range(ep.n_decisions)])
    c32 = np.array([ep.merge_cost_at(d, 1) for d in range(ep.n_decisions)])
    assert np.all(c4 <= c32 + 1e-9) and np.any(c4 < c32)


def test_progress_credit_follows_the_chosen_precision():
    kw = {"fragments": 2, "progress_weight": 1.0}
    always4 = DiLoCoFleetEnv(bits=4, **kw)
    mixed = DiLoCoFleetEnv(bits=32, bits_options=(4, 32), **kw)
    always32 = DiLoCoFleetEnv(bits=32, **kw)
    _, s4 = _run(always4, 1, lambda rng, t: 1)
    _, s32 = _run(always32, 1, lambda rng, t: 1)
    _, sm4 = _run(mixed, 1, lambda rng, t: [1, 0])
    _, sm32 = _run(mixed, 1, lambda rng, t: [1, 1])
    # choosing one precision throughout is that fixed-precision fleet's progress
    assert sm4["merge_decisions"] == s4["merge_decisions"]
    assert sm4["progress"] == pytest.approx(s4["progress"])
    assert sm32["progress"] == pytest.approx(s32["progress"])
    assert s4["progress"] == pytest.approx(s32["progress"] * progress_factor(4, 0.01))


def test_action_mask_samples_and_checkers():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = DiLoCoFleetEnv(fragments=2, bits_options=(4, 8, 32))
    env.action_space.seed(0)  # the same draws every run
    _, info = env.reset(seed=0)
    assert env.action_masks().shape == (2 + 3,)
    for _ in range(40):
        a = env.action_space.sample(info["action_mask"])
        assert info["action_mask"][0][a[0]]  # a sampled launch is one the corridor allows
        _, _, _, trunc, info = env.step(a)
        if trunc:
            break
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        check_env(DiLoCoFleetEnv(fragments=2, bits_options=(4, 32)), skip_render_check=True)
        sb3_check(gym.make("DiLoCoFleet-v0", fragments=2, bits_options=[8, 32]))


def test_determinism_with_precision_action():
    def pick(rng, t):
        return [int(rng.integers(2)), int(rng.integers(3))]

    a = _run(DiLoCoFleetEnv(bits_options=(4, 8, 32)), 9, pick)
    b = _run(DiLoCoFleetEnv(bits_options=(4, 8, 32)), 9, pick)
    assert a == b


def test_bad_precision_actions_and_options_are_one_line_errors(tmp_path):
    env = DiLoCoFleetEnv(bits_options=(4, 32))
    env.reset(seed=0)
    for bad in (1, [1, 2], [2, 0], [1, 0, 0]):
        with pytest.raises(ValueError, match=r"precision index 0\.\.1.*bits_options=\(4, 32\)"):
            env.step(bad)
    with pytest.raises(FleetConfigError, match="bits \\(32\\) must be one of bits_options"):
        FleetParams(bits_options=(4, 8))
    with pytest.raises(FleetConfigError, match="each must be one of"):
        FleetParams(bits_options=(3, 32))
    with pytest.raises(FleetConfigError, match="must not repeat"):
        FleetParams(bits_options=(32, 32))
    with pytest.raises(FleetConfigError, match="non-empty list"):
        FleetParams(bits_options=())
    with pytest.raises(FleetConfigError, match="'bits_options' must be a list of integers"):
        fleet_from_dict({"fleet": {"bits_options": 8}}, where="f.toml")
    with pytest.raises(FleetConfigError, match="f.toml"):
        fleet_from_dict({"fleet": {"bits_options": [8, "x"]}}, where="f.toml")


def test_toml_key(tmp_path):
    p = tmp_path / "fleet.toml"
    p.write_text("[fleet]\nbits = 8\nbits_options = [4, 8]\n")
    env = gym.make("DiLoCoFleet-v0", fleet=p).unwrapped
    assert env.fleet.bits_options == (4, 8)
    assert env.action_space == gym.spaces.MultiDiscrete([2, 2])


def test_protocol_refuses_the_precision_action(tmp_path):
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol
    from diloco_gym.rl.config import ConfigError, TrainConfig
    from diloco_gym.rl.env_specs import build_env_specs
    from diloco_gym.scale.fleet_points import fleet_point_config

    p = tmp_path / "fleet.toml"
    p.write_text('[fleet]\nbits_options = [4, 32]\n[[site]]\nname = "bursty"\n')
    msg = r"scores fixed-precision fleets only.*bits_options \[4, 32\].*Remove bits_options"
    with pytest.raises(FleetConfigError, match="the fleet report " + msg):
        run_protocol(FleetReportConfig(fleet=str(p), agents=["random"], seeds=2))
    with pytest.raises(FleetConfigError, match="a fleet sweep point " + msg):
        fleet_point_config({"fleet": str(p)}, tmp_path, {})
    with pytest.raises(ConfigError, match="fleet training " + msg):  # before any run starts
        build_env_specs(TrainConfig(fleet=str(p), budgets_per_hour=[48.0]), "t.toml")
