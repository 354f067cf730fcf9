"""The simulation kernel: both envs are it (a direct kernel rollout reproduces the single env
and env 0 of the vector env exactly), its input checks, its rules on scalars and arrays
alike (options, budget tables), the seed's draws, and the one-rule paths of the sidecar
that the envs, the protocol and the report share."""

from __future__ import annotations

import kernel_reference as ref
import numpy as np
import pytest

from diloco_gym.envs import kernel
from diloco_gym.envs.bank import BuildSpec, EpisodeBank, build_rows
from diloco_gym.envs.env import DiLoCoSyncEnv, make_generator
from diloco_gym.envs.episode import Episode, episode_from_seed
from diloco_gym.envs.observation import OBS_DIM
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import nominal_rate_rps
from diloco_gym.envs.schedule import sync_mask
from diloco_gym.envs.vector import DiLoCoSyncVectorEnv
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim import compiled_step
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import sidecar as sc
from diloco_gym.sim.regimes import get_regime


def _kernel_rollout(seed: int, actions: list[int], **overrides):
    """One episode driven by the kernel functions alone (no env object)."""
    params = EnvParams(**overrides)
    gen, sidecar, _ = make_generator("bursty")
    lp = lrn.LearnerParams()
    spec = BuildSpec(
        gen,
        params,
        sidecar,
        lp,
        sc.cost_horizon(sidecar, params.step_seconds, params.merge_steps),
        nominal_rate_rps(gen, params),
    )
    bank = EpisodeBank(1, params, sidecar, lp.num_learners)
    (rows,) = build_rows(spec, [seed])
    bank.write_rows(np.array([0]), rows)
    state, batch = kernel.new_state(1), kernel.new_batch(1, lp.num_learners)
    budgets = kernel.Budgets(params)
    row = np.array([0])

    def cost(idx, d):
        return bank.merge_costs(batch.slot[idx], d, pooled=False)

    kernel.load_episodes(batch, bank, row)
    ref.reset_rows(state, batch, row, params, lp, budgets, cost)
    out = np.zeros((1, OBS_DIM), dtype=np.float32)
    obs = [kernel.observe(state, batch, bank.exo, params, lp, out)[0].copy()]
    rewards, masks = [], [ref.action_masks(state, batch, params, budgets)[0].copy()]
    for a in actions:
        res = ref.step(state, batch, np.array([a == 1]), None, params, lp, budgets, cost)
        obs.append(kernel.observe(state, batch, bank.exo, params, lp, out)[0].copy())
        rewards.append(float(res["reward"][0]))
        if res["truncated"][0]:
            break
        masks.append(ref.action_masks(state, batch, params, budgets)[0].copy())
    return obs, rewards, masks


@pytest.mark.parametrize(
    "overrides",
    [{}, {"skip_forced": False}, {"merge_budget": 10}, {"progress_weight": 0.5}],
)
def test_single_env_and_vector_env0_equal_a_direct_kernel_rollout(overrides):
    seed = 4
    actions = (np.random.default_rng(1).random(2000) < 0.2).astype(int).tolist()
    k_obs, k_rew, k_masks = _kernel_rollout(seed, actions, **overrides)
    assert len(k_rew) > 20

    env = DiLoCoSyncEnv(**overrides)
    obs, _ = env.reset(seed=seed)
    venv = DiLoCoSyncVectorEnv(3, **overrides)
    vobs, _ = venv.reset(seed=seed)
    np.testing.assert_array_equal(obs, k_obs[0])
    np.testing.assert_array_equal(vobs[0], k_obs[0])
    for t, a in enumerate(actions[: len(k_rew)]):
        np.testing.assert_array_equal(env.action_masks(), k_masks[t])
        np.testing.assert_array_equal(venv.action_masks()[0], k_masks[t])
        obs, rew, _, trunc, _ = env.step(a)
        vobs, vrew, _, vtrunc, _ = venv.step(np.array([a, 0, 1]))
        np.testing.assert_array_equal(obs, k_obs[t + 1], err_msg=f"single, step {t}")
        np.testing.assert_array_equal(vobs[0], k_obs[t + 1], err_msg=f"vector, step {t}")
        assert rew == vrew[0] == k_rew[t], t
        assert trunc == vtrunc[0] == (t == len(k_rew) - 1)


