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
from diloco_gym.schedules import (
    CompletionTable,
    completion_table,
    optimal_schedule,
    sample_uniform,
)
from diloco_gym.sidecar import SidecarParams

__all__ = ["MatchedRandomDeferral", "envelope", "replay_many", "paired_test", "gate_verdict",
           "ALPHA", "VERDICTS"]

ALPHA = 0.05
VERDICTS = ("placement gain", "tied with matched random", "worse than matched random",
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
             counts: CompletionTable | None = None, exact: bool = False) -> np.ndarray:
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


def paired_test(diff: np.ndarray, rng: np.random.Generator, n_boot: int = 5000,
                n_flip: int = 100_000) -> dict:
    """Two-sided sign-flip test of mean(diff) = 0 and a bootstrap 95 % CI of the mean.

    Exact (all ``2**n`` sign patterns) for ``n <= 20``, Monte Carlo with ``n_flip`` random
    patterns above (p then counts the observed statistic, so it is never 0).
    """
    diff = np.asarray(diff, dtype=np.float64)
    n = diff.size
    if n == 0:
        return {"n": 0, "mean": float("nan"), "p_value": float("nan"),
                "ci_low": float("nan"), "ci_high": float("nan")}
    obs = abs(diff.mean())
    if n <= 20:
        p = _exact_sign_flip_p(diff, obs)
    else:
        signs = rng.choice([-1.0, 1.0], size=(n_flip, n))
        stats = np.abs(signs @ diff) / n
        p = float((np.sum(stats >= obs - 1e-12) + 1) / (n_flip + 1))
    boot = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"n": n, "mean": float(diff.mean()), "p_value": p, "ci_low": float(lo),
            "ci_high": float(hi)}


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
                 alpha: float = ALPHA) -> str:
    """The gate of SPEC.md §4.4 (``mean_diff`` = agent minus matched random, pp)."""
    if calibration_verdict == "uncalibrated":
        return "no claim (uncalibrated)"
    if calibration_verdict == "no measurable SLO effect":
        return "no claim (no SLO effect)"
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


def counts_for(n: int, params: core.EnvParams, m_max: int) -> CompletionTable:
    """Completion counts (log space) shared by all draws of an episode length (cache them
    per N)."""
    return completion_table(n, params.h_min, params.h_max, m_max)
