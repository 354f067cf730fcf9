"""The fleet's observation table (:func:`fleet_obs_features`) and its per-site serving cap
(``FleetParams.site_cap_pp``; off by default), whose features it appends.

**The rule.** Site ``i``'s *settled* sync-excess at decision ``d`` is the sum of the
isolated costs (requests, as the reward counts them) of the syncs launched this episode
whose cost windows have ended by ``t_d``: a sync at ``d'`` is settled once ``(d - d') *
decision_interval`` training steps cover its window and its sidecar's ``tail_s`` plus one
step (:func:`settle_lags`), so every request it is charged for arrived before ``t_d``. Its
*forecast* is the largest settled isolated cost of that site this episode (0 before one has
settled). A launch at ``d`` is **masked** when, for any site,

    ``settled_i + (pending_i + 1 + reserve(d)) * forecast_i > cap_i``

with ``pending_i`` the launched syncs not yet settled, ``reserve(d) = (n - 1 - d) //
H_max`` the syncs the corridor will force after a launch at ``d`` even if the agent never
launches again (``n`` the episode's decisions, fixed before it starts), and ``cap_i =
site_cap_pp / 100 * nominal_i`` (the site's nominal requests, its nominal rate times the
window: fixed before the episode). Everything the rule reads is in the past: the mask, the
``<site>.cap_used`` features, ``info["action_overridden"]`` and the masked / vetoed /
overridden counts are causal (tested); the final summary's ``site_cap_used_pp`` is not. The price of
causality: the cost of the sync being decided (and of the reserved ones) is a forecast, so
a site can end above its cap when its syncs cost more than its largest settled one, and
nothing is masked before a first sync has settled. A sync the corridor forces (gap
``H_max``) is launched even when the cap would mask it; the summary counts it
(``cap_overridden_syncs``).

:func:`schedules_respect_cap` replays the same rule on a whole schedule (the protocol's
matched-random control under the cap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from diloco_gym.envs.observation import EXO_SLICE, OBS_FEATURES
from diloco_gym.sim.sidecar import cost_horizon

__all__ = [
    "CAP_FEATURE",
    "CapTracker",
    "cap_allows",
    "site_cap_allows",
    "cap_obs_features",
    "cap_state",
    "cap_tracker",
    "forced_after",
    "fleet_obs_features",
    "site_nominal_requests",
    "schedules_respect_cap",
    "rounds_respect_cap",
    "contribution_table",
    "settle_lags",
    "variant_lags",
    "episode_lags",
]

#: the per-site observation feature of the cap: ``<site>.cap_used``.
CAP_FEATURE = "cap_used"
_EXO_NAMES = tuple(f[0] for f in OBS_FEATURES[EXO_SLICE])


def fleet_obs_features(
    site_names: list[str] | tuple[str, ...], fragments: int
) -> tuple[tuple[str, str, float, float, str], ...]:
    """The fleet's observation table: the single env's 17 features (its pressure block is
    the first site's, named ``<site>.<feature>``), then one pressure block per further
    site, then (``F > 1``) the staleness of every fragment in sync order (``fragment0`` is
    the next to sync). One site and one fragment: exactly the single env's layout."""
    out = []
    first = site_names[0]
    for name, unit, lo, hi, meaning in OBS_FEATURES:
        if name in _EXO_NAMES:
            out.append((f"{first}.{name}", unit, lo, hi, f"site {first}: {meaning}"))
        else:
            out.append((name, unit, lo, hi, meaning))
    exo = OBS_FEATURES[EXO_SLICE]
    for s in site_names[1:]:
        for name, unit, lo, hi, meaning in exo:
            out.append((f"{s}.{name}", unit, lo, hi, f"site {s}: {meaning}"))
    if fragments > 1:
        for j in range(fragments):
            out.append(
                (
                    f"fragment{j}_staleness",
                    "clip(decisions / H_max)",
                    0.0,
                    1.0,
                    f"decisions since the fragment {j}-th in sync order (0: next) was synced",
                )
            )
    return tuple(out)


def cap_obs_features(
    site_names: list[str] | tuple[str, ...], cap_pp: float | None
) -> tuple[tuple[str, str, float, float, str], ...]:
    """The cap's observation features, one per site (none without a cap): appended after
    the fleet's own table, so the default layout is unchanged."""
    if cap_pp is None:
        return ()
    return tuple(
        (
            f"{s}.{CAP_FEATURE}",
            "clip(settled excess / cap)",
            0.0,
            1.0,
            f"site {s}: its settled sync-excess this episode over its cap ({cap_pp:g} pp of "
            f"its nominal requests)",
        )
        for s in site_names
    )


def settle_lags(params: Any, sidecars: list[Any]) -> np.ndarray:
    """``(N,)`` decisions after its launch at which a sync's isolated cost at each site is
    settled: its cost window (:func:`~diloco_gym.sim.sidecar.cost_horizon`: the sync and
    ``tail_s`` after) plus one step, in whole decisions."""
    iv = int(params.decision_interval)
    out = [
        -(-(cost_horizon(sc, params.step_seconds, params.merge_steps) + 1) // iv) for sc in sidecars
    ]
    return np.asarray(out, dtype=np.int64)


def cap_state(
    d: np.ndarray, past_d: np.ndarray, past_costs: np.ndarray, past_lags: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(settled, pending, forecast)``, each ``(N, k)``, for ``k`` rows (schedules) at
    decisions ``d`` ``(k,)`` (module doc), from the syncs each row launched before:
    ``past_d`` ``(k, j)``, their per-site isolated costs ``past_costs`` ``(N, k, j)`` and
    settle lags ``past_lags`` (broadcast to ``(N, k, j)``). One code path for the env (one
    row) and the protocol (many), so both compute the same floats."""
    n_sites, k, j = past_costs.shape
    if j == 0:
        z = np.zeros((n_sites, k))
        return z, np.zeros((n_sites, k), dtype=np.int64), z
    done = (np.asarray(d)[:, None] - past_d)[None] >= past_lags
    costs = np.ascontiguousarray(np.where(done, past_costs, 0.0))
    # a sequential sum (not numpy's pairwise one), so that syncs a site did not join
    # (zeros, with per-site timing) leave its sum bit for bit as without them
    settled = np.cumsum(costs, axis=-1)[..., -1]
    return settled, (~done).sum(axis=-1), costs.max(axis=-1)


def cap_allows(
    d: np.ndarray,
    past_d: np.ndarray,
    past_costs: np.ndarray,
    past_lags: np.ndarray,
    caps: np.ndarray,
    reserve: np.ndarray,
) -> np.ndarray:
    """``(k,)`` whether the cap lets each row launch a sync at its ``d`` (module doc;
    arguments as :func:`cap_state`), ``reserve`` ``(k,)`` the syncs the corridor would
    force after it (:func:`forced_after`)."""
    return np.all(site_cap_allows(d, past_d, past_costs, past_lags, caps, reserve), axis=0)


def site_cap_allows(
    d: np.ndarray,
    past_d: np.ndarray,
    past_costs: np.ndarray,
    past_lags: np.ndarray,
    caps: np.ndarray,
    reserve: np.ndarray,
) -> np.ndarray:
    """``(N, k)`` whether the cap lets each site sync (or, with per-site timing,
    contribute) at each row's ``d`` (arguments as :func:`cap_allows`; a sync a site did not
    join is in ``past_costs`` as 0 with lag 0)."""
    settled, pending, forecast = cap_state(d, past_d, past_costs, past_lags)
    need = settled + (pending + 1 + np.asarray(reserve)[None, :]) * forecast
    return need <= np.asarray(caps)[:, None]


def forced_after(d: np.ndarray, n: int, h_max: int) -> np.ndarray:
    """The syncs the corridor forces after a sync at each ``d`` in an episode of ``n``
    decisions when no other sync is launched (one every ``h_max`` decisions while
    ``d < n``)."""
    return np.maximum(0, (int(n) - 1 - np.asarray(d, dtype=np.int64)) // int(h_max))


def schedules_respect_cap(
    schedules: np.ndarray, site_costs: np.ndarray, lags: np.ndarray, caps: np.ndarray, h_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """Replay the cap on ``k`` fixed-precision schedules ``(k, m)`` (sorted decisions):
    ``(ok, forced)``, each ``(k,)``: ``ok`` when every sync the corridor does not force
    (gap ``< h_max`` since the previous sync, the episode starting just after one) is
    allowed by the cap, ``forced`` the syncs the corridor forced while the cap would have
    masked them (the env's ``cap_overridden_syncs``). ``site_costs``: ``(N, n_decisions)``
    isolated costs; ``lags``: ``(N,)`` (:func:`settle_lags`), or ``(N, n_decisions)`` per
    decision (:func:`episode_lags`: changing links)."""
    sched = np.asarray(schedules, dtype=np.int64)
    costs = np.asarray(site_costs, dtype=np.float64)
    n_sites, n = costs.shape
    k, m = sched.shape
    lag_arr = np.asarray(lags, dtype=np.int64)
    lag3 = lag_arr[:, None, None]
    ok = np.ones(k, dtype=bool)
    forced = np.zeros(k, dtype=np.int64)
    prev = np.zeros(k, dtype=np.int64)
    for j in range(m):
        d = sched[:, j]
        past = sched[:, :j]
        past_lags = lag3 if lag_arr.ndim == 1 else lag_arr[:, past]
        allowed = cap_allows(d, past, costs[:, past], past_lags, caps, forced_after(d, n, h_max))
        by_corridor = d - prev >= h_max
        ok &= allowed | by_corridor
        forced += ~allowed & by_corridor
        prev = d
    return ok, forced


def contribution_table(
    openings: np.ndarray, rows: list[list[list[int]]], n_sites: int
) -> np.ndarray:
    """``(R, m, N)`` each row's contribution decision of every round and site (-1: the
    site did not contribute to that round), from its round openings ``(R, m)`` and each
    site's sync decisions (a contribution belongs to the last round opened by then)."""
    op = np.asarray(openings, dtype=np.int64).reshape(len(rows), -1)
    out = np.full((op.shape[0], op.shape[1], n_sites), -1, dtype=np.int64)
    for r, row in enumerate(rows):
        for s, ds in enumerate(row):
            if ds:
                k = np.searchsorted(op[r], np.asarray(ds, dtype=np.int64), side="right") - 1
                out[r, k, s] = ds
    return out


def rounds_respect_cap(
    openings: np.ndarray,
    sends: np.ndarray,
    rules: Any,
    site_costs: np.ndarray,
    lags: np.ndarray,
    caps: np.ndarray,
    h_max: int,
) -> np.ndarray:
    """Replay the cap on ``R`` rounds schedules (per-site timing): ``(R,)`` whether each
    respects it. ``openings`` ``(R, m)``: the round openings; ``sends`` ``(R, m, N)``:
    each round's contribution decision per site, -1 for none (:func:`contribution_table`);
    ``rules``: the rounds' :class:`~diloco_gym.sim.rounds.RoundRules`; the rest as
    :func:`schedules_respect_cap`.

    The env's rule, per site (:meth:`CapTracker.site_allows`: the site's own settled,
    pending and largest costs, the reserve of the rounds the corridor forces after the
    round's opening). A row is kept when every round the corridor does not force (gap
    ``< h_max`` since the previous opening) opens with at least ``quorum`` sites the cap
    allows, and every contribution is allowed, except those the rules may have forced:
    at or after the round's window end while fewer than ``quorum`` of its contributions
    came earlier, or at the episode's last decision. The env's own schedules are kept
    (tested); the kept rows are uniform among the drawn ones that keep the rule."""
    op = np.asarray(openings, dtype=np.int64)
    x = np.asarray(sends, dtype=np.int64)
    costs = np.asarray(site_costs, dtype=np.float64)
    n_sites, n = costs.shape
    r_rows, m = op.shape
    last = n - 1
    lag_arr = np.asarray(lags, dtype=np.int64)
    ok = np.ones(r_rows, dtype=bool)
    caps = np.asarray(caps, dtype=np.float64)
    # events in round order, one per (round, site): decisions (R, j), per-site costs and
    # lags (N, R, j), a site's entry 0 in the others' events (settled at once: adds 0);
    # the first j = k x N of m x N columns are the rounds so far
    ev_d = np.zeros((r_rows, m * n_sites), dtype=np.int64)
    ev_c = np.zeros((n_sites, r_rows, m * n_sites))
    ev_l = np.zeros((n_sites, r_rows, m * n_sites), dtype=np.int64)
    prev = np.zeros(r_rows, dtype=np.int64)
    for k in range(m):
        j = k * n_sites
        past = ev_d[:, :j], ev_c[:, :, :j], ev_l[:, :, :j]
        o = op[:, k]
        reserve = forced_after(o, n, h_max)
        at_open = site_cap_allows(o, *past, caps, reserve)
        ok &= (o - prev >= h_max) | (at_open.sum(axis=0) >= rules.quorum)
        xk = x[:, k, :]  # (R, N)
        sent = xk >= 0
        window_end = np.minimum(o + rules.grace, last)
        for s in range(n_sites):
            xs = np.where(sent[:, s], xk[:, s], o)
            own = past[0], past[1][s : s + 1], past[2][s : s + 1]  # site s's state alone
            allowed = site_cap_allows(xs, *own, caps[s : s + 1], reserve)[0]
            before = (sent & (xk < xs[:, None])).sum(axis=1)
            exempt = ((xs >= window_end) & (before < rules.quorum)) | (xs >= last)
            ok &= ~sent[:, s] | exempt | allowed
            lag = lag_arr[s] if lag_arr.ndim == 1 else lag_arr[s, xs]
            ev_c[s, :, j + s] = np.where(sent[:, s], costs[s, xs], 0.0)
            ev_l[s, :, j + s] = np.where(sent[:, s], lag, 0)
        ev_d[:, j : j + n_sites] = np.where(sent, xk, o[:, None])
        prev = o
    return ok


def site_nominal_requests(setup: Any) -> np.ndarray:
    """``(N,)`` each site's nominal requests per episode window (its nominal rate times
    the window's length: fixed before the episode), the cap's unit."""
    duration = float(setup.generators[0].duration_s)
    return np.asarray([r * duration for r in setup.rates], dtype=np.float64)


def cap_tracker(setup: Any, n_of: Callable[[], int]) -> CapTracker | None:
    """The cap of a :class:`~diloco_gym.envs.fleet.FleetSetup` (``None`` without
    ``site_cap_pp``; ``n_of``: the current episode's decisions). A cap with
    ``merge_budget`` is refused: the budget's mask plans the remaining syncs without the
    cap, so a capped defer could leave the budget infeasible."""
    cap_pp = setup.fleet.site_cap_pp
    if cap_pp is None:
        return None
    if setup.params.merge_budget is not None:
        from diloco_gym.sim.fleet import FleetConfigError

        raise FleetConfigError(
            f"site_cap_pp ({cap_pp:g}) and merge_budget ({setup.params.merge_budget}) "
            f"cannot be combined: remove one of them"
        )
    caps = cap_pp / 100.0 * site_nominal_requests(setup)
    return CapTracker(cap_pp, caps, variant_lags(setup), setup.params.h_max, n_of)


def variant_lags(setup: Any) -> Callable[[int], np.ndarray]:
    """Each sync variant's settle lags (:func:`settle_lags` of its kernel parameters and
    sidecars; a variant is a precision option, or one in a link state:
    :mod:`diloco_gym.envs.fleet_links`), computed once per variant."""
    memo: dict[int, np.ndarray] = {}

    def lags_of(variant: int) -> np.ndarray:
        if variant not in memo:
            memo[variant] = settle_lags(
                setup.option_params[variant], setup.option_sidecars[variant]
            )
        return memo[variant]

    return lags_of


def episode_lags(episode: Any) -> np.ndarray:
    """``(N, n_decisions)`` settle lags of a sync at each decision of a fleet episode at
    ``bits`` (each decision's link state with changing links)."""
    setup = episode.setup
    lags_of = variant_lags(setup)
    cols = [
        lags_of(episode.variant_at(d, setup.default_option)) for d in range(episode.n_decisions)
    ]
    return np.stack(cols, axis=1)


class CapTracker:
    """The cap's state in one fleet env: each launched sync's per-site isolated costs and
    settle lags, and the counters the summary reports.

    Args:
        caps: ``(N,)`` caps in requests (``site_cap_pp / 100 * nominal``).
        lags_of: a sync variant's ``(N,)`` settle lags (:func:`variant_lags`).
        h_max: the corridor's ``H_max`` (decisions), for the reserve of forced syncs.
        n_of: the current episode's number of decisions.
    """

    def __init__(
        self,
        cap_pp: float,
        caps: np.ndarray,
        lags_of: Callable[[int], np.ndarray],
        h_max: int,
        n_of: Callable[[], int],
    ) -> None:
        self.cap_pp = float(cap_pp)
        self.h_max = int(h_max)
        self.n_of = n_of
        self.caps = np.asarray(caps, dtype=np.float64)
        self.lags_of = lags_of
        self.reset()

    def reset(self) -> None:
        self.d: list[int] = []
        self.costs: list[np.ndarray] = []
        self.lags: list[np.ndarray] = []
        #: corridor-feasible launches the cap masked (decisions the agent was asked at).
        self.masked = 0
        #: launches the agent asked for that the cap turned into a defer.
        self.vetoed = 0
        #: syncs the corridor forced while the cap would have masked them.
        self.overridden = 0
        #: whether the last step's action was vetoed (``info["action_overridden"]``).
        self.last_vetoed = False
        self._allowed: tuple[tuple[int, int, int], np.ndarray] | None = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The launched syncs as one row of :func:`cap_state`'s arguments."""
        n = len(self.caps)
        if not self.d:
            return np.zeros((1, 0), np.int64), np.zeros((n, 1, 0)), np.zeros((n, 1, 0), np.int64)
        costs = np.ascontiguousarray(np.stack(self.costs).T[:, None, :])
        return np.asarray([self.d]), costs, np.stack(self.lags).T[:, None, :]

    def allows(self, d: int) -> bool:
        dd = np.array([d], dtype=np.int64)
        reserve = forced_after(dd, self.n_of(), self.h_max)
        return bool(cap_allows(dd, *self._arrays(), self.caps, reserve)[0])

    def site_allows(self, d: int, opening: int) -> np.ndarray:
        """``(N,)`` whether the cap lets each site contribute at ``d`` to a round opened at
        ``opening`` (per-site timing: the reserve counts the rounds the corridor forces
        after that opening); read-only, computed once per decision, opening and record."""
        key = (int(d), int(opening), len(self.d))  # the state changes only by a record
        if self._allowed is not None and self._allowed[0] == key:
            return self._allowed[1]  # the step and the mask ask alike at a decision
        reserve = forced_after(np.array([opening], dtype=np.int64), self.n_of(), self.h_max)
        dd = np.array([d], dtype=np.int64)
        out = site_cap_allows(dd, *self._arrays(), self.caps, reserve)[:, 0]
        out.setflags(write=False)
        self._allowed = (key, out)
        return out

    def record_sends(self, d: int, variant: int, site_costs: np.ndarray, sends: np.ndarray) -> None:
        """The contributions at ``d`` (per-site timing): the sites of ``sends`` with these
        isolated costs; the others' entries are 0 with lag 0 (settled at once, adding
        nothing)."""
        sends = np.asarray(sends, dtype=bool)
        self.d.append(int(d))
        self.costs.append(np.where(sends, np.asarray(site_costs, dtype=np.float64), 0.0))
        self.lags.append(np.where(sends, self.lags_of(variant), 0))

    def record(self, d: int, variant: int, site_costs: np.ndarray) -> None:
        """A sync launched at ``d`` as sync variant ``variant`` (its precision option and
        link state) with these per-site isolated costs (counted as overridden when the cap
        would have masked it)."""
        if not self.allows(d):
            self.overridden += 1
        self.d.append(int(d))
        self.costs.append(np.asarray(site_costs, dtype=np.float64))
        self.lags.append(self.lags_of(variant))

    def mask(self, base: np.ndarray, d: int) -> np.ndarray:
        """The corridor's ``[defer, launch, ...]`` mask with the cap: launch masked when
        deferring is feasible and the cap does not allow it."""
        if base[0] and base[1] and not self.allows(d):
            base = base.copy()
            base[1] = False
        return base

    def want(self, want: bool, d: int, base: np.ndarray) -> bool:
        """The agent's launch request at ``d`` under the cap (``base``: the corridor's
        mask): a launch the cap masks becomes a defer (``last_vetoed``)."""
        blocked = bool(base[0] and base[1]) and not self.allows(d)
        self.masked += int(blocked)
        self.last_vetoed = bool(want and blocked)
        self.vetoed += int(self.last_vetoed)
        return want and not blocked

    def used(self, d: int) -> np.ndarray:
        """``(N,)`` float32: each site's settled excess over its cap, clipped to [0, 1]."""
        settled = cap_state(np.array([d], dtype=np.int64), *self._arrays())[0][:, 0]
        return np.minimum(1.0, settled / self.caps).astype(np.float32)

    def summary(self, site_names: list[str], nominal: np.ndarray) -> dict[str, Any]:
        """The cap's figures for ``episode_summary``: the cap, its counters and each site's
        additive isolated excess in pp of its nominal requests (the cap's own measure)."""
        total = np.zeros(len(self.caps)) if not self.costs else np.sum(self.costs, axis=0)
        pp = 100.0 * total / nominal
        return {
            "site_cap_pp": self.cap_pp,
            "cap_masked_decisions": self.masked,
            "cap_vetoed_launches": self.vetoed,
            "cap_overridden_syncs": self.overridden,
            "site_cap_used_pp": {s: float(v) for s, v in zip(site_names, pp, strict=True)},
        }
