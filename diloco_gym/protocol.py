"""The calibration protocol of SPEC.md §4: load match, matched-random envelope, statistics, gate.

For each regime and agent, over N episodes (seeds):

1. **No-sync load match**: the same trace replayed without merges; sync-excess is
   measured against it.
2. **Effect-size transfer**: the simulator's effect sizes vs the real sidecar's
   (:mod:`diloco_gym.calibration`) give the regime's verdict.
3. **Matched-random envelope**: K schedules drawn uniformly among all feasible schedules
   with exactly the agent's number of merges in that episode (same trace), each replayed
   exactly; the envelope is the distribution of their sync-excess.
4. **Gate**: a paired test over episodes of the agent's sync-excess against its envelope
   mean (exact sign-flip test for up to 20 episodes, a 100,000-flip Monte Carlo test
   above), a bootstrap CI of the mean difference, and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym import core
from diloco_gym.schedules import completion_counts, optimal_schedule, sample_uniform
from diloco_gym.sidecar import SidecarParams

__all__ = ["MatchedRandomDeferral", "envelope", "replay_many", "paired_test", "gate_verdict",
           "min_achievable_p", "units_needed", "ALPHA", "VERDICTS", "SATURATION_PCT",
           "N_FLIP"]

ALPHA = 0.05
#: Random sign patterns of the Monte Carlo test (more than 20 units).
N_FLIP = 100_000
#: Largest exact test: up to this many units every sign pattern is counted.
EXACT_MAX_N = 20
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
VERDICTS = ("placement gain", "tied with matched random", "worse than matched random",
            "inconclusive (too few episodes)", "no claim (saturated)",
            "no claim (uncalibrated)", "no claim (no SLO effect)")


def replay_many(episode: core.Episode, schedules: np.ndarray, params: core.EnvParams,
                sidecar: SidecarParams, chunk: int = 256) -> np.ndarray:
    """Exact sync-excess (percentage points) of many schedules at once.

    Args:
        schedules: int ``(K, M)`` decision indices, one schedule per row.

    Returns:
        float ``(K,)``: each schedule's violation % minus the no-merge violation %.
    """
    schedules = np.asarray(schedules, dtype=np.int64)
    k, m = schedules.shape
    n_bins = episode.pressure_bin.size
    base_viol = episode.baseline.violation_pct
    out = np.empty(k)
    if m == 0:
        out[:] = 0.0
        return out
    m0 = 1.0 + sidecar.pressure_gain * episode.pressure_bin**2
    work = np.bincount(episode.req_bin, weights=episode.base_s, minlength=n_bins)
    steps = params.merge_steps
    for lo in range(0, k, chunk):
        sch = schedules[lo:lo + chunk]
        rows = sch.shape[0]
        delta = np.zeros((rows, n_bins + steps + 1))
        starts = sch * params.decision_interval
        r_idx = np.repeat(np.arange(rows), m)
        np.add.at(delta, (r_idx, starts.ravel()), 1.0)
        np.add.at(delta, (r_idx, starts.ravel() + steps), -1.0)
        mask = np.minimum(np.cumsum(delta, axis=1)[:, :n_bins], 1.0)
        slow = m0 * (1.0 + sidecar.sync_slowdown * mask)  # (rows, n_bins)
        x = work - sidecar.slots * params.step_seconds / slow
        s = np.zeros((rows, n_bins + 1))
        np.cumsum(x, axis=1, out=s[:, 1:])
        backlog = s[:, :-1] - np.minimum.accumulate(s, axis=1)[:, :-1]
        b = episode.req_bin
        lat = (episode.base_s + backlog[:, b] / sidecar.slots) * slow[:, b]
        viol = (lat > sidecar.slo_s).mean(axis=1) * 100.0
        out[lo:lo + rows] = viol - base_viol
    return out


def envelope(episode: core.Episode, merges: int, draws: int, rng: np.random.Generator,
             params: core.EnvParams, sidecar: SidecarParams,
             counts: np.ndarray | None = None, exact: bool = False) -> np.ndarray:
    """Sync-excess (pp) of ``draws`` matched-random schedules with exactly ``merges`` merges.

    With ``exact=False`` (the default) each draw is scored by the sum of its merges'
    isolated costs (``episode.merge_cost``), which equals the exact replay whenever each
    merge's backlog has drained before the next merge (merges are >= H_min apart); the
    report measures the largest difference on a sample of draws and prints it. With
    ``exact=True`` every draw is replayed through the queue (:func:`replay_many`).
    """
    sch = sample_uniform(episode.n_decisions, params.h_min, params.h_max, merges, draws, rng,
                         counts=counts)
    if exact:
        return replay_many(episode, sch, params, sidecar)
    return episode.merge_cost[sch].sum(axis=1) * episode.pct_per_request


def oracle_excess(episode: core.Episode, merges: int, params: core.EnvParams,
                  sidecar: SidecarParams) -> tuple[float, np.ndarray]:
    """Exact sync-excess (pp) of the offline oracle at exactly ``merges`` merges."""
    sched, _ = optimal_schedule(episode.merge_cost, params.h_min, params.h_max, merges)
    return float(replay_many(episode, sched[None, :], params, sidecar)[0]), sched


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
    raise ValueError(f"no number of units reaches alpha {alpha} with {n_tests} tests and "
                     f"{n_flip} Monte Carlo sign patterns")


def paired_test(diff: np.ndarray, rng: np.random.Generator, n_boot: int = 5000,
                n_flip: int = N_FLIP) -> dict:
    """Two-sided sign-flip test of mean(diff) = 0 and a bootstrap 95 % CI of the mean.

    Exact (all ``2**n`` sign patterns) for ``n <= 20``, Monte Carlo with ``n_flip`` random
    patterns above (p then counts the observed statistic, so it is never 0). The result's
    ``min_p`` is the smallest p this test could give on ``n`` units
    (:func:`min_achievable_p`): when even that cannot reach the gate's alpha, the units are
    too few to tell a tie from a gain.
    """
    diff = np.asarray(diff, dtype=np.float64)
    n = diff.size
    if n == 0:
        return {"n": 0, "mean": float("nan"), "p_value": float("nan"),
                "ci_low": float("nan"), "ci_high": float("nan"), "min_p": 1.0}
    obs = abs(diff.mean())
    if n <= EXACT_MAX_N:
        p = _exact_sign_flip_p(diff, obs)
    else:
        signs = rng.choice([-1.0, 1.0], size=(n_flip, n))
        stats = np.abs(signs @ diff) / n
        p = float((np.sum(stats >= obs - 1e-12) + 1) / (n_flip + 1))
    boot = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"n": n, "mean": float(diff.mean()), "p_value": p, "ci_low": float(lo),
            "ci_high": float(hi), "min_p": min_achievable_p(n, n_flip)}


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
    first = _sign_sums(diff[:n // 2])
    second = np.sort(_sign_sums(diff[n // 2:]))
    upper = second.size - np.searchsorted(second, t - first, side="left")  # sum >= t
    lower = np.searchsorted(second, -t - first, side="right")  # sum <= -t
    return float((upper.sum() + lower.sum()) / 2**n)


def gate_verdict(calibration_verdict: str, mean_diff: float, p_value: float,
                 alpha: float = ALPHA, *, n_units: int | None = None, n_tests: int = 1,
                 no_sync_violation_pct: float | None = None,
                 saturation_pct: float = SATURATION_PCT) -> str:
    """The gate (docs/protocol.md): one of :data:`VERDICTS`.

    In order:

    1. ``no claim (no SLO effect)`` when the real sidecar showed no merge effect;
    2. ``no claim (saturated)`` when the replay's no-merge violation rate is above
       ``saturation_pct`` (see :data:`SATURATION_PCT`);
       then ``no claim (uncalibrated)`` when the effect sizes did not transfer;
    3. ``inconclusive (too few episodes)`` when ``n_units`` independent units could not
       have reached ``alpha`` whatever the data: ``n_tests * min_achievable_p(n_units)``
       (the smallest Holm-adjusted p over ``n_tests`` tests) is not below it;
    4. ``placement gain`` / ``worse than matched random`` when ``p_value`` (Holm-adjusted
       when the caller corrects) is below ``alpha``;
    5. otherwise ``tied with matched random``.

    Args:
        calibration_verdict: ``calibrated``, ``uncalibrated`` or ``no measurable SLO
            effect``.
        mean_diff: agent minus matched random, percentage points.
        p_value: the p-value the gate compares with ``alpha``.
        n_units: independent paired units behind ``p_value`` (``None``: not checked; for
            overlapping windows, the number of disjoint windows the data hold).
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
    # Before the p-value: with independent units a p below alpha is then impossible anyway,
    # and with overlapping ones (n_units = the independent count) a small p is
    # pseudo-replication, not evidence.
    if n_units is not None and n_tests * min_achievable_p(n_units) >= alpha:
        return "inconclusive (too few episodes)"
    if np.isfinite(p_value) and p_value < alpha:
        return "placement gain" if mean_diff < 0 else "worse than matched random"
    return "tied with matched random"


