"""The deployable controller (diloco_gym/deploy.py) against the env it stands in for.

The key check is equivalence: an agent run through ``DiLoCoSyncEnv`` episodes and the same
agent behind a :class:`Controller` fed the telemetry those episodes imply (the arrivals of
each decision interval from the episode's trace, the network and checkpoint pressure the
env samples, the learner reports of the env's surrogate at each gap) see bit for bit the
same float32 observations at the same decisions and take the same merges, whole episodes
long. Then causality, the telemetry's validation and determinism.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the env ids)
from diloco_gym.agents.base import Agent
from diloco_gym.agents.registry import make_agent
from diloco_gym.deploy import Controller, Decision, Telemetry
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.observation import OBS_INDEX
from diloco_gym.eval.rollout import attach_agent
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.traces import PRESSURE_DT_S


class SeededRandom(Agent):
    """Merge or defer by a coin of its own seeded generator, one coin per question."""

    name = "seeded-random"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.rng.integers(0, 2, size=len(obs)).astype(np.int64)


def _agent(name: str, seed: int) -> Any:
    return SeededRandom(1000 + seed) if name == "seeded-random" else make_agent(name)


def run_env(env: Any, agent: Any, seed: int) -> dict[str, Any]:
    """One episode as the evaluation runner runs it (attach, predict with episode_start,
    the mask before each question): the observation the agent saw and the env's learner
    reports at each decision it was asked, and the schedule."""
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    ctx = attach_agent(env, agent, info["episode_seed"])
    seen: dict[int, np.ndarray] = {}
    reports: dict[int, dict[str, np.ndarray]] = {}
    state, start, done = None, True, False
    while not done:
        d = base.decision
        seen[d] = obs.copy()
        reports[d] = base.learner_reports()
        action, state = agent.predict(
            obs.copy(), state=state, episode_start=np.array([start]), deterministic=True
        )
        start = False
        obs, _, _, done, info = env.step(int(np.asarray(action).reshape(-1)[0]))
        if not done:
            ctx._set_mask(base.action_masks())
    return {"seen": seen, "reports": reports, "merges": base.merges, "episode": base.episode}


def telemetry_of(env: Any, merges: list[int], shuffle: int | None = 0, reports: bool = True):
    """The telemetry of every decision of the env's current episode, as a deployment would
    measure it: requests per decision interval (arrivals in ``[t_(d-1), t_d)``), the
    pressure series sampled at the decision time, and the learner reports of the env's
    surrogate, its global tokens moved by each merge of ``merges`` before the decision (in
    a shuffled learner order unless ``shuffle`` is None). Also returns the reports."""
    base = env.unwrapped
    ep, p, lp = base.episode, base.params, base.learner_params
    tr, n, dec_s = ep.trace, ep.n_decisions, p.decision_seconds
    t_dec = np.arange(n) * dec_s
    before = np.searchsorted(tr.arrival_s, t_dec, side="left")  # arrivals strictly before
    counts = np.diff(before, prepend=0)
    last_sample = int(np.ceil(tr.duration_s / PRESSURE_DT_S - 1e-9)) - 1
    p_idx = np.minimum((t_dec / PRESSURE_DT_S).astype(np.int64), last_sample)
    rng = np.random.default_rng(shuffle)
    tok, last, out, raw = float(lp.initial_tokens), 0, [], []
    merged = set(merges)
    for d in range(n):
        gap_s = (d - last) * dec_s
        delta, tau = lrn.reports(gap_s, tok, ep.throughputs, lp)
        raw.append((delta, tau))
        order = rng.permutation(delta.size) if shuffle is not None else np.arange(delta.size)
        out.append(
            Telemetry(
                requests=int(counts[d]),
                network=None if tr.network is None else float(tr.network[p_idx[d]]),
                checkpoint=None if tr.checkpoint is None else float(tr.checkpoint[p_idx[d]]),
                loss_delta=delta[order].tolist() if reports else None,
                tokens=tau[order].tolist() if reports else None,
            )
        )
        if d in merged:
            added, _ = lrn.merge_gain(gap_s, tok, ep.throughputs, lp)
            tok, last = tok + added, d
    return out, raw


def controller_for(env: Any, agent: Any, **kw: Any) -> Controller:
    base = env.unwrapped
    return Controller(
        agent,
        base.params,
        base.learner_params,
        serving_capacity_rps=base.sidecar.serving_capacity_rps,
        decisions=base.episode.n_decisions,
        regime=base.regime_name,
        **kw,
    )


def run_controller(ctrl: Controller, stream: list[Telemetry]) -> list[Decision]:
    return [ctrl.step(t) for t in stream]


def assert_equivalent(env: Any, agent_name: str, seed: int, **ctrl_kw: Any) -> dict:
    """The env's episode and the controller's run on its telemetry agree: the same asked
    decisions with bit-identical observations, the same merges, and the harness's learner
    reports are the env's own."""
    ran = run_env(env, _agent(agent_name, seed), seed)
    stream, raw = telemetry_of(
        env, ran["merges"], reports=ctrl_kw.get("learner_throughputs") is None
    )
    for d, rep in ran["reports"].items():  # the harness reproduces the env's reports
        assert np.array_equal(raw[d][0], rep["loss_delta"]), d
        assert np.array_equal(raw[d][1], rep["tokens"]), d
    ctrl = controller_for(env, _agent(agent_name, seed), **ctrl_kw)
    decisions = run_controller(ctrl, stream)
    asked = {x.decision: x.observation for x in decisions if x.asked}
    assert sorted(asked) == sorted(ran["seen"])
    for d, obs in ran["seen"].items():
        assert obs.dtype == asked[d].dtype == np.float32
        assert obs.tobytes() == asked[d].tobytes(), (d, obs, asked[d])
    assert [x.decision for x in decisions if x.merge] == ran["merges"]
    assert ctrl.done and len(decisions) == ran["episode"].n_decisions
    return {"ran": ran, "decisions": decisions}


