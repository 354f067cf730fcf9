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
from diloco_gym.sim.fleet_links import link_states, with_link_levels
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
        #: the chain's level probabilities (``None``: fixed links)
        self.probs: np.ndarray | None = None
        self.stay = 1.0
        levels = fleet.link_levels
        if levels is None:
            return
        probs = fleet.link_probs or (1.0 / len(levels),) * len(levels)
        self.probs = np.asarray(probs, dtype=np.float64)
        dwell = 60.0 if fleet.link_dwell_s is None else fleet.link_dwell_s
        self.stay = math.exp(-params.decision_seconds / dwell)

    @property
    def on(self) -> bool:
        return self.probs is not None

    def slowest_plans(self) -> list[fl.SyncPlan]:
        """Each precision's plan with every link at its lowest level: the longest windows,
        which the corridor must hold (none with fixed links)."""
        if self.fleet.link_levels is None:
            return []
        low = (min(self.fleet.link_levels),) * self.fleet.n_sites
        return [self._plan(b, low) for b in self.setup.option_bits]

    def slowest_window_s(self) -> float | None:
        """The longest sync window at ``bits`` (every link at its lowest level; ``None``
        with fixed links)."""
        if self.fleet.link_levels is None:
            return None
        low = (min(self.fleet.link_levels),) * self.fleet.n_sites
        return self._plan(self.fleet.bits, low).window_s

    def _plan(self, bits: int, shares: tuple[float, ...]) -> fl.SyncPlan:
        fleet = with_link_levels(replace(self.fleet, bits=bits), shares)
        return fl.sync_plan(fleet, self._base_sidecars, self._step_s)

    def states(self, seed: int | None, n_decisions: int) -> list[tuple[int, ...]] | None:
        """Each decision's link levels (indices into ``link_levels``, one per site) of the
        episode of ``seed`` (:func:`~diloco_gym.sim.fleet_links.link_states`); ``None``
        with fixed links."""
        if self.probs is None:
            return None
        if seed is None:
            raise ValueError("a fleet with changing links needs an episode seed")
        st = link_states(seed, n_decisions, self.fleet.n_sites, self.probs, self.stay)
        return [tuple(r) for r in st.tolist()]

    def rates(self, state: tuple[int, ...]) -> tuple[float, ...]:
        """The sites' link rates (shares of nominal) at levels ``state``."""
        levels = self.fleet.link_levels
        assert levels is not None
        return tuple(float(levels[i]) for i in state)

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
