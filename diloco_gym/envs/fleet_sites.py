"""A fleet episode's site episodes, built together.

:func:`site_groups` groups a fleet's sites whose episodes one batch can build: sites of the
same synthetic regime (:func:`~diloco_gym.envs.kernel.is_synthetic`) whose sidecars agree
in everything the episode build reads (all but ``sync_slowdown``, which only the merge
costs read). :func:`site_episodes` builds such a group's episodes for their seeds in one
trace generation (:meth:`~diloco_gym.sim.regimes.SyntheticRegime.from_raw`) and one
episode build (:func:`~diloco_gym.envs.episode.episode_core_batch`), each episode bit for
bit the :func:`~diloco_gym.envs.episode.episode_from_seed` of its seed: the same draws from
the same generator, in the same order, and batch operations that treat every episode as
a batch of one (tested).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from diloco_gym.envs.episode import Episode, episode_core_batch, episode_from_seed
from diloco_gym.envs.fused import NO_THRESHOLDS
from diloco_gym.envs.kernel import is_synthetic
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import reward_per_request
from diloco_gym.sim import compiled
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import (
    ReplayResult,
    SidecarParams,
    cost_horizon,
    cost_queue,
    no_merge_queue,
    padded,
)
from diloco_gym.sim.traces import Trace

__all__ = ["SiteCosts", "build_sites", "cost_groups", "site_groups", "site_episodes"]


def site_groups(generators: list[Any], sidecars: list[SidecarParams]) -> list[list[int]]:
    """The fleet's sites (indices, in order) in groups that :func:`site_episodes` builds
    together; a site that shares with no other is a group of its own (built alone)."""
    groups: dict[tuple, list[int]] = {}
    for i, (gen, sc) in enumerate(zip(generators, sidecars, strict=True)):
        if is_synthetic(gen):
            key: tuple = (id(gen), replace(sc, sync_slowdown=0.0))
        else:
            key = ("alone", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def build_sites(
    setup: Any, episode_seed: int, seeds: list[int], learner_params: lrn.LearnerParams
) -> list[Episode]:
    """The site episodes of a fleet episode (``setup``: its
    :class:`~diloco_gym.envs.fleet.FleetSetup`; ``seeds``: each site's seed): each group of
    :attr:`FleetSetup.groups` of several sites by :func:`site_episodes`, a site alone by
    :func:`~diloco_gym.envs.episode.episode_from_seed` (the same episodes either way)."""
    s = setup
    sites: list[Any] = [None] * len(seeds)
    for group in s.groups:
        if len(group) > 1:
            built = site_episodes(
                s.generators[group[0]], [seeds[i] for i in group], s.params,
                [s.sidecars[i] for i in group], learner_params, [s.rates[i] for i in group],
            )  # fmt: skip
        else:
            i = group[0]
            built = [
                episode_from_seed(
                    s.generator_for(i, episode_seed),
                    seeds[i],
                    s.params,
                    s.sidecars[i],
                    learner_params,
                    rate_rps=s.rates[i],
                )  # fmt: skip
            ]
        for i, e in zip(group, built, strict=True):
            sites[i] = e
    return sites


def site_episodes(
    generator: Any,
    seeds: list[int],
    params: EnvParams,
    sidecars: list[SidecarParams],
    learner_params: lrn.LearnerParams,
    rates: list[float],
) -> list[Episode]:
    """The episodes of ``seeds`` of the synthetic regime ``generator``, one per seed, with
    ``sidecars[k]`` and reward rate ``rates[k]``: what
    ``episode_from_seed(generator, seeds[k], params, sidecars[k], learner_params,
    rate_rps=rates[k])`` returns, bit for bit. The sidecars must agree in all but
    ``sync_slowdown`` (:func:`site_groups`)."""
    raws, thrs = [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)  # as kernel.episode_draws: the trace, then learners
        raws.append(generator.draw_raw(rng))
        thrs.append(learner_params.draw_throughputs(rng))
    arrivals, prompt, output, counts, pressure = generator.from_raw(raws, np.int64)
    duration = generator.duration_s
    c = episode_core_batch(
        arrivals, prompt, output, pressure[:, 0], pressure[:, 1], duration, params,
        sidecars[0], generator.name, counts=counts,
    )  # fmt: skip
    offsets = np.zeros(len(seeds) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out = []
    for k, seed in enumerate(seeds):
        a, b = int(offsets[k]), int(offsets[k + 1])
        trace = Trace(
            arrivals[a:b],
            prompt[a:b],
            output[a:b],
            duration,
            network=pressure[k, 0],
            checkpoint=pressure[k, 1],
            name=generator.name,
            meta={"regime": generator.name},
        )
        req_bin = c.req_bin[a:b]
        baseline = ReplayResult(
            c.latency[a:b], c.violated[a:b], np.zeros(b - a, dtype=bool), c.pressure_bin[k][req_bin]
        )
        out.append(
            Episode(
                trace,
                c.n,
                c.exo[k],
                thrs[k],
                c.base_s[a:b],
                req_bin,
                c.pressure_bin[k],
                baseline,
                params,
                sidecars[k],
                seed,
                reward_per_request(rates[k], duration),
                (c.m0[k], c.s[k], c.prefmin[k]),
            )  # fmt: skip
        )
    return out


def cost_groups(sidecars: list[SidecarParams]) -> list[list[int]]:
    """The fleet's sites (indices, in order) in groups of equal sidecars, whose merges
    :class:`SiteCosts` costs together (one group of one per site without an equal)."""
    groups: dict[SidecarParams, list[int]] = {}
    for i, sc in enumerate(sidecars):
        groups.setdefault(sc, []).append(i)
    return list(groups.values())


class SiteCosts:
    """The isolated merge costs of a group of a fleet episode's site episodes of equal
    parameters and sidecar: their cost queues as the rows of one bank
    (:func:`~diloco_gym.sim.sidecar.cost_queue` of the group, one compiled call), and a
    sync's cost at every site of the group in one compiled call
    (:func:`~diloco_gym.sim.jit.isolated_costs`, which costs each row as
    :meth:`~diloco_gym.sim.sidecar.IsolatedMergeCost.cost_at` costs its episode: the same
    values, bit for bit)."""

    def __init__(self, episodes: list[Episode]) -> None:
        e0 = episodes[0]
        p, sc = e0.params, e0.sidecar
        self.episodes = episodes
        self.decision_bins = int(p.decision_interval)
        self.merge_bins = int(p.merge_steps)
        self.horizon = cost_horizon(sc, p.step_seconds, self.merge_bins)
        size = e0.pressure_bin.size + 1 + self.horizon
        queues = [e.queue or no_merge_queue(e.base_s, e.req_bin, e.pressure_bin, sc,
                                            p.step_seconds) for e in episodes]  # fmt: skip
        self.queue = cost_queue(
            np.concatenate([e.base_s for e in episodes]),
            np.concatenate([e.req_bin for e in episodes]),
            np.concatenate([e.baseline.violated for e in episodes]),
            np.stack([q[0] for q in queues]),
            np.stack([q[1] for q in queues]),
            sc,
            p.step_seconds,
            size,
            counts=np.array([e.base_s.size for e in episodes], dtype=np.int64),
        )
        # per bin, the sites' no-merge minimum (a contiguous row for each start)
        self.prefmin = np.ascontiguousarray(padded(np.stack([q[2] for q in queues]), size).T)
        self.rows = np.arange(len(episodes), dtype=np.int64)
        self.consts = (1.0 + sc.sync_slowdown, sc.slo_s, float(sc.slots))
        self._starts = np.empty(len(episodes), dtype=np.int64)
        self._out = np.empty(len(episodes))

    def fill(self, d: int) -> None:
        """Cost a sync at decision ``d`` at every site of the group, into each site
        episode's cost memo (:attr:`Episode.cost_memo`, where ``merge_cost_at`` finds it)."""
        q = self.queue
        a = d * self.decision_bins
        self._starts[:] = a
        compiled().isolated_costs(
            q.s, q.d, q.ptr, q.rbin, q.base, q.m0, int(q.m0_bins), NO_THRESHOLDS,
            NO_THRESHOLDS, self.rows, self._starts, self.prefmin[a], self.merge_bins,
            self.horizon, *self.consts, self._out,
        )  # fmt: skip
        for e, c in zip(self.episodes, self._out.tolist(), strict=True):
            e.cost_memo[0, d] = c
