"""The fleet with per-site timing (envs/fleet_rounds.py)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.fleet_rounds import DiLoCoFleetRoundsEnv, make_fleet_env
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import rounds as rd

LONG = {"h_min_steps": 256}  # room for a round of up to 18 s before the next may open


def rounds_env(
    n=4, grace=0.0, quorum=None, delays=None, speeds=None, fragments=1, bits_options=None, **kw
):
    sites = tuple(
        fl.SiteConfig(
            name=f"s{i}",
            delay_max_s=0.0 if delays is None else delays[i],
            compute_speed=1.0 if speeds is None else speeds[i],
        )
        for i in range(n)
    )
    precision = {} if bits_options is None else {"bits": 8, "bits_options": bits_options}
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", grace_s=grace, quorum=quorum,
        fragments=fragments, **precision,
    )  # fmt: skip
    return gym.make("DiLoCoFleet-v1", fleet=f, **kw).unwrapped


def rollout(env, policy, seed):
    obs, info = env.reset(seed=seed)
    steps = [(obs, 0.0, info)]
    k = 0
    while True:
        obs, r, term, trunc, info = env.step(policy(k, obs, info))
        steps.append((obs, r, info))
        k += 1
        if trunc:
            return steps


def masked_rollout(env, seed):
    """Actions drawn from the env's sample mask (seeded), every observation in the space:
    each step's info, and the episode summary."""
    obs, info = env.reset(seed=seed)
    env.action_space.seed(seed)
    steps = []
    while True:
        obs, r, term, trunc, info = env.step(env.action_space.sample(mask=info["action_mask"]))
        assert env.observation_space.contains(obs)
        steps.append(info)
        if trunc:
            return steps, info["episode_summary"]


def replay_keeps(env, summary) -> bool:
    """Whether the protocol's replay of the site cap (fleet_cap.rounds_respect_cap, with
    the episode's costs and each decision's settle lags) keeps the env's own rounds."""
    from diloco_gym.envs import fleet_cap
    from diloco_gym.eval.fleet_cap import cap_check

    ep, check = env.episode, cap_check(env)
    names = env.setup.site_names
    rows = [[list(summary["site_sync_decisions"][nm]) for nm in names]]
    openings = np.array([summary["round_openings"]])
    table = fleet_cap.contribution_table(openings, rows, len(names))
    ok = fleet_cap.rounds_respect_cap(
        openings, table, env.rules, ep.site_costs, check.lags_for(ep), check.caps,
        env.params.h_max,
    )  # fmt: skip
    return bool(ok[0])


@pytest.mark.parametrize("n, fragments", [(1, 1), (4, 1), (1, 2), (4, 2), (4, 4)])
def test_the_one_instant_special_case_is_the_fleet_env_bit_for_bit(n, fragments):
    """No grace window, every site in the quorum, no stragglers: the fleet env, with one
    fragment or several (each round syncs the next fragment, as each sync does)."""
    sites = tuple(fl.SiteConfig(name=f"s{i}") for i in range(n))
    one = fl.FleetParams(sites=sites, fragments=fragments)
    base = gym.make("DiLoCoFleet-v1", fleet=one).unwrapped
    rnd = rounds_env(n, fragments=fragments)
    assert type(base) is DiLoCoFleetEnv and type(rnd) is DiLoCoFleetRoundsEnv
    for seed in (0, 7):
        launch = np.random.default_rng(seed).random(2000) < 0.2
        a = rollout(base, lambda k, o, i, go=launch: int(go[k]), seed)
        b = rollout(rnd, lambda k, o, i, go=launch: np.full(n, int(go[k])), seed)
        assert len(a) == len(b)
        k = base.observation_space.shape[0]
        for (oa, ra, ia), (ob, rb, ib) in zip(a, b, strict=True):
            assert np.array_equal(oa, ob[:k]) and ra == rb
            assert ia["reward_terms"] == ib["reward_terms"]
            for key in ia:
                if key not in ("action_mask", "episode_summary"):
                    assert ia[key] == ib[key], key
        sa, sb = a[-1][2]["episode_summary"], b[-1][2]["episode_summary"]
        assert sa["merges"] > 3
        for key in sa:
            assert sa[key] == sb[key], key
        assert sb["round_sites"] == [list(range(n))] * sa["merges"]