def _count_calls(monkeypatch, module, names) -> dict[str, int]:
    calls: dict[str, int] = {}
    for name in names:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def test_both_envs_step_through_the_compiled_step(monkeypatch):
    """The envs hold no dynamics of their own: a decision is one compiled ``step_rows`` call
    (the vector env: one per step for all rows; a subclass that costs merges itself: one
    more per merge, resumed once the cost is known), an episode start ``kernel.reset_rows``
    and ``reset_advance``."""
    step_calls = _count_calls(monkeypatch, compiled_step(), ("step_rows", "reset_advance"))
    resets = _count_calls(monkeypatch, kernel, ("reset_rows",))

    class OwnCost(DiLoCoSyncEnv):
        asked = 0

        def _merge_cost_at(self, d: int) -> float:
            OwnCost.asked += 1
            return super()._merge_cost_at(d)

    cases = ((DiLoCoSyncEnv, 1), (lambda: DiLoCoSyncVectorEnv(2), np.array([1, 1])))
    for make, action in (*cases, (OwnCost, 1)):
        step_calls.clear()
        resets.clear()
        env = make()
        env.reset(seed=0)
        for _ in range(20):  # merges (each followed by forced deferrals), no episode end
            env.step(action)
        assert resets == {"reset_rows": 1}, resets
        asked = OwnCost.asked if make is OwnCost else 0
        assert step_calls == {"reset_advance": 1, "step_rows": 20 + asked}, step_calls
        merges = len(env.merges) if isinstance(env, DiLoCoSyncEnv) else env.merge_counts[0]
        assert merges >= 5
    assert OwnCost.asked >= 5


def test_reset_with_a_prebuilt_episode_equals_a_plain_reset():
    env = DiLoCoSyncEnv(regime="non-periodic")
    ep = episode_from_seed(
        env.generator, 7, env.params, env.sidecar, env.learner_params, env.reward_rate_rps
    )
    actions = (np.random.default_rng(0).random(300) < 0.3).astype(int)
    runs = []
    for opts in (None, {"episode": ep}):
        obs, info = env.reset(seed=7, options=opts)
        trace = [obs]
        for a in actions:
            obs, r, _, trunc, info = env.step(int(a))
            trace += [obs, np.array([r])]
            if trunc:
                break
        runs.append((np.concatenate(trace), info.get("episode_summary")))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_reset_refuses_a_foreign_episode():
    env = DiLoCoSyncEnv()
    ep = episode_from_seed(
        env.generator, 3, env.params, env.sidecar, env.learner_params, env.reward_rate_rps
    )
    with pytest.raises(ValueError, match="must be a diloco_gym.envs.episode.Episode"):
        env.reset(seed=3, options={"episode": "not an episode"})
    with pytest.raises(ValueError, match="episode of seed 3, not of seed 4"):
        env.reset(seed=4, options={"episode": ep})
    other = DiLoCoSyncEnv(merge_budget=10)
    with pytest.raises(ValueError, match="other EnvParams or SidecarParams"):
        other.reset(seed=3, options={"episode": ep})


def test_run_episode_on_a_prebuilt_episode_equals_a_fresh_one():
    from diloco_gym.agents.registry import make_agent

    env = DiLoCoSyncEnv(regime="bursty")
    ep = episode_from_seed(
        env.generator, 2, env.params, env.sidecar, env.learner_params, env.reward_rate_rps
    )
    for name in ("wa-diloco", "offline-oracle"):
        fresh = run_episode(env, make_agent(name), 2)
        shared = run_episode(env, make_agent(name), 2, episode=ep)
        assert fresh == shared, name


@pytest.mark.parametrize(
    "actions, shape, match",
    [
        (np.array([0, 2]), (2,), r"actions must be 0 \(defer\) or 1 \(merge\), got 2"),
        (np.array([0.0, 0.5]), (2,), r"got 0\.5"),
        (np.array([1, 0, 1]), (2,), r"actions must have shape \(2,\), got \(3,\)"),
        (np.array(["a", "b"]), (2,), "actions must be 0"),
        (0.7, (), r"action must be 0 \(defer\) or 1 \(merge\), got 0\.7"),
        (np.array([[1]]), (), "action must be 0"),
        (None, (), "action must be 0"),
    ],
)
def test_check_actions_rejects_bad_input(actions, shape, match):
    with pytest.raises(ValueError, match=match):
        kernel.check_actions(actions, shape)


