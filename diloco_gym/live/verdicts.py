"""The simulator's side of a live verdict: one trace window's episode, the schedules replayed
live on it and what the simulator predicts for them.

A live verdict (``diloco-gym validate verdicts``) replays K disjoint trace windows against a
real serving engine: on each window an agent's merge schedule, M matched-random schedules
with the same number of merges and a no-merge control. This module gives, for one window,
exactly what the protocol's report would compute on it:

* :func:`window_episode`: the env's episode of the window (:class:`WindowEpisode`), built by
  :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` itself, with the protocol's exact scorer;
* :func:`agent_schedule`: the agent's merges on it, rolled out as the report rolls them out;
* :func:`matched_random_schedules`: the protocol's matched-random draws for that budget;
* :func:`merge_windows_s` / :func:`schedule_from_starts`: a schedule as planned live merge
  windows (seconds) and back;
* :func:`predicted_excess` / :func:`predicted_violation_pct`: the exact scorer's
  sync-excess of each schedule and the violation % it predicts.

A schedule here is a 0/1 ``int8`` array with one entry per decision of the episode (1: a
merge starts at that decision). The statistics that compare the live and the simulated
numbers are in :mod:`diloco_gym.live.verdict_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco_gym.envs.env import DiLoCoSyncEnv, check_seed
from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.protocol import EpisodeScorer, counts_for, episode_control
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim.limits import check_limit
from diloco_gym.sim.sidecar import SidecarParams, pct_of
from diloco_gym.sim.traces import Trace

__all__ = [
    "WindowEpisode",
    "window_episode",
    "agent_schedule",
    "matched_random_schedules",
    "merge_windows_s",
    "schedule_from_starts",
    "predicted_excess",
    "predicted_violation_pct",
]

#: A live start this close (in decisions) below a decision's time still counts as that
#: decision: ``d * decision_seconds`` read back as seconds and divided again can round to
#: just below ``d``.
START_TOL_DECISIONS = 1e-6


@dataclass(frozen=True, eq=False)
class WindowEpisode:
    """The env's episode of one trace window, as the protocol scores it.

    Attributes:
        trace: the window (arrivals from 0 to ``trace.duration_s``, as replayed live).
        episode: the :class:`~diloco_gym.envs.episode.Episode` the env built from it.
        scorer: the protocol's exact scorer of that episode.
        n_decisions: decisions of the episode (a schedule has one entry per decision).
        params: the env's parameters.
        sidecar: the sidecar model the episode was built with.
        seed: the episode seed (it draws the pressure series of a trace without them, and
            seeds the matched-random control: ``[seed, merges, 7]``).
    """

    trace: Trace
    episode: Episode
    scorer: EpisodeScorer
    n_decisions: int
    params: EnvParams
    sidecar: SidecarParams
    seed: int

    @property
    def control_violation_pct(self) -> float:
        """Violation % of the no-merge replay of the window (the load match every
        sync-excess is measured against), as the env's episode summary counts it."""
        ep = self.episode
        return pct_of(ep.baseline_violated, ep.baseline.violated.size)

    def env(self) -> DiLoCoSyncEnv:
        """A fresh env of this window (same trace, parameters and sidecar)."""
        return DiLoCoSyncEnv(regime=self.trace, params=self.params, sidecar=self.sidecar)


