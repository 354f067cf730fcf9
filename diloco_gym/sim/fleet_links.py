"""Links that change over time (docs/fleet.md "Links that change over time").

With ``link_levels`` set in a fleet, each site's link runs at a share of its nominal
``link_gbps`` that changes over the episode: a Markov chain over the levels, one state per
decision and site, independent across sites. At each decision a site's link keeps its
level with probability ``exp(-decision_seconds / link_dwell_s)``; otherwise it draws a
level from ``link_probs`` (which may draw the same level again). The chain starts from
``link_probs``, which is therefore its stationary distribution at every decision.

A sync started at decision ``d`` runs at the links' levels of ``d`` for its whole window:
the ring runs at the slowest link's rate then, and each site's link share, window, stall and
serving slowdown follow from :func:`~diloco_gym.sim.fleet.sync_plan` on the fleet with those
rates (:func:`with_link_levels`). The draws come from a stream of their own, seeded by the
episode seed, so the sites' traffic is the same with and without changing links.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from diloco_gym.sim.limits import check_limit

__all__ = [
    "LINK_STREAM",
    "LinkTrace",
    "check_link_levels",
    "check_fleet_links",
    "link_states",
    "load_link_trace",
    "with_link_levels",
]

#: The tag of the link draws' stream (``SeedSequence([episode_seed, LINK_STREAM])``).
LINK_STREAM = 0x6C696E6B  # "link"


def check_link_levels(levels: Any, probs: Any, dwell_s: Any) -> str | None:
    """What is wrong with a link process, as one line naming the key (``None``: nothing).
    ``levels``: shares of the nominal rate in (0, 1]; ``probs``: one probability per level,
    summing to 1 (``None``: every level alike); ``dwell_s``: the mean seconds a level
    holds before the next draw (> 0)."""
    if levels is None:
        if probs is not None:
            return "link_probs applies only with link_levels"
        return None
    if not isinstance(levels, tuple) or not levels:
        return f"link_levels must be a non-empty list of numbers, got {levels!r}"
    for v in levels:
        if not _number(v) or not 0.0 < v <= 1.0:
            return f"link_levels must be shares of the nominal rate in (0, 1], got {list(levels)}"
    if len(set(levels)) != len(levels):
        return f"link_levels must be distinct, got {list(levels)}"
    if probs is not None:
        if not isinstance(probs, tuple) or len(probs) != len(levels):
            return f"link_probs must give one probability per level ({len(levels)}), got {probs!r}"
        if not all(_number(p) and p >= 0.0 for p in probs) or abs(sum(probs) - 1.0) > 1e-9:
            return f"link_probs must be probabilities summing to 1, got {list(probs)}"
    if not _number(dwell_s) or not dwell_s > 0.0:
        return f"link_dwell_s must be a positive number of seconds, got {dwell_s!r}"
    return None


def check_fleet_links(fleet: Any) -> str | None:
    """What is wrong with a fleet's link keys (one line), or ``None``: the process
    (:func:`check_link_levels`, ``link_dwell_s`` 60 s when absent), no key without
    ``link_levels``, and no ``merge_seconds`` beside it (a window given directly does not
    follow the links)."""
    dwell = 60.0 if fleet.link_dwell_s is None else fleet.link_dwell_s
    err = check_link_levels(fleet.link_levels, fleet.link_probs, dwell)
    if err is None and fleet.link_levels is None and fleet.link_dwell_s is not None:
        err = "link_dwell_s applies only with link_levels"
    traced = [st.name for st in fleet.sites if st.link_trace is not None]
    key = "link_levels" if fleet.link_levels is not None else "link_trace" if traced else None
    if err is None and traced and fleet.link_levels is not None:
        err = (
            f"give link_levels (a link process) or a site's link_trace (site(s) "
            f"{', '.join(map(repr, traced))}), not both"
        )
    if err is None and key is not None and fleet.merge_seconds is not None:
        err = (
            f"{key} needs syncs timed by payload and bandwidth: merge_seconds fixes the "
            "sync window whatever the links; remove it"
        )
    return err


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def link_states(
    seed: int, n_decisions: int, n_sites: int, probs: np.ndarray, stay: float
) -> np.ndarray:
    """``(n_decisions, n_sites)`` level indices of one episode (see the module): the first
    row drawn from ``probs``, and each later row keeping the row before with probability
    ``stay`` per site, else drawn from ``probs``. The same seed gives the same states."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), LINK_STREAM]))
    shape = (int(n_decisions), int(n_sites))
    draws = rng.choice(len(probs), size=shape, p=probs)
    jump = rng.random(shape) >= stay
    if shape[0]:
        jump[0] = True
    rows = np.where(jump, np.arange(shape[0])[:, None], 0)
    last = np.maximum.accumulate(rows, axis=0)  # the decision of each site's last draw
    return np.take_along_axis(draws, last, axis=0).astype(np.int64)


