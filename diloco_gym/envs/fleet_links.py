"""Changing links in the fleet env (:mod:`diloco_gym.sim.fleet_links` is the process).

A sync's *variant* is its plan, sidecars and kernel parameters in one link state: the
index into a :class:`~diloco_gym.envs.fleet.FleetSetup`'s ``option_plans``,
``option_sidecars``, ``option_params`` and ``variant_bits``. The first variants are the
precision options with every link at its nominal rate; :meth:`FleetLinks.variant` adds
one per further (precision, link rates) pair met, once per fleet. The observation gains
one feature per site, ``<site>.link_rate``: the share of its nominal rate the site's link
runs at in the current decision (what a deployed scheduler reads from its own links).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import fleet as fl
from diloco_gym.sim.fleet_links import LinkTrace, link_states, load_link_trace, with_link_levels
from diloco_gym.sim.sidecar import SidecarParams

__all__ = ["FleetLinks", "LINK_FEATURE", "link_obs_features", "with_slowdowns"]

#: the per-site observation feature of changing links: ``<site>.link_rate``.
LINK_FEATURE = "link_rate"


def with_slowdowns(sidecars: list[SidecarParams], plan: fl.SyncPlan) -> list[SidecarParams]:
    """The sites' sidecars with the sync slowdowns of ``plan``."""
    return [
        sc if sc.sync_slowdown == m else replace(sc, sync_slowdown=m)
        for sc, m in zip(sidecars, plan.slowdowns, strict=True)
    ]


def link_obs_features(
    site_names: list[str] | tuple[str, ...], on: bool
) -> tuple[tuple[str, str, float, float, str], ...]:
    """The link features of the observation table (none with fixed links)."""
    if not on:
        return ()
    return tuple(
        (
            f"{n}.{LINK_FEATURE}",
            "share",
            0.0,
            1.0,
            f"share of site {n}'s nominal link rate its link runs at now",
        )
        for n in site_names
    )