def test_make_picks_the_env_by_timing(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text(
        '[fleet]\nmodel_version = 1\ntiming = "rounds"\ngrace_s = 4.5\n'
        '[[site]]\nname = "a"\nregime = "bursty"\n[env]\nh_min_steps = 256\n'
    )
    assert type(gym.make("DiLoCoFleet-v1", fleet=str(p)).unwrapped) is DiLoCoFleetRoundsEnv
    assert type(make_fleet_env(fleet=str(p))) is DiLoCoFleetRoundsEnv
    assert type(gym.make("DiLoCoFleet-v1").unwrapped) is DiLoCoFleetEnv
    env = gym.make("DiLoCoFleet-v1", timing="rounds", grace_s=4.5, **LONG).unwrapped
    assert type(env) is DiLoCoFleetRoundsEnv and env.rules.grace == 4
    with pytest.raises(ValueError, match="minimum gap of 16 decisions"):
        gym.make("DiLoCoFleet-v1", timing="rounds", grace_s=18.0)


def test_spaces_and_bad_actions():
    env = rounds_env(3, grace=4.5, **LONG)
    assert env.action_space == gym.spaces.MultiBinary(3)
    names = [f[0] for f in env.obs_features]
    assert names[-8:] == ["round_open", "round_age"] + [
        f"s{i}.{x}" for i in range(3) for x in ("ready", "sent")
    ]
    env.reset(seed=0)
    assert env.action_masks().shape == (6,)
    for bad in (1, [1, 0], [0, 2, 1], "x"):
        with pytest.raises(ValueError, match=r"not in MultiBinary\(3\): expected one 0 or 1"):
            env.step(bad)


def test_env_checkers_pass():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = rounds_env(2, grace=4.5, **LONG)
    check_env(env, skip_render_check=True)
    sb3_check(env)


def test_a_late_site_is_charged_when_it_contributes():
    env = rounds_env(4, grace=9.0, **LONG)

    def one_site_first(k, obs, info):
        if obs[env.obs_index["round_open"]] < 0.5:
            return np.array([1, 0, 0, 0])
        return np.zeros(4, dtype=int)  # the others wait for the window's end

    steps = rollout(env, one_site_first, 3)
    s = steps[-1][2]["episode_summary"]
    scale = env.episode.reward_per_request
    charged = -sum(i["reward_terms"]["sync_excess"] for _, _, i in steps) / scale
    assert charged == pytest.approx(s["additive_excess_requests"], rel=1e-12)
    assert steps[-1][2]["excess_requests_so_far"] == pytest.approx(charged, rel=1e-12)
    g = env.rules.grace
    for o, sites in zip(s["round_openings"], s["round_sites"], strict=True):
        assert sites == [0, 1, 2, 3]
        assert o in s["site_sync_decisions"]["s0"]
        for name in ("s1", "s2", "s3"):
            assert min(o + g, env.episode.n_decisions - 1) in s["site_sync_decisions"][name]
    assert sum(s["merge_costs_requests"]) == pytest.approx(s["additive_excess_requests"])


def test_dropped_sites_take_their_token_share_back():
    """A round merges only its contributing sites' share of the tokens (token-weighted):
    after the first round closes the global model holds a quarter of the full round's
    tokens, and the progress credited over the episode is the loss curve's decrease to the
    tokens merged (the reward's progress terms sum to it)."""
    from diloco_gym.sim import learners as lrn

    env = rounds_env(4, grace=4.5, quorum=2, speeds=[1.0, 1.0, 1.0, 5.0], **LONG)
    full = rounds_env(4, grace=4.5, **LONG)
    t_init = env.learner_params.initial_tokens

    def first_round(e, action):
        e.reset(seed=4)
        while True:
            obs, *_ = e.step(action)
            if e.decision > e.rules.grace + e.params.h_min:  # the first round has closed
                return e._state.tokens.item(0)

    two, four = first_round(env, np.array([1, 1, 0, 0])), first_round(full, np.ones(4, int))
    assert two - t_init == pytest.approx(0.25 * (four - t_init), rel=1e-12)

    steps = rollout(env, lambda k, o, i: np.array([1, 1, 0, 0]), 4)
    s = steps[-1][2]["episode_summary"]
    t = rollout(full, lambda k, o, i: np.ones(4, dtype=int), 4)[-1][2]["episode_summary"]
    assert s["merges"] == t["merges"] and all(x == [0, 1] for x in s["round_sites"][:-1])
    assert s["token_share_mean"] < 1.0 and s["dropped_progress"] > 0
    assert s["progress"] < t["progress"]
    curve = lrn.loss(np.array([t_init, env._state.tokens.item(0)]), env.learner_params)
    assert s["progress"] == pytest.approx(curve[0] - curve[1], rel=1e-9)
    assert sum(i["reward_terms"]["progress"] for _, _, i in steps) == pytest.approx(s["progress"])


@pytest.mark.parametrize("sample_seed", [0, 47])
def test_stragglers_join_when_ready_and_the_mask_is_honest(sample_seed):
    """Actions drawn from the mask are taken as drawn, with one documented exception: a
    round opened at the episode's last decision closes at once, so every ready site sends
    (per-site masks cannot say "all or none"). Sample seed 47 opens one there."""
    env = rounds_env(3, grace=2.0, delays=[0.0, 0.0, 9.0], **LONG)
    env.action_space.seed(sample_seed)
    obs, info = env.reset(seed=11)
    last = env.episode.n_decisions - 1
    while True:
        a = env.action_space.sample(mask=info["action_mask"])
        flat = env.action_masks().reshape(-1, 2)
        assert all(flat[s, a[s]] for s in range(3))
        d, idle = env.decision, env._round is None or env._round.closed
        obs, r, term, trunc, info = env.step(a)
        if info["action_overridden"]:  # only a round opened at the last decision
            assert idle and d == last and a.any() and sample_seed == 47
        if trunc:
            break
    s = info["episode_summary"]
    assert info["action_overridden"] == (sample_seed == 47)  # the exception is exercised
    if info["action_overridden"]:  # that round took every site ready at its opening
        k = len(s["round_openings"]) - 1
        late = rd.draw_delays(11, k + 1, env.rules)[k]
        assert s["round_openings"][k] == last
        assert s["round_sites"][k] == [i for i in range(3) if late[i] == 0]
    delays = rd.draw_delays(11, len(s["round_openings"]), env.rules)
    assert delays[:, 2].max() > env.rules.grace  # some rounds waited for the straggler
    for k, o in enumerate(s["round_openings"]):
        assert s["round_sites"][k] == [0, 1, 2] or o + delays[k, 2] >= env.episode.n_decisions
        sent = [d for d in s["site_sync_decisions"]["s2"] if o <= d < o + env.params.h_min]
        assert all(d >= o + delays[k, 2] for d in sent)


def test_round_features_follow_the_round():
    env = rounds_env(2, grace=4.5, **LONG)
    obs, info = env.reset(seed=2)
    i = env.obs_index
    while obs[i["round_open"]] < 0.5:
        obs, *_ = env.step(np.array([1, 0]))
    assert obs[i["s0.sent"]] == 1.0 and obs[i["s1.sent"]] == 0.0
    assert obs[i["s0.ready"]] == 0.0 and obs[i["s1.ready"]] == 1.0
    assert 0.0 < obs[i["round_age"]] <= 1.0
    obs, *_ = env.step(np.array([0, 1]))
    assert obs[i["round_open"]] == 0.0 and obs[i["round_age"]] == 0.0


def test_same_seed_same_run():
    env = rounds_env(3, grace=4.5, quorum=2, delays=[0.0, 3.0, 6.0], **LONG)

    def pol(k, obs, info):
        return np.array([k % 2, (k // 2) % 2, 1])

    a = rollout(env, pol, 5)
    b = rollout(env, pol, 5)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert a[-1][2]["episode_summary"] == b[-1][2]["episode_summary"]


def test_the_one_instant_env_refuses_a_rounds_fleet():
    with pytest.raises(fl.FleetConfigError, match=r"fleet-rounds.toml: this fleet has timing"):
        DiLoCoFleetEnv(fleet="docs/examples/fleet-rounds.toml")
    with pytest.raises(ValueError, match="DiLoCoFleetEnv, the one-instant fleet, does not run"):
        DiLoCoFleetEnv(timing="rounds", model_version=1, h_min_steps=256)


@pytest.mark.parametrize("case", range(6))
def test_random_rules_and_actions_keep_the_books(case):
    """Random rules (sites, grace, quorum, stragglers, speeds) and actions drawn from the
    mask: the reward's terms add up to the summary's costs and progress, each round's
    sites are the sites' own records, and no site syncs twice within H_min."""
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 5))
    env = rounds_env(
        n,
        grace=float(rng.choice([0.0, 2.0, 4.5, 9.0])),
        quorum=int(rng.integers(1, n + 1)),
        delays=[float(rng.choice([0.0, 3.0, 6.0])) for _ in range(n)],
        speeds=[float(rng.uniform(0.5, 2.0)) for _ in range(n)],
        **LONG,
    )
    steps, s = masked_rollout(env, case)
    scale = env.episode.reward_per_request
    excess = -sum(i["reward_terms"]["sync_excess"] for i in steps) / scale
    assert excess == pytest.approx(s["additive_excess_requests"], rel=1e-9, abs=1e-9)
    assert sum(i["reward_terms"]["progress"] for i in steps) == pytest.approx(s["progress"])
    names = env.setup.site_names
    for k, o in enumerate(s["round_openings"]):
        nxt = s["round_openings"][k + 1] if k + 1 < len(s["round_openings"]) else 10**9
        for i, name in enumerate(names):
            mine = [d for d in s["site_sync_decisions"][name] if o <= d < nxt]
            assert len(mine) == (1 if i in s["round_sites"][k] else 0)
    for name in names:
        gaps = np.diff(s["site_sync_decisions"][name])
        assert (gaps >= env.params.h_min - env.rules.span).all()


def _cap_sites() -> tuple[fl.SiteConfig, ...]:
    """A bursty site beside an always-busy one (the example capped fleet's)."""
    return (fl.SiteConfig(name="bursty"), fl.SiteConfig(name="busy", regime="sync-heavy"))


def test_the_one_instant_special_case_holds_under_a_site_cap():
    """With a site cap, grace 0, every site in the quorum and no stragglers, the rounds env
    with every site asked (or none) is the capped fleet env bit for bit: the same masked
    launches, vetoes, forced syncs over the cap, observations (the cap features
    included), rewards and summary."""
    base = gym.make(
        "DiLoCoFleet-v1", fleet=fl.FleetParams(sites=_cap_sites(), site_cap_pp=6.0)
    ).unwrapped
    f = fl.FleetParams(sites=_cap_sites(), model_version=1, timing="rounds", site_cap_pp=6.0)
    rnd = gym.make("DiLoCoFleet-v1", fleet=f).unwrapped
    assert type(rnd) is DiLoCoFleetRoundsEnv
    for seed in (0, 3):
        launch = np.random.default_rng(seed).random(2000) < 0.3
        a = rollout(base, lambda k, o, i, go=launch: int(go[k]), seed)
        b = rollout(rnd, lambda k, o, i, go=launch: np.full(2, int(go[k])), seed)
        assert len(a) == len(b)
        k = base.observation_space.shape[0]
        for (oa, ra, ia), (ob, rb, ib) in zip(a, b, strict=True):
            assert np.array_equal(oa, ob[:k]) and ra == rb
            for key in ia:
                if key not in ("action_mask", "episode_summary"):
                    assert ia[key] == ib[key], key
            # the rounds mask offers a launch to every site exactly where the fleet's does
            # (2: the site's send is free; 0: it must be 0)
            assert list(ib["action_mask"]) == [2 * int(ia["action_mask"][1])] * 2
        sa, sb = a[-1][2]["episode_summary"], b[-1][2]["episode_summary"]
        assert sa["cap_masked_decisions"] > 0 and sa["cap_vetoed_launches"] > 0
        assert sa["cap_overridden_syncs"] > 0  # every counter is exercised
        for key in sa:
            assert sa[key] == sb[key], key
        assert sb["cap_overridden_contributions"] >= sb["cap_overridden_syncs"]


@pytest.mark.parametrize("case", range(6))
def test_under_a_site_cap_the_mask_is_honest_and_the_protocol_keeps_the_envs_schedule(case):
    """Random rules (grace, quorum, stragglers) with a site cap and actions drawn from the
    mask: the cap never has to veto what the mask offered, the books keep (the reward's
    terms add up to the summary's costs), and the protocol's replay of the cap
    (fleet_cap.rounds_respect_cap) keeps the env's own schedule, the set matched random
    is drawn from is never empty."""

    rng = np.random.default_rng(100 + case)
    regimes = ["bursty", "sync-heavy", "bursty"]
    n = int(rng.integers(2, 4))
    sites = tuple(
        fl.SiteConfig(
            name=f"s{i}", regime=regimes[i], delay_max_s=float(rng.choice([0.0, 3.0, 6.0]))
        )
        for i in range(n)
    )
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", site_cap_pp=float(rng.choice([3.0, 6.0])),
        grace_s=float(rng.choice([0.0, 4.5, 9.0])), quorum=int(rng.integers(1, n + 1)),
    )  # fmt: skip
    # cases 4 and 5 ask the agent at the corridor's forced decisions too
    env = gym.make("DiLoCoFleet-v1", fleet=f, skip_forced=case < 4, **LONG).unwrapped
    steps, s = masked_rollout(env, case)
    assert s["cap_vetoed_launches"] == 0
    assert s["cap_masked_decisions"] > 0  # the cap binds in this episode
    scale = env.episode.reward_per_request
    excess = -sum(i["reward_terms"]["sync_excess"] for i in steps) / scale
    assert excess == pytest.approx(s["additive_excess_requests"], rel=1e-9, abs=1e-9)
    assert replay_keeps(env, s)


def test_under_a_site_cap_asked_sites_the_cap_stops_are_vetoed_and_flagged():
    """An agent that asks every site at every decision: the cap vetoes some asks (an
    opening with too few sites it allows, or a capped site's send), each flagged in
    ``action_overridden``; the replay keeps the schedule."""

    sites = _cap_sites()
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", site_cap_pp=4.0, grace_s=9.0, quorum=1
    )
    env = gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped
    steps = rollout(env, lambda k, o, i: np.ones(2, dtype=int), 5)
    s = steps[-1][2]["episode_summary"]
    assert s["cap_vetoed_launches"] > 0
    assert sum(bool(i["action_overridden"]) for _, _, i in steps[1:]) >= s["cap_vetoed_launches"]
    # quorum 1: a round can go on without the capped site, so some rounds lack a site
    assert any(len(x) < 2 for x in s["round_sites"])
    assert replay_keeps(env, s)


