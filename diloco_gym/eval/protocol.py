"""The calibration protocol (docs/protocol.md): load match, matched-random envelope,
statistics, gate.

For each regime and agent, over N episodes (seeds):

1. **No-sync load match**: the same trace replayed without merges; sync-excess is
   measured against it.
2. **Effect-size transfer**: the simulator's effect sizes vs the real sidecar's
   (:mod:`diloco_gym.eval.calibration`) give the regime's verdict.
3. **Matched-random envelope**: K schedules drawn uniformly among all feasible schedules
   with exactly the agent's number of merges in that episode (same trace), each replayed
   exactly; the envelope is the distribution of their sync-excess.
4. **Gate**: a paired test over episodes of the agent's sync-excess against its envelope
   mean (exact sign-flip test for up to 20 episodes, a 100,000-flip Monte Carlo test
   above), a bootstrap CI of the mean difference, and the verdict.

The exact scorer is :mod:`diloco_gym.eval.scorer` and the offline oracle
:mod:`diloco_gym.eval.oracle`; this module re-exports their public names
(``protocol.EpisodeScorer``, ``protocol.oracle_score`` keep working).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import gymnasium as gym
import numpy as np

from diloco_gym.envs.env import Action, Observation
from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.schedule import sync_mask
from diloco_gym.eval.oracle import (
    ORACLE_BOUND,
    ORACLE_ENUMERATE_MAX,
    ORACLE_ENUMERATED,
    ORACLE_EXACT,
    enumerate_schedules,
    exact_local_search,
    oracle_excess,
    oracle_score,
)
from diloco_gym.eval.scorer import EpisodeScorer, Scores
from diloco_gym.sim.schedules import (
    CompletionTable,
    completion_table,
    sample_uniform,
)
from diloco_gym.sim.sidecar import SidecarParams, replay

if TYPE_CHECKING:
    from diloco_gym.envs.env import DiLoCoSyncEnv

__all__ = [
    "MatchedRandomDeferral",
    "Control",
    "matched_control",
    "episode_control",
    "control_figures",
    "CONTROL_STREAM",
    "EpisodeScorer",
    "Scores",
    "envelope",
    "replay_many",
    "replay_full",
    "oracle_score",
    "oracle_excess",
    "paired_test",
    "gate_verdict",
    "min_achievable_p",
    "units_needed",
    "nonzero_units",
    "ZERO_TOL",
    "ALPHA",
    "VERDICTS",
    "SATURATION_PCT",
    "N_FLIP",
    "ORACLE_BOUND",
    "ORACLE_ENUMERATE_MAX",
    "ORACLE_ENUMERATED",
    "ORACLE_EXACT",
    "enumerate_schedules",
    "exact_local_search",
]

ALPHA = 0.05
#: Random sign patterns of the Monte Carlo test (more than 20 units).
N_FLIP = 100_000
#: Largest exact test: up to this many units every sign pattern is counted.
EXACT_MAX_N = 20
#: A paired difference no larger than this (pp) is zero: flipping its sign changes no
#: statistic by more than the sign-flip test's rounding tolerance, so it carries no evidence.
ZERO_TOL = 1e-12
#: No-merge SLO violation rate (% of requests) above which a replay is *saturated* and the
#: gate makes no claim. Above 50 % the median request already misses its SLO before any
#: merge: the sidecar is overloaded (its backlog grows through the window), a merge can only
#: move requests between "late" and "later", and sync-excess is squeezed against the
#: ceiling of the requests left to violate. Sync-excess then says nothing about whether a
#: scheduler protects a service that meets its SLO. The threshold is a property of the
#: service (its typical request fails), not of any agent's numbers. The synthetic
#: pressure-heavy regime (39.6 % with no merges) is below it: it stays judged by its
#: calibration (no measurable SLO effect), not called saturated.
SATURATION_PCT = 50.0
VERDICTS = (
    "placement gain",
    "tied with matched random",
    "worse than matched random",
    "inconclusive (too few episodes)",
    "no claim (saturated)",
    "no claim (uncalibrated)",
    "no claim (calibration uncertain)",
    "no claim (no SLO effect)",
)


def replay_many(
    episode: Episode,
    schedules: np.ndarray,
    params: EnvParams,
    sidecar: SidecarParams,
    scorer: EpisodeScorer | None = None,
) -> np.ndarray:
    """Exact sync-excess (percentage points) of many schedules at once.

    Args:
        schedules: int ``(K, M)`` decision indices, one schedule per row.
        scorer: an :class:`EpisodeScorer` of this episode to reuse (built when ``None``).

    Returns:
        float ``(K,)``: each schedule's violation % minus the no-merge violation %.
    """
    scorer = scorer or EpisodeScorer(episode, params, sidecar)
    return scorer.score(schedules).exact_pct


def replay_full(
    episode: Episode,
    schedules: np.ndarray,
    params: EnvParams,
    sidecar: SidecarParams,
    chunk: int = 256,
) -> np.ndarray:
    """Sync-excess (pp) of each schedule by replaying the whole episode through the queue
    (the slow reference for :func:`replay_many`)."""
    schedules = np.asarray(schedules, dtype=np.int64)
    k, m = schedules.shape
    n_bins = episode.pressure_bin.size
    base_viol = episode.baseline.violation_pct
    out = np.empty(k)
    if m == 0:
        out[:] = 0.0
        return out
    for lo in range(0, k, chunk):
        mask = sync_mask(schedules[lo : lo + chunk], n_bins, params)
        res = replay(
            episode.base_s,
            episode.req_bin,
            episode.pressure_bin,
            mask,
            sidecar,
            params.step_seconds,
        )
        out[lo : lo + mask.shape[0]] = res.violated.mean(axis=1) * 100.0 - base_viol
    return out


def envelope(
    episode: Episode,
    merges: int,
    draws: int,
    rng: np.random.Generator,
    params: EnvParams,
    sidecar: SidecarParams,
    counts: CompletionTable | None = None,
    exact: bool = True,
    scorer: EpisodeScorer | None = None,
) -> np.ndarray:
    """Sync-excess (pp) of ``draws`` matched-random schedules with exactly ``merges`` merges.

    With ``exact=True`` (the default) every draw is scored by the exact replay
    (:class:`EpisodeScorer`, the replay the agent and the oracle get too). ``exact=False``
    gives the sum of the merges' isolated costs (``episode.merge_cost``), which differs
    from the replay when merges interact (a merge starting before the previous one's
    backlog has drained).
    """
    sch = sample_uniform(
        episode.n_decisions, params.h_min, params.h_max, merges, draws, rng, counts=counts
    )
    if exact:
        return replay_many(episode, sch, params, sidecar, scorer=scorer)
    return episode.merge_cost[sch].sum(axis=1) * episode.pct_per_request


#: Per-row scoring labels (results.csv ``scoring`` / ``oracle_schedule``).
SCORING_PROVEN = "additive (proven equal)"
SCORING_EXACT = "exact"


class Control(NamedTuple):
    """The matched-random control of one episode and budget: the drawn schedules and
    their scores (:func:`matched_control`)."""

    schedules: np.ndarray
    scores: Scores


def matched_control(
    scorer: EpisodeScorer,
    merges: int,
    draws: int,
    rng: np.random.Generator,
    counts: CompletionTable | None = None,
) -> Control:
    """``draws`` schedules drawn uniformly among the episode's feasible schedules with
    exactly ``merges`` merges, scored by ``scorer``: what :func:`score_episode` draws for
    an agent with ``merges`` merges from the same ``rng`` (so a caller scoring several
    agents at one budget can draw and score the control once and pass it to each)."""
    ep, p = scorer.episode, scorer.params
    sch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, merges, draws, rng, counts=counts)
    return Control(sch, scorer.score(sch))


#: The last element of a matched-random control's seed, ``[episode seed, merges, 7]``.
CONTROL_STREAM = 7


def episode_control(
    scorer: EpisodeScorer,
    merges: int,
    draws: int,
    seed: int,
    counts: CompletionTable | None = None,
) -> Control:
    """The protocol's matched-random control of the episode of seed ``seed`` at ``merges``
    merges: :func:`matched_control` with the generator seeded ``[seed, merges, 7]``, so the
    draws depend on (episode, merges) only: the report, the frontier and
    :class:`diloco_gym.wrappers.MatchedRandomScore` draw the same schedules for an agent
    with ``merges`` merges in that episode."""
    rng = np.random.default_rng([int(seed), int(merges), CONTROL_STREAM])
    return matched_control(scorer, merges, draws, rng, counts)


def control_figures(scores: Scores) -> dict[str, float]:
    """A matched-random control's columns in the report (results.csv): the mean of its
    exact sync-excess, its 5 % and 95 % percentiles and its additive mean (pp)."""
    return {
        "matched_random_mean": float(scores.exact_pct.mean()),
        "matched_random_p05": float(np.percentile(scores.exact_pct, 5)),
        "matched_random_p95": float(np.percentile(scores.exact_pct, 95)),
        "matched_random_additive_mean": float(scores.additive_pct.mean()),
    }


def score_episode(
    scorer: EpisodeScorer,
    agent_schedule,
    draws: int,
    rng: np.random.Generator,
    counts: CompletionTable | None = None,
    control: Control | None = None,
) -> dict[str, Any]:
    """Agent, matched-random control and oracle of one episode, all by the same exact replay.

    The control is ``draws`` schedules drawn uniformly among the feasible schedules with
    the agent's number of merges; the oracle is the additive optimum at that budget.

    Returns:
        The report's scoring columns: ``sync_excess_pct`` and ``additive_excess_pct`` (the
        agent), ``matched_random_mean`` / ``_p05`` / ``_p95`` and
        ``matched_random_additive_mean``, ``oracle_same_budget_pct`` (exact replay) and
        ``oracle_additive_pct``, ``oracle_schedule`` (:data:`ORACLE_EXACT` when the episode
        is proven additive, else :data:`ORACLE_BOUND`), ``oracle_lower_bound_pct`` (a
        certified lower bound on the exact optimum at that budget, the optimum itself where
        it is known), ``scoring``
        (:data:`SCORING_PROVEN` when every scored schedule's merges each started from the
        no-merge queue and their exact excess equals their isolated cost, else
        :data:`SCORING_EXACT`), ``replayed_schedules`` (how many needed a windowed replay)
        and ``additive_exact_gap_pp`` (the largest |exact - additive| over all of them).

    ``control``: the control already drawn and scored (:func:`matched_control` with this
    scorer, the agent's number of merges, ``draws`` and the same ``rng`` and ``counts``);
    ``rng`` is then not drawn from.
    """
    ep, p = scorer.episode, scorer.params
    agent = np.asarray(agent_schedule, dtype=np.int64).reshape(1, -1)
    m = agent.shape[1]
    if control is None:
        control = matched_control(scorer, m, draws, rng, counts)
    elif control.schedules.shape != (draws, m):
        raise ValueError(
            f"control: {draws} schedules of {m} merges needed, got shape {control.schedules.shape}"
        )
    sch, c = control
    a = scorer.score(agent)
    orc = oracle_score(ep, m, p, scorer.sidecar, scorer=scorer)
    o = scorer.score(orc["schedule"][None, :])
    gaps = np.abs(np.concatenate([x.exact_pct - x.additive_pct for x in (a, c, o)]))
    used = np.concatenate([agent.ravel(), sch.ravel(), orc["schedule"]])
    replayed = int(a.replayed.sum() + c.replayed.sum() + o.replayed.sum())
    proven = replayed == 0 and bool(np.array_equal(scorer.iso_excess[used], scorer.cost[used]))
    return {
        "sync_excess_pct": float(a.exact_pct[0]),
        "additive_excess_pct": float(a.additive_pct[0]),
        **control_figures(c),
        "oracle_same_budget_pct": float(o.exact_pct[0]),
        "oracle_additive_pct": float(o.additive_pct[0]),
        "oracle_schedule": orc["status"],
        "oracle_lower_bound_pct": float(orc["lower_bound_pct"]),
        "scoring": SCORING_PROVEN if proven else SCORING_EXACT,
        "replayed_schedules": replayed,
        "additive_exact_gap_pp": float(gaps.max()),
    }


def min_achievable_p(n: int, n_flip: int = N_FLIP) -> float:
    """The smallest p-value :func:`paired_test` can return on ``n`` paired units.

    The exact two-sided sign-flip test counts the observed sign pattern and its mirror
    image, so its p is at least ``2 / 2**n`` (0.0625 for 5 units); the Monte Carlo test
    (``n > 20``) counts the observed statistic among ``n_flip + 1``, so at least
    ``1 / (n_flip + 1)``. With no unit there is no test (``1.0``).
    """
    if n < 1:
        return 1.0
    exact = 2.0 / 2.0**n
    return exact if n <= EXACT_MAX_N else max(exact, 1.0 / (n_flip + 1))


def nonzero_units(diff: np.ndarray, tol: float = ZERO_TOL) -> int:
    """How many paired units can carry evidence in a sign-flip test: those whose
    difference is not zero (``|d| > tol``).

    A unit with a difference of exactly zero gives the same statistic under both signs, so
    every sign pattern is counted twice over it: with ``k`` non-zero units out of ``n`` the
    smallest achievable p is ``2 / 2**k``, not ``2 / 2**n``.
    """
    d = np.asarray(diff, dtype=np.float64)
    return int(np.count_nonzero(np.abs(d) > tol))


def units_needed(alpha: float = ALPHA, n_tests: int = 1, n_flip: int = N_FLIP) -> int:
    """The fewest independent units whose best achievable p, Holm-adjusted over
    ``n_tests`` tests (the smallest Holm-adjusted p is ``n_tests`` times the smallest raw
    p), is below ``alpha``: 6 for one test at 0.05 (2/2**5 = 0.0625 is not), 9 for eight.

    Raises:
        ValueError: when no number of units can reach ``alpha`` (Monte Carlo resolution).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    for n in range(1, 64):
        if n_tests * min_achievable_p(n, n_flip) < alpha:
            return n
    raise ValueError(
        f"no number of units reaches alpha {alpha} with {n_tests} tests and "
        f"{n_flip} Monte Carlo sign patterns"
    )


def paired_test(
    diff: np.ndarray, rng: np.random.Generator, n_boot: int = 5000, n_flip: int = N_FLIP
) -> dict:
    """Two-sided sign-flip test of mean(diff) = 0 and a bootstrap 95 % CI of the mean.

    Exact (all ``2**n`` sign patterns) for ``n <= 20``, Monte Carlo with ``n_flip`` random
    patterns above (p then counts the observed statistic, so it is never 0). The result's
    ``nonzero`` counts the units whose difference is not zero (:func:`nonzero_units`;
    only they can carry evidence) and ``min_p`` is the smallest p this test could give on
    them (:func:`min_achievable_p` of ``nonzero``): when even that cannot reach the gate's
    alpha, the units are too few to tell a tie from a gain.
    """
    diff = np.asarray(diff, dtype=np.float64)
    n = diff.size
    if n == 0:
        return {
            "n": 0,
            "mean": float("nan"),
            "p_value": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "min_p": 1.0,
            "nonzero": 0,
        }
    obs = abs(diff.mean())
    if n <= EXACT_MAX_N:
        p = _exact_sign_flip_p(diff, obs)
    else:
        p = float((_monte_carlo_hits(diff, obs, rng, n_flip) + 1) / (n_flip + 1))
    boot = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    k = nonzero_units(diff)
    return {
        "n": n,
        "mean": float(diff.mean()),
        "p_value": p,
        "ci_low": float(lo),
        "ci_high": float(hi),
        "min_p": min_achievable_p(k, n_flip),
        "nonzero": k,
    }


#: Sign patterns of the Monte Carlo test drawn and summed per block (bounded memory).
_FLIP_BLOCK = 4096


def _monte_carlo_hits(diff: np.ndarray, obs: float, rng: np.random.Generator, n_flip: int) -> int:
    """How many of ``n_flip`` random sign patterns (``rng.choice([-1, 1])`` per unit, row
    by row) give ``|mean|`` at least ``obs`` (less ``1e-12``). Drawn in blocks of
    :data:`_FLIP_BLOCK` rows: consecutive draws continue one stream, so the patterns, each
    pattern's sum and ``rng``'s state after are those of one ``(n_flip, n)`` draw, without
    holding ``n_flip * n`` signs at once."""
    n = diff.size
    hits = 0
    for start in range(0, n_flip, _FLIP_BLOCK):
        rows = min(_FLIP_BLOCK, n_flip - start)
        signs = rng.choice([-1.0, 1.0], size=(rows, n))
        hits += int(np.sum(np.abs(signs @ diff) / n >= obs - 1e-12))
    return hits


def _sign_sums(x: np.ndarray) -> np.ndarray:
    """``sum_i s_i x_i`` for all ``2**len(x)`` sign patterns ``s``."""
    signs = ((np.arange(2**x.size)[:, None] >> np.arange(x.size)) & 1) * 2 - 1
    return signs @ x


def _exact_sign_flip_p(diff: np.ndarray, obs: float) -> float:
    """Share of the ``2**n`` sign patterns whose ``|mean|`` is at least ``obs`` (less
    ``1e-12`` for rounding), counted without enumerating them: every pattern's sum is a sum
    of one of the ``2**(n//2)`` sign sums of the first half and one of the second half's,
    so for each first-half sum a binary search over the sorted second-half sums counts the
    patterns at or beyond ``+-n * (obs - 1e-12)`` (``O(2**(n/2) n)`` instead of
    ``O(2**n n)``: 1 M patterns for the report's 20 seeds)."""
    n = diff.size
    t = n * (obs - 1e-12)
    if t <= 0.0:
        return 1.0  # every pattern qualifies
    first = _sign_sums(diff[: n // 2])
    second = np.sort(_sign_sums(diff[n // 2 :]))
    upper = second.size - np.searchsorted(second, t - first, side="left")  # sum >= t
    lower = np.searchsorted(second, -t - first, side="right")  # sum <= -t
    return float((upper.sum() + lower.sum()) / 2**n)


def gate_verdict(
    calibration_verdict: str,
    mean_diff: float,
    p_value: float,
    alpha: float = ALPHA,
    *,
    n_units: int | None = None,
    n_nonzero: int | None = None,
    n_tests: int = 1,
    no_sync_violation_pct: float | None = None,
    saturation_pct: float = SATURATION_PCT,
) -> str:
    """The gate (docs/protocol.md): one of :data:`VERDICTS`.

    In order:

    1. ``no claim (no SLO effect)`` when the real sidecar showed no merge effect;
    2. ``no claim (saturated)`` when the replay's no-merge violation rate is above
       ``saturation_pct`` (see :data:`SATURATION_PCT`);
       then ``no claim (uncalibrated)`` when the effect sizes did not transfer, and
       ``no claim (calibration uncertain)`` when the measured interval of an effect size is
       too wide to decide the transfer;
    3. ``inconclusive (too few episodes)`` when the independent units that can carry
       evidence (``n_nonzero`` when given: a unit whose difference is exactly zero
       carries none; else ``n_units``) could not have reached ``alpha`` whatever the
       data: ``n_tests * min_achievable_p(n)`` (the smallest Holm-adjusted p over
       ``n_tests`` tests) is not below it;
    4. ``placement gain`` / ``worse than matched random`` when ``p_value`` (Holm-adjusted
       when the caller corrects) is below ``alpha``;
    5. otherwise ``tied with matched random``.

    Args:
        calibration_verdict: ``calibrated``, ``uncalibrated`` or ``no measurable SLO
            effect``.
        mean_diff: agent minus matched random, percentage points.
        p_value: the p-value the gate compares with ``alpha``.
        n_units: independent paired units behind ``p_value`` (``None``: not checked).
        n_nonzero: how many of them have a non-zero difference (:func:`nonzero_units`;
            ``None``: all of them).
        n_tests: size of the Holm family ``p_value`` was adjusted over (1 if raw).
        no_sync_violation_pct: mean violation % of the replay with no merges (``None``:
            not checked).
    """
    if calibration_verdict == "no measurable SLO effect":
        return "no claim (no SLO effect)"
    # Saturation before 'uncalibrated': a saturated replay's effect sizes collapse towards
    # 1, so it is also the likely reason for an 'uncalibrated' transfer verdict.
    if no_sync_violation_pct is not None and no_sync_violation_pct > saturation_pct:
        return "no claim (saturated)"
    if calibration_verdict == "uncalibrated":
        return "no claim (uncalibrated)"
    if calibration_verdict == "uncertain":  # the measured interval straddles the verdict
        return "no claim (calibration uncertain)"
    # Before the p-value: with these units a p below alpha is impossible anyway (a zero
    # difference carries no evidence, so only the non-zero units count).
    counts = [c for c in (n_units, n_nonzero) if c is not None]
    if counts and n_tests * min_achievable_p(min(counts)) >= alpha:
        return "inconclusive (too few episodes)"
    if np.isfinite(p_value) and p_value < alpha:
        return "placement gain" if mean_diff < 0 else "worse than matched random"
    return "tied with matched random"


@dataclass(frozen=True)
class _Draw:
    schedule: np.ndarray
    planned: frozenset[int]


class MatchedRandomDeferral(gym.Wrapper[Observation, Action, Observation, Action]):
    """The matched random deferral control as a Gymnasium wrapper.

    For an episode whose reference schedule has ``M`` merges, the wrapped env's merges are
    placed by a schedule drawn **uniformly at random among all feasible schedules with
    exactly M merges** (exact sampling by counting completions, see
    :func:`diloco_gym.sim.schedules.sample_uniform`); the actions passed to :meth:`step` are
    ignored. Same trace as the reference (same episode seed), draws seeded by
    ``(draw_seed, episode_seed)``.

    Args:
        env: a ``DiLoCoSync`` env (any wrappers).
        merges: ``M`` for every episode, or a mapping ``episode seed -> M`` (for example the
            reference agent's merges per seed).
        draw_seed: seed of the draws.
    """

    def __init__(self, env: gym.Env, merges: int | dict[int, int], draw_seed: int = 0) -> None:
        super().__init__(env)
        self.merges = merges
        self.draw_seed = int(draw_seed)
        self._draw: _Draw | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        base = cast("DiLoCoSyncEnv", self.env.unwrapped)
        ep_seed = int(info["episode_seed"])
        if isinstance(self.merges, dict):
            if ep_seed not in self.merges:
                raise KeyError(f"MatchedRandomDeferral: no merge count for episode seed {ep_seed}")
            m = int(self.merges[ep_seed])
        else:
            m = int(self.merges)
        p = base.params
        if base.merges:
            raise RuntimeError(
                "MatchedRandomDeferral needs an env that has not merged at "
                "reset (skip_forced starts at gap 0, so this cannot happen "
                "with DiLoCoSyncEnv)"
            )
        assert base.episode is not None  # set by the reset() above
        rng = np.random.default_rng([self.draw_seed, ep_seed])
        sched = sample_uniform(base.episode.n_decisions, p.h_min, p.h_max, m, 1, rng)[0]
        self._draw = _Draw(sched, frozenset(int(d) for d in sched))
        info["matched_schedule"] = sched.tolist()
        return obs, info

    def step(self, action: Any):
        if self._draw is None:
            raise RuntimeError("call reset() first")
        base = cast("DiLoCoSyncEnv", self.env.unwrapped)
        a = 1 if base.decision in self._draw.planned else 0
        obs, reward, terminated, truncated, info = self.env.step(a)
        if terminated or truncated:
            realised = info["episode_summary"]["merge_decisions"]
            if realised != self._draw.schedule.tolist():
                raise RuntimeError(
                    f"matched schedule {self._draw.schedule.tolist()} was not "
                    f"realised ({realised}); the env must use the default "
                    f"corridor semantics"
                )
        return obs, reward, terminated, truncated, info


def counts_for(n: int, params: EnvParams, m_max: int) -> CompletionTable:
    """Completion counts (log space) shared by all draws of an episode length (cache them
    per N). The last few tables are kept for the process: every unit of a report or a
    frontier with episodes of one length asks for the same one (tables are only read)."""
    return _counts(int(n), int(params.h_min), int(params.h_max), int(m_max))


@functools.lru_cache(maxsize=4)
def _counts(n: int, h_min: int, h_max: int, m_max: int) -> CompletionTable:
    return completion_table(n, h_min, h_max, m_max)
