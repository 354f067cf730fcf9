"""The fleet's per-site serving cap (``site_cap_pp``): it binds, it is causal, off by
default changes nothing, bad values are one-line errors, the checkers pass with it on."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from diloco_gym.envs import fleet_cap
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.sim.fleet import FleetConfigError, FleetParams, SiteConfig
from diloco_gym.sim.sidecar import cost_horizon

CAP = 12.0


def _busy_fleet(cap: float | None = None, sidecar: tuple = (), **kw) -> FleetParams:
    """Two sites: an ordinary one the syncs barely touch and a bursty, busy one."""
    sites = (
        SiteConfig(name="calm", regime="ordinary", sidecar=sidecar),
        SiteConfig(name="busy", regime="bursty", sidecar=sidecar),
    )
    return FleetParams(sites=sites, site_cap_pp=cap, **kw)


def _always_launch(env, seed, perturb=None):
    """Run an agent that always asks to launch; per decision the mask, observation and
    reward. ``perturb``: called once after the reset (to alter the env's cap tracker)."""
    obs, info = env.reset(seed=seed)
    if perturb is not None:
        perturb(env)
    rows = [(info["decision"], tuple(info["action_mask"]), obs.tobytes(), None)]
    while True:
        obs, r, _, trunc, info = env.step(1)
        rows.append((info["decision"], tuple(info["action_mask"]), obs.tobytes(), r))
        if trunc:
            return rows, info["episode_summary"]


def test_the_cap_binds_on_the_busy_site():
    """Uncapped, an always-launching agent takes the busy site past the cap; capped, the
    busy site's own excess (the cap's measure) stays under it on every seed, the calm site
    keeps its excess, and the cap's counters say it bound."""
    free = DiLoCoFleetEnv(_busy_fleet())
    capped = DiLoCoFleetEnv(_busy_fleet(CAP))
    for seed in (0, 1, 2):
        _, s_free = _always_launch(free, seed)
        _, s_cap = _always_launch(capped, seed)
        busy_free = s_free["sites"][1]
        assert busy_free["sync_excess_pct"] > CAP + 5
        used = s_cap["site_cap_used_pp"]
        assert used["busy"] <= CAP
        assert s_cap["sites"][1]["sync_excess_pct"] < busy_free["sync_excess_pct"] - 5
        assert s_cap["merges"] < s_free["merges"]
        assert s_cap["cap_masked_decisions"] > 0
        assert s_cap["cap_vetoed_launches"] == s_cap["cap_masked_decisions"]
        assert "site_cap_used_pp" not in s_free


def test_a_masked_launch_is_a_defer_and_overridden():
    env = DiLoCoFleetEnv(_busy_fleet(CAP))
    env.reset(seed=0)
    seen = 0
    while seen < 3:
        mask = env.action_masks()
        merges = len(env.merges)
        _, _, _, trunc, info = env.step(1)
        assert not trunc
        if mask[0] and not mask[1]:
            seen += 1
            assert info["action_overridden"]
            assert not info["merged"]
            assert len(env.merges) == merges
        elif mask[1]:
            assert not info["action_overridden"]


def test_the_mask_and_observation_are_causal():
    """Two runs whose syncs cost the same where their cost windows end by decision D (and
    differ after) give the same masks and observations at every decision up to D: the cap
    reads only settled costs. The perturbation does change the run after D (the test can
    fail), and the mask binds before D (it is not vacuous). A 30 s ``tail_s`` makes a
    sync's cost window longer than the corridor's H_min, so the next launches are decided
    while it is still open."""
    env = DiLoCoFleetEnv(_busy_fleet(8.0, sidecar=(("tail_s", 30.0),)))
    p = env.params
    # a sync's cost counts requests up to its window and tail_s after (its cost horizon,
    # in steps), computed here apart from the cap's own settle lags
    steps = max(cost_horizon(sc, p.step_seconds, p.merge_steps) for sc in env.setup.sidecars)
    lag = steps // p.decision_interval + 1
    base, summary = _always_launch(env, 3)
    # D: just before the cost window of the first sync after the cap first masked ends
    first_masked = next(d for d, m, _, _ in base if m == (1, 0))
    launch = next(d for d in summary["merge_decisions"] if d > first_masked)
    horizon = launch + lag - 1

    def perturb(e):
        record = e._cap.record

        def late_costs_times_7(d, option, costs):
            scale = 7.0 if d + lag > horizon else 1.0
            record(d, option, np.asarray(costs) * scale)

        e._cap.record = late_costs_times_7

    other, _ = _always_launch(env, 3, perturb)
    upto = [r for r in base if r[0] <= horizon]
    assert any(launch < r[0] for r in upto)  # a decision inside that sync's cost window
    assert upto == other[: len(upto)]
    assert base != other  # the run after D saw the perturbed costs: the test can fail


def test_cap_state_ignores_unsettled_costs():
    past_d = np.array([[10, 30]])
    lags = np.array([[[18, 18]]])
    costs = np.array([[[5.0, 2.0]]])
    settled, pending, forecast = fleet_cap.cap_state(np.array([40]), past_d, costs, lags)
    assert (settled[0, 0], pending[0, 0], forecast[0, 0]) == (5.0, 1, 5.0)
    costs2 = np.array([[[5.0, 900.0]]])
    assert np.array_equal(fleet_cap.cap_state(np.array([40]), past_d, costs2, lags)[0], settled)
    # at d = 48 the second sync has settled
    assert fleet_cap.cap_state(np.array([48]), past_d, costs, lags)[0][0, 0] == 7.0


def test_default_off_changes_nothing():
    """No cap, or a cap left unset explicitly: the same observations (layout included),
    rewards and summaries; a cap too loose to bind changes no observation feature of the
    default layout, no reward and no schedule (the cap machinery perturbs nothing)."""
    a = DiLoCoFleetEnv(_busy_fleet())
    b = DiLoCoFleetEnv(_busy_fleet(None))
    loose = DiLoCoFleetEnv(_busy_fleet(100.0))
    assert a.observation_space == b.observation_space
    assert a.obs_features == b.obs_features
    assert not any(n.endswith(".cap_used") for n in a.obs_index)
    n0 = a.observation_space.shape[0]
    assert loose.observation_space.shape[0] == n0 + 2
    assert [f[0] for f in loose.obs_features[n0:]] == ["calm.cap_used", "busy.cap_used"]
    ra, sa = _always_launch(a, 5)
    rb, sb = _always_launch(b, 5)
    rl, sl = _always_launch(loose, 5)
    assert ra == rb and sa == sb
    assert [(d, m, o[: 4 * n0], r) for d, m, o, r in rl] == ra
    assert sl["merge_decisions"] == sa["merge_decisions"]
    assert sl["cap_masked_decisions"] == 0 and sl["cap_overridden_syncs"] == 0


def test_cap_feature_is_the_settled_excess_over_the_cap():
    env = DiLoCoFleetEnv(_busy_fleet(CAP))
    obs, _ = env.reset(seed=1)
    assert np.array_equal(obs[-2:], np.zeros(2, dtype=np.float32))
    for _ in range(120):
        obs, *_ = env.step(1)
    lags = fleet_cap.settle_lags(env.params, env.setup.sidecars)
    d = env.decision
    costs = env.episode.site_costs
    nominal = fleet_cap.site_nominal_requests(env.setup)
    want = [
        sum(costs[i, m] for m in env.merges if d - m >= lags[i]) / (CAP / 100 * nominal[i])
        for i in range(2)
    ]
    assert obs[-1] > 0
    assert np.allclose(obs[-2:], np.minimum(1.0, want), atol=1e-6)
    assert env.observation_space.contains(obs)


def test_env_schedule_replays_under_the_protocol_check():
    """The env's capped schedule passes the protocol's replay of the rule, which counts
    the same forced syncs over the cap."""
    env = DiLoCoFleetEnv(_busy_fleet(CAP))
    _, s = _always_launch(env, 2)
    lags = fleet_cap.settle_lags(env.params, env.setup.sidecars)
    caps = CAP / 100 * fleet_cap.site_nominal_requests(env.setup)
    sched = np.asarray([s["merge_decisions"]])
    ok, forced = fleet_cap.schedules_respect_cap(
        sched, env.episode.site_costs, lags, caps, env.params.h_max
    )
    assert ok[0] and forced[0] == s["cap_overridden_syncs"]
    # the uncapped schedule of the same episode breaks the rule
    free = DiLoCoFleetEnv(_busy_fleet())
    _, s_free = _always_launch(free, 2)
    ok_free, _ = fleet_cap.schedules_respect_cap(
        np.asarray([s_free["merge_decisions"]]), env.episode.site_costs, lags, caps,
        env.params.h_max,
    )  # fmt: skip
    assert not ok_free[0]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), 150.0, "5", True])