def test_under_a_site_cap_the_rounds_masks_and_observations_are_causal():
    """As the one-instant cap's test: two runs whose contributions cost the same where
    their cost windows end by decision D (and 7 times more after) give the same masks and
    observations up to D. A 30 s tail_s keeps cost windows open across decisions, and the
    perturbation does change the run after D (the test can fail)."""
    from diloco_gym.sim.sidecar import cost_horizon

    sites = tuple(
        fl.SiteConfig(name=s.name, regime=s.regime, sidecar=(("tail_s", 30.0),))
        for s in _cap_sites()
    )
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", site_cap_pp=8.0, grace_s=9.0, quorum=1
    )
    env = gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped
    p = env.params
    steps = max(cost_horizon(sc, p.step_seconds, p.merge_steps) for sc in env.setup.sidecars)
    lag = steps // p.decision_interval + 1

    def run(perturb=None):
        obs, info = env.reset(seed=4)
        if perturb is not None:
            perturb(env)
        rows = [(info["decision"], tuple(env.action_masks()), obs.tobytes())]
        while True:
            obs, _, _, trunc, info = env.step(np.ones(2, dtype=int))
            rows.append((info["decision"], tuple(env.action_masks()), obs.tobytes()))
            if trunc:
                return rows, info["episode_summary"]

    base, summary = run()
    assert summary["cap_vetoed_launches"] > 0  # the cap binds: some asked sends stopped
    horizon = summary["round_openings"][len(summary["round_openings"]) // 2] + lag - 1

    def perturb(e):
        record = e._cap.record_sends

        def late_costs_times_7(d, variant, costs, sends):
            scale = 7.0 if d + lag > horizon else 1.0
            record(d, variant, np.asarray(costs) * scale, sends)

        e._cap.record_sends = late_costs_times_7

    other, _ = run(perturb)
    upto = [r for r in base if r[0] <= horizon]
    assert len(upto) > 10 and upto == other[: len(upto)]
    # before D, with no round open, the mask offered a send to one site and not the
    # other: only the cap does that (the cap binds on the masks compared)
    k = env.obs_index["round_open"]
    assert any(m[1] != m[3] and np.frombuffer(o, np.float32)[k] == 0 for _, m, o in upto)
    assert base != other  # the run after D saw the perturbed costs


def test_the_site_cap_with_per_site_timing_and_changing_links(tmp_path):
    """Rounds, changing links and the cap together: each contribution settles after its own
    link state's window, and the protocol's replay (with each decision's lags) keeps the
    env's own schedule."""

    base = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-rounds-links.toml"
    text = base.read_text().replace("quorum = 4", "quorum = 2\nsite_cap_pp = 3.0")
    path = tmp_path / "f.toml"
    path.write_text(text)
    env = make_fleet_env(fleet=str(path), h_min_steps=256)
    assert type(env) is DiLoCoFleetRoundsEnv and env.setup.links.on
    for seed in (0, 1):
        steps, s = masked_rollout(env, seed)
        assert s["cap_vetoed_launches"] == 0 and s["cap_masked_decisions"] > 0
        assert replay_keeps(env, s)


@pytest.mark.parametrize("cap", [None, 6.0])
def test_the_one_instant_special_case_holds_with_a_worst_site_weight(cap):
    """With a worst-site weight (and a site cap, or none), grace 0, every site in the quorum
    and no stragglers, the rounds env is the one-instant fleet env bit for bit: each
    round's reward adds lambda times its worst site as the one-instant sync's does."""
    sites = _cap_sites()
    base = gym.make(
        "DiLoCoFleet-v1",
        fleet=fl.FleetParams(sites=sites, worst_site_weight=2.0, site_cap_pp=cap),
    ).unwrapped
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", worst_site_weight=2.0, site_cap_pp=cap
    )
    rnd = gym.make("DiLoCoFleet-v1", fleet=f).unwrapped
    plain = gym.make("DiLoCoFleet-v1", fleet=fl.FleetParams(sites=sites, site_cap_pp=cap)).unwrapped
    launch = np.random.default_rng(1).random(2000) < 0.3
    a = rollout(base, lambda k, o, i: int(launch[k]), 1)
    b = rollout(rnd, lambda k, o, i: np.full(2, int(launch[k])), 1)
    c = rollout(plain, lambda k, o, i: int(launch[k]), 1)
    assert [x[1] for x in a] != [x[1] for x in c]  # the weight changes the rewards
    k = base.observation_space.shape[0]
    for (oa, ra, ia), (ob, rb, ib) in zip(a, b, strict=True):
        assert np.array_equal(oa, ob[:k]) and ra == rb
        assert ia["reward_terms"] == ib["reward_terms"]
    sa, sb = a[-1][2]["episode_summary"], b[-1][2]["episode_summary"]
    for key in sa:
        assert sa[key] == sb[key], key


