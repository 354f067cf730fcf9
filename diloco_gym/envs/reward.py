"""The reward's sync-excess term: its scale, its modes, and the exact (marginal) credit.

* The scale (:func:`nominal_rate_rps`, :func:`reward_per_request`): extra SLO-violating
  requests per :data:`REWARD_NOMINAL_REQUESTS` *nominal* requests of the window, fixed
  before the episode starts.
* The mode (``EnvParams.reward_mode``, :data:`REWARD_MODES`): ``"additive"`` credits each
  merge its isolated cost at launch; ``"exact"`` credits each merge its marginal cost in
  the exact replay, once its backlog has drained (:class:`ExactCredit`), so that an
  episode's credits sum to the exact replay's sync-excess, the figure the protocol scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.sim.regimes import ReplayRegime, SyntheticRegime
from diloco_gym.sim.sidecar import (
    SidecarParams,
    cost_horizon,
    episode_cost_queue,
    merge_window,
)

__all__ = [
    "REWARD_MODES",
    "REWARD_NOMINAL_REQUESTS",
    "REWARD_SHAPINGS",
    "check_reward_shaping",
    "ExactCredit",
    "check_reward_mode",
    "nominal_rate_rps",
    "require_additive",
    "reward_per_request",
]

#: The reward counts extra SLO-violating requests per this many nominal requests.
REWARD_NOMINAL_REQUESTS = 1000.0

#: ``EnvParams.reward_mode`` values: how the sync-excess term credits a merge.
REWARD_MODES = ("additive", "exact")


def _check_choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else ``ValueError`` naming
    ``EnvParams.<field>`` and the valid names."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"EnvParams.{field} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return value


def check_reward_mode(mode: Any) -> str:
    """``mode`` if it is one of :data:`REWARD_MODES`, else ``ValueError`` naming it."""
    return _check_choice("reward_mode", mode, REWARD_MODES)


#: ``EnvParams.reward_shaping`` values (:mod:`diloco_gym.envs.shaping`).
REWARD_SHAPINGS = ("none", "merge-debt")


def check_reward_shaping(value: Any) -> str:
    """``value`` if it is one of :data:`REWARD_SHAPINGS`, else ``ValueError`` naming it."""
    return _check_choice("reward_shaping", value, REWARD_SHAPINGS)


def require_additive(params: Any, owner: str) -> None:
    """Refuse ``reward_mode="exact"`` in an env (``owner``) that credits merges only at
    launch (the vector and the fleet env), rather than silently paying the additive reward."""
    if params.reward_mode != "additive":
        raise ValueError(
            f"{owner} supports reward_mode='additive' only, got reward_mode="
            f"{params.reward_mode!r}; the exact reward (each merge's marginal exact cost) is "
            f"DiLoCoSyncEnv's (gym.make('DiLoCoSync-v2', reward_mode='exact'); to train on it, "
            f"batch single envs: vec_env 'dummy' or 'subproc')"
        )


def nominal_rate_rps(generator, params: Any = None) -> float:
    """The request rate that fixes the reward scale, known before any episode starts.

    In order: ``params.reward_rate_rps`` when set; a ``nominal_rate_rps`` attribute of the
    generator; for a :class:`~diloco_gym.sim.regimes.SyntheticRegime` the long-run mean of its
    rate function, ``quiet + (busy - quiet) * min(1, (burst_s + ramp_s / 2) /
    burst_period_s)`` (bursty: 8 req/s, non-periodic: 8.1, steady regimes: their rate); for a
    :class:`~diloco_gym.sim.regimes.ReplayRegime` its ``target_rate_rps`` when set, otherwise
    the mean rate of the whole loaded source trace (a constant of the regime, the same for
    every window drawn from it, but computed from the whole file, later windows included,
    so not from a window's past alone; when the regime is one fixed trace, that trace's own
    mean rate; pass ``reward_rate_rps`` for a declared, causal scale or to put several
    traces on one scale).

    Raises:
        ValueError: a generator of another kind without a ``nominal_rate_rps`` attribute
            and no ``params.reward_rate_rps``.
    """
    if params is not None and params.reward_rate_rps is not None:
        return float(params.reward_rate_rps)
    declared = getattr(generator, "nominal_rate_rps", None)
    if declared is not None:
        rate = float(declared)
    elif isinstance(generator, SyntheticRegime):
        g = generator
        rate = g.quiet_rate_rps
        if g.burst_period_s > 0 and g.busy_rate_rps > g.quiet_rate_rps:
            duty = min(1.0, (g.burst_s + 0.5 * g.ramp_s) / g.burst_period_s)
            rate += (g.busy_rate_rps - g.quiet_rate_rps) * duty
    elif isinstance(generator, ReplayRegime):
        rate = (
            generator.target_rate_rps
            if generator.target_rate_rps is not None
            else generator.trace.mean_rate_rps
        )
    else:
        raise ValueError(
            f"cannot fix a reward scale for the generator "
            f"{getattr(generator, 'name', type(generator).__name__)!r}: give it a "
            f"nominal_rate_rps attribute (requests/s) or pass reward_rate_rps"
        )
    if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"nominal request rate of the reward scale must be > 0, got {rate!r}")
    return float(rate)


def reward_per_request(rate_rps: float, duration_s: float) -> float:
    """Reward units per extra violating request: ``REWARD_NOMINAL_REQUESTS / (rate_rps *
    duration_s)``, i.e. the reward counts violating requests per 1,000 nominal requests of
    the window (``rate_rps`` from :func:`nominal_rate_rps`, ``duration_s`` the window
    length; both fixed before the episode starts)."""
    return REWARD_NOMINAL_REQUESTS / (float(rate_rps) * float(duration_s))


class ExactCredit:
    """The exact replay's sync-excess of one episode's schedule, merge by merge.

    The exact replay (:func:`~diloco_gym.sim.sidecar.merge_window`, the rule the protocol's
    scorer counts through) splits a schedule's sync-excess into the extra violations of
    each merge from its start until its backlog drains or the next merge starts, the queue
    state carried into the next merge. Merge ``j`` of a schedule is credited its marginal
    exact cost given the merges before it::

        marginal_j = E(merges 0..j) - E(merges 0..j-1)
                   = seg_(j-1) - tail_(j-1) + tail_j

    with ``E`` the exact sync-excess (requests) of a schedule, ``tail_j`` merge ``j``'s
    extra violations from its start (in the state the earlier merges leave) to its drain
    (or the episode's end) with no later merge, and ``seg_(j-1)`` the previous merge's up
    to merge ``j``'s start. The marginals telescope: their sum over an episode is ``E`` of
    the whole schedule.

    ``marginal_j`` is known once both backlogs it follows (the schedule up to ``j-1`` and
    up to ``j``) have drained; it becomes *due* at bin ``ready_j`` = the later of the two
    drain bins (the episode's bin count when one has not drained by then). :meth:`due`
    pays it at the first decision whose start bin is after ``ready_j``: it then counts
    only requests that arrived at least one training step before that decision.
    """

    def __init__(self, episode: Any, params: Any, sidecar: SidecarParams) -> None:
        p, sc = params, sidecar
        self.sidecar = sc
        self.interval = p.decision_interval
        self.w = p.merge_steps
        self.n_bins = episode.pressure_bin.size
        self._horizon = cost_horizon(sc, p.step_seconds, self.w)
        self._q, self._prefmin, self._base_bl = episode_cost_queue(  # as the scorer's
            episode.base_s,
            episode.req_bin,
            episode.pressure_bin,
            episode.baseline.violated,
            episode.queue,
            sc,
            p.step_seconds,
            self.w,
        )
        #: the previous merge: (start bin, entering offset, entering minimum, tail, drain bin)
        self._last: tuple[int, float, float, float, int] | None = None
        self._due: list[tuple[int, float]] = []  # (ready bin, marginal requests), unpaid
        #: each merge's marginal exact cost (requests), in launch order, and the bin from
        #: which it is due (after its ``ready`` bin, see above).
        self.marginals: list[float] = []
        self.ready_bins: list[int] = []
        #: the requests credited by :meth:`due` so far.
        self.credited = 0.0

    def _window(self, st: int, off0: float, min0: float, length: int, want_state: bool):
        return merge_window(
            self._q,
            self._base_bl,
            np.array([st], dtype=np.int64),
            np.array([off0]),
            np.array([min0]),
            np.array([length], dtype=np.int64),
            self.w,
            self.sidecar,
            want_state,
        )

    def _tail(self, st: int, off0: float, min0: float):
        """The merge at bin ``st`` followed to its drain or the episode's end: over its
        cost window first, then over windows 4x longer until it has drained (the drain is
        the first bin where the backlogs meet, so a longer window finds the same one)."""
        length = self._horizon + 1
        while True:
            length = min(length, self.n_bins - st)
            out = self._window(st, off0, min0, length, False)
            if out[0][0][0] or length == self.n_bins - st:
                return out
            length *= 4

    def add(self, d: int) -> float:
        """A merge launched at decision ``d`` (after every earlier one): its marginal
        exact cost (requests), queued until it is due."""
        st = int(d) * self.interval
        off0, min0 = 0.0, float(self._prefmin[st])
        marginal = 0.0
        ready = 0
        if self._last is not None:
            st0, off_0, min_0, tail0, ready = self._last
            if st <= st0:
                raise ValueError(f"merges must be added in launch order, got {d} after {st0}")
            (drained, _), seg, (off1, run1) = self._window(st0, off_0, min_0, st - st0, True)
            if not drained[0]:  # the earlier backlog is still there: carry its state
                off0, min0 = float(off1[0]), float(run1[0])
            marginal = float(seg[0]) - tail0
        (drained, t_drain), tail = self._tail(st, off0, min0)
        drain = st + int(t_drain[0]) if drained[0] else self.n_bins
        marginal += float(tail[0])
        self._last = (st, off0, min0, float(tail[0]), drain)
        self._due.append((max(ready, drain), marginal))
        self.marginals.append(marginal)
        self.ready_bins.append(max(ready, drain))
        return marginal

    def due(self, decision: int, final: bool = False) -> float:
        """The marginal costs (requests) due by ``decision`` (every one left when
        ``final``), each paid once."""
        now = int(decision) * self.interval
        paid = 0.0
        keep = []
        for ready, c in self._due:
            if final or ready < now:
                paid += c
            else:
                keep.append((ready, c))
        self._due = keep
        self.credited += paid
        return paid