def test_bad_cap_values_are_one_line_errors(value):
    with pytest.raises(FleetConfigError, match="site_cap_pp") as exc:
        _busy_fleet(value)
    assert "\n" not in str(exc.value)


def test_bad_cap_in_a_file_names_the_file_and_key(tmp_path):
    path = tmp_path / "capped.toml"
    path.write_text('[fleet]\nsite_cap_pp = -2.0\n\n[[site]]\nname = "a"\n')
    with pytest.raises(FleetConfigError) as exc:
        DiLoCoFleetEnv(fleet=path)
    msg = str(exc.value)
    assert str(path) in msg and "site_cap_pp" in msg and "\n" not in msg
    path.write_text("[fleet]\nsite_cap_pp = 5.0\n\n[env]\nmerge_budget = 30\n")
    with pytest.raises(FleetConfigError) as exc:
        DiLoCoFleetEnv(fleet=path)
    msg = str(exc.value)
    assert str(path) in msg and "site_cap_pp" in msg and "merge_budget" in msg
    path.write_text('[fleet]\nsite_cap_pp = 5.0\n\n[[site]]\nname = "a"\n')
    assert DiLoCoFleetEnv(fleet=path).fleet.site_cap_pp == 5.0


def test_gymnasium_and_sb3_checkers_with_the_cap():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        check_env(DiLoCoFleetEnv(_busy_fleet(CAP)), skip_render_check=True)
        sb3_check(DiLoCoFleetEnv(_busy_fleet(CAP, fragments=2)))


