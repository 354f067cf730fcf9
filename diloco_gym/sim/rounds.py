"""Per-site timing of a fleet's syncs: a sync is a *round* (docs/fleet.md, "Per-site timing").

A round opens at a decision ``o`` (the agent's launch, or the corridor's forced sync at
``H_max``); the corridor applies to round openings, so the exact uniform sampler of
feasible schedules and the oracle's dynamic programme still describe when rounds open.
Each site then contributes its outer update once, at a decision of its own:

* site ``s`` is **ready** from ``o + delay[k, s]`` on, where ``delay[k, s]`` is the start
  delay of round ``k`` at site ``s``: a straggler, drawn uniformly from
  ``0 .. floor(delay_max_s / decision_seconds)`` decisions per round from the episode seed
  (:func:`draw_delays`); 0 for a site without ``delay_max_s``;
* the **grace window** ends at ``o + G`` (``G = floor(grace_s / decision_seconds)``);
* the round **closes** once every site has contributed, or once the window has ended and
  at least ``quorum`` sites have contributed. Until then a site may contribute at any
  decision it is ready; at the window's end the sites still needed for the quorum are
  **forced** (the ready ones, in site order), and a quorum that the ready sites cannot
  reach waits for the next site to become ready, which is forced then;
* a site that has not contributed when the round closes is **dropped** from that round,
  as torchft drops a replica outside the quorum: its tokens of the round do not reach the
  merged model;
* the merged update is **token-weighted**: site ``s`` trains ``compute_speed_s`` of the
  fleet's tokens per second, so a round merges the contributing sites' share of the
  fleet's tokens (:func:`token_share`).

A contribution occupies the site for the fleet's sync window and slows its serving as a
one-instant sync does (the same plan, the same per-site slowdown), so a site's cost of
contributing at decision ``j`` is its isolated cost of a sync at ``j``. With a grace window
of 0, a quorum of every site and no stragglers every site contributes at ``o``: the
one-instant sync, bit for bit.

A round must close before the next may open and a site's syncs must not overlap:
``max(G, max delay) + window <= H_min`` (in decisions) is checked when the env is built
(:func:`check_fits`). At the episode's last decision an open round closes: its ready
sites are forced as at the window's end and the sites not yet ready are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TIMINGS",
    "RoundRules",
    "round_rules",
    "check_fits",
    "draw_delays",
    "token_share",
    "send_range",
    "send_ranges",
    "RoundState",
]

#: ``instant``: every site joins one sync at one instant (the fleet's original model);
#: ``rounds``: per-site timing (this module).
TIMINGS = ("instant", "rounds")
#: Salt of the stragglers' random stream (its own stream of the episode seed).
_DELAY_SALT = 0x5_7A66


@dataclass(frozen=True)
class RoundRules:
    """The rules of a fleet's rounds, in decisions.

    Attributes:
        grace: ``G``, the grace window after a round opens.
        quorum: the number of sites that must contribute before a round may close.
        delay_max: per site, the largest start delay.
        weights: per site, its share of the fleet's tokens (sums to 1).
    """

    grace: int
    quorum: int
    delay_max: tuple[int, ...]
    weights: tuple[float, ...]

    @property
    def n_sites(self) -> int:
        return len(self.delay_max)

    @property
    def span(self) -> int:
        """The most decisions after its opening that a round's last contribution can be."""
        return max(self.grace, max(self.delay_max))


def round_rules(
    grace_s: float,
    quorum: int | None,
    delay_max_s: list[float],
    speeds: list[float],
    decision_seconds: float,
) -> RoundRules:
    """The rules in decisions (``quorum=None``: every site)."""
    n = len(delay_max_s)
    q = n if quorum is None else int(quorum)
    if not 1 <= q <= n:
        raise ValueError(f"quorum must be in [1, {n}] (the number of sites), got {quorum!r}")
    tot = float(sum(speeds))
    return RoundRules(
        grace=int(math.floor(grace_s / decision_seconds + 1e-9)),
        quorum=q,
        delay_max=tuple(int(math.floor(x / decision_seconds + 1e-9)) for x in delay_max_s),
        weights=tuple(float(s) / tot for s in speeds),
    )


def check_fits(rules: RoundRules, window_decisions: int, h_min: int) -> None:
    """A round closes, and a site's sync ends, before the next round may open."""
    need = rules.span + window_decisions
    if need > h_min:
        raise ValueError(
            f"a round can last {rules.span} decisions (grace window and largest start delay) "
            f"and its last sync {window_decisions} more, {need} in all, which must fit inside "
            f"the corridor's minimum gap of {h_min} decisions (h_min_steps / "
            f"decision_interval): shorten grace_s or delay_max_s, or raise h_min_steps"
        )


