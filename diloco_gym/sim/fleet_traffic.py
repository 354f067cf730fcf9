"""Correlated traffic between a fleet's sites (``traffic_correlation``).

**Synthetic sites.**

Sites of one synthetic regime draw independent traces by default. With
``FleetParams.traffic_correlation = rho`` in (0, 1], each such site's requests are a mix:
every request of the site's own trace is kept with probability ``1 - rho``, and every
request of a trace **common to all the fleet's sites of that regime** (drawn once per
episode from the episode seed) with probability ``rho``. Each site keeps its regime's
request rate (``(1 - rho) + rho = 1`` of it) and its own request sizes' distribution; a
share ``rho`` of its requests, bursts included, comes from the common stream, so the
sites' loads rise and fall together. ``rho = 1``: every site of the regime serves the same
trace; ``rho = 0`` is the independent fleet (the default, which never calls this
module). The network and checkpoint pressures stay the site's own.

Why thinning: it keeps each site's marginal rate exactly, needs no model of the regime
beyond its generator, and makes the common component's share of every window's requests
``rho`` in expectation.

**Trace sites** (:func:`mixed_replay`). The common component is the **common window**: the
600 s window that the fleet's reference trace site (``FleetParams.traffic_common``; by
default the first trace site) replays in the episode. The reference site replays it as
without correlation. Every other trace site keeps each request of its own window with
probability ``1 - rho`` and takes each request of the common window ``rho * c`` times in
expectation (``floor(rho * c)`` times, and once more with probability the fractional
part), where ``c = r_site / r_ref`` is the ratio of the two sites' nominal rates (their
``target_rate_rps``, else their whole traces' mean rates): so each site keeps its own
nominal rate in expectation over the trace's windows, whatever its rate against the
reference. A request taken from the common window keeps its arrival time and gets the
size (prompt and output tokens) of a request drawn uniformly from the site's own trace
file, so that the site keeps its own request sizes and offered work per request (its
``target_utilization`` stays what it says). ``rho = 1``: every trace site's arrival times
are the common window's (each taken ``c`` times in expectation; all of them, once each,
when the site's rate equals the reference's). The pressures stay the site's own.
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.traces import Trace

__all__ = ["shared_seed", "mix_seed", "mixed_trace", "take_counts", "mixed_replay"]

_SALT = 0xC0_441


def shared_seed(episode_seed: int, regime_index: int) -> int:
    """The seed of the trace common to the sites of the fleet's ``regime_index``-th
    synthetic regime in the episode of ``episode_seed``."""
    ss = np.random.SeedSequence([_SALT, int(episode_seed), int(regime_index)])
    return int(ss.generate_state(1)[0])


def mix_seed(episode_seed: int, site: int) -> list[int]:
    """The seed of site ``site``'s thinning draws in the episode of ``episode_seed``."""
    return [_SALT, int(episode_seed), int(site), 1]


def mixed_trace(own: Trace, common: Trace, rho: float, rng: np.random.Generator) -> Trace:
    """``own``'s requests kept with probability ``1 - rho`` and ``common``'s with
    probability ``rho``, in arrival order (ties: own first), over ``own``'s window and with
    its pressures (module docstring)."""
    _check_mix(own, common, rho, "trace")
    keep_own = rng.random(own.num_requests) >= rho
    keep_common = rng.random(common.num_requests) < rho
    return _joined(
        own,
        keep_own,
        common.arrival_s[keep_common],
        common.prompt_tokens[keep_common],
        common.output_tokens[keep_common],
        rho,
    )


def _check_mix(own: Trace, common: Trace, rho: float, what: str) -> None:
    """A mix's share and windows: ``rho`` in (0, 1], the common ``what`` as long as the
    site's window."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"traffic_correlation must be in (0, 1], got {rho!r}")
    if common.duration_s != own.duration_s:
        raise ValueError(
            f"the common {what} lasts {common.duration_s} s, the site's {own.duration_s} s"
        )


def _joined(
    own: Trace,
    keep_own: np.ndarray,
    arrival: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    rho: float,
) -> Trace:
    """``own``'s kept requests and the taken ones (``arrival``, ``prompt``, ``output``) as
    one trace in arrival order (ties: own first), over ``own``'s window, with its pressures
    and its token dtypes."""
    t = np.concatenate([own.arrival_s[keep_own], arrival])
    order = np.argsort(t, kind="stable")
    p = np.concatenate([own.prompt_tokens[keep_own], prompt])
    o = np.concatenate([own.output_tokens[keep_own], output])
    return Trace(
        t[order],
        p[order].astype(own.prompt_tokens.dtype, copy=False),
        o[order].astype(own.output_tokens.dtype, copy=False),
        own.duration_s,
        own.network,
        own.checkpoint,
        own.name,
        {**own.meta, "traffic_correlation": float(rho)},
    )


def take_counts(n: int, share: float, rng: np.random.Generator) -> np.ndarray:
    """How many times each of ``n`` requests is taken when each is taken ``share`` times in
    expectation: ``floor(share)``, plus one with probability ``share - floor(share)``."""
    if not (np.isfinite(share) and share >= 0.0):
        raise ValueError(
            f"the share of the common window must be a finite number >= 0, got {share!r}"
        )
    whole = int(np.floor(share))
    return whole + (rng.random(n) < share - whole).astype(np.int64)


def mixed_replay(
    own: Trace,
    common: Trace,
    rho: float,
    scale: float,
    sizes: Trace,
    rng: np.random.Generator,
) -> Trace:
    """A trace site's episode trace (module docstring, "Trace sites"): ``own``'s requests
    kept with probability ``1 - rho``, each of ``common``'s taken ``rho * scale`` times in
    expectation (:func:`take_counts`) with the size of a request drawn uniformly from
    ``sizes`` (the site's own trace), in arrival order (ties: own first), over ``own``'s
    window and with its pressures."""
    _check_mix(own, common, rho, "window")
    if sizes.num_requests == 0:
        raise ValueError("the site's trace has no request to draw sizes from")
    keep_own = rng.random(own.num_requests) >= rho
    taken = np.repeat(
        np.arange(common.num_requests), take_counts(common.num_requests, rho * scale, rng)
    )
    pick = rng.integers(0, sizes.num_requests, taken.size)
    return _joined(
        own,
        keep_own,
        common.arrival_s[taken],
        sizes.prompt_tokens[pick],
        sizes.output_tokens[pick],
        rho,
    )
