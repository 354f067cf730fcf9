"""``DiLoCoFleet-v1`` (and the deprecated ``-v0``): when to run the next fragment sync of
a DiLoCo fleet of sites.

The fleet env is the single env (:class:`~diloco_gym.envs.env.DiLoCoSyncEnv`, the kernel
on a batch of one) with a fleet episode: every site's episode is built by the same
:func:`~diloco_gym.envs.episode.episode_from_seed` with the fleet's kernel parameters (the
fragment corridor, the payload-timed sync window) and the site's sidecar (slowed down as
the sync's link share says, :func:`~diloco_gym.sim.fleet.sync_plan`); a sync's cost is the
sum of the sites' isolated costs. No rule of the dynamics is written here: the corridor,
budget, merge, reward and observation blocks are the kernel's.

The model, its formulas and defaults: docs/fleet.md.
"""

from __future__ import annotations

from dataclasses import fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.envs import fleet_cap
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import episode_length
from diloco_gym.envs.fleet_cap import fleet_obs_features
from diloco_gym.envs.fleet_links import FleetLinks, link_obs_features, with_slowdowns
from diloco_gym.envs.fleet_sites import (
    FleetEpisode,
    build_sites,
    check_common_window,
    compiled_cost_rule,
    cost_groups,
    site_groups,
    site_seed,
)
from diloco_gym.envs.observation import EXO_SLICE, OBS_DIM, OBS_FEATURES
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import nominal_rate_rps, require_additive
from diloco_gym.envs.schedule import schedule_summary, site_summaries
from diloco_gym.envs.shaping import require_unshaped
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import fleet_toml
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.regimes import ReplayRegime, get_regime, replay_rate_scale
from diloco_gym.sim.sidecar import SidecarParams

__all__ = [
    "DiLoCoFleetEnv",
    "FleetEpisode",
    "FleetSetup",
    "fleet_setup",
    "fleet_obs_features",
    "require_fixed_precision",
    "site_seed",
]

_EXO_NAMES = tuple(f[0] for f in OBS_FEATURES[EXO_SLICE])
_N_EXO = len(_EXO_NAMES)
_FLEET_FIELDS = {f.name for f in fields(fl.FleetParams)}
_ENV_FIELDS = {f.name for f in fields(EnvParams)}


def require_fixed_precision(fleet: fl.FleetParams, what: str) -> None:
    """Refuse a fleet with the per-sync precision action where ``what`` (a protocol step)
    launches every sync at one precision: its heuristic agents, matched-random control and
    oracle choose only when to sync, so their scores would not be comparable."""
    if fleet.bits_options is not None:
        raise fl.FleetConfigError(
            f"{what} scores fixed-precision fleets only, and this fleet sets bits_options "
            f"{list(fleet.bits_options)} (the per-sync precision action): its agents, "
            f"matched-random control and oracle launch every sync at one precision. Remove "
            f"bits_options to score the fleet at bits={fleet.bits}"
        )


@lru_cache(maxsize=8)
def _load_trace(path: str):
    from diloco_gym.sim.loaders import load_trace

    return load_trace(path)