@dataclass(frozen=True)
class _Draw:
    schedule: np.ndarray
    planned: frozenset[int]


class MatchedRandomDeferral(gym.Wrapper):
    """The matched random deferral control as a Gymnasium wrapper.

    For an episode whose reference schedule has ``M`` merges, the wrapped env's merges are
    placed by a schedule drawn **uniformly at random among all feasible schedules with
    exactly M merges** (exact sampling by counting completions, see
    :func:`diloco_gym.schedules.sample_uniform`); the actions passed to :meth:`step` are
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
        base = self.env.unwrapped
        ep_seed = int(info["episode_seed"])
        if isinstance(self.merges, dict):
            if ep_seed not in self.merges:
                raise KeyError(f"MatchedRandomDeferral: no merge count for episode seed "
                               f"{ep_seed}")
            m = int(self.merges[ep_seed])
        else:
            m = int(self.merges)
        p = base.params
        if base.merges:
            raise RuntimeError("MatchedRandomDeferral needs an env that has not merged at "
                               "reset (skip_forced starts at gap 0, so this cannot happen "
                               "with DiLoCoSyncEnv)")
        rng = np.random.default_rng([self.draw_seed, ep_seed])
        sched = sample_uniform(base.episode.n_decisions, p.h_min, p.h_max, m, 1, rng)[0]
        self._draw = _Draw(sched, frozenset(int(d) for d in sched))
        info["matched_schedule"] = sched.tolist()
        return obs, info

    def step(self, action: Any):
        if self._draw is None:
            raise RuntimeError("call reset() first")
        base = self.env.unwrapped
        a = 1 if base.decision in self._draw.planned else 0
        obs, reward, terminated, truncated, info = self.env.step(a)
        if terminated or truncated:
            realised = info["episode_summary"]["merge_decisions"]
            if realised != self._draw.schedule.tolist():
                raise RuntimeError(f"matched schedule {self._draw.schedule.tolist()} was not "
                                   f"realised ({realised}); the env must use the default "
                                   f"corridor semantics")
        return obs, reward, terminated, truncated, info


def counts_for(n: int, params: core.EnvParams, m_max: int) -> np.ndarray:
    """Completion counts shared by all draws of an episode length (cache them per N)."""
    return completion_counts(n, params.h_min, params.h_max, m_max)