def test_check_actions_accepts_the_action_forms():
    np.testing.assert_array_equal(
        kernel.check_actions(np.array([0, 1, 1]), (3,)), [False, True, True]
    )
    np.testing.assert_array_equal(kernel.check_actions([True, False], (2,)), [True, False])
    np.testing.assert_array_equal(kernel.check_actions(np.array([1.0, 0.0]), (2,)), [1, 0])
    assert kernel.check_actions(np.array([1]), ()) and not kernel.check_actions(0.0, ())


def test_resolve_is_the_same_rule_on_scalars_and_arrays():
    cases = [(w, m, d) for w in (False, True) for m in (False, True) for d in (False, True)]
    want, can_merge, can_defer = (np.array(c) for c in zip(*cases, strict=True))
    merge, over = ref.resolve(want, can_merge, can_defer)
    for i, (w, m, d) in enumerate(cases):
        one = ref.resolve(w, m, d)
        assert (bool(one[0]), bool(one[1])) == (merge[i], over[i])
        assert bool(one[0]) == ((w and m) or not d)


# --------------------------------------------------------------------------- sidecar paths
def _episode(regime: str = "bursty", seed: int = 0) -> Episode:
    reg = get_regime(regime)
    return episode_from_seed(reg, seed, EnvParams(), reg.sidecar, lrn.LearnerParams())


def test_batched_replay_equals_one_schedule_at_a_time():
    ep = _episode("sync-heavy", 1)
    p = EnvParams()
    rng = np.random.default_rng(0)
    sch = np.sort(rng.choice(ep.n_decisions, (5, 9), replace=False), axis=1)
    mask = sync_mask(sch, ep.pressure_bin.size, p)
    both = sc.replay(ep.base_s, ep.req_bin, ep.pressure_bin, mask, ep.sidecar, p.step_seconds)
    assert both.latency_s.shape == (5, ep.req_bin.size)
    for k in range(5):
        np.testing.assert_array_equal(mask[k], sync_mask(sch[k], ep.pressure_bin.size, p))
        one = sc.replay(ep.base_s, ep.req_bin, ep.pressure_bin, mask[k], ep.sidecar, p.step_seconds)
        np.testing.assert_array_equal(both.latency_s[k], one.latency_s)
        np.testing.assert_array_equal(both.violated[k], one.violated)
        np.testing.assert_array_equal(both.sync_active[k], one.sync_active)


def test_merge_cost_paths_agree():
    """The one merge-cost rule has three ways to pair requests with merges (every decision
    of one episode, one merge, any merges of any rows); all give the same counts."""
    ep = _episode("bursty", 3)
    p = EnvParams()
    q, m0, s, prefmin = _queue(ep, p)
    starts = np.arange(ep.n_decisions) * p.decision_interval
    every = sc.merge_costs(
        ep.base_s,
        ep.req_bin,
        ep.pressure_bin,
        ep.sidecar,
        p.step_seconds,
        starts,
        p.merge_steps,
        ep.baseline.violated,
    )
    assert every.sum() > 0
    # Any merges: shuffled, so neither the one-row strided nor the single-merge path runs.
    order = np.random.default_rng(0).permutation(starts.size)
    rows = np.zeros(starts.size, dtype=np.int64)
    mixed = sc.isolated_merge_costs(
        q, rows, starts[order], prefmin[starts[order]], p.merge_steps, ep.sidecar, p.step_seconds
    )
    np.testing.assert_array_equal(mixed, every[order])
    one = [
        sc.isolated_merge_costs(
            q, rows[:1], starts[i : i + 1], prefmin[starts[i : i + 1]], p.merge_steps,
            ep.sidecar, p.step_seconds,
        )[0]
        for i in range(0, starts.size, 7)
    ]  # fmt: skip
    np.testing.assert_array_equal(one, every[::7])


def _queue(ep: Episode, p: EnvParams):
    m0, s, prefmin = sc.no_merge_queue(
        ep.base_s, ep.req_bin, ep.pressure_bin, ep.sidecar, p.step_seconds
    )
    h = sc.cost_horizon(ep.sidecar, p.step_seconds, p.merge_steps)
    size = ep.pressure_bin.size + 1 + h
    q = sc.cost_queue(
        ep.base_s,
        ep.req_bin,
        ep.baseline.violated,
        m0[None],
        s[None],
        ep.sidecar,
        p.step_seconds,
        size,
    )
    return q, m0, s, sc.padded(prefmin, size)