class FleetSetup:
    """A fleet resolved against the env parameters: per-site generators, sidecars (with
    the sync's slowdown) and nominal rates, the sync plan and the kernel parameters."""

    def __init__(self, fleet: fl.FleetParams, params: EnvParams) -> None:
        self.fleet = fleet
        gens: list[Any] = []
        #: trace sites: ``site -> (start_s, tiles)``; episode seed ``k`` replays the disjoint
        #: 600 s window ``k mod tiles`` after ``start_s`` (:meth:`generator_for`).
        self.tiles: dict[int, tuple[float, int]] = {}
        base_sidecars: list[SidecarParams] = []
        for s in fleet.sites:
            if s.trace is not None:
                gen: Any = self._trace_site(s, len(gens))
            else:
                assert s.regime is not None
                try:
                    gen = get_regime(s.regime)
                except (KeyError, ValueError) as exc:
                    raise fl.FleetConfigError(f"site {s.name!r}: {exc}") from None
            gens.append(gen)
            base_sidecars.append(s.sidecar_params(gen.sidecar))
        durations = {float(g.duration_s) for g in gens}
        if len(durations) != 1:
            raise fl.FleetConfigError(
                f"the sites' windows differ in length ({sorted(durations)} s); they must be equal"
            )
        self.generators = gens
        self.plan = fl.sync_plan(fleet, base_sidecars, params.step_seconds)
        self.sidecars = [
            sc if sc.sync_slowdown == m else replace(sc, sync_slowdown=m)
            for sc, m in zip(base_sidecars, self.plan.slowdowns, strict=True)
        ]
        self._option_tables(fleet, base_sidecars, params.step_seconds)
        #: changing links: each sync's plan in the links' state (envs/fleet_links.py)
        self.links = FleetLinks(self, base_sidecars, params)
        lo, hi = fl.fragment_corridor(params.h_min, params.h_max, fleet.fragments)
        iv = params.decision_interval
        window = max(pl.window_s for pl in self.option_plans + self.links.slowest_plans())
        try:
            self.params = replace(
                params, h_min_steps=lo * iv, h_max_steps=hi * iv, merge_seconds=window
            )
        except ValueError as exc:
            raise fl.FleetConfigError(
                f"the fragment sync ({window:.2f} s) does not fit the fragment "
                f"corridor [{lo}, {hi}] decisions ({exc})"
            ) from None
        self._check_decision_counts(fleet, float(durations.pop()))
        #: per precision option: the kernel parameters with that sync's window.
        self.option_params = [
            replace(self.params, merge_seconds=pl.window_s) for pl in self.option_plans
        ]
        kp = self.params
        self.rates = [nominal_rate_rps(g, replace(kp, reward_rate_rps=None)) for g in gens]
        if params.reward_rate_rps is not None:
            self.rate_total = float(params.reward_rate_rps)
        else:
            total = 0.0
            for r in self.rates:
                total += r
            self.rate_total = total
        mean_rate = self.rate_total / len(self.rates)
        #: per-site normaliser of the worst-site term: requests of a site of mean size.
        self.norm = [mean_rate / r for r in self.rates]
        self.progress_factor = fl.progress_factor(fleet.bits, fleet.quant_penalty)
        self.site_names = [s.name for s in fleet.sites]
        #: the sites whose episodes one batch builds, and whose merges one call costs
        #: (envs/fleet_sites.py)
        self.groups = site_groups(gens, self.sidecars)
        check_common_window(self)  # correlated trace sites: bounded before any episode
        self.cost_groups = cost_groups(self.sidecars)
        if len(gens) == 1:
            self.regime_name = str(getattr(gens[0], "name", fleet.sites[0].name))
        else:
            self.regime_name = "fleet[" + ",".join(self.site_names) + "]"

    def _check_decision_counts(self, fleet: fl.FleetParams, duration_s: float) -> None:
        """Every site's episode has the same decisions (its window less the margin its
        sidecar's ``tail_s`` charges the last merge): checked here, not at the first reset."""
        counts = {
            s.name: episode_length(duration_s, self.params, sc, s.name)
            for s, sc in zip(fleet.sites, self.sidecars, strict=True)
        }
        if len(set(counts.values())) != 1:
            raise fl.FleetConfigError(
                f"the sites' episodes would have different decision counts {counts} (a "
                f"sidecar's tail_s sets how much of the window an episode uses); give the "
                f"sites equal tail_s"
            )

    def _trace_site(self, s: fl.SiteConfig, index: int) -> ReplayRegime:
        """Site ``index``'s replay of its trace (its rate, start and disjoint tiles)."""
        try:
            trace = _load_trace(str(s.trace))
        except (OSError, ValueError) as exc:
            raise fl.FleetConfigError(f"site {s.name!r}: {exc}") from None
        pressure = get_regime(s.regime) if s.regime is not None else None
        sidecar0 = s.sidecar_params(SidecarParams())
        rate = s.target_rate_rps
        if s.target_utilization is not None:
            scale = replay_rate_scale(trace, sidecar0, target_utilization=s.target_utilization)
            rate = trace.mean_rate_rps * scale
        gen = ReplayRegime(
            trace,
            duration_s=600.0,
            start_s=s.start_s if s.start_s is not None else 0.0,
            target_rate_rps=rate,
            pressure_from=pressure,
            name=s.name,
        )
        length = trace.duration_s * (1.0 if rate is None else trace.mean_rate_rps / float(rate))
        start = 0.0 if s.start_s is None else float(s.start_s)
        n_tiles = int((length - start) // 600.0)
        if n_tiles < 1:
            raise fl.FleetConfigError(
                f"site {s.name!r}: start_s={start} leaves less than a 600 s window "
                f"in {s.trace} ({length:.0f} s at the site's rate)"
            )
        self.tiles[index] = (start, n_tiles)
        return gen

    def _option_tables(
        self, fleet: fl.FleetParams, base_sidecars: list[SidecarParams], step_s: float
    ) -> None:
        """The precision options' sync plans, sidecars and progress credits (one option,
        ``bits``, without ``bits_options``)."""
        #: the precisions an action chooses from (``(bits,)`` without the precision action).
        self.option_bits = fleet.bits_options or (fleet.bits,)
        self.default_option = self.option_bits.index(fleet.bits)
        #: each variant's precision (envs/fleet_links.py): first the options themselves
        self.variant_bits = list(self.option_bits)
        self.option_plans = [
            self.plan
            if b == fleet.bits
            else fl.sync_plan(replace(fleet, bits=b), base_sidecars, step_s)
            for b in self.option_bits
        ]
        self.option_sidecars = [with_slowdowns(base_sidecars, pl) for pl in self.option_plans]
        self.option_factors = [fl.progress_factor(b, fleet.quant_penalty) for b in self.option_bits]

    def generator_for(self, site: int, episode_seed: int) -> Any:
        """Site ``site``'s generator for the episode of ``episode_seed``: a synthetic
        regime as is (its seed makes the episode); a trace site's window is the disjoint
        tile ``episode_seed mod tiles`` after its ``start_s``, so distinct seeds below the
        tile count replay disjoint windows (independent units)."""
        gen = self.generators[site]
        if site not in self.tiles:
            return gen
        start, n_tiles = self.tiles[site]
        return replace(gen, start_s=start + 600.0 * (int(episode_seed) % n_tiles))

    @property
    def independent_episodes(self) -> int | None:
        """How many episode seeds (0, 1, ...) replay disjoint windows at every trace site
        (``None``: no trace site, every seed is a fresh draw)."""
        if not self.tiles:
            return None
        return min(n for _, n in self.tiles.values())

    def unit_period(self, n_decisions: int) -> int | None:
        """How many consecutive episode seeds share no data, for episodes of
        ``n_decisions``: the smallest of the trace sites' tile counts
        (:attr:`independent_episodes`) and the link traces' (seeds that many apart replay
        the same links); ``None`` when every seed is a fresh draw."""
        periods = [] if self.independent_episodes is None else [self.independent_episodes]
        if self.links.traced:
            periods.append(self.links.trace_tiles(n_decisions))
        return min(periods) if periods else None


def fleet_setup(fleet: fl.FleetParams, params: EnvParams) -> FleetSetup:
    return FleetSetup(fleet, params)


def _check_env_table(env: dict[str, Any], where: str) -> None:
    """A fleet file's ``[env]`` table: ``EnvParams`` fields with valid values (one line
    naming the file and the key; an unknown key was a ``TypeError`` naming no file)."""
    bad = sorted(set(env) - _ENV_FIELDS)
    if bad:
        raise fl.FleetConfigError(
            f"{where}: [env] has unknown key(s) {bad}; valid: EnvParams fields "
            f"{sorted(_ENV_FIELDS)}"
        )
    try:
        EnvParams(**env)
    except (TypeError, ValueError) as exc:
        raise fl.FleetConfigError(f"{where}: [env] {' '.join(str(exc).split())}") from None


class DiLoCoFleetEnv(DiLoCoSyncEnv):
    """## Description

    A DiLoCo fleet: ``N`` sites, each with its own serving traffic and sidecar, all
    synchronised by ring all-reduce. Every decision the agent chooses whether to launch the
    next fragment sync (Streaming DiLoCo: ``F`` fragments, round-robin). A sync occupies
    every site's hosts for its window (payload-timed: ``model_params * bits / 8 / F`` bytes
    over the slowest link plus a fixed overhead) and slows every site's serving by its
    sidecar's ``sync_slowdown`` scaled by the link share the sync uses; the cost is the
    extra SLO-violating requests summed over sites. docs/fleet.md states every formula,
    default and source.

    ## Action Space

    ``Discrete(2)``: ``0`` defer, ``1`` launch the next fragment sync; the corridor on
    consecutive fragment syncs is ``[ceil(H_min/F), floor(H_max/F)]`` decisions, which keeps
    every fragment's own gap within ``[H_min, H_max]``; ``action_masks()`` as in
    ``DiLoCoSync-v0``. With ``bits_options`` (off by default): ``MultiDiscrete([2, K])``,
    ``[launch, k]`` syncs (or a forced sync in that step runs) at ``bits_options[k]`` bits,
    with that precision's window, cost and progress credit (docs/fleet.md).

    ## Observation Space

    ``Box`` float32, :attr:`obs_features` (:func:`fleet_obs_features`): the single env's
    17 features with the first site's pressure block, one pressure block per further site,
    ``F`` fragment staleness features when ``F > 1``, and with changing links
    (``link_levels``) each site's ``<site>.link_rate`` (envs/fleet_links.py). All causal.

    ## Rewards

    As ``DiLoCoSync-v0`` with the fleet's cost and a reward scale of the sites' summed
    nominal rate; the progress term of a sync at ``b`` bits is multiplied by
    :func:`~diloco_gym.sim.fleet.progress_factor`. ``worst_site_weight > 0`` adds the worst
    site's (size-normalised) cost to each sync's cost.

    ## Special case

    One site, ``fragments=1``, ``bits=32``, ``merge_seconds=8``: the observations, rewards
    and summaries of ``DiLoCoSync-v0`` for the same seed, bit for bit (tested).

    ## Arguments

    ``fleet``: a :class:`~diloco_gym.sim.fleet.FleetParams`, a path to a fleet TOML file
    (docs/fleet.md), or ``None`` (the default fleet). ``params`` / ``learners`` as for
    ``DiLoCoSync-v0`` (``h_min_steps`` / ``h_max_steps`` are the full-model corridor;
    ``merge_seconds`` is ignored: the fleet times its syncs). Keywords: any ``FleetParams``
    field (``fragments=4``, ``bits=8``) or ``EnvParams`` field (``merge_budget=16``).

    ## Version History

    * v1: the fleet model v1 (``model_version=1``, docs/fleet.md "What v1 changes"): each
      site's slowdown at its own link share; a streamed sync's host part charged by its
      work; a full-mode sync stalls the learners of a fleet of several sites; a fragment's
      credit discounted by its own staleness; a ring hop's latency is the two sites' access
      latencies. ``DiLoCoFleetEnv(...)`` keeps model v0 unless the fleet (or its file's
      ``model_version = 1``, or the keyword) selects v1.
    * v0: initial version (deprecated id, kept for one release).
    """

    def __init__(
        self,
        fleet: fl.FleetParams | str | Path | None = None,
        params: EnvParams | None = None,
        learners: lrn.LearnerParams | None = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        source = str(fleet) if isinstance(fleet, (str, Path)) else None
        try:
            self._build(fleet, params, learners, render_mode, overrides)
        except ValueError as exc:
            # A value of the file that fails only once the fleet is assembled (a sync
            # that does not fit the corridor, sites of different decision counts): the
            # message names the file, as its loader's do.
            from diloco_gym.sim.traces import TraceFormatError

            if source is None or isinstance(exc, TraceFormatError) or str(exc).startswith(source):
                raise
            raise fl.FleetConfigError(f"{source}: {' '.join(str(exc).split())}") from None

    def _build(
        self,
        fleet: fl.FleetParams | str | Path | None,
        params: EnvParams | None,
        learners: lrn.LearnerParams | None,
        render_mode: str | None,
        overrides: dict[str, Any],
    ) -> None:
        """:meth:`__init__`'s work (its errors are named by the file there)."""
        env_kw: dict[str, Any] = {}
        if isinstance(fleet, (str, Path)):
            source = str(fleet)
            fleet, env_kw = fleet_toml.load_fleet_toml(fleet)
            _check_env_table(env_kw, source)
        fleet_kw = {k: v for k, v in overrides.items() if k in _FLEET_FIELDS}
        env_kw.update({k: v for k, v in overrides.items() if k not in _FLEET_FIELDS})
        unknown = set(env_kw) - _ENV_FIELDS
        if unknown:
            raise TypeError(
                f"unknown DiLoCoFleetEnv argument(s) {sorted(unknown)}; valid: FleetParams "
                f"fields {sorted(_FLEET_FIELDS)} and EnvParams fields {sorted(_ENV_FIELDS)}"
            )
        fleet = fleet if fleet is not None else fl.FleetParams()
        if not isinstance(fleet, fl.FleetParams):
            raise TypeError(
                f"fleet must be a FleetParams, a TOML path or None, got {type(fleet).__name__}"
            )
        if fleet_kw:
            fleet = replace(fleet, **fleet_kw)
        base = replace(params or EnvParams(), **env_kw)
        require_additive(base, "DiLoCoFleetEnv")  # its reward is the sites' isolated costs
        require_unshaped(base, "DiLoCoFleetEnv")
        if fleet.per_site_timing and type(self) is DiLoCoFleetEnv:
            raise ValueError(
                "this fleet has timing = 'rounds' (per-site timing), which DiLoCoFleetEnv, "
                "the one-instant fleet, does not run: make it with gym.make('DiLoCoFleet-v1', "
                "...) or diloco_gym.envs.fleet_rounds.DiLoCoFleetRoundsEnv (make_fleet_env picks "
                "the env by timing)"
            )
        setup = FleetSetup(fleet, base)
        self.fleet = fleet
        self.setup = setup
        first = fleet.sites[0]
        regime0: Any = first.regime if first.trace is None else setup.generators[0]
        super().__init__(
            regime=regime0,
            params=setup.params,
            sidecar=setup.sidecars[0],
            learners=learners,
            render_mode=render_mode,
        )
        self.generator = setup.generators[0]
        self.regime_name = setup.regime_name
        self.reward_rate_rps = setup.rate_total
        self._init_obs(setup)
        p = self.params
        self._h_full = p.h_max * fleet.fragments  # a fragment's own H_max (decisions)
        self._site_rows = np.zeros((1, 0), dtype=np.float32)
        self._site_rows_of: FleetEpisode | None = None
        self._cap = fleet_cap.cap_tracker(setup, self._n_decisions)  # None without a cap
        self._init_precision()
        self._compiled_cost, self._stall_s = compiled_cost_rule(setup, type(self) is DiLoCoFleetEnv)
        # a launch is the base env's action (no precision component, no cap to veto it)
        self._base_want = (
            type(self)._want is DiLoCoFleetEnv._want
            and fleet.bits_options is None
            and self._cap is None
        )
        self._own_obs = type(self)._obs is not DiLoCoFleetEnv._obs
        # the step's (can_defer, can_merge) are the masks unless a cap, the precision
        # action or a subclass's own masks change them
        self._base_masks = (
            type(self).action_masks is DiLoCoFleetEnv.action_masks
            and self._cap is None
            and fleet.bits_options is None
        )

    def _init_obs(self, setup: FleetSetup) -> None:
        """The observation table and space, and where the fleet's features start."""
        fleet = setup.fleet
        #: the observation table (name, unit, low, high, meaning).
        self.obs_features = (
            fleet_obs_features(setup.site_names, fleet.fragments)
            + link_obs_features(setup.site_names, setup.links.on)
            + fleet_cap.cap_obs_features(setup.site_names, fleet.site_cap_pp)
        )
        self.obs_index = {f[0]: i for i, f in enumerate(self.obs_features)}
        low = np.array([f[2] for f in self.obs_features], dtype=np.float32)
        high = np.array([f[3] for f in self.obs_features], dtype=np.float32)
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self._n_base = OBS_DIM
        self._frag0 = OBS_DIM + _N_EXO * (fleet.n_sites - 1)
        self._link0 = self._frag0 + (fleet.fragments if fleet.fragments > 1 else 0)
        self._cap0 = self._link0 + (fleet.n_sites if setup.links.on else 0)
        #: every sync in the fleet's one plan (no precision action, fixed links)
        self._plain_syncs = fleet.bits_options is None and not setup.links.on

    def _cost_source(self, ep: Any) -> tuple[tuple, np.ndarray]:
        """The sites' cost queues and the episode's cost bank when the compiled step
        costs the syncs (:func:`~diloco_gym.envs.fleet_sites.compiled_cost_rule`), else
        the single env's (none: each sync is asked here)."""
        compiled = self._compiled_cost and isinstance(ep, FleetEpisode)
        self._batch.sites[0] = len(ep.sites) if compiled else 1
        self._batch.stall_s[0] = self._stall_s if compiled else 0.0
        f = self.fleet.fragments  # model v1's fragment credit, in the compiled step
        self._batch.fragments[0] = f if compiled and f > 1 and self.fleet.model_version >= 1 else 0
        if not compiled:
            return super()._cost_source(ep)
        return ep.bank_source, ep.cost_bank

    def _options_of_syncs(self) -> list[int]:
        """Each sync's option so far (the default one for every sync the compiled step
        costs)."""
        if self._compiled_cost:
            return [self.setup.default_option] * self._state.n_merges.item(0)
        return self._sync_options

    def _n_decisions(self) -> int:
        assert self.episode is not None  # the cap asks only within an episode
        return self.episode.n_decisions

    def _init_precision(self) -> None:
        s = self.setup
        # The kernel credits a sync's learner progress times the precision surrogate.
        self._batch.credit[:] = s.progress_factor
        #: the precision option of the next sync (index into ``setup.option_bits``).
        self._option = s.default_option
        self._sync_options: list[int] = []  # each sync's option, beside ``_merges``
        if self.fleet.bits_options is not None:
            # the precision action widens the base env's Discrete(2) space
            space: Any = gym.spaces.MultiDiscrete([2, len(self.fleet.bits_options)])
            self.action_space = space

    # ------------------------------------------------------------------ episode
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """As ``DiLoCoSync-v0``'s; syncs forced before the first action use ``bits``."""
        self._choose(self.setup.default_option)
        self._sync_options = []
        if self._cap is not None:
            self._cap.reset()
        return super().reset(seed=seed, options=options)

    def _choose(self, option: int) -> None:
        self._option = option
        self._batch.credit[:] = self.setup.option_factors[option]

    def _want(self, action: Any) -> bool:
        """``Discrete(2)``: as ``DiLoCoSync-v0``. With ``bits_options``: ``[launch, k]``,
        the sync (asked, or forced in this step) at precision ``bits_options[k]``."""
        if self.fleet.bits_options is None:
            want = super()._want(action)
        elif not self.action_space.contains(np.asarray(action)):
            raise ValueError(
                f"action {action!r} is not in {self.action_space}: expected [launch (0 or 1), "
                f"precision index 0..{len(self.fleet.bits_options) - 1}] "
                f"(bits_options={self.fleet.bits_options})"
            )
        else:
            self._choose(int(np.asarray(action)[1]))
            want = bool(np.asarray(action)[0] == 1)
        if self._cap is None:
            return want
        return self._cap.want(want, self._state.d.item(0), super().action_masks())

    def _merge_cost_at(self, d: int) -> float:
        # The compiled step asks every fleet sync's cost here, just before it merges (the
        # fleet env's memo starts empty each episode): the sync's option and, in model v1,
        # its learner credit are set now.
        assert isinstance(self.episode, FleetEpisode)  # called only after reset()
        variant = self.episode.variant_at(d, self._option)
        self._sync_options.append(variant)
        if self._cap is not None:
            self._cap.record(d, variant, self.episode.site_costs_at(d, self._option))
        if self.fleet.model_version >= 1:
            self._set_learner_work(d)
        return self.episode.merge_cost_at(d, self._option)

    def _set_learner_work(self, d: int) -> None:
        """Model v1's learner credit of the fragment sync at decision ``d``
        (:func:`~diloco_gym.sim.fleet.fragment_work_seconds`): the compute seconds since the
        previous fragment sync, discounted for drift by this fragment's own staleness, both
        without the seconds the learners stalled for earlier syncs
        (:attr:`~diloco_gym.sim.fleet.SyncPlan.stall_s`: each sync stalls them for that
        many seconds from its start). The kernel credits ``efficiency(g) * g * thr_sum``
        with ``g`` the wall-clock gap since the previous sync; the learners' summed
        throughput of this merge (``thr_sum`` of the batch) is scaled so that the product is
        v1's credit. The syncs before the episode (:meth:`fragment_staleness`'s history)
        count as syncs at ``bits``, stalls included."""
        s = self.setup
        f = self.fleet.fragments
        before = self._sync_options[:-1]  # the syncs so far, without this one
        if f == 1 and s.plan.stall_s == 0.0 and not any(s.option_plans[k].stall_s for k in before):
            return  # v0's credit exactly (one site, or streamed syncs the overlap covers)
        # the last f syncs (the history's last f entries are all that is read)
        n = self._state.n_merges.item(0)
        merges = self._fused.sched_d[0, max(0, n - f) : n].tolist()
        hist = [-(f - 1 - k) * self.params.h_max for k in range(f)] + merges
        hist_stall = [s.plan.stall_s] * f + [s.option_plans[k].stall_s for k in before[-f:]]
        dec = self.params.decision_seconds
        gap = (d - hist[-1]) * dec
        compute_gap = gap - hist_stall[-1]
        own = (d - hist[-f]) * dec - sum(hist_stall[-f:])
        lp = self.learner_params
        target = fl.fragment_work_seconds(compute_gap, own, lp.drift_s, lp.merge_overhead_s)
        kernel_work = fl.fragment_work_seconds(gap, gap, lp.drift_s, lp.merge_overhead_s)
        assert isinstance(self.episode, FleetEpisode)
        self._batch.thr_sum[0] = self.episode.throughput_sum * (target / kernel_work)

    def _corridor_masks(self) -> np.ndarray:
        """``[defer, launch]`` by the corridor and the budget alone (the single env's mask,
        before the site cap)."""
        return super().action_masks()

    def action_masks(self) -> np.ndarray:
        """``[defer, launch]``; with ``bits_options`` followed by one ``True`` per
        precision (MaskablePPO's flat mask of a ``MultiDiscrete`` space)."""
        base = self._corridor_masks()
        if self._cap is not None:
            base = self._cap.mask(base, self._state.d.item(0))
        if self.fleet.bits_options is None:
            return base
        return np.concatenate([base, np.ones(len(self.fleet.bits_options), dtype=bool)])

    def _step_info(
        self, merged: bool, overridden: bool, mask: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        info = super()._step_info(merged, overridden, mask)
        if self._cap is not None:
            info["action_overridden"] = overridden or self._cap.last_vetoed
            self._cap.last_vetoed = False
        if self.fleet.bits_options is not None:  # per component, as MultiDiscrete.sample wants
            m = info["action_mask"]
            info["action_mask"] = (m[:2], m[2:])
        return info

    def _episode_of_seed(self, episode_seed: int) -> FleetEpisode:
        """The sites' episodes (:func:`site_seed` each; a group of sites of one synthetic
        regime in one batch, :func:`~diloco_gym.envs.fleet_sites.build_sites`)."""
        sites, cores = build_sites(self.setup, episode_seed, self.learner_params)
        return FleetEpisode(self.setup, sites, int(episode_seed), cores)

    def _check_episode(self, episode: Any, seed: int | None) -> Any:
        if not isinstance(episode, FleetEpisode) or episode.setup is not self.setup:
            raise ValueError(
                "options['episode'] must be a FleetEpisode built by this env "
                "(env.unwrapped.build_episode(seed))"
            )
        if seed is not None and episode.seed != int(seed):
            raise ValueError(
                f"options['episode'] is the episode of seed {episode.seed}, not of seed {seed}"
            )
        return episode

    def build_episode(self, seed: int) -> FleetEpisode:
        """The fleet episode of ``seed`` (to run several agents on one build)."""
        return self._episode_of_seed(int(seed))

    # ------------------------------------------------------------------ observation
    def _new_episode_tables(self) -> None:
        """The further sites' pressure blocks per decision (row ``n`` repeats the last
        decision's, as the kernel's terminal observation does)."""
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        n = ep.n_decisions
        width = _N_EXO * (len(ep.sites) - 1)
        extra = np.zeros((n + 1, width), dtype=np.float32)
        for k, e in enumerate(ep.sites[1:]):
            extra[:n, k * _N_EXO : (k + 1) * _N_EXO] = e.exo
            extra[n, k * _N_EXO : (k + 1) * _N_EXO] = e.exo[n - 1]
        self._site_rows = extra
        self._site_rows_of = ep

    def fragment_staleness(self) -> np.ndarray:
        """Decisions since each fragment's last sync, in sync order (0: next to sync). The
        episode starts just after a sync of the last fragment, the others staggered by
        ``floor(H_max/F)`` decisions (so every fragment's first own gap is within the
        corridor too)."""
        f = self.fleet.fragments
        d = self._state.d.item(0)
        h = self.params.h_max
        n = self._state.n_merges.item(0)  # the schedule's last f syncs, as recorded
        hist = [-(f - 1 - k) * h for k in range(f)] + self._fused.sched_d[
            0, max(0, n - f) : n
        ].tolist()
        last_f = hist[-f:]
        return np.array([d - t for t in last_f], dtype=np.int64)

    def _obs(self) -> np.ndarray:
        """The single env's observation (the kernel's, with the first site's pressure
        block), then the further sites' blocks and the fragments' staleness."""
        return self._fleet_obs(super()._obs())

    def _step_obs(self) -> np.ndarray:
        # after a step the compiled step's observation is the kernel's (a subclass with an
        # _obs of its own, such as the rounds env's, observes as it does)
        if self._own_obs:
            return self._obs()
        return self._fleet_obs(self._obs_out[0])

    def _fleet_obs(self, base: np.ndarray) -> np.ndarray:
        """A new observation array: ``base`` (the kernel's), then the fleet's features."""
        if len(self.obs_features) == base.shape[0]:
            return base.copy()
        if self._site_rows_of is not self.episode:
            self._new_episode_tables()
        if len(self.obs_features) == self._frag0:  # the further sites' blocks only
            return np.concatenate((base, self._site_rows[self._state.d.item(0)]))
        obs = np.empty(len(self.obs_features), dtype=np.float32)
        obs[: base.shape[0]] = base
        d = self._state.d.item(0)
        obs[base.shape[0] : self._frag0] = self._site_rows[d]
        f = self.fleet.fragments
        if f > 1:
            st = self.fragment_staleness()
            obs[self._frag0 : self._frag0 + f] = np.minimum(1.0, st / self._h_full)
        ep = self.episode
        if not self._plain_syncs and isinstance(ep, FleetEpisode) and ep.link_states is not None:
            state = ep.link_states[min(d, ep.n_decisions - 1)]  # at the end: the last one
            obs[self._link0 : self._link0 + len(state)] = self.setup.links.rates(state)
        if self._cap is not None:
            obs[self._cap0 : self._cap0 + len(self.setup.site_names)] = self._cap.used(d)
        return obs

    # ------------------------------------------------------------------ summary
    def episode_summary(self) -> dict[str, Any]:
        """Exact replay of the schedule so far at every site (all syncs together), the
        fleet totals and each site's share; with one site the single env's summary."""
        self._require_episode()
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        s = self.setup
        merges = self._merges
        opts = self._options_of_syncs()
        per = self._site_summaries(ep)
        if len(per) == 1:
            out = dict(per[0])
        else:
            req = sum(x["requests"] for x in per)
            viol = sum(x["violated"] for x in per)
            base_viol = sum(x["violated"] - x["sync_excess_requests"] for x in per)
            additive = sum(x["additive_excess_requests"] for x in per)
            out = {
                "requests": int(req),
                "violated": int(viol),
                "violation_pct": 100.0 * viol / max(1, req),
                "sync_active_frac": float(
                    sum(x["sync_active_frac"] * x["requests"] for x in per) / max(1, req)
                ),
                "merges": int(len(merges)),
                "no_sync_violation_pct": 100.0 * base_viol / max(1, req),
                "sync_excess_pct": 100.0 * (viol - base_viol) / max(1, req),
                "sync_excess_requests": int(viol - base_viol),
                "additive_excess_requests": float(additive),
                "additive_excess_pct": float(additive * 100.0 / max(1, req)),
            }
        total_ex = sum(x["sync_excess_requests"] for x in per)
        sites = []
        for name, x in zip(s.site_names, per, strict=True):
            sites.append(
                {
                    "site": name,
                    "requests": x["requests"],
                    "no_sync_violation_pct": x["no_sync_violation_pct"],
                    "sync_excess_pct": x["sync_excess_pct"],
                    "sync_excess_requests": x["sync_excess_requests"],
                    "share_of_excess": (x["sync_excess_requests"] / total_ex if total_ex else 0.0),
                }
            )
        worst = max(sites, key=lambda r: r["sync_excess_pct"])
        out["sites"] = sites
        out["worst_site"] = worst["site"]
        out["worst_site_sync_excess_pct"] = worst["sync_excess_pct"]
        plan = s.plan
        out["fragments"] = self.fleet.fragments
        out["bits"] = self.fleet.bits
        out["sync_window_s"] = plan.window_s
        out["payload_bytes"] = plan.payload_bytes
        out["link_share"] = plan.link_share
        out["model_version"] = self.fleet.model_version
        if self._cap is not None:
            out.update(self._cap.summary(s.site_names, fleet_cap.site_nominal_requests(s)))
        out["site_link_shares"] = list(plan.site_shares)
        out["sync_stall_s"] = plan.stall_s
        out["progress_factor"] = s.progress_factor
        out["sync_bits"] = [s.variant_bits[k] for k in opts]
        out["sync_windows_s"] = [s.option_plans[k].window_s for k in opts]
        out["merge_decisions"] = list(merges)
        out["merge_times_s"] = [d * self.params.decision_seconds for d in merges]
        out["merge_costs_requests"] = list(self._costs)
        out["progress"] = self._state.progress_sum.item(0)
        out["regime"] = self.regime_name
        out["episode_seed"] = ep.seed
        return out

    def _site_summaries(self, ep: FleetEpisode) -> list[dict[str, Any]]:
        """Each site's exact replay of its syncs so far (:func:`schedule_summary`)."""
        scheds = self._site_schedules()
        # the sites' own costs of the syncs, where the compiled step kept them
        kept = [ep.cost_bank[1 + i, m].tolist() if self._compiled_cost else None
                for i, m in enumerate(scheds)]  # fmt: skip
        if self._plain_syncs and len(ep.sites) > 1 and all(x == scheds[0] for x in scheds):
            # one schedule at every site: every site's replay in one compiled call
            costs = [c if c is not None else [e.merge_cost_at(int(d)) for d in scheds[0]]
                     for c, e in zip(kept, ep.sites, strict=True)]  # fmt: skip
            return site_summaries(ep.sites, scheds[0], self.params, self.setup.sidecars, costs)
        per_sync = [None if self._plain_syncs else self._sync_episodes(i, m)
                    for i, m in enumerate(scheds)]  # fmt: skip
        one = len(ep.sites) == 1  # a fleet's summary reads none of a site's percentiles
        rows = zip(ep.sites, scheds, self.setup.sidecars, per_sync, kept, strict=True)
        return [
            schedule_summary(e, m, self.params, sc, ps, costs=c, percentiles=one)
            for e, m, sc, ps, c in rows
        ]

    def _sync_episodes(self, site: int, schedule: list[int]) -> list[Any]:
        """Site ``site``'s episode of each of its syncs (at ``schedule``'s decisions): the
        variant each sync ran as (its precision and link state)."""
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        if self.fleet.bits_options is not None:  # one site schedule: the fleet's syncs
            return [ep.sites_of(k)[site] for k in self._sync_options]
        k = self.setup.default_option
        return [ep.sites_of(ep.variant_at(d, k))[site] for d in schedule]

    def _site_schedules(self) -> list[list[int]]:
        """Each site's sync decisions (one schedule for every site: all sync at once)."""
        return [self._merges] * self.fleet.n_sites

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "rgb_array" and self.episode is not None:
            from diloco_gym.envs.render import timeline_rgb

            ep = self.episode
            assert isinstance(ep, FleetEpisode)
            return timeline_rgb(
                ep.sites[0],
                self._merges,
                self.params,
                self.setup.sidecars[0],
                upto=self._state.d.item(0),
            )
        return super().render()