@pytest.mark.parametrize("case", range(3))
def test_a_worst_site_weight_is_charged_once_per_round(case):
    """Random rules with a worst-site weight, actions from the mask: the reward's cost terms
    add up to the rounds' costs in the summary, each round's lambda term included once."""
    rng = np.random.default_rng(200 + case)
    sites = _cap_sites()
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", worst_site_weight=1.5,
        grace_s=float(rng.choice([4.5, 9.0])), quorum=int(rng.integers(1, 3)),
    )  # fmt: skip
    env = gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped
    steps, s = masked_rollout(env, case)
    scale = env.episode.reward_per_request
    charged = -sum(i["reward_terms"]["sync_excess"] for i in steps) / scale
    assert charged == pytest.approx(sum(s["merge_costs_requests"]), rel=1e-9)
    assert sum(s["merge_costs_requests"]) > s["additive_excess_requests"] + 1.0


@pytest.mark.parametrize("case", range(3))
def test_rounds_with_a_cap_links_a_weight_and_stragglers_together(tmp_path, case):
    """Every option per-site timing takes, at once (a site cap, a link trace at one site,
    a worst-site weight, stragglers, random grace and quorum), actions from the mask: the
    mask is honest, the reward's cost terms add up to the rounds' costs, and the
    protocol's replay of the cap keeps the env's schedule."""

    rng = np.random.default_rng(300 + case)
    link = tmp_path / "link.csv"
    shares = [1.0, 0.3, 0.6]  # a change every 150 s for 40 minutes
    link.write_text("time_s,share\n" + "".join(f"{150 * k},{shares[k % 3]}\n" for k in range(17)))
    sites = (
        fl.SiteConfig(name="bursty", link_trace=str(link), delay_max_s=3.0),
        fl.SiteConfig(name="busy", regime="sync-heavy"),
        fl.SiteConfig(name="other", regime="bursty", delay_max_s=float(rng.choice([0.0, 6.0]))),
    )
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", site_cap_pp=5.0, worst_site_weight=0.5,
        grace_s=float(rng.choice([4.5, 9.0])), quorum=int(rng.integers(1, 4)),
    )  # fmt: skip
    env = gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped
    steps, s = masked_rollout(env, case)
    assert s["cap_vetoed_launches"] == 0
    scale = env.episode.reward_per_request
    charged = -sum(i["reward_terms"]["sync_excess"] for i in steps) / scale
    assert charged == pytest.approx(sum(s["merge_costs_requests"]), rel=1e-9)
    assert len(set(s["sync_windows_s"])) > 1  # the trace changes the syncs' windows
    assert replay_keeps(env, s)