class FleetLinks:
    """The link process of one fleet setup: its chain (probabilities, per-decision stay
    probability) and the variants of the syncs in each link state."""

    def __init__(self, setup: Any, base_sidecars: list[SidecarParams], params: EnvParams) -> None:
        fleet: fl.FleetParams = setup.fleet
        self.setup = setup
        self.fleet = fleet
        self._base_sidecars = base_sidecars
        self._step_s = params.step_seconds
        self._variants: dict[tuple[int, tuple[float, ...]], int] = {}
        self._decision_s = params.decision_seconds
        #: the chain's level probabilities (``None``: fixed links, or traces)
        self.probs: np.ndarray | None = None
        self.stay = 1.0
        #: each site's link trace (``None``: none), read when the env is built
        self.traces: list[LinkTrace | None] = [
            None if st.link_trace is None else load_link_trace(st.link_trace, st.name)
            for st in fleet.sites
        ]
        #: the shares a link takes (a state is an index into them per site)
        self.levels: tuple[float, ...] = (1.0,)
        #: each site's lowest share (the slowest plans)
        self.low: tuple[float, ...] = (1.0,) * fleet.n_sites
        if any(t is not None for t in self.traces):
            shares = {1.0}.union(*(t.shares.tolist() for t in self.traces if t is not None))
            self.levels = tuple(sorted(shares, reverse=True))
            self.low = tuple(1.0 if t is None else float(t.shares.min()) for t in self.traces)
            return
        levels = fleet.link_levels
        if levels is None:
            return
        self.levels = tuple(levels)
        self.low = (min(levels),) * fleet.n_sites
        probs = fleet.link_probs or (1.0 / len(levels),) * len(levels)
        self.probs = np.asarray(probs, dtype=np.float64)
        dwell = 60.0 if fleet.link_dwell_s is None else fleet.link_dwell_s
        self.stay = math.exp(-params.decision_seconds / dwell)

    @property
    def on(self) -> bool:
        return self.probs is not None or self.traced

    @property
    def traced(self) -> bool:
        """Some site's link follows a trace."""
        return any(t is not None for t in self.traces)

    def slowest_plans(self) -> list[fl.SyncPlan]:
        """Each precision's plan with every link at its lowest share: the longest windows,
        which the corridor must hold (none with fixed links)."""
        if not self.on:
            return []
        return [self._plan(b, self.low) for b in self.setup.option_bits]

    def slowest_window_s(self) -> float | None:
        """The longest sync window at ``bits`` (every link at its lowest share; ``None``
        with fixed links)."""
        if not self.on:
            return None
        return self._plan(self.fleet.bits, self.low).window_s

    def _plan(self, bits: int, shares: tuple[float, ...]) -> fl.SyncPlan:
        fleet = with_link_levels(replace(self.fleet, bits=bits), shares)
        return fl.sync_plan(fleet, self._base_sidecars, self._step_s)

    def states(self, seed: int | None, n_decisions: int) -> list[tuple[int, ...]] | None:
        """Each decision's link levels (indices into ``link_levels``, one per site) of the
        episode of ``seed`` (:func:`~diloco_gym.sim.fleet_links.link_states`); ``None``
        with fixed links."""
        if not self.on:
            return None
        if seed is None:
            raise ValueError("a fleet with changing links needs an episode seed")
        if self.traced:
            st = self._trace_states(int(seed), n_decisions)
        else:
            assert self.probs is not None
            st = link_states(seed, n_decisions, self.fleet.n_sites, self.probs, self.stay)
        return [tuple(r) for r in st.tolist()]

    def trace_tiles(self, n_decisions: int) -> int:
        """How many disjoint episodes of ``n_decisions`` the shortest link trace holds (0
        without traces): episodes that many seeds apart replay the same links."""
        span = n_decisions * self._decision_s
        lengths = [t.length_s for t in self.traces if t is not None]
        return min(int(x // span) for x in lengths) if lengths else 0

    def _trace_states(self, seed: int, n_decisions: int) -> np.ndarray:
        """``(n_decisions, N)`` level indices from the sites' traces: the episode of ``seed``
        replays tile ``seed mod tiles`` of the traces (each tile as long as the episode's
        decisions, the tiles disjoint); a site without a trace stays at its nominal rate."""
        span = n_decisions * self._decision_s
        sites = self.fleet.sites
        traced = [(st, t) for st, t in zip(sites, self.traces, strict=True) if t is not None]
        tiles = self.trace_tiles(n_decisions)
        if tiles < 1:
            st, t = min(traced, key=lambda x: x[1].length_s)
            raise ValueError(
                f"{st.link_trace}: link_trace of site {st.name!r} covers {t.length_s:g} s; an "
                f"episode's {n_decisions} decisions span {span:g} s"
            )
        times = (seed % tiles) * span + np.arange(n_decisions) * self._decision_s
        index = {m: i for i, m in enumerate(self.levels)}
        out = np.zeros((n_decisions, len(sites)), dtype=np.int64)
        for j, t in enumerate(self.traces):
            if t is not None:
                out[:, j] = [index[m] for m in t.at(times).tolist()]
        return out

    def rates(self, state: tuple[int, ...]) -> tuple[float, ...]:
        """The sites' link rates (shares of nominal) at levels ``state``."""
        return tuple(float(self.levels[i]) for i in state)

    def variant(self, option: int, state: tuple[int, ...]) -> int:
        """The variant of a sync at precision option ``option`` with the links at levels
        ``state``: ``option`` itself when every link runs at its nominal rate, else the
        plan of those rates (built once per fleet)."""
        shares = self.rates(state)
        if all(m == 1.0 for m in shares):
            return option
        key = (option, shares)
        v = self._variants.get(key)
        if v is None:
            s = self.setup
            pl = self._plan(s.option_bits[option], shares)
            s.option_plans.append(pl)
            s.option_sidecars.append(with_slowdowns(self._base_sidecars, pl))
            s.option_params.append(replace(s.params, merge_seconds=pl.window_s))
            s.variant_bits.append(s.option_bits[option])
            v = self._variants[key] = len(s.option_plans) - 1
        return v