def draw_delays(seed: int | None, n_rounds: int, rules: RoundRules) -> np.ndarray:
    """``(n_rounds, N)`` start delays (decisions) of the episode of ``seed``: round ``k``'s
    delay at site ``s`` uniform in ``0 .. delay_max[s]``, from the seed's own stream (the
    same for every agent on the episode, whatever it does)."""
    n = rules.n_sites
    hi = np.asarray(rules.delay_max, dtype=np.int64)
    if n_rounds <= 0 or not hi.any():
        return np.zeros((max(0, n_rounds), n), dtype=np.int64)
    rng = np.random.default_rng([_DELAY_SALT, -1 if seed is None else int(seed)])
    return rng.integers(0, hi + 1, size=(n_rounds, n), dtype=np.int64)


def token_share(rules: RoundRules, contributed: np.ndarray) -> float:
    """The contributing sites' share of the fleet's tokens (1.0 when every site did)."""
    if bool(np.all(contributed)):
        return 1.0
    return float(sum(w for w, c in zip(rules.weights, contributed, strict=True) if c))


def send_range(opening: int, delay: int, grace: int, last: int) -> tuple[int, int]:
    """The decisions ``[lo, hi]`` at which a site may contribute to a round opened at
    ``opening`` with start delay ``delay`` once the quorum needs every site: from ready to
    its deadline ``max(window end, ready)``, both clipped to the episode's ``last``
    decision (``lo > hi``: the site is never ready in the episode)."""
    lo = opening + delay
    hi = min(max(opening + grace, lo), last)
    return lo, hi


def send_ranges(
    openings: np.ndarray, delays: np.ndarray, grace: int, last: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`send_range` of arrays: ``(lo, hi)`` of each (opening, delay) pair, elementwise
    (broadcast), the same decisions (tested)."""
    lo = np.asarray(openings, dtype=np.int64) + np.asarray(delays, dtype=np.int64)
    hi = np.minimum(np.maximum(np.asarray(openings, dtype=np.int64) + grace, lo), last)
    return lo, hi


class RoundState:
    """One open round: who has contributed, who may, who must (the env's and the
    rule-checkers' one implementation of the rules above)."""

    def __init__(self, rules: RoundRules, opening: int, delays: np.ndarray, last: int) -> None:
        self.rules = rules
        self.opening = int(opening)
        self.delays = np.asarray(delays, dtype=np.int64)
        self.last = int(last)
        self.window_end = min(self.opening + rules.grace, self.last)
        n = rules.n_sites
        self.sent = np.zeros(n, dtype=bool)
        self.send_d = np.full(n, -1, dtype=np.int64)
        self.closed = False

    def ready(self, d: int) -> np.ndarray:
        """Sites that may contribute at ``d`` (ready, not yet contributed)."""
        return (self.opening + self.delays <= d) & ~self.sent

    def forced(self, d: int, voluntary: np.ndarray, prefer: np.ndarray | None = None) -> np.ndarray:
        """The sites forced at ``d`` beside the ``voluntary`` ones (already restricted to
        the ready sites): at or after the window's end (or the episode's last decision),
        the ready sites still needed for the quorum, in site order (``prefer``: those
        sites first, then the others; a site cap prefers the sites it allows)."""
        out = np.zeros(self.rules.n_sites, dtype=bool)
        if d < self.window_end:
            return out
        need = self.rules.quorum - int(self.sent.sum()) - int(voluntary.sum())
        if d >= self.last:
            need = self.rules.n_sites  # the episode ends: every ready site is forced
        if need <= 0:
            return out
        cand = np.flatnonzero(self.ready(d) & ~voluntary)
        if prefer is not None:
            first = np.asarray(prefer, dtype=bool)[cand]
            cand = np.concatenate([cand[first], cand[~first]])
        for s in cand[:need]:
            out[s] = True
        return out

    def must_send(self, d: int) -> np.ndarray:
        """Sites that must contribute at ``d`` whatever the agent asks: every ready site
        when the quorum still needs all of them (the mask's forced ones)."""
        out = np.zeros(self.rules.n_sites, dtype=bool)
        if d < self.window_end:
            return out
        ready = self.ready(d)
        need = self.rules.quorum - int(self.sent.sum())
        if d >= self.last or need >= int(ready.sum()):
            out[:] = ready
        return out

    def contribute(
        self, d: int, wanted: np.ndarray, prefer: np.ndarray | None = None
    ) -> tuple[np.ndarray, bool]:
        """The sites that contribute at ``d`` given the agent's ``wanted`` sites: the wanted
        ready ones plus the forced ones. Returns them and whether the rules changed the
        agent's choice: a forced site it did not ask, or, after the opening, a site it
        asked that was not ready (at the opening a site's start delay is not yet known, so
        asking a straggler then is no override: it joins when ready). Closes the round when
        its rules say so. ``prefer``: the sites forced first (:meth:`forced`)."""
        wanted = np.asarray(wanted, dtype=bool)
        ready = self.ready(d)
        voluntary = wanted & ready
        forced = self.forced(d, voluntary, prefer)
        sends = voluntary | forced
        self.sent |= sends
        self.send_d[sends] = d
        late = d > self.opening and bool(np.any(wanted & ~ready))
        overridden = late or bool(np.any(forced))
        done = bool(self.sent.all())
        if d >= self.window_end and int(self.sent.sum()) >= self.rules.quorum:
            done = True
        if d >= self.last:
            done = True
        self.closed = done
        return sends, overridden