@pytest.mark.parametrize("n, fragments", [(1, 1), (4, 1), (4, 2)])
def test_the_one_instant_special_case_holds_with_the_precision_action(n, fragments):
    """With ``bits_options`` the action is each site's bit then a precision index
    (``MultiDiscrete([2] * N + [K])``); with one-instant rules and the same launches and
    precisions it is the fleet env with the precision action bit for bit."""
    sites = tuple(fl.SiteConfig(name=f"s{i}") for i in range(n))
    one = fl.FleetParams(sites=sites, fragments=fragments, bits=8, bits_options=(4, 8, 32))
    base = gym.make("DiLoCoFleet-v1", fleet=one).unwrapped
    rnd = rounds_env(n, fragments=fragments, bits_options=(4, 8, 32))
    assert rnd.action_space == gym.spaces.MultiDiscrete([2] * n + [3])
    for seed in (0, 7):
        g = np.random.default_rng(seed)
        launch, prec = g.random(3000) < 0.2, g.integers(0, 3, 3000)
        a = rollout(base, lambda k, o, i, go=launch, b=prec: np.array([int(go[k]), b[k]]), seed)
        b = rollout(
            rnd, lambda k, o, i, go=launch, b=prec: np.array([int(go[k])] * n + [b[k]]), seed
        )
        assert len(a) == len(b)
        k = base.observation_space.shape[0]
        for (oa, ra, ia), (ob, rb, ib) in zip(a, b, strict=True):
            assert np.array_equal(oa, ob[:k]) and ra == rb
            assert ia["reward_terms"] == ib["reward_terms"]
        sa, sb = a[-1][2]["episode_summary"], b[-1][2]["episode_summary"]
        assert len(set(sa["sync_bits"])) == 3  # every precision was used
        for key in sa:
            assert sa[key] == sb[key], key