@pytest.mark.parametrize("regime", ["bursty", "pressure-heavy", "non-periodic"])
@pytest.mark.parametrize("agent", ["online-forecast", "seeded-random", "random-deferral"])
def test_controller_sees_and_decides_as_the_env(regime, agent):
    env = DiLoCoSyncEnv(regime)
    merges = 0
    for seed in (0, 1, 2):
        out = assert_equivalent(env, agent, seed)
        merges += len(out["ran"]["merges"])
    assert merges > 3 * 5  # real schedules, not all-defer


@pytest.mark.parametrize("regime", ["bursty", "pressure-heavy"])
@pytest.mark.parametrize("agent", ["online-forecast-budget", "seeded-random", "fixed-budget"])
def test_controller_holds_the_merge_budget_as_the_env(regime, agent):
    env = DiLoCoSyncEnv(regime, merge_budget=12)
    for seed in (0, 3):
        out = assert_equivalent(env, agent, seed)
        decisions = out["decisions"]
        assert sum(x.merge for x in decisions) == 12
        # the budget's own mask: a merge refused or forced inside the corridor
        assert any(x.forced or x.not_allowed for x in decisions if 16 <= x.gap < 64)


def test_controller_matches_the_registered_v2_env():
    """``gym.make("DiLoCoSync-v2")`` (the shipped learner calibration's learners, the
    wrappers Gymnasium adds), free and with a merge budget."""
    for kwargs in ({}, {"merge_budget": 10}):
        env = gym.make("DiLoCoSync-v2", regime="pressure-heavy", **kwargs)
        assert env.unwrapped.learner_params != lrn.LearnerParams()
        for seed in (4, 5):
            assert_equivalent(env, "seeded-random", seed)
            assert_equivalent(env, "online-forecast", seed)


def test_controller_runs_the_shipped_learned_agents_as_the_env():
    """A learned policy (reference-ppo-v2) and a budget-conditioned MaskablePPO model (its
    action mask and budget features from the controller's context) see and decide as in
    the env."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("sb3_contrib")
    env = gym.make("DiLoCoSync-v2", regime="bursty")
    assert len(assert_equivalent(env, "reference-ppo-v2", 0)["ran"]["merges"]) > 0
    env = gym.make("DiLoCoSync-v2", regime="bursty", merge_budget=12)
    assert len(assert_equivalent(env, "reference-budget-bursty", 1)["ran"]["merges"]) == 12


def test_controller_surrogate_path_matches_the_env():
    """Telemetry without learner reports: the controller's surrogate, given the episode's
    throughputs (in another order), tracks the global tokens through the merges as the env
    does."""
    env = gym.make("DiLoCoSync-v2", regime="bursty")
    for seed in (0, 1):
        env.reset(seed=seed)
        thr = env.unwrapped.episode.throughputs[::-1].copy()
        assert_equivalent(env, "seeded-random", seed, learner_throughputs=thr)


def test_controller_asks_every_decision_without_skip_forced():
    env = DiLoCoSyncEnv("bursty", skip_forced=False, merge_budget=12)
    out = assert_equivalent(env, "seeded-random", 7)
    decisions = out["decisions"]
    assert all(x.asked for x in decisions)
    assert any(x.overridden for x in decisions)
    assert all(x.merge for x in decisions if x.forced)
    assert not any(x.merge for x in decisions if x.not_allowed)


class Recorder(SeededRandom):
    """A seeded random agent that records what it is handed at each question: the
    ``episode_start`` flag and its context's action mask."""

    name = "recorder"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.seen: list[tuple[bool, tuple[bool, ...]]] = []
        self.context: Any = None

    def attach(self, context: Any) -> None:
        self.context = context

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        mask = tuple(bool(x) for x in self.context.action_mask())
        self.seen.append((bool(np.asarray(episode_start).reshape(-1)[0]), mask))
        return super().predict(observation, state, episode_start, deterministic)