def test_queue_rows_are_independent_queues():
    rng = np.random.default_rng(5)
    p = sc.SidecarParams(slots=3.0, pressure_gain=0.7)
    work = rng.uniform(0, 0.6, (4, 200))
    m = sc.slowdown(rng.random((4, 200)), (rng.random((4, 200)) < 0.2).astype(float), p)
    s, prefmin = sc.queue(work, m, p, 0.14)
    for k in range(4):
        s1, pm1 = sc.queue(work[k], m[k], p, 0.14)
        np.testing.assert_array_equal(s[k], s1)
        np.testing.assert_array_equal(prefmin[k], pm1)
    # The closed form is the Lindley recursion.
    backlog, b = s[0, :-1] - prefmin[0, :-1], 0.0
    for k in range(200):
        assert backlog[k] == pytest.approx(b, abs=1e-9)
        b = max(0.0, b + work[0, k] - p.slots * 0.14 / m[0, k])


@pytest.mark.parametrize("budget", [None, 9])
def test_options_at_is_the_same_rule_on_scalars_and_arrays(budget):
    """The single env asks ``options_at`` one decision at a time on Python ints, the vector
    env on arrays of rows: the same answer elementwise, and the corridor without a budget."""
    p = EnvParams(merge_budget=budget)
    n = 300
    tables = None if budget is None else kernel.BudgetTables(n, p.h_min, p.h_max, budget)
    rng = np.random.default_rng(5)
    last = rng.integers(0, n - p.h_max, 200)
    d = last + rng.integers(0, p.h_max + 1, 200)
    m_left = rng.integers(0, 4, 200) if budget is not None else np.zeros(200, dtype=np.int64)
    can_merge, can_defer = kernel.options_at(d, last, m_left, p, n, tables)
    for i in range(200):
        one = kernel.options_at(int(d[i]), int(last[i]), int(m_left[i]), p, n, tables)
        assert (bool(one[0]), bool(one[1])) == (can_merge[i], can_defer[i])
    if budget is None:
        np.testing.assert_array_equal(can_merge, d - last >= p.h_min)
        np.testing.assert_array_equal(can_defer, d - last < p.h_max)


def test_budget_tables_refuse_an_infeasible_budget_with_the_feasible_range():
    with pytest.raises(ValueError, match=r"merge_budget=100 is infeasible .* feasible budgets"):
        kernel.BudgetTables(300, 16, 64, 100)
    t = kernel.BudgetTables(300, 16, 64, 9)
    assert t.reach.shape == (10, 300) and t.prefix.shape == (10, 301)
    np.testing.assert_array_equal(t.prefix[:, -1], t.reach.sum(axis=1))


@pytest.mark.parametrize("synthetic", [True, False])
def test_batch_draws_are_each_seeds_draws(synthetic):
    """``episode_draws_batch`` gives each seed the arrays of its ``episode_draws`` (a
    synthetic regime's from one compiled call, any other generator's one trace at a time)."""
    reg = get_regime("bursty")
    gen = reg if synthetic else (lambda rng: reg(rng))
    assert kernel.is_synthetic(gen) is synthetic
    lp = lrn.LearnerParams()
    batch = kernel.episode_draws_batch(gen, [4, 9], lp)
    for seed, got in zip([4, 9], batch, strict=True):
        trace, thr = kernel.episode_draws(gen, seed, lp)
        want = (trace.arrival_s, trace.prompt_tokens, trace.output_tokens, trace.network)
        for g, w in zip(got[:4], want, strict=True):
            np.testing.assert_array_equal(g, w)
        assert got[5] == trace.duration_s and got[6] == trace.name
        np.testing.assert_array_equal(got[7], thr)
        single = kernel.episode_draws(gen, seed, lp, as_trace=False)
        np.testing.assert_array_equal(single[0], got[0])


def _random_rows(b: int, k: int, seed: int):
    """A state and batch of ``b`` rows with random values (merges allowed in each)."""
    rng = np.random.default_rng(seed)
    state, batch = kernel.new_state(b), kernel.new_batch(b, k)
    state.last[:] = rng.integers(0, 200, b)
    state.d[:] = state.last + rng.integers(1, 70, b)
    state.m_left[:] = rng.integers(1, 9, b)
    state.n_merges[:] = rng.integers(0, 9, b)
    for a in (state.tokens, state.excess_sum, state.excess_requests, state.progress_sum):
        a[:] = rng.random(b) * rng.choice([1.0, 1e6, 1e9])
    batch.thr[:] = np.sort(rng.lognormal(8.0, 0.5, (b, k)), axis=1)
    batch.thr_sum[:] = batch.thr.sum(axis=1)
    batch.pct[:] = rng.random(b) * 0.05
    batch.scale[:] = rng.random(b)
    batch.credit[:] = rng.choice([1.0, 0.8, 0.3], b)
    return state, batch