def window_episode(
    trace: Trace, sidecar: SidecarParams, params: EnvParams | None = None, seed: int = 0
) -> WindowEpisode:
    """The episode of one trace window, built by the env itself
    (``DiLoCoSyncEnv(regime=trace, params=params, sidecar=sidecar).reset(seed=seed)``), so
    that it is exactly the episode the env steps and the protocol scores.

    Raises:
        TypeError: ``trace`` is not a :class:`~diloco_gym.sim.traces.Trace` or ``sidecar``
            not a :class:`~diloco_gym.sim.sidecar.SidecarParams`.
        ValueError: a window too short for an episode (the env's own message:
            :func:`~diloco_gym.envs.episode.episode_length`), or a bad ``seed``.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"window_episode: trace must be a Trace, got {type(trace).__name__}")
    if not isinstance(sidecar, SidecarParams):
        raise TypeError(
            f"window_episode: sidecar must be a SidecarParams, got {type(sidecar).__name__}"
        )
    seed = check_seed(seed)
    env = DiLoCoSyncEnv(regime=trace, params=params, sidecar=sidecar)
    env.reset(seed=seed)
    ep = env.episode
    assert ep is not None  # set by reset()
    return WindowEpisode(
        trace=trace,
        episode=ep,
        scorer=EpisodeScorer(ep, env.params, env.sidecar),
        n_decisions=int(ep.n_decisions),
        params=env.params,
        sidecar=env.sidecar,
        seed=seed,
    )


def agent_schedule(we: WindowEpisode, agent: Any) -> np.ndarray:
    """The merges ``agent`` launches on the window's episode (0/1 ``int8`` per decision).

    Rolled out as the report rolls an agent out (:func:`~diloco_gym.eval.rollout.run_episode`
    on a fresh env of the window, on the episode ``we`` holds, with its seed); the merges
    are read from the env's final ``episode_summary["merge_decisions"]``.

    ``agent``: an agent object, or a name :func:`~diloco_gym.agents.registry.make_agent`
    knows (``"online-forecast"``, ``"fixed-256"``, a model path, ``module:attr``).
    """
    if isinstance(agent, str):
        from diloco_gym.agents.registry import make_agent

        agent = make_agent(agent)
    res = run_episode(we.env(), agent, we.seed, we.episode)
    out = np.zeros(we.n_decisions, dtype=np.int8)
    out[np.asarray(res["merge_decisions"], dtype=np.int64)] = 1
    return out


def matched_random_schedules(
    we: WindowEpisode, merges: int, draws: int, seed: int | None = None
) -> np.ndarray:
    """``draws`` matched-random schedules with exactly ``merges`` merges, ``(draws,
    n_decisions)`` 0/1 ``int8``: the protocol's control
    (:func:`~diloco_gym.eval.protocol.episode_control`, its generator seeded ``[seed,
    merges, 7]``), so exactly the schedules the report draws for an agent with ``merges``
    merges on this episode. ``seed``: the episode seed the report uses (``None``: the
    window's, ``we.seed``).

    Raises:
        ValueError: ``merges`` outside the feasible range of the episode (the message gives
            the range) or ``draws`` below 1.
        diloco_gym.sim.limits.LimitError: ``draws`` above the ``DRAWS`` limit.
    """
    merges, draws = int(merges), int(draws)
    if draws < 1:
        raise ValueError(f"matched_random_schedules: draws must be >= 1, got {draws}")
    check_limit("DRAWS", draws, "matched_random_schedules: draws")
    if merges < 0:
        raise ValueError(f"matched_random_schedules: merges must be >= 0, got {merges}")
    seed = we.seed if seed is None else check_seed(seed)
    counts = counts_for(we.n_decisions, we.params, max(merges, 40))  # the report's table
    control = episode_control(we.scorer, merges, draws, seed, counts)
    out = np.zeros((draws, we.n_decisions), dtype=np.int8)
    np.put_along_axis(out, control.schedules, 1, axis=1)
    return out


def _as_schedules(schedules: Any, n_decisions: int, what: str) -> np.ndarray:
    """``schedules`` as a 2-D 0/1 array with ``n_decisions`` columns (one row for a 1-D
    schedule), or a one-line ``ValueError`` naming ``what``."""
    a = np.asarray(schedules)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] != n_decisions:
        raise ValueError(
            f"{what}: a schedule has one 0/1 entry per decision ({n_decisions}), "
            f"got shape {np.shape(schedules)}"
        )
    if a.size and not np.isin(a, (0, 1)).all():
        raise ValueError(f"{what}: a schedule's entries must be 0 or 1")
    return a.astype(np.int8)


def merge_windows_s(schedule: Any, params: EnvParams) -> list[tuple[float, float]]:
    """The planned live merge windows ``(start_s, length_s)`` of a schedule, seconds from
    the window's start.

    The env's convention (:func:`~diloco_gym.envs.schedule.sync_mask`, and
    ``episode_summary["merge_times_s"]``): a merge decided at decision ``d`` starts at the
    decision itself, bin ``d * decision_interval``, i.e. at ``d * decision_seconds``
    (the start of the decision's interval, not inside it), and occupies ``merge_steps``
    training steps, ``merge_steps * step_seconds`` seconds.
    """
    s = np.asarray(schedule)
    if s.ndim != 1:
        raise ValueError(f"merge_windows_s: schedule must be 1-D, got shape {s.shape}")
    s = _as_schedules(s, s.size, "merge_windows_s: schedule")[0]
    length = float(params.merge_steps * params.step_seconds)
    dec = float(params.decision_seconds)
    return [(float(d) * dec, length) for d in np.flatnonzero(s)]


def schedule_from_starts(starts_s: Any, params: EnvParams, n_decisions: int) -> np.ndarray:
    """The schedule (0/1 ``int8`` per decision) of merges a live controller launched at
    ``starts_s`` (seconds from the window's start): each start maps to the decision whose
    interval ``[d * decision_seconds, (d + 1) * decision_seconds)`` holds it (a start up
    to :data:`START_TOL_DECISIONS` of a decision below ``d``'s time counts as ``d``); the
    inverse of :func:`merge_windows_s`.

    Raises:
        ValueError: a start that is not finite or outside the episode's decisions, or two
            merges in one decision (one line naming them).
    """
    n_decisions = int(n_decisions)
    starts = np.asarray(starts_s, dtype=np.float64).reshape(-1)
    dec = float(params.decision_seconds)
    out = np.zeros(n_decisions, dtype=np.int8)
    if starts.size == 0:
        return out
    if not np.isfinite(starts).all():
        raise ValueError("schedule_from_starts: starts_s must be finite seconds")
    d = np.floor(starts / dec + START_TOL_DECISIONS).astype(np.int64)
    bad = np.flatnonzero((starts < 0) | (d >= n_decisions))
    if bad.size:
        raise ValueError(
            f"schedule_from_starts: merge start {starts[bad[0]]:g} s is outside the "
            f"window's {n_decisions} decisions [0, {n_decisions * dec:g}) s"
        )
    uniq, seen = np.unique(d, return_counts=True)
    if (seen > 1).any():
        k = int(np.flatnonzero(seen > 1)[0])
        twice = starts[d == uniq[k]]
        raise ValueError(
            f"schedule_from_starts: merges at {twice[0]:g} s and {twice[1]:g} s fall in "
            f"one decision ({int(uniq[k])}, {dec:g} s each)"
        )
    out[d] = 1
    return out


def predicted_excess(we: WindowEpisode, schedules: Any) -> np.ndarray:
    """The simulator's sync-excess (pp) of each schedule on the window: the exact scorer's
    ``exact_pct`` (:meth:`~diloco_gym.eval.scorer.EpisodeScorer.score`), the number the
    report gives an agent and its matched random.

    ``schedules``: one schedule (0/1 per decision) or a ``(S, n_decisions)`` array of them
    (their merge counts may differ). Returns float ``(S,)`` (``(1,)`` for one schedule).
    """
    rows = _as_schedules(schedules, we.n_decisions, "predicted_excess: schedules")
    out = np.zeros(rows.shape[0])
    counts = rows.sum(axis=1, dtype=np.int64)
    for m in np.unique(counts):
        if m == 0:
            continue  # no merge: the no-merge replay itself
        idx = np.flatnonzero(counts == m)
        sch = np.nonzero(rows[idx])[1].reshape(idx.size, int(m))
        out[idx] = we.scorer.score(sch).exact_pct
    return out


def predicted_violation_pct(we: WindowEpisode, schedule: Any) -> float:
    """The violation % the simulator predicts for one schedule on the window (for the
    record): the no-merge violation % (:attr:`WindowEpisode.control_violation_pct`) plus its
    exact sync-excess (:func:`predicted_excess`)."""
    rows = _as_schedules(schedule, we.n_decisions, "predicted_violation_pct: schedule")
    if rows.shape[0] != 1:
        raise ValueError(
            f"predicted_violation_pct: one schedule expected, got {rows.shape[0]} "
            f"(predicted_excess scores several)"
        )
    return we.control_violation_pct + float(predicted_excess(we, rows)[0])