def with_link_levels(fleet: Any, shares: tuple[float, ...]) -> Any:
    """``fleet`` (a :class:`~diloco_gym.sim.fleet.FleetParams`) with each site's link at
    ``shares[i]`` of its ``link_gbps`` and no link process or trace (the fleet of one
    state)."""
    sites = tuple(
        replace(s, link_gbps=s.link_gbps * m, link_trace=None)
        if m != 1.0 or s.link_trace is not None
        else s
        for s, m in zip(fleet.sites, shares, strict=True)
    )
    return replace(fleet, sites=sites, link_levels=None, link_probs=None, link_dwell_s=None)


class LinkTrace(NamedTuple):
    """A site's measured link rate: from ``times[k]`` (seconds, ``times[0] == 0``,
    increasing) on, its link runs at ``shares[k]`` of its nominal rate, until the next
    time; the trace ends at its last time."""

    times: np.ndarray
    shares: np.ndarray

    @property
    def length_s(self) -> float:
        return float(self.times[-1])

    def at(self, t: np.ndarray) -> np.ndarray:
        """The shares at times ``t`` (seconds from the trace's start)."""
        return self.shares[np.searchsorted(self.times, t, side="right") - 1]


def load_link_trace(path: str, site: str) -> LinkTrace:
    """Site ``site``'s link trace: a CSV file with a header ``time_s,share`` and one row
    per change (at least two: the first at 0 s, the last marks the end). Every error is one
    line naming the file, the site and the row or column."""
    import csv

    where = f"{path}: link_trace of site {site!r}"
    try:
        check_limit("SETTINGS_BYTES", os.path.getsize(path), f"{where}: size in bytes")
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot be read ({exc})") from None
    if not rows or [c.strip() for c in rows[0]] != ["time_s", "share"]:
        raise ValueError(f"{where}: the header must be 'time_s,share'")
    times: list[float] = []
    shares: list[float] = []
    for k, row in enumerate(rows[1:], start=2):
        if len(row) != 2:
            raise ValueError(f"{where}: row {k} must have 2 columns, got {len(row)}")
        try:
            t, m = float(row[0]), float(row[1])
        except ValueError:
            raise ValueError(f"{where}: row {k} is not two numbers: {','.join(row)!r}") from None
        if not math.isfinite(t) or (times and t <= times[-1]) or (not times and t != 0.0):
            raise ValueError(
                f"{where}: row {k}: time_s must start at 0 and increase, got {row[0]!r}"
            )
        if not (math.isfinite(m) and 0.0 < m <= 1.0):
            raise ValueError(f"{where}: row {k}: share must be in (0, 1], got {row[1]!r}")
        times.append(t)
        shares.append(m)
    if len(times) < 2:
        raise ValueError(f"{where}: needs at least two rows (0 s and the trace's end)")
    return LinkTrace(np.asarray(times), np.asarray(shares))