def test_compiled_merge_equals_the_array_rule_bit_for_bit():
    """The compiled merge of one row (``jit_step.merge_row``) leaves every state array and
    gives the terms bit for bit as the NumPy rule on arrays of rows, with the same costs
    (random states, tokens over nine orders of magnitude, fleet credits)."""
    p, lp = EnvParams(), lrn.LearnerParams()
    costs = np.random.default_rng(1).random(64) * 5.0
    state, batch = _random_rows(64, lp.num_learners, 3)
    one_state, one_batch = _random_rows(64, lp.num_learners, 3)
    ex, gain = ref.apply_merges(state, batch, np.arange(64), p, lp, lambda idx, d: costs[idx])
    ist, fst = kernel.state_arrays(one_state)
    bi, bf = kernel.batch_arrays(one_batch)
    ip, fp = kernel.step_params(p, lp, sc.SidecarParams(), 1)
    sched_d, sched_c = np.zeros((64, 20), dtype=np.int64), np.zeros((64, 20))
    k0 = one_state.n_merges.copy()
    jit = compiled_step()
    for i in range(64):
        e1, g1 = jit.merge_row(i, costs[i], ist, fst, bi, bf, ip, fp, sched_d, sched_c)
        assert (e1, g1) == (ex[i], gain[i]), i
        assert (sched_d[i, k0[i]], sched_c[i, k0[i]]) == (state.d[i], costs[i])
    for a, b in zip(state, one_state, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("budget", [None, 9])
def test_forced_deferral_end_is_the_same_rule_on_scalars_and_arrays(budget):
    """The single env's Python ints and the vector env's arrays give the same ends."""
    p = EnvParams(merge_budget=budget)
    n = 300
    budgets = kernel.Budgets(p) if budget is not None else None
    rng = np.random.default_rng(8)
    last = rng.integers(0, n - p.h_max, 200)
    d = last + rng.integers(0, p.h_max, 200)
    m_left = rng.integers(0, 4, 200) if budget is not None else np.zeros(200, dtype=np.int64)
    n_ = np.full(200, n)
    end = ref.forced_deferral_end(d, last, n_, m_left, p, budgets)
    for i in range(200):
        one = ref.forced_deferral_end(int(d[i]), int(last[i]), n, int(m_left[i]), p, budgets)
        assert int(one) == end[i]


N_COMPILED = 517


def _states(rng, n: int, budget: int | None, size: int = 4000):
    last = rng.integers(0, n, size)
    d = np.minimum(last + rng.integers(0, 80, size), n - 1)
    m_left = rng.integers(0, (budget or 0) + 1, size) if budget else np.zeros(size, np.int64)
    return d, last, m_left


@pytest.mark.parametrize("budget", [None, 8, 12, 32])
def test_options_and_forced_end_equal_the_kernel_rules(budget):
    p = EnvParams(merge_budget=budget)
    budgets = kernel.Budgets(p)
    tables = budgets.tables(N_COMPILED) if budget else None
    reach, prefix, nxt = kernel.budget_arrays(budgets, N_COMPILED)
    b = -1 if budget is None else budget
    jit = compiled_step()
    d, last, m_left = _states(np.random.default_rng(budget or 0), N_COMPILED, budget)
    cm, cd = ref.options_at(d, last, m_left, p, N_COMPILED, tables)
    end = ref.forced_deferral_end(
        d, last, np.full(d.size, N_COMPILED), m_left, p, budgets if budget else None
    )
    for k in range(d.size):
        args = (int(d[k]), int(last[k]), int(m_left[k]))
        got = jit.options_one(*args, N_COMPILED, p.h_min, p.h_max, b, reach, prefix)
        assert got == (bool(cm[k]), bool(cd[k])), (k, args)
        if not cm[k] or budget is None:  # forced deferrals only
            e = jit.forced_end_one(args[0], args[1], N_COMPILED, args[2], p.h_min, b, nxt)
            assert e == end[k], (k, args)