def test_the_cap_with_the_precision_action():
    """With ``bits_options`` the cap masks the launch component; actions sampled from
    the info's mask are never overridden, and each option has its own settle lags."""
    env = DiLoCoFleetEnv(_busy_fleet(CAP, fragments=2, bits_options=(4, 32), model_version=1))
    env.action_space.seed(0)
    _, info = env.reset(seed=0)
    masked = 0
    while True:
        launch_mask = info["action_mask"][0]
        masked += int(launch_mask[0] and not launch_mask[1])
        action = env.action_space.sample(mask=info["action_mask"])
        _, _, _, trunc, info = env.step(action)
        assert not info["action_overridden"]
        if trunc:
            break
    s = info["episode_summary"]
    assert masked > 0 and s["cap_vetoed_launches"] == 0
    assert {env._cap.lags_of(k).shape for k in (0, 1)} == {(2,)}


def test_the_rounds_replay_applies_the_cap_per_site():
    """The cap's replay on rounds schedules (per-site timing), on costs made by hand: one
    site at cost 10 per contribution, settled after 1 decision. A round the corridor does
    not force opens only when quorum sites may contribute; a contribution the rules may
    have forced (the window's end with the quorum not yet met) is exempt."""
    from diloco_gym.sim import rounds as rd

    costs = np.full((1, 50), 10.0)  # 50 decisions: the last is 49
    lags = np.array([1])
    rules = rd.RoundRules(grace=4, quorum=1, delay_max=(0,), weights=(1.0,))
    openings = np.array([[5, 20]])

    def kept(cap, sends):
        table = np.array([sends])[:, :, None]
        return fleet_cap.rounds_respect_cap(
            openings, table, rules, costs, lags, np.array([cap]), 30
        )[0]

    # at the second opening: settled 10, forecast 10, no reserve (49 - 20 < 30): need 20
    assert kept(25.0, [5, 20]) and not kept(15.0, [5, 20])
    # the second round's contribution at its window's end (24) would be forced only if the
    # round had opened: the opening itself is refused
    assert not kept(15.0, [5, 24])
    # a round the corridor forces (gap 30 >= H_max) opens whatever the cap; its one
    # contribution at the window's end (quorum not met before) is exempt, earlier it is not
    forced = np.array([[5, 35]])
    for sends, want in (([5, 39], True), ([5, 35], False)):
        table = np.array([sends])[:, :, None]
        got = fleet_cap.rounds_respect_cap(forced, table, rules, costs, lags, np.array([15.0]), 30)
        assert got[0] == want, sends
    # the table of contributions from per-site decision lists
    t = fleet_cap.contribution_table(np.array([[5, 20]]), [[[7], [20]]], 2)
    assert t.tolist() == [[[7, -1], [-1, 20]]]
