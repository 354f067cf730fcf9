"""DiLoCoFleet-v1, the fleet model v1 (docs/fleet.md, "What v1 changes"): each fix against
model v0, which stays reachable (``model_version=0``, the deprecated ``DiLoCoFleet-v0``)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import fleet_toml

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"


def _plan(version: int, **kw) -> fl.SyncPlan:
    return DiLoCoFleetEnv(fleet=EXAMPLE, model_version=version, **kw).setup.plan


# ----------------------------------------------------------------- 1. own link share
def test_each_site_is_slowed_at_its_own_link_share():
    # The example fleet: eu and us at 10 Gbit/s, asia at 5, small at 2.5 (the slowest). The
    # ring runs at 2.5 Gbit/s, so eu and us use 2.5/10 of their links, asia 2.5/5.
    v1 = _plan(1)
    assert v1.site_shares == (0.25, 0.25, 0.5, 1.0)
    # bursty sidecar: sync_slowdown 0.5; host_share 0.25, exponent 1
    assert v1.slowdowns[0] == pytest.approx(0.5 * (0.25 + 0.75 * 0.25)) == pytest.approx(0.21875)
    assert v1.slowdowns[1] == v1.slowdowns[0]
    assert v1.slowdowns[2] == pytest.approx(0.5 * (0.25 + 0.75 * 0.5))
    assert v1.slowdowns[3] == 0.5  # the slowest site uses its whole link: exactly base
    # model v0 charged every site the full slowdown
    v0 = _plan(0)
    assert v0.slowdowns == (0.5, 0.5, 0.5, 0.5)


def test_streamed_site_share_is_the_ring_share_times_its_link_ratio():
    v1 = _plan(1, mode="streamed", overlap_steps=32)
    u = v1.link_share
    assert 0 < u < 1
    assert v1.site_shares == pytest.approx((0.25 * u, 0.25 * u, 0.5 * u, u))
    assert v1.slowdowns[0] < v1.slowdowns[2] < v1.slowdowns[3]
    # every site's slowdown-seconds are those of its full-rate sending (exponent 1)
    full = _plan(1)
    assert [s * v1.window_s for s in v1.slowdowns] == pytest.approx(
        [s * full.window_s for s in full.slowdowns], rel=1e-12
    )


# ----------------------------------------------------------------- 2. streamed host part
@pytest.mark.parametrize("f", [1, 2, 4])
def test_streamed_slowdown_seconds_equal_full_rate_sending(f):
    # The docs' streamed fragments: 4 bursty sites, 32 bits, overlap_steps = H_min / F.
    def seconds(version, mode):
        p = DiLoCoFleetEnv(
            fragments=f, mode=mode, overlap_steps=128 // f, model_version=version
        ).setup.plan
        return p, [s * p.window_s for s in p.slowdowns]

    full1, s_full1 = seconds(1, "full")
    st1, s_st1 = seconds(1, "streamed")
    assert st1.window_s > full1.window_s and st1.link_share < 1  # really stretched
    assert s_st1 == pytest.approx(s_full1, rel=1e-12)
    # model v0 charged the host part over the whole stretched window: +21 %, +15 %, +5 %
    _, s_full0 = seconds(0, "full")
    _, s_st0 = seconds(0, "streamed")
    extra = s_st0[0] / s_full0[0] - 1
    assert extra == pytest.approx({1: 0.21, 2: 0.15, 4: 0.05}[f], abs=0.01)


def test_streamed_slowdown_seconds_by_hand_and_full_mode_exactly_base():
    # one site of the example fleet, the formula of streamed_slowdown written out
    base, h, gamma = 0.5, 0.25, 1.5
    host, window, share, ratio = 2.0, 20.0, 0.3, 0.25
    link_s = window - host
    coll = share * link_s
    want = (
        base * (h + (1 - h) * ratio**gamma) * host
        + base * h * coll
        + base * (1 - h) * (ratio * share) ** gamma * link_s
    ) / window
    assert fl.streamed_slowdown(base, share, ratio, host, window, h, gamma) == pytest.approx(want)
    # at the full rate: the full-mode slowdown at the site's own share, exactly
    assert fl.streamed_slowdown(base, 1.0, 1.0, host, window, h, gamma) == base
    assert fl.streamed_slowdown(base, 1.0, ratio, host, 7.0, h, gamma) == fl.sync_slowdown(
        base, ratio, h, gamma
    )
    # full mode of an equal-link fleet: every site exactly its sidecar's slowdown
    p = DiLoCoFleetEnv(model_version=1).setup.plan
    assert p.slowdowns == (0.5, 0.5, 0.5, 0.5)


# ----------------------------------------------------------------- 3. the stall
def _eager(env: DiLoCoFleetEnv, seed: int) -> tuple[list[int], float]:
    """Launch whenever allowed; the schedule and the global tokens at the end."""
    env.reset(seed=seed)
    while True:
        *_, trunc, _info = env.step(1)
        if trunc:
            return env.merges, env._state.tokens.item(0)


def _work(gaps_s, drift_s):
    return sum(fl.fragment_work_seconds(g, g, drift_s) for g in gaps_s)


def test_full_mode_stall_reduces_credit_by_the_window_and_overlap_does_not():
    full = DiLoCoFleetEnv(model_version=1)
    streamed = DiLoCoFleetEnv(model_version=1, mode="streamed", overlap_steps=128)
    old = DiLoCoFleetEnv(model_version=0)
    w = full.setup.plan.stall_s
    assert w == full.setup.plan.window_s > 7  # the whole window: 4 sites, 32 bits
    assert streamed.setup.plan.stall_s == 0.0  # the overlap covers the sync
    assert old.setup.plan.stall_s == 0.0
    thr = float(np.sum(DiLoCoFleetEnv().build_episode(4).throughputs))
    drift = full.learner_params.drift_s
    dec = full.params.decision_seconds

    def gaps(merges):
        assert len(merges) > 5
        return np.diff([0, *merges]) * dec

    merges, tokens = _eager(full, 4)
    m2, t_streamed = _eager(streamed, 4)
    m0, t_old = _eager(old, 4)
    # every gap loses the window's compute (the episode starts just after a sync, which
    # stalls too); streamed with overlap and model v0 credit the whole gap
    assert tokens == pytest.approx(thr * _work(gaps(merges) - w, drift), rel=1e-12)
    assert tokens < thr * _work(gaps(merges), drift)
    assert t_streamed == pytest.approx(thr * _work(gaps(m2), drift), rel=1e-12)
    assert t_old == pytest.approx(thr * _work(gaps(m0), drift), rel=1e-12)
    s = full.episode_summary()
    assert s["sync_stall_s"] == w and s["model_version"] == 1


def test_streamed_stall_is_the_part_the_overlap_does_not_cover():
    env = DiLoCoFleetEnv(model_version=1, mode="streamed", overlap_steps=8)
    p = env.setup.plan
    full = DiLoCoFleetEnv(model_version=1).setup.plan.window_s
    assert p.window_s == full and p.link_share == 1.0
    assert p.stall_s == pytest.approx(full - 8 * env.params.step_seconds)


def test_one_site_never_stalls():
    one = fl.FleetParams(sites=(fl.SiteConfig(name="a"),), model_version=1)
    assert DiLoCoFleetEnv(fleet=one).setup.plan.stall_s == 0.0
    assert DiLoCoFleetEnv(fleet=replace(one, merge_seconds=8.0)).setup.plan.stall_s == 0.0


# ----------------------------------------------------------------- 4. fragment credit
def _always_defer_tokens(fragments: int, version: int) -> tuple[int, float, DiLoCoFleetEnv]:
    # streamed, each fragment spread over the minimum gap (no stall): the corridor forces
    # a fragment sync every floor(H_max / F) decisions, so F = 1 and F = 8 move the same
    # bytes per hour (64 decisions between whole-model syncs, 8 between fragment syncs)
    env = DiLoCoFleetEnv(
        fragments=fragments, mode="streamed", overlap_steps=128 // fragments, model_version=version
    )
    assert env.setup.plan.stall_s == 0.0
    env.reset(seed=11)
    while True:
        *_, trunc, _info = env.step(0)
        if trunc:
            return len(env.merges), env._state.tokens.item(0), env


def test_fragment_credit_by_own_staleness_equal_bytes_per_hour():
    """The relation: at an equal number of bytes per hour, evenly spaced and without a
    stall, a fragment sync credits 1/F of the whole model's credit at the same staleness
    (every fragment's own gap is the whole-model gap G): F fragment syncs credit exactly
    what one whole-model sync does, ``efficiency(G) * G * thr``. So F = 8 credits the same
    tokens per whole-model gap as F = 1."""
    n1, t1, e1 = _always_defer_tokens(1, 1)
    n8, t8, e8 = _always_defer_tokens(8, 1)
    assert np.all(np.diff([0, *e1.merges]) == 64) and np.all(np.diff([0, *e8.merges]) == 8)
    per_model_1 = t1 / n1
    per_model_8 = t8 / n8 * 8
    assert per_model_8 == pytest.approx(per_model_1, rel=1e-12)
    g = 64 * e1.params.decision_seconds
    thr = float(np.sum(e1.episode.throughputs))
    assert per_model_1 == pytest.approx(thr * fl.fragment_work_seconds(g, g, 120.0), rel=1e-12)
    # model v0 discounted each fragment by the gap since the previous fragment sync (G / 8)
    n8_0, t8_0, _ = _always_defer_tokens(8, 0)
    _, t1_0, _ = _always_defer_tokens(1, 0)
    assert t8_0 / n8_0 * 8 > 1.3 * (t1_0 / n1)


def test_fragment_work_seconds():
    assert fl.fragment_work_seconds(10.0, 80.0, 120.0) == pytest.approx(10.0 / (1 + 80 / 120))
    assert fl.fragment_work_seconds(10.0, 80.0, 120.0, 5.0) == pytest.approx(
        10.0 / (1 + 80 / 120 + 5 / 80)
    )
    assert fl.fragment_work_seconds(0.0, 80.0, 120.0) == 0.0


# ----------------------------------------------------------------- 5. ring latency
def test_ring_latency_by_hand():
    # access latencies 20, 50, 90, 50 ms (the example fleet, in its order): the hops
    # eu-us 70, us-asia 140, asia-small 140, small-eu 70 ms; a step waits for the largest
    assert fl.ring_latency_seconds([20, 50, 90, 50]) == pytest.approx(0.140)
    assert fl.ring_latency_seconds([20, 50, 90, 50], version=0) == pytest.approx(0.090)
    assert fl.ring_latency_seconds([10, 0, 30]) == pytest.approx(0.040)  # hops 10, 30, 40
    assert fl.ring_latency_seconds([25, 35]) == pytest.approx(0.060)
    assert fl.ring_latency_seconds([50]) == 0.0
    # the example fleet's collective: 2 (N-1)/N x 275 MB x 8 / 2.5 Gbit/s + 2 (N-1) x 140 ms
    p1 = _plan(1)
    assert p1.collective_s == pytest.approx(1.5 * 2.75e8 * 8 / 2.5e9 + 6 * 0.140)
    assert p1.window_s == pytest.approx(0.5 + 1.5 / 4 + p1.collective_s)
    assert _plan(0).collective_s == pytest.approx(1.5 * 2.75e8 * 8 / 2.5e9 + 6 * 0.090)


# ----------------------------------------------------------------- versions and ids
def test_ids_select_the_model_and_v0_warns(tmp_path):
    with pytest.warns(FutureWarning, match="DiLoCoFleet-v0 is deprecated"):
        old = gym.make("DiLoCoFleet-v0").unwrapped
    assert old.fleet.model_version == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = gym.make("DiLoCoFleet-v1", fleet=EXAMPLE).unwrapped
    assert new.fleet.model_version == 1
    # the class keeps model v0; a file's model_version = 1 selects v1
    assert DiLoCoFleetEnv(fleet=EXAMPLE).fleet.model_version == 0
    f = tmp_path / "f.toml"
    f.write_text(EXAMPLE.read_text().replace("[fleet]\n", "[fleet]\nmodel_version = 1\n"))
    assert DiLoCoFleetEnv(fleet=f).fleet.model_version == 1
    assert DiLoCoFleetEnv(fleet=f).setup.plan == new.setup.plan


@pytest.mark.parametrize("value", ["2", "1.0", "true", '"1"'])
def test_bad_model_version_is_one_line_naming_file_and_key(tmp_path, value):
    f = tmp_path / "f.toml"
    f.write_text(f"[fleet]\nmodel_version = {value}\n")
    with pytest.raises(fl.FleetConfigError, match="model_version") as info:
        fleet_toml.load_fleet_toml(f)
    assert str(f) in str(info.value) and "\n" not in str(info.value)
    for bad in (2, 1.0, True, "1"):
        with pytest.raises(fl.FleetConfigError, match=r"model_version must be one of \(0, 1\)"):
            fl.FleetParams(model_version=bad)


# ---------------------------------- checkers (the special case: test_fleet_env.py, both ids)
@pytest.mark.slow
def test_gymnasium_and_sb3_checkers_v1():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        check_env(gym.make("DiLoCoFleet-v1").unwrapped, skip_render_check=True)
        check_env(gym.make("DiLoCoFleet-v1", fleet=EXAMPLE).unwrapped, skip_render_check=True)
        sb3_check(gym.make("DiLoCoFleet-v1", fragments=4, bits=4, mode="streamed"))


def test_each_sync_stalls_the_learners_for_its_own_precision_window():
    env = DiLoCoFleetEnv(model_version=1, bits=32, bits_options=[8, 32])
    plans = zip(env.setup.option_bits, env.setup.option_plans, strict=True)
    stall = {b: p.stall_s for b, p in plans}
    assert stall[8] < stall[32]  # a shorter payload, a shorter window and stall
    env.reset(seed=2)
    k = 0
    while True:
        *_, trunc, info = env.step([1, k % 2])
        k += 1
        if trunc:
            break
    s = info["episode_summary"]
    assert set(s["sync_bits"]) == {8, 32}
    dec = env.params.decision_seconds
    gaps = np.diff([0, *s["merge_decisions"]]) * dec
    before = [32, *s["sync_bits"][:-1]]  # the sync before each (the episode's first: bits)
    compute = gaps - np.array([stall[b] for b in before])
    thr = float(np.sum(env.episode.throughputs))
    want = thr * _work(compute, env.learner_params.drift_s)
    assert env._state.tokens.item(0) == pytest.approx(want, rel=1e-12)
