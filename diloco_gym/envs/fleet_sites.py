"""A fleet episode and its site episodes, built and costed together.

:class:`FleetEpisode` is the agent-independent data of one fleet episode: one
:class:`~diloco_gym.envs.episode.Episode` per site. :func:`build_sites` builds the sites'
episodes: :func:`site_groups` groups the sites whose episodes one batch can build (sites of
the same synthetic regime, :func:`~diloco_gym.envs.kernel.is_synthetic`, whose sidecars
agree in everything the episode build reads: all but ``sync_slowdown``, which only the
merge costs read), and :func:`site_episodes` builds such a group's episodes in one trace
generation (:meth:`~diloco_gym.sim.regimes.SyntheticRegime.from_raw`) and one episode
build (:func:`~diloco_gym.envs.episode.episode_core_batch`). :class:`SiteCosts` costs a
sync at every site of a group of equal sidecars in one compiled call. Every episode and
cost is bit for bit what :func:`~diloco_gym.envs.episode.episode_from_seed` and
:meth:`~diloco_gym.envs.episode.Episode.merge_cost_at` give for the site alone: the same
draws from the same generators in the same order, and batch operations that treat every
row as a batch of one (tested).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.episode import Episode, EpisodeCore, episode_core_batch, episode_from_seed
from diloco_gym.envs.fused import NO_THRESHOLDS
from diloco_gym.envs.kernel import is_synthetic
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import reward_per_request
from diloco_gym.sim import bound_call, compiled
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import (
    ReplayResult,
    SidecarParams,
    cost_horizon,
    cost_queue,
    no_merge_queue,
    padded,
    queue_thresholds,
)
from diloco_gym.sim.traces import Trace

__all__ = [
    "compiled_cost_rule",
    "compiled_refusal",
    "FleetEpisode",
    "Joined",
    "GroupedCosts",
    "SiteCosts",
    "build_sites",
    "cost_groups",
    "site_groups",
    "site_episodes",
    "site_seed",
    "correlated_sites",
    "reference_site",
    "check_common_window",
    "fleet_cost_bank",
]


def site_seed(episode_seed: int, site: int) -> int:
    """The seed of site ``site``'s episode: the episode seed itself for site 0 (so a
    one-site fleet is the single env), ``SeedSequence((episode_seed, site))`` otherwise
    (independent streams; no site of one episode repeats a site of another seed)."""
    if site == 0:
        return int(episode_seed)
    return int(np.random.SeedSequence([int(episode_seed), int(site)]).generate_state(1)[0])


def compiled_refusal(setup: Any) -> str | None:
    """Why the compiled step does not cost a one-instant fleet's syncs itself (``None``: it
    does): it costs a sync as the sum of its sites' isolated costs at one precision and
    link state, with one cost horizon for every site (their sidecars' ``tail_s``), and no
    rule of the cap or the worst site on top. Sites of different sidecars are costed with
    their requests' own violation thresholds (:func:`fleet_cost_bank`); any number of
    fragments (model v1's fragment credit is the compiled step's,
    :attr:`~diloco_gym.envs.kernel.EpisodeBatch.fragments`)."""
    s, f = setup, setup.fleet
    p = s.params
    horizons = {cost_horizon(sc, p.step_seconds, p.merge_steps) for sc in s.sidecars}
    reasons = [
        (f.bits_options is not None, "bits_options is set (the per-sync precision action)"),
        (s.links.on, "its links change over time"),
        (f.site_cap_pp is not None, "site_cap_pp is set (a per-site serving cap)"),
        (bool(f.worst_site_weight), "worst_site_weight is set"),
        (len(horizons) > 1, "its sites' merge costs follow different horizons (tail_s)"),
    ]
    return next((why for bad, why in reasons if bad), None)


def compiled_cost_rule(setup: Any, own_env: bool) -> tuple[bool, float]:
    """Whether the compiled step costs a fleet's syncs itself, and the seconds each sync
    stalls the learners there (model v1's learner credit; 0 in v0). ``own_env``: the env is
    the one-instant fleet env itself (not a subclass with costs of its own). It does for
    the plain fleet (the default's): several sites and nothing :func:`compiled_refusal`
    names. The sync's cost is then the sum of the sites' costs and its credit model v1's,
    each operation for operation as the env's ``_merge_cost_at`` computes them (tested);
    other fleets' syncs are costed in Python at each merge."""
    s, f = setup, setup.fleet
    plain = own_env and f.n_sites > 1 and compiled_refusal(s) is None
    stall = float(s.plan.stall_s) if f.model_version >= 1 else 0.0
    if not plain or (f.model_version >= 1 and s.option_plans[s.default_option].stall_s != stall):
        return False, 0.0
    return True, stall


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
    setup: Any, episode_seed: int, learner_params: lrn.LearnerParams
) -> tuple[list[Episode], dict[tuple[int, ...], Joined]]:
    """The site episodes of a fleet episode (``setup``: its
    :class:`~diloco_gym.envs.fleet.FleetSetup`; site ``i``'s seed
    ``site_seed(episode_seed, i)``): each group of
    :attr:`FleetSetup.groups` of several sites by :func:`site_episodes`, a site alone by
    :func:`~diloco_gym.envs.episode.episode_from_seed` (the same episodes either way); and
    each group's batch build (for :class:`SiteCosts`), by its sites."""
    s = setup
    if s.fleet.traffic_correlation > 0:
        return correlated_sites(setup, episode_seed, learner_params), {}
    seeds = [site_seed(episode_seed, i) for i in range(len(s.sidecars))]
    sites: list[Any] = [None] * len(seeds)
    cores: dict[tuple[int, ...], Joined] = {}
    for group in s.groups:
        if len(group) > 1:
            built, c = site_episodes(
                s.generators[group[0]], [seeds[i] for i in group], s.params,
                [s.sidecars[i] for i in group], learner_params, [s.rates[i] for i in group],
            )  # fmt: skip
            # what SiteCosts reads (the episodes' own arrays, joined; none held twice)
            assert c.counts is not None  # episode_core_batch of counted requests
            cores[tuple(group)] = Joined(c.base_s, c.req_bin, c.violated, c.m0, c.s, c.prefmin,
                                         c.counts)  # fmt: skip
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
    return sites, cores


def correlated_sites(
    setup: Any, episode_seed: int, learner_params: lrn.LearnerParams
) -> list[Episode]:
    """The site episodes of a fleet with ``traffic_correlation > 0``
    (:mod:`diloco_gym.sim.fleet_traffic`): each synthetic site's own trace (its
    :func:`site_seed`'s first draw, as without correlation) mixed with the trace common to
    its regime's sites; each trace site's own window (as without correlation) mixed with
    the common window, the window the reference trace site replays in the episode
    (:func:`reference_site`; that site's own episode is unchanged). The learner
    throughputs are then drawn from the site's stream as
    :func:`~diloco_gym.envs.episode.episode_from_seed` draws them. The mix is fixed here,
    before the episode starts."""
    from diloco_gym.envs.episode import build_episode
    from diloco_gym.sim import fleet_traffic as ft

    s = setup
    rho = float(s.fleet.traffic_correlation)
    ref = reference_site(s.fleet)
    common_window = None
    if ref is not None:  # its requests only (the generator's pressures are not read)
        common_window = s.generator_for(ref, episode_seed)(np.random.default_rng(0))
    regimes: dict[str, int] = {}
    out = []
    for i, site in enumerate(s.fleet.sites):
        seed = site_seed(episode_seed, i)
        rng = np.random.default_rng(seed)
        gen = s.generator_for(i, episode_seed)
        own = gen(rng)
        mix_rng = np.random.default_rng(ft.mix_seed(episode_seed, i))
        if site.trace is None:
            k = regimes.setdefault(str(site.regime), len(regimes))
            common = gen(np.random.default_rng(ft.shared_seed(episode_seed, k)))
            trace = ft.mixed_trace(own, common, rho, mix_rng)
        elif i == ref:
            trace = own
        else:
            assert common_window is not None and ref is not None
            scale = s.rates[i] / s.rates[ref]
            trace = ft.mixed_replay(own, common_window, rho, scale, gen.trace, mix_rng)
        out.append(
            build_episode(trace, s.params, s.sidecars[i], learner_params, rng, seed, s.rates[i])
        )
    return out


def check_common_window(setup: Any) -> None:
    """Under ``traffic_correlation`` with trace sites, the most requests a trace site can
    take from the common window in any episode (``ceil(rho x r_site / r_ref)`` times the
    reference's busiest window) within the ``REQUESTS`` limit
    (:mod:`diloco_gym.sim.limits`): checked when the fleet is built, before any episode
    (a site far faster than the reference would take each common request many times)."""
    from diloco_gym.sim.limits import check_limit

    fleet = setup.fleet
    ref = reference_site(fleet)
    rho = float(fleet.traffic_correlation)
    if ref is None or not rho > 0:
        return
    gen = setup.generators[ref]
    start, n_tiles = setup.tiles[ref]
    src = gen.trace
    factor = 1.0 if gen.target_rate_rps is None else src.mean_rate_rps / gen.target_rate_rps
    edges = start + float(gen.duration_s) * np.arange(n_tiles + 1)
    busiest = int(np.max(np.diff(np.searchsorted(src.arrival_s * factor, edges))))
    for i, st in enumerate(fleet.sites):
        if st.trace is None or i == ref:
            continue
        share = rho * setup.rates[i] / setup.rates[ref]
        check_limit(
            "REQUESTS",
            math.ceil(share) * busiest,
            f"site {st.name!r}: requests taken from the common window of "
            f"{fleet.sites[ref].name!r} (each of its busiest window's {busiest} up to "
            f"ceil(traffic_correlation x the rates' ratio) = {math.ceil(share)} times)",
        )


def reference_site(fleet: Any) -> int | None:
    """The index of the fleet's reference trace site (``traffic_common``, else its first
    trace site), whose episode window is the trace sites' common window under
    ``traffic_correlation``; ``None`` without a trace site."""
    names = [st.name for st in fleet.sites]
    if fleet.traffic_common is not None:
        return names.index(fleet.traffic_common)
    traced = [i for i, st in enumerate(fleet.sites) if st.trace is not None]
    return traced[0] if traced else None


def site_episodes(
    generator: Any,
    seeds: list[int],
    params: EnvParams,
    sidecars: list[SidecarParams],
    learner_params: lrn.LearnerParams,
    rates: list[float],
) -> tuple[list[Episode], EpisodeCore]:
    """The episodes of ``seeds`` of the synthetic regime ``generator``, one per seed, with
    ``sidecars[k]`` and reward rate ``rates[k]``: what
    ``episode_from_seed(generator, seeds[k], params, sidecars[k], learner_params,
    rate_rps=rates[k])`` returns, bit for bit. The sidecars must agree in all but
    ``sync_slowdown`` (:func:`site_groups`). Also returns the batch build (the episodes'
    arrays joined)."""
    rngs = [np.random.default_rng(seed) for seed in seeds]
    # as kernel.episode_draws: each site's trace, then its learners, from its own generator
    arrivals, prompt, output, counts, pressure = generator.draw_batch(rngs)
    thrs = [learner_params.draw_throughputs(rng) for rng in rngs]
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
    return out, c


class Joined(NamedTuple):
    """What :class:`SiteCosts` reads of its episodes, joined (the fields of a batch
    build's :class:`~diloco_gym.envs.episode.EpisodeCore` it reads)."""

    base_s: np.ndarray
    req_bin: np.ndarray
    violated: np.ndarray
    m0: np.ndarray
    s: np.ndarray
    prefmin: np.ndarray
    counts: np.ndarray


def _joined(episodes: list[Episode]) -> Joined:
    """``episodes``' arrays joined, as their batch build would hold them."""
    e0 = episodes[0]
    p, sc = e0.params, e0.sidecar
    queues = [e.queue or no_merge_queue(e.base_s, e.req_bin, e.pressure_bin, sc,
                                        p.step_seconds) for e in episodes]  # fmt: skip
    m0, s, prefmin = (np.stack([q[k] for q in queues]) for k in range(3))
    return Joined(
        np.concatenate([e.base_s for e in episodes]),
        np.concatenate([e.req_bin for e in episodes]),
        np.concatenate([e.baseline.violated for e in episodes]),
        m0,
        s,
        prefmin,
        np.array([e.base_s.size for e in episodes], dtype=np.int64),
    )


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

    def __init__(self, episodes: list[Episode], core: Joined | None = None) -> None:
        """``core``: the batch build of exactly these episodes, in order (its arrays are
        theirs, joined: :func:`build_sites`), so that they are not joined again."""
        e0 = episodes[0]
        p, sc = e0.params, e0.sidecar
        self.episodes = episodes
        self.decision_bins = int(p.decision_interval)
        self.merge_bins = int(p.merge_steps)
        self.horizon = cost_horizon(sc, p.step_seconds, self.merge_bins)
        size = e0.pressure_bin.size + 1 + self.horizon
        c = _joined(episodes) if core is None else core
        self.queue = cost_queue(
            c.base_s, c.req_bin, c.violated, c.m0, c.s, sc, p.step_seconds, size,
            counts=c.counts,
        )  # fmt: skip
        # per bin, the sites' no-merge minimum (a contiguous row for each start)
        self.prefmin = np.ascontiguousarray(padded(c.prefmin, size).T)
        k = len(episodes)
        self._starts = np.empty(k, dtype=np.int64)
        self._min0 = np.empty(k)
        self._out = np.empty(k)
        self._sidecar = sc

    @cached_property
    def _call(self) -> Any:
        """One call on arguments bound once (a sync writes its start and minima in place),
        bound at the first sync costed here (none where the compiled step costs them)."""
        q, sc, k = self.queue, self._sidecar, self._out.size
        return bound_call(
            compiled().isolated_costs,
            (
                q.s, q.d, q.ptr, q.rbin, q.base, q.m0, int(q.m0_bins), NO_THRESHOLDS,
                NO_THRESHOLDS, np.arange(k, dtype=np.int64), self._starts, self._min0,
                self.merge_bins, self.horizon, 1.0 + sc.sync_slowdown, float(sc.slo_s),
                float(sc.slots), self._out,
            ),
        )  # fmt: skip

    def fill(self, d: int) -> list[float]:
        """Cost a sync at decision ``d`` at every site of the group, into each site
        episode's cost memo (:attr:`Episode.cost_memo`, where ``merge_cost_at`` finds it);
        the costs, in the group's order."""
        a = d * self.decision_bins
        self._starts.fill(a)
        self._min0[:] = self.prefmin[a]
        self._call()
        out = self._out.tolist()
        for e, c in zip(self.episodes, out, strict=True):
            e.cost_memo[0, d] = c
        return out


def fleet_cost_bank(
    sites: list[Episode], groups: list[list[int]], cores: dict[tuple[int, ...], Joined]
) -> tuple:
    """The cost queues of a fleet episode's sites of several sidecars as one bank of a slot
    per site, in site order (:attr:`FleetEpisode.bank_source`'s layout): each cost group's
    queue as :class:`SiteCosts` builds it, padded to the widest group's requests (``-inf``
    service times, never counted), and each request's violation thresholds inside a sync's
    window and after it from its site's own sidecar
    (:func:`~diloco_gym.sim.sidecar.violation_threshold`: the operations the compiled count
    does with one sidecar; ``+inf`` for a request already violated and for padding). The
    sites must share one cost horizon (their sidecars' ``tail_s``)."""
    e0 = sites[0]
    p = e0.params
    n, step = e0.n_decisions, int(p.decision_interval)
    size = e0.pressure_bin.size + 1 + cost_horizon(e0.sidecar, p.step_seconds, int(p.merge_steps))
    parts: dict[int, tuple] = {}
    for g in groups:
        eps = [sites[i] for i in g]
        c = cores.get(tuple(g)) or _joined(eps)
        q = cost_queue(c.base_s, c.req_bin, c.violated, c.m0, c.s, eps[0].sidecar,
                       p.step_seconds, size, counts=c.counts)  # fmt: skip
        pre = padded(c.prefmin, size)[:, : n * step : step]
        for k, i in enumerate(g):
            parts[i] = (q, k, pre[k])
    order = [parts[i] for i in range(len(sites))]
    w = max(q.rbin.shape[1] for q, _, _ in order)
    rbin = np.zeros((len(sites), w), dtype=np.int32)
    base = np.full((len(sites), w), -np.inf)
    thr_in = np.full((len(sites), w), np.inf)
    thr_tail = np.full((len(sites), w), np.inf)
    for i, (q, k, _) in enumerate(order):
        m = q.rbin.shape[1]
        rbin[i, :m], base[i, :m] = q.rbin[k], q.base[k]
        thr_in[i, :m], thr_tail[i, :m] = queue_thresholds(
            q.m0[k], q.rbin[k], q.base[k], q.m0_bins, sites[i].sidecar
        )
    rows = [(q.s[k], q.d[k], q.ptr[k], q.m0[k]) for q, k, _ in order]
    s_, d_, ptr, m0 = (np.stack([r[j] for r in rows]) for j in range(4))
    pre = np.stack([x for _, _, x in order])
    return (s_, d_, ptr, rbin, base, m0, thr_in, thr_tail, pre, int(order[0][0].m0_bins))


class GroupedCosts:
    """A fleet episode's site episodes in groups of equal sidecars (:func:`cost_groups`),
    each group of several sites costed by one :class:`SiteCosts` (``cores``: the batch
    builds of :func:`build_sites`, by group)."""

    def __init__(
        self,
        sites: list[Episode],
        groups: list[list[int]],
        cores: dict[tuple[int, ...], Joined],
    ) -> None:
        many = [g for g in groups if len(g) > 1]
        self.groups = [SiteCosts([sites[i] for i in g], cores.get(tuple(g))) for g in many]
        #: one group of every site, in order (the default fleet's four bursty sites)
        self.whole = len(many) == 1 and len(many[0]) == len(sites)

    def fill(self, d: int) -> list[float] | None:
        """Each group's costs of a sync at decision ``d``, where not yet in the memos; with
        one group of every site, the sites' costs (``None`` when already costed)."""
        out = None
        for group in self.groups:
            memo = group.episodes[0].cost_memo
            if memo[0, d] != memo[0, d]:  # NaN: not costed yet
                out = group.fill(d)
        return out if self.whole else None


class FleetEpisode:
    """The agent-independent data of one fleet episode: one
    :class:`~diloco_gym.envs.episode.Episode` per site (same decisions), and what the env
    reads from an episode (``n_decisions``, ``exo`` of the first site, the learner
    ``throughputs`` of the first site's stream, reward scale, costs).

    ``merge_cost_at(d)``: the sum over sites of the isolated cost (requests) of a fragment
    sync at ``d``, plus ``worst_site_weight`` times the largest site cost normalised to a
    site of mean nominal rate (0 by default). Additive over syncs, so the exact oracle is
    the dynamic programme over it.
    """

    def __init__(
        self,
        setup: Any,  # the fleet's envs.fleet.FleetSetup
        sites: list[Episode],
        seed: int | None,
        cores: dict[tuple[int, ...], Any] | None = None,
    ) -> None:
        self.setup = setup
        self.sites = sites
        self._cores = cores or {}  # batch builds of groups of sites (envs/fleet_sites.py)
        e0 = sites[0]
        ns = {e.n_decisions for e in sites}
        if len(ns) != 1:
            raise ValueError(f"fleet sites have different decision counts {sorted(ns)}")
        self.n_decisions = e0.n_decisions
        self.exo = e0.exo
        self.throughputs = e0.throughputs
        self.trace = e0.trace
        self.params = setup.params
        self.sidecar = e0.sidecar
        self.seed = seed
        self.reward_per_request = reward_per_request(setup.rate_total, e0.trace.duration_s)
        self.n_requests = sum(e.n_requests for e in sites)
        self.pct_per_request = 100.0 / max(1, self.n_requests)
        self._lam = setup.fleet.worst_site_weight
        self._memo: dict[tuple[int, int], float] = {}
        self._variant_sites: dict[int, list[Episode]] = {}
        self._copies: dict[tuple, Episode] = {}
        #: each decision's link levels (changing links; ``None`` with fixed links)
        self.link_states = setup.links.states(seed, self.n_decisions)

    def variant_at(self, d: int, option: int) -> int:
        """The variant (envs/fleet_links.py) of a sync at decision ``d`` at precision
        option ``option``: the option itself with fixed links."""
        if self.link_states is None:
            return option
        return self.setup.links.variant(option, self.link_states[d])

    def sites_of(self, variant: int) -> list[Episode]:
        """Every site's episode with that variant's sync window and slowdown (the same
        requests and decisions; the episode's own sites for the plain fleet's sync)."""
        s = self.setup
        if variant == s.default_option and s.fleet.bits_options is None and not s.links.on:
            return self.sites
        out = self._variant_sites.get(variant)
        if out is None:
            kp, scs = s.option_params[variant], s.option_sidecars[variant]
            out = [self._site_copy(i, kp, sc) for i, sc in enumerate(scs)]
            self._variant_sites[variant] = out
        return out

    def _site_copy(self, site: int, params: EnvParams, sidecar: Any) -> Episode:
        """Site ``site``'s episode with these sync parameters, one per distinct pair (the
        variants that differ only at other sites share it, and its cost memo)."""
        key = (site, params, sidecar)
        e = self._copies.get(key)
        if e is None:
            e = self._copies[key] = replace(self.sites[site], params=params, sidecar=sidecar)
        return e

    @cached_property
    def throughput_sum(self) -> float:
        """The learners' summed throughput (model v1's learner credit scales it)."""
        return float(np.sum(self.throughputs, axis=-1))

    @cached_property
    def site_costs(self) -> np.ndarray:
        """``(N_sites, n_decisions)`` isolated cost (requests) per site and decision (of a
        sync at ``bits``, in each decision's link state)."""
        k = self.setup.default_option
        if self.link_states is not None:
            cols = [self.site_costs_at(d, k) for d in range(self.n_decisions)]
            return np.asarray(cols, dtype=np.float64).T.copy()
        return np.stack([np.asarray(e.merge_cost, dtype=np.float64) for e in self.sites_of(k)])

    @cached_property
    def merge_cost(self) -> np.ndarray:
        """``(n_decisions,)`` cost of a fragment sync at each decision (see the class)."""
        if len(self.sites) == 1 and not self._lam and self.link_states is None:
            return self.sites_of(self.setup.default_option)[0].merge_cost
        c = self.site_costs
        total = np.zeros(self.n_decisions)
        for row in c:
            total += row
        if self._lam:
            norm = np.asarray(self.setup.norm)[:, None]
            total = total + self._lam * np.max(c * norm, axis=0)
        total.setflags(write=False)
        return total

    @cached_property
    def cost_bank(self) -> np.ndarray:
        """``(N + 1, n_decisions)`` the compiled step's cost memo of this episode
        (:func:`~diloco_gym.sim.jit_step.sites_cost`): row 0 the fleet's cost of a sync at
        each decision (the sum over sites, NaN: not yet), then each site's own, whose rows
        become the site episodes' cost memos (:attr:`Episode.cost_memo`; the costs they
        held are kept), so a cost is computed once whoever asks first."""
        bank = np.full((len(self.sites) + 1, self.n_decisions), np.nan)
        for j, e in enumerate(self.sites):
            bank[1 + j] = e.cost_memo[0]
            e.__dict__["cost_memo"] = bank[1 + j : 2 + j]
        return bank

    @cached_property
    def bank_source(self) -> tuple:
        """The sites' cost queues as the compiled step reads them, a bank of one slot per
        site in site order (:attr:`Episode.cost_source`'s layout; ``prefmin`` per
        decision): one cost group's :class:`SiteCosts`, or for sites of several sidecars
        :func:`fleet_cost_bank` (their thresholds precomputed)."""
        if len(self.setup.cost_groups) > 1:
            sites = self.sites_of(self.setup.default_option)
            return fleet_cost_bank(sites, self.setup.cost_groups, self._cores)
        (g,) = self._grouped.groups
        q = g.queue
        n, step = self.n_decisions, g.decision_bins
        pre = np.ascontiguousarray(g.prefmin[: n * step : step].T)
        return (q.s, q.d, q.ptr, q.rbin, q.base, q.m0, NO_THRESHOLDS, NO_THRESHOLDS, pre,
                int(q.m0_bins))  # fmt: skip

    @cached_property
    def _grouped(self) -> GroupedCosts:
        """The default option's sites, in groups costed together (envs/fleet_sites.py)."""
        sites = self.sites_of(self.setup.default_option)
        return GroupedCosts(sites, self.setup.cost_groups, self._cores)

    def site_costs_at(self, d: int, option: int) -> list[float]:
        """Each site's isolated cost (requests) of a sync at decision ``d`` at precision
        option ``option`` in the link state of ``d`` (memoised in the site episodes)."""
        v = self.variant_at(d, option)
        if v == self.setup.default_option:
            costs = self._grouped.fill(d)
            if costs is not None:  # each is merge_cost_at(d) (equal to merge_cost[d])
                return costs
        return [e.merge_cost_at(d) for e in self.sites_of(v)]

    def merge_cost_at(self, d: int, option: int | None = None) -> float:
        """The cost of a sync at decision ``d`` at precision option ``option`` (``None``:
        ``bits``, the only option without the precision action)."""
        k = self.setup.default_option if option is None else int(option)
        v = self.variant_at(d, k)
        sites = self.sites_of(v)
        if len(sites) == 1 and not self._lam:
            return sites[0].merge_cost_at(d)
        key = (v, d)
        if key not in self._memo:
            cs = self.site_costs_at(d, k)
            total = 0.0
            for c in cs:
                total += c
            if self._lam:
                total += self._lam * max(c * w for c, w in zip(cs, self.setup.norm, strict=True))
            self._memo[key] = total
        return self._memo[key]