@pytest.mark.parametrize("skip_forced", [True, False])
def test_the_agent_gets_the_runners_episode_start_and_action_mask(skip_forced):
    """What the evaluation runner hands an agent besides the observation (the episode-start
    flag, the context's action mask, as MaskablePPO models read it) is what the controller
    hands it, question by question."""
    env = DiLoCoSyncEnv("bursty", skip_forced=skip_forced, merge_budget=10)
    in_env = Recorder(3)
    ran = run_env(env, in_env, 3)
    stream, _ = telemetry_of(env, ran["merges"])
    in_ctrl = Recorder(3)
    run_controller(controller_for(env, in_ctrl), stream)
    assert in_ctrl.seen == in_env.seen
    assert [s for s, _ in in_env.seen].count(True) == 1 and in_env.seen[0][0]
    if not skip_forced:
        assert len({m for _, m in in_env.seen}) > 1  # masks other than [1, 1] were handed


def test_the_first_decisions_rate_is_zero_and_the_ewmas_bias_corrected():
    """What the equivalence relies on, stated directly: the first interval's requests are
    not used (the env has no interval before decision 0), and after it the forecast is
    the bias-corrected EWMA, so a constant rate is forecast exactly from the second
    decision on."""
    ctrl = Controller(
        make_agent("no-sync"),
        serving_capacity_rps=20.0,
        decisions=100,
        learner_throughputs=[1e4] * 8,
    )
    dec_s = ctrl.params.decision_seconds
    first = ctrl.step(Telemetry(requests=50))
    assert first.observation[OBS_INDEX["rate_now"]] == 0.0
    assert first.observation[OBS_INDEX["rate_forecast"]] == 0.0
    obs = ctrl.step(Telemetry(requests=9)).observation
    r = 9 / dec_s
    assert obs[OBS_INDEX["rate_now"]] == np.float32(r / (r + 8.0))
    assert obs[OBS_INDEX["rate_forecast"]] == np.float32(r / (r + 8.0))
    assert obs[OBS_INDEX["rate_baseline"]] == np.float32(r / (r + 8.0))
    assert obs[OBS_INDEX["serving"]] == np.float32(min(1.0, r / 20.0))


def _stream(seed: int, n: int) -> list[Telemetry]:
    rng = np.random.default_rng(seed)
    return [
        Telemetry(
            requests=int(rng.poisson(10)),
            network=float(rng.random()),
            checkpoint=None if d % 7 == 0 else float(rng.random()),
            loss_delta=(rng.random(8) * 0.01 * d).tolist(),
            tokens=(rng.random(8) * 1e4 * d).tolist(),
        )
        for d in range(n)
    ]


@pytest.mark.parametrize("agent", ["online-forecast", "seeded-random"])
def test_controller_is_causal(agent):
    """Two telemetry streams equal up to decision t give equal observations and decisions
    up to t, whatever follows."""
    n, t = 300, 150
    a = _stream(0, n)
    b = a[: t + 1] + _stream(1, n - t - 1)
    runs = []
    for stream in (a, b):
        ctrl = Controller(_agent(agent, 0), serving_capacity_rps=20.0, decisions=n)
        runs.append(run_controller(ctrl, stream))
    ra, rb = runs
    for x, y in zip(ra[: t + 1], rb[: t + 1], strict=True):
        assert (x.decision, x.merge, x.asked, x.forced) == (y.decision, y.merge, y.asked, y.forced)
        assert x.observation.tobytes() == y.observation.tobytes()
    after = zip(ra[t + 1 :], rb[t + 1 :], strict=True)
    # the streams do differ afterwards, and the controller sees it
    assert any(x.observation.tobytes() != y.observation.tobytes() for x, y in after)