def test_a_round_keeps_the_precision_it_opened_with():
    """Sites that join an open round later send at the round's precision, whatever the
    precision index of the actions while it is open; each contribution's cost is its own
    site's at that precision; the masks are MultiDiscrete's; a bad index is refused."""
    env = rounds_env(3, grace=9.0, delays=(0.0, 3.0, 6.0), bits_options=(4, 8, 32), **LONG)
    obs, info = env.reset(seed=2)
    assert len(info["action_mask"]) == 4 and list(info["action_mask"][3]) == [1, 1, 1]
    opened = []
    while True:
        open_now = obs[env.obs_index["round_open"]] > 0.5
        k = int(env.unwrapped.np_random.integers(0, 3)) if not open_now else 2 - len(opened) % 3
        if not open_now:
            opened.append(k)
        a = np.array([1, 0, 0, k]) if not open_now else np.array([0, 1, 1, k])
        obs, r, term, trunc, info = env.step(a)
        if trunc:
            break
    s = info["episode_summary"]
    ep = env.episode
    bits = (4, 8, 32)
    assert [bits.index(b) for b in s["sync_bits"]] == opened  # each round's own precision
    for site, name in enumerate(env.setup.site_names):
        rounds_of_site = [r for r, x in enumerate(s["round_sites"]) if site in x]
        sends = s["site_sync_decisions"][name]
        assert len(sends) == len(rounds_of_site) > 0
        want = [
            ep.sites_of(ep.variant_at(d, opened[r]))[site].merge_cost_at(d)
            for d, r in zip(sends, rounds_of_site, strict=True)
        ]
        assert env._send_costs[site] == want  # later sends too, at the round's precision
    assert len(set(s["sync_bits"])) > 1
    with pytest.raises(ValueError, match="precision index 0..2"):
        env.step(np.array([0, 0, 0, 3]))
