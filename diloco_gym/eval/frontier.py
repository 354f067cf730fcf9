"""The frontier leaderboard: sync-excess against merge rate, and agents compared at equal budgets.

A scheduler that merges less often has less sync-excess for a trivial reason: its budget.
The protocol's report (:mod:`diloco_gym.eval.report`) controls for that per agent, with a
matched-random envelope at the agent's own number of merges. This module compares agents
*with each other* at the same merge rate:

* **Free-budget points.** Every agent run as it is (its own merges per hour), scored by
  the exact replay with its matched random and the oracle at its own budget.
* **Budget grid.** At each budget of a grid (merges per hour; ``M`` merges per episode)
  the *budget-held* agents run with the env's ``merge_budget=M``: the action mask keeps
  the schedule feasible with exactly ``M`` merges. Agents that read ``budget_left`` and
  steer by it are **budget-aware** (``diloco_gym.agents.heuristics.OnlineForecastBudget``,
  ``FixedBudget``); any other agent run so is only **budget-held by the mask** (its own
  rule decides, and the mask forces or forbids merges to keep the budget).
* **Curves.** At every feasible budget of the episode the matched-random mean (random
  placement) and the oracle (exact dynamic programme over the additive cost, replayed
  exactly) per seed.

Agent, matched random and oracle are always scored by the same
:class:`~diloco_gym.eval.protocol.EpisodeScorer` replay
(:func:`~diloco_gym.eval.protocol.score_episode`),
with the draws seeded by (seed, budget) as in the report, so the matched random of every
agent at budget ``M`` is the same envelope, and it equals the curve's value at ``M``.

Statistics per regime and budget (unit: the seed; seeds are independent traces):

* each budget-held agent against matched random: paired sign-flip test
  (:func:`~diloco_gym.eval.protocol.paired_test`), Holm-adjusted across the agents at that
  budget, verdict by :func:`~diloco_gym.eval.protocol.gate_verdict`;
* every pair of budget-held agents: paired test of their sync-excess over the same seeds,
  Holm-adjusted across the pairs at that budget;
* gap captured ``(matched random - agent) / (matched random - oracle)`` (means over
  seeds) with a 95 % percentile bootstrap CI over seeds (undefined when the oracle is no
  better than random);
* dominance: A dominates B when at every budget A's mean sync-excess is no higher than
  B's and at least one difference is significant (pairwise Holm-adjusted p < alpha). When
  no test at any budget could reach alpha with the units given, the relation is
  ``inconclusive (too few episodes)``, never a tie.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import Episode, episode_from_seed
from diloco_gym.eval import calibration as cal
from diloco_gym.eval import protocol
from diloco_gym.eval.cells import quality_columns
from diloco_gym.eval.clairvoyant import expected_cost_pp, rate_clairvoyant_schedule
from diloco_gym.eval.frontier_render import frontier_figure, render_markdown, undominated
from diloco_gym.eval.frontier_stats import (
    DOMINANCE_VERDICTS,
    N_BOOT,
    budget_stats,
    dominance,
    free_stats,
    gap_captured,
    holm_scope,
    pairwise_stats,
)
from diloco_gym.eval.output_dir import write_output_dir
from diloco_gym.eval.quality_vs_random import write_quality_figures
from diloco_gym.eval.replay_options import ReplayOptions
from diloco_gym.eval.report_render import sandbox_record
from diloco_gym.eval.rollout import run_episodes
from diloco_gym.eval.units import episode_budget, unit_learners
from diloco_gym.io import json_default
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.schedules import budget_range

if TYPE_CHECKING:
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig

__all__ = [
    "FrontierConfig",
    "run_frontier",
    "budget_stats",
    "pairwise_stats",
    "dominance",
    "gap_captured",
    "write_frontier",
    "render_markdown",
    "frontier_figure",
    "DEFAULT_BUDGETS_PER_HOUR",
    "DEFAULT_BUDGET_AGENTS",
    "DOMINANCE_VERDICTS",
    # statistics, from diloco_gym.eval.frontier_stats
    "free_stats",
    "holm_scope",
    "N_BOOT",
    "undominated",
]

#: The default grid: 8, 10, 12, 16 and 24 merges per 10 min (8 is about the fewest the
#: corridor allows in a 600 s episode; there placement has little freedom).
DEFAULT_BUDGETS_PER_HOUR = (48.0, 60.0, 72.0, 96.0, 144.0)
#: Agents run at every budget of the grid: the budget-aware agents (the causal planner and
#: the budget-aware heuristics), and the deployable heuristics that steer by the load (held
#: to the budget by the env's mask).
DEFAULT_BUDGET_AGENTS = (
    "causal-planner",
    "online-forecast-budget",
    "fixed-budget",
    "online-forecast",
    "calibrated-wa",
    "wa-diloco",
    "pressure-gate",
)


@dataclass(frozen=True, kw_only=True)
class FrontierConfig(ReplayOptions):
    """What a frontier run computes: the shared replay options (:class:`ReplayOptions`:
    regimes, seeds, draws, trace, load, ...) and the frontier's own.

    Attributes:
        regimes: synthetic regime names (default: bursty, non-periodic, sync-heavy); with
            ``trace``: set to the replay's, ``replay:<file stem>``.
        budgets_per_hour: the budget grid, merges per hour (converted to merges per
            episode by the episode's length and rounded; each must be feasible).
        budget_agents: agents run with ``merge_budget=M`` at every budget of the grid.
        free_agents: agents run as they are (points at their own merges per hour; default:
            every heuristic).

    With ``trace`` the units are the trace's disjoint windows of ``window_s``.
    """

    regimes: list[str] = field(default_factory=lambda: ["bursty", "non-periodic", "sync-heavy"])
    budgets_per_hour: list[float] = field(default_factory=lambda: list(DEFAULT_BUDGETS_PER_HOUR))
    budget_agents: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGET_AGENTS))
    free_agents: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trace is not None:
            object.__setattr__(self, "regimes", [f"replay:{Path(self.trace).stem}"])
        if not self.free_agents:
            from diloco_gym.agents.registry import HEURISTICS

            object.__setattr__(self, "free_agents", list(HEURISTICS))
        self._check_budgets()
        if not self.budget_agents and not self.free_agents:
            raise ValueError("give at least one agent")
        for name, lst in (("budget_agents", self.budget_agents), ("free_agents", self.free_agents)):
            if len(set(lst)) != len(lst):
                raise ValueError(f"{name}: each agent once, got {lst}")

    def _check_budgets(self) -> None:
        """The budget grid: positive, each once; kept sorted."""
        if not self.budgets_per_hour:
            raise ValueError("budgets: give at least one budget (merges per hour)")
        for b in self.budgets_per_hour:
            if not (np.isfinite(b) and b > 0):
                raise ValueError(f"budgets must be positive numbers of merges per hour, got {b}")
        budgets = sorted(float(b) for b in self.budgets_per_hour)
        object.__setattr__(self, "budgets_per_hour", budgets)
        twice = sorted({b for b in budgets if budgets.count(b) > 1})
        if twice:
            raise ValueError(
                f"budgets given more than once: {', '.join(f'{b:g}' for b in twice)} "
                f"merges/h; give each budget once"
            )


#: One env per merge budget (``None``: the free-budget env) of a unit.
_Envs = dict[int | None, DiLoCoSyncEnv]


def _same_episode(ep: Episode, env: DiLoCoSyncEnv) -> Episode:
    """``ep`` for an env that differs from the one it was built for only by its merge
    budget (a budget is not used to build an episode, only to mask the actions)."""
    if ep.params == env.params:
        return ep
    if replace(ep.params, merge_budget=env.params.merge_budget) != env.params:
        raise ValueError("the budget envs of a unit differ by more than the merge budget")
    return replace(ep, params=env.params)


def _trace_tiles(config: FrontierConfig, sidecar) -> list:
    """The trace's disjoint windows (one fixed-window regime each) at the configured load."""
    from diloco_gym.sim.loaders import load_trace
    from diloco_gym.sim.regimes import ReplayRegime, replay_rate_scale
    from diloco_gym.sim.traces import scale_rate

    assert config.trace is not None  # only called for a trace replay
    tr = load_trace(config.trace, config.trace_format)
    scale = replay_rate_scale(tr, sidecar, config.rate_scale, config.target_utilization)
    replayed = tr if scale == 1.0 else scale_rate(tr, tr.mean_rate_rps * scale)
    try:
        tiles = ReplayRegime(
            replayed, duration_s=config.window_s, sidecar=sidecar, name=tr.name
        ).tiles()
    except ValueError as exc:
        raise ValueError(
            f"{config.trace}: {exc} (the trace lasts {tr.duration_s:.0f} s, "
            f"{replayed.duration_s:.0f} s at rate scale {scale:.3g})"
        ) from None
    if len(tiles) < 2:
        raise ValueError(
            f"{config.trace}: {len(tiles)} window(s) of {config.window_s:g} s; "
            f"the paired tests need at least 2 (use a shorter --window-s)"
        )
    from diloco_gym.eval.seed_ranges import check_test_seeds

    check_test_seeds(config.seed0, len(tiles), "window seeds (--seed0 + window index)")
    return tiles


def _scorer(cache: dict[str, Any], ep, env: DiLoCoSyncEnv):
    """The episode's exact scorer and the completion counts, reused while they fit."""
    p = env.params
    if cache.get("scorer") is None or not cache["scorer"].matches(ep):
        cache["scorer"] = protocol.EpisodeScorer(ep, p, env.sidecar)
    counts = cache.get("counts")
    if counts is None or counts.shape[1] != ep.n_decisions:
        hi = budget_range(ep.n_decisions, p.h_min, p.h_max)[1]
        cache["counts"] = protocol.counts_for(ep.n_decisions, p, max(hi, 1))
    return cache["scorer"], cache["counts"]


#: A unit's matched-random controls by number of merges (drawn and scored once per unit).
_Controls = dict[int, protocol.Control]


def _control(
    controls: _Controls, scorer, counts, seed: int, m: int, draws: int
) -> protocol.Control:
    """The unit's matched-random control at ``m`` merges: the draws depend on (seed, m)
    only, so every agent with ``m`` merges and the curve at ``m`` share one, drawn and
    scored once."""
    if m not in controls:
        controls[m] = protocol.episode_control(scorer, m, draws, seed, counts)
    return controls[m]


def _score(
    cache: dict[str, Any],
    controls: _Controls,
    ep,
    env: DiLoCoSyncEnv,
    merges,
    seed: int,
    draws: int,
) -> dict[str, Any]:
    """Agent, matched random and oracle of one episode by the same exact replay; the draws
    depend on (seed, merges) only, as in the report."""
    scorer, counts = _scorer(cache, ep, env)
    m = len(merges)
    control = _control(controls, scorer, counts, seed, m, draws)
    return protocol.score_episode(
        scorer, merges, draws, np.random.default_rng([seed, m, 7]), counts, control=control
    )


#: One unit of a frontier plan: (label, calibration key, fitted sidecar, units (seed,
#: generator), envs shared by the units or None).
_PlanEntry = tuple[str, str, Any, list[tuple[int, Any]], "_Envs | None"]


def _plan(config: FrontierConfig, calib) -> list[_PlanEntry]:
    """The regimes (or the trace replay) of a frontier and their units, in run order."""
    seeds = list(range(config.seed0, config.seed0 + config.seeds))
    plan: list[_PlanEntry] = []
    if config.trace is None:
        for regime in config.regimes:
            fitted = calib.sidecar_for(regime)
            gen = REGIMES[regime].with_load(fitted, config.rate_scale, config.target_utilization)
            # One env per budget, reused across seeds (a synthetic regime's seeds are its
            # units).
            envs: _Envs = {
                None: DiLoCoSyncEnv(regime=gen, sidecar=fitted, learners=unit_learners(config))
            }
            plan.append((regime, regime, fitted, [(seed, gen) for seed in seeds], envs))
    else:
        key = config.trace_sidecar
        fitted = calib.sidecar_for(key)
        tiles = _trace_tiles(config, fitted or REGIMES[key].sidecar)
        label = f"replay:{Path(config.trace).stem}"
        plan.append(
            (label, key, fitted, [(config.seed0 + i, t) for i, t in enumerate(tiles)], None)
        )
    return plan


def _shipped(config: FrontierConfig) -> FrontierConfig:
    """``config`` with its trace, calibration and model paths absolute, for workers whose
    working directory may differ from this process's (a cell carries names, paths and
    parameters, never episodes)."""
    from diloco_gym.agents.registry import shipped_spec

    def absolute(p: str | None) -> str | None:
        return None if p is None else str(Path(p).expanduser().resolve())

    def agents(names: list[str]) -> list[str]:
        return [shipped_spec(a) for a in names]

    return replace(
        config,
        trace=absolute(config.trace),
        calibration=absolute(config.calibration),
        learner_calibration=absolute(config.learner_calibration),
        budget_agents=agents(config.budget_agents),
        free_agents=agents(config.free_agents),
    )


@dataclass(frozen=True)
class FrontierCell:
    """One unit of a frontier (regime ``regime`` of the plan, its unit ``unit``) with every
    agent at every budget, and the unit's curves: what a backend runs."""

    config: FrontierConfig
    regime: int
    unit: int


def _frontier_state(
    config: FrontierConfig,
) -> tuple[Any, list[_PlanEntry], list, list[list]]:
    """This process's calibration, plan and (sealed) agents of ``config``, built once.

    The budget agents are built once per budget of the grid (``budget_agents[i]`` runs at
    the ``i``-th budget): an agent follows one episode at a time, so with one object per
    budget every run of a unit steps in one lockstep wave (one pipe round trip per
    decision of the episode, not one per decision and budget). Agents start afresh at
    every episode (a unit's results do not depend on which process or agent object ran
    it), so the copies change no result."""
    from diloco_gym.eval.cells import cached

    calib = cached(
        "frontier-calibration", config, None, lambda: cal.load_calibration(config.calibration)
    )
    plan = cached("frontier-plan", config, None, lambda: _plan(config, calib))
    free_agents, budget_agents = cached(
        "frontier-agents", config, None, lambda: _frontier_agents(config)
    )
    return calib, plan, free_agents, budget_agents


def _frontier_agents(config: FrontierConfig) -> tuple[list, list[list]]:
    """The free agents and one list of budget agents per budget of the grid, sealed (the
    free agents in one worker, every budget's agents in another) unless in-process."""
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.sealed import seal_agents

    inproc = config.in_process_agents
    free = seal_agents(make_agents(config.free_agents) if config.free_agents else [], inproc)
    k, n_budgets = len(config.budget_agents), len(config.budgets_per_hour)
    built = [a for _ in range(n_budgets) for a in make_agents(config.budget_agents)] if k else []
    held = seal_agents(built, inproc)
    return free, [held[i * k : (i + 1) * k] for i in range(n_budgets)]


def run_frontier_cell(cell: FrontierCell) -> dict[str, list[dict]]:
    """Run one unit of a frontier (module-level: workers import it by name).

    Returns:
        ``{"rows": [...], "curves": [...]}``: the unit's rows (free agents, then budget
        agents per budget) and its curve points, in the serial order.
    """
    from diloco_gym.eval.cells import cached

    config = cell.config
    _calib, plan, free_agents, budget_agents = _frontier_state(config)
    regime, calib_key, fitted, units, shared_envs = plan[cell.regime]
    # The scorer cache of the regime (reused across its units in this process).
    cache: dict[str, Any] = cached("frontier-scorers", config, regime, dict)
    seed, gen = units[cell.unit]
    envs: _Envs = (
        shared_envs
        if shared_envs is not None
        else {
            None: DiLoCoSyncEnv(
                regime=gen,
                sidecar=fitted or REGIMES[calib_key].sidecar,
                learners=unit_learners(config),
            )
        }
    )
    env = envs[None]
    # Built once, directly (no env reset): every agent runs on it and the curves
    # and the scoring read it.
    ep0 = episode_from_seed(
        env.generator,
        seed,
        env.params,
        env.sidecar,
        env.learner_params,
        rate_rps=env.reward_rate_rps,
    )
    budgets = _unit_budgets(config, ep0, env)
    for m in budgets.values():
        if m not in envs:
            envs[m] = DiLoCoSyncEnv(
                regime=gen, sidecar=env.sidecar, learners=env.learner_params, merge_budget=m
            )
    runs: list[_Run] = [(agent, env, "free", np.nan, np.nan) for agent in free_agents]
    runs += [
        (agent, envs[m], "budget", per_hour, m)
        for (per_hour, m), agents in zip(budgets.items(), budget_agents, strict=True)
        for agent in agents
    ]
    jobs = [(r[1], r[0], seed, _same_episode(ep0, r[1])) for r in runs]  # lockstep, on copies
    results = run_episodes(jobs, copies=True)
    controls: _Controls = {}  # the unit's matched random per budget, shared by rows and curves
    rows = [
        _row(cache, controls, config, regime, gen, seed, run, ep, res)
        for run, (*_, ep), res in zip(runs, jobs, results, strict=True)
    ]
    curves = _unit_curves(cache, controls, ep0, env, seed, regime, config.draws)
    # The rate-clairvoyant reference at each row's own number of merges.
    reference = {c["budget"]: c["rate_clairvoyant_pct"] for c in curves}
    for row in rows:
        row["rate_clairvoyant_pct"] = reference.get(row["merges"], np.nan)
    return {"rows": rows, "curves": curves}


#: One agent run of a unit: (agent, env, mode ``free`` or ``budget``, budget per hour,
#: merges per episode; NaN for a free run).
_Run = tuple[Any, DiLoCoSyncEnv, str, float, float]


def _unit_budgets(config: FrontierConfig, ep: Episode, env: DiLoCoSyncEnv) -> dict[float, int]:
    """The grid's budgets in merges per episode of ``ep``, by merges per hour (distinct)."""
    budgets = {
        b: episode_budget(b, ep.trace.duration_s, ep.n_decisions, env.params)
        for b in config.budgets_per_hour
    }
    if len(set(budgets.values())) != len(budgets):
        raise ValueError(
            f"budgets {config.budgets_per_hour} merges/h round to the same merges per "
            f"episode ({list(budgets.values())}); give distinct budgets"
        )
    return budgets


def _row(
    cache: dict[str, Any],
    controls: _Controls,
    config: FrontierConfig,
    regime: str,
    gen: Any,
    seed: int,
    run: _Run,
    ep: Episode,
    res: dict[str, Any],
) -> dict[str, Any]:
    """One agent run's row: its merges scored against matched random and the oracle."""
    from diloco_gym.agents.registry import is_budget_aware

    agent, e, mode, per_hour, m_budget = run
    if mode == "budget" and int(res["merges"]) != m_budget:
        # The env's mask guarantees it; checked, never assumed.
        raise RuntimeError(
            f"{agent.name} made {res['merges']} merges with merge_budget={m_budget} (seed {seed})"
        )
    scored = _score(cache, controls, ep, e, res["merge_decisions"], seed, config.draws)
    held = "free" if mode == "free" else "budget-aware" if is_budget_aware(agent) else "mask"
    return {
        "regime": regime,
        "agent": agent.name,
        "mode": mode,
        "held": held,
        "deployable": res["deployable"],
        "budget_per_hour": per_hour,
        "budget": m_budget,
        "seed": seed,
        "merges": int(res["merges"]),
        "merges_per_hour": int(res["merges"]) * 3600.0 / ep.trace.duration_s,
        **scored,
        "no_sync_violation_pct": res["no_sync_violation_pct"],
        "duration_s": ep.trace.duration_s,
        "n_decisions": ep.n_decisions,
        **quality_columns(
            config.learner_calibration,
            res,
            controls[len(res["merge_decisions"])],  # the control scored above: same draws
            e.params.decision_seconds,
        ),
        "unit": "seed" if config.trace is None else "window",
        # in the replayed (rate-scaled) trace's clock
        "window_start_replayed_s": getattr(gen, "start_s", np.nan)
        if config.trace is not None
        else np.nan,
    }


def _unit_curves(
    cache: dict[str, Any],
    controls: _Controls,
    ep: Episode,
    env: DiLoCoSyncEnv,
    seed: int,
    regime: str,
    draws: int,
) -> list[dict]:
    """One unit's curves: random placement, the oracle and the rate-clairvoyant reference
    (:mod:`diloco_gym.eval.clairvoyant`; NaN on a replayed trace) at every feasible budget.
    Random placement is the unit's control at M (:func:`_control`: drawn as score_episode
    draws it, same rng, same counts, once per unit), so the curve at M is every budget-held
    agent's matched random at M."""
    scorer, counts = _scorer(cache, ep, env)
    p = env.params
    expected = expected_cost_pp(env, seed)
    lo, hi = budget_range(ep.n_decisions, p.h_min, p.h_max)
    curves = []
    for m in range(max(lo, 1), hi + 1):
        mr = _control(controls, scorer, counts, seed, m, draws).scores.exact_pct
        orc = protocol.oracle_score(ep, m, p, env.sidecar, scorer=scorer)
        rc = np.nan
        if expected is not None:
            rc_sched = rate_clairvoyant_schedule(expected, p.h_min, p.h_max, m)
            rc = float(scorer.score(rc_sched[None, :]).exact_pct[0])
        curves.append(
            {
                "regime": regime,
                "seed": seed,
                "budget": m,
                "budget_per_hour": m * 3600.0 / ep.trace.duration_s,
                "matched_random_mean": float(mr.mean()),
                "oracle_pct": orc["exact_pct"],
                "oracle_exact_optimum": bool(orc["exact_optimum"]),
                "oracle_lower_bound_pct": float(orc["lower_bound_pct"]),
                "rate_clairvoyant_pct": rc,
            }
        )
    return curves


def run_frontier(
    config: FrontierConfig | FleetFrontierConfig,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the free-budget points, the budget grid and the curves; compute the statistics.

    ``config``: a single host's frontier (:class:`FrontierConfig`) or a fleet's
    (:class:`~diloco_gym.eval.fleet_frontier.FleetFrontierConfig`: the fleet report at each
    budget, its episodes run as the report's cells on the same backends; the result is
    :func:`~diloco_gym.eval.fleet_frontier.frontier_result`'s, with ``elapsed_s``).

    The units (one cell each: every agent at every budget, and the unit's curves) run on
    ``backend`` (``serial``, ``processes`` or ``ray``; see
    :func:`diloco_gym.scale.run_cells`) with ``jobs`` workers; the results are put back in
    the serial order, so everything but ``elapsed_s`` is the same on every backend.

    Returns:
        ``{"rows", "curves", "budgets", "pairwise", "dominance", "free", "calibration",
        "config", "elapsed_s"}``: ``rows`` one row per regime x agent x mode x budget x
        seed (mode ``free`` or ``budget``; ``held`` is ``free``, ``budget-aware`` or
        ``mask``), ``curves`` the matched-random mean and the oracle per regime x feasible
        budget x seed, and the tables of :func:`budget_stats`, :func:`pairwise_stats`,
        :func:`dominance` and the free points' summary.
    """
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig

    backend_kw = {"backend": backend, "jobs": jobs, "ray_address": ray_address}
    started = time.perf_counter()
    if isinstance(config, FleetFrontierConfig):
        result = _fleet_frontier(config, progress, backend_kw)
    else:
        result = _single_host_frontier(config, progress, backend_kw)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def _fleet_frontier(
    config: FleetFrontierConfig, progress: bool, backend: dict[str, Any]
) -> dict[str, Any]:
    """A fleet's frontier (:func:`run_frontier`), but its ``elapsed_s``: every budget's
    report cells in one run (:func:`~diloco_gym.eval.fleet_frontier.frontier_cells`)."""
    from diloco_gym.eval import fleet_frontier
    from diloco_gym.eval.cells import run_report_cells
    from diloco_gym.eval.fleet import fleet_cell

    reports, cells = fleet_frontier.frontier_cells(config)
    done = run_report_cells(fleet_cell, cells, progress, **backend)
    return fleet_frontier.frontier_result(config, reports, done)


def _single_host_frontier(
    config: FrontierConfig, progress: bool, backend: dict[str, Any]
) -> dict[str, Any]:
    """A single host's frontier (:func:`run_frontier`), but its ``elapsed_s``."""
    from diloco_gym.agents.registry import is_budget_aware, make_agents
    from diloco_gym.backends import run_cells
    from diloco_gym.eval.cells import cached, release_cached

    free_agents = make_agents(config.free_agents) if config.free_agents else []
    if config.budget_agents:
        make_agents(config.budget_agents)  # unique names; the same agent twice is refused
    aware_free = [a.name for a in free_agents if is_budget_aware(a)]
    if aware_free:
        raise ValueError(
            f"budget-aware agent(s) {aware_free} need a merge budget: give them "
            f"as budget agents (run at every budget of the grid), not free ones"
        )
    calib = cached(
        "frontier-calibration", config, None, lambda: cal.load_calibration(config.calibration)
    )
    plan = cached("frontier-plan", config, None, lambda: _plan(config, calib))
    calib_verdicts: dict[str, str] = {}
    for regime, calib_key, fitted, _units, _envs in plan:
        sim, _ = cal.simulate_as_measured(
            calib_key, config.calibration, fitted, range(config.seed0, config.seed0 + 8)
        )
        measured = calib.measured(calib_key)
        calib_verdicts[regime] = cal.transfer_verdict(
            sim, measured, interval=cal.measured_intervals(measured)
        )
    shipped = _shipped(config)
    cells = [
        FrontierCell(shipped, r, u) for r, entry in enumerate(plan) for u in range(len(entry[3]))
    ]
    try:
        done = run_cells(run_frontier_cell, cells, progress=progress, desc="frontier", **backend)
    finally:
        release_cached()  # this process's sealed agents' workers end with the run
    rows = [row for res in done for row in res["rows"]]
    curves = [point for res in done for point in res["curves"]]
    df = pd.DataFrame(rows)
    cv = pd.DataFrame(curves)
    return {
        "rows": df,
        "curves": cv,
        **_tables(df, calib_verdicts, config),
        "calibration": calib_verdicts,
        "config": asdict(config),
        "agent_sandbox": sandbox_record(config.in_process_agents),
    }


# ----------------------------------------------------------------------------- output
def _tables(
    df: pd.DataFrame, calib_verdicts: dict[str, str], config: FrontierConfig
) -> dict[str, pd.DataFrame]:
    """The frontier's statistics tables (:mod:`diloco_gym.eval.frontier_stats`)."""
    across = config.holm_across_settings
    budget_df = budget_stats(df[df["mode"] == "budget"], calib_verdicts, config.alpha, across)
    pair_df = pairwise_stats(df[df["mode"] == "budget"], config.alpha)
    return {
        "budgets": budget_df,
        "pairwise": pair_df,
        "dominance": dominance(budget_df, pair_df, config.alpha),
        "free": free_stats(df[df["mode"] == "free"], calib_verdicts, config.alpha, across),
    }


def _save_png(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=90)


def write_frontier(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write frontier.csv, curves.csv, frontier.md, frontier.json and one figure per regime
    (with a learner calibration also the two-axis figure of each regime,
    ``frontier_quality_<regime>.png``: :func:`~diloco_gym.eval.quality_vs_random.quality_figure`).

    The output directory follows the report's safety rules: it is checked by
    :func:`diloco_gym.eval.output_dir.prepare_out_dir` (``force`` replaces only a directory
    holding the report marker, never the current, home or root directory), carries the
    report's marker file, and is written completely beside ``out`` before it replaces
    ``out`` (:func:`diloco_gym.eval.output_dir.write_output_dir`).

    Raises:
        FileExistsError: see :func:`diloco_gym.eval.output_dir.prepare_out_dir`.

    A fleet frontier's result (with ``"fleet"``) is written as
    :func:`~diloco_gym.eval.fleet_frontier.write_fleet_frontier` writes it.
    """
    if "fleet" in result:
        from diloco_gym.eval.fleet_frontier import write_fleet_frontier

        return write_fleet_frontier(result, out, force=force, command=command)

    def fill(tmp: Path) -> None:
        result["rows"].to_csv(tmp / "frontier.csv", index=False)
        result["curves"].to_csv(tmp / "curves.csv", index=False)
        figures = {}
        for regime in result["config"]["regimes"]:
            name = f"frontier_{regime.replace(':', '_')}.png"
            _save_png(frontier_figure(result, regime), tmp / name)
            figures[regime] = name
        quality = (
            write_quality_figures(result, tmp, dpi=90)
            if "quality_vs_random" in result["rows"]
            else {}
        )
        payload = {
            "config": result["config"],
            "command": command,
            "elapsed_s": result["elapsed_s"],
            "calibration": result["calibration"],
            "figures": figures,
            "quality_figures": quality,
            "budgets": result["budgets"].to_dict(orient="records"),
            "pairwise": result["pairwise"].to_dict(orient="records"),
            "dominance": result["dominance"].to_dict(orient="records"),
            "free": result["free"].to_dict(orient="records"),
            "holm_family": holm_scope(result["config"]),
            "agent_sandbox": result.get("agent_sandbox"),
        }
        (tmp / "frontier.json").write_text(json.dumps(payload, indent=2, default=json_default))
        (tmp / "frontier.md").write_text(render_markdown(result, figures, command, quality))

    return write_output_dir(out, force, fill)