def test_controller_is_deterministic_and_learner_order_free():
    n = 250
    stream = _stream(3, n)
    first = run_controller(
        Controller(SeededRandom(5), serving_capacity_rps=20.0, decisions=n, merge_budget=6), stream
    )
    again = run_controller(
        Controller(SeededRandom(5), serving_capacity_rps=20.0, decisions=n, merge_budget=6), stream
    )
    rng = np.random.default_rng(0)
    permuted = []
    for s in stream:
        order = rng.permutation(8)
        permuted.append(
            Telemetry(
                s.requests,
                s.network,
                s.checkpoint,
                [s.loss_delta[i] for i in order],
                [s.tokens[i] for i in order],
            )
        )
    shuffled = run_controller(
        Controller(SeededRandom(5), serving_capacity_rps=20.0, decisions=n, merge_budget=6),
        permuted,
    )
    for x, y, z in zip(first, again, shuffled, strict=True):
        assert x.observation.tobytes() == y.observation.tobytes() == z.observation.tobytes()
        assert x.merge == y.merge == z.merge
    assert sum(x.merge for x in first) == 6


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"requests": -1}, "requests"),
        ({"requests": 2.5}, "requests"),
        ({"requests": True}, "requests"),
        ({"requests": 3, "network": float("nan")}, "network"),
        ({"requests": 3, "network": 1.5}, "network"),
        ({"requests": 3, "checkpoint": -0.1}, "checkpoint"),
        ({"requests": 3, "checkpoint": "high"}, "checkpoint"),
        ({"requests": 3, "loss_delta": [0.1, float("nan")], "tokens": [1, 2]}, "loss_delta[1]"),
        ({"requests": 3, "loss_delta": [0.1, 0.2], "tokens": [1, -2]}, "tokens[1]"),
        ({"requests": 3, "loss_delta": [0.1, 0.2], "tokens": [1]}, "tokens"),
        ({"requests": 3, "loss_delta": [0.1, 0.2]}, "loss_delta"),
        ({"requests": 3, "loss_delta": [], "tokens": []}, "loss_delta"),
        ({"requests": 3, "loss_delta": [[0.1]], "tokens": [[1.0]]}, "loss_delta"),
    ],
)
def test_bad_telemetry_is_one_line_naming_the_field(kwargs, field):
    with pytest.raises(ValueError) as info:
        Telemetry(**kwargs)
    msg = str(info.value)
    assert f"Telemetry.{field}" in msg and "\n" not in msg


def test_wrong_number_of_learners_or_no_reports_is_refused_before_any_state_changes():
    ctrl = Controller(make_agent("online-forecast"), serving_capacity_rps=20.0, decisions=100)
    with pytest.raises(ValueError, match=r"Telemetry\.loss_delta has 3 learners.*8") as info:
        ctrl.step(Telemetry(3, loss_delta=[0.1] * 3, tokens=[1.0] * 3))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="no learner_throughputs") as info:
        ctrl.step(Telemetry(3))
    assert "\n" not in str(info.value)
    assert ctrl.d == 0  # nothing was taken
    with pytest.raises(ValueError, match="step\\(\\) takes a Telemetry"):
        ctrl.step({"requests": 3})  # type: ignore[arg-type]


def test_controller_arguments_are_checked():
    agent = make_agent("online-forecast")
    with pytest.raises(ValueError, match="not deployable"):
        Controller(make_agent("offline-oracle"), serving_capacity_rps=20.0, decisions=100)
    with pytest.raises(ValueError, match="merge_budget=40 is infeasible"):
        Controller(agent, serving_capacity_rps=20.0, decisions=100, merge_budget=40)
    with pytest.raises(ValueError, match="serving_capacity_rps must be finite and > 0"):
        Controller(agent, serving_capacity_rps=0.0, decisions=100)
    with pytest.raises(ValueError, match="decisions must be > H_min"):
        Controller(agent, serving_capacity_rps=20.0, decisions=10)
    with pytest.raises(ValueError, match="learner_throughputs must have one value per learner"):
        Controller(agent, serving_capacity_rps=20.0, decisions=100, learner_throughputs=[1.0])
    with pytest.raises(Exception, match="DILOCO_GYM_MAX_DECISIONS"):
        Controller(agent, serving_capacity_rps=20.0, decisions=10**12)


def test_controller_stops_after_its_decisions_and_checks_the_agents_answer():
    class Bad(Agent):
        def act(self, obs):
            return np.array([2])

    n = 20
    ctrl = Controller(make_agent("no-sync"), serving_capacity_rps=20.0, decisions=n)
    out = run_controller(ctrl, _stream(0, n))
    assert [x.decision for x in out if x.merge] == []  # the corridor never forced one at 20
    with pytest.raises(RuntimeError, match="decisions are over"):
        ctrl.step(Telemetry(1, loss_delta=[0.0] * 8, tokens=[0.0] * 8))
    bad = Controller(Bad(), serving_capacity_rps=20.0, decisions=n)
    stream = _stream(0, n)
    with pytest.raises(ValueError, match="an action is 0 \\(defer\\) or 1 \\(merge\\)"):
        run_controller(bad, stream)
