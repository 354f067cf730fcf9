"""Correlated traffic between a fleet's synthetic sites (``traffic_correlation``).

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
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.traces import Trace

__all__ = ["shared_seed", "mix_seed", "mixed_trace"]

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
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"traffic_correlation must be in (0, 1], got {rho!r}")
    if common.duration_s != own.duration_s:
        raise ValueError(
            f"the common trace lasts {common.duration_s} s, the site's {own.duration_s} s"
        )
    keep_own = rng.random(own.num_requests) >= rho
    keep_common = rng.random(common.num_requests) < rho
    arrival = np.concatenate([own.arrival_s[keep_own], common.arrival_s[keep_common]])
    order = np.argsort(arrival, kind="stable")
    prompt = np.concatenate([own.prompt_tokens[keep_own], common.prompt_tokens[keep_common]])
    output = np.concatenate([own.output_tokens[keep_own], common.output_tokens[keep_common]])
    return Trace(
        arrival[order],
        prompt[order],
        output[order],
        own.duration_s,
        own.network,
        own.checkpoint,
        own.name,
        {**own.meta, "traffic_correlation": float(rho)},
    )
