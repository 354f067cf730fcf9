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

import itertools
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diloco_gym.envs import core
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.eval import calibration as cal
from diloco_gym.eval import protocol
from diloco_gym.eval.cells import quality_columns
from diloco_gym.eval.rollout import run_episodes
from diloco_gym.eval.units import episode_budget
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.schedules import budget_range, sample_uniform

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
]

#: The issue's grid: 8, 10, 12, 16 and 24 merges per 10 min (8 is about the fewest the
#: corridor allows in a 600 s episode; there placement has little freedom).
DEFAULT_BUDGETS_PER_HOUR = (48.0, 60.0, 72.0, 96.0, 144.0)
#: Agents run at every budget of the grid: the budget-aware heuristics, and the deployable
#: heuristics that steer by the load (held to the budget by the env's mask).
DEFAULT_BUDGET_AGENTS = (
    "online-forecast-budget",
    "fixed-budget",
    "online-forecast",
    "calibrated-wa",
    "wa-diloco",
    "pressure-gate",
)
#: The relations :func:`dominance` gives a pair of agents.
DOMINANCE_VERDICTS = (
    "dominates",
    "is dominated by",
    "no dominance (order changes across budgets)",
    "no dominance (no significant difference)",
    "inconclusive (too few episodes)",
)
#: Bootstrap resamples of the gap-captured CI.
N_BOOT = 5000


@dataclass
class FrontierConfig:
    """What a frontier run computes.

    Attributes:
        regimes: synthetic regime names.
        budgets_per_hour: the budget grid, merges per hour (converted to merges per
            episode by the episode's length and rounded; each must be feasible).
        budget_agents: agents run with ``merge_budget=M`` at every budget of the grid.
        free_agents: agents run as they are (points at their own merges per hour).
        seeds / seed0: episodes ``seed0 .. seed0 + seeds - 1`` per regime (the units).
        draws: matched-random draws per episode and budget.
        alpha: significance level (Holm-adjusted tests).
        calibration: calibration file (``None``: the shipped reference measurements); a
            live file's fitted sidecar drives the regimes it measured, as in the report.
        trace / trace_format: replay a trace file instead of the synthetic regimes; its
            disjoint windows of ``window_s`` are the units (window ``i`` uses seed
            ``seed0 + i`` for the pressure series added to it) and ``seeds`` is unused.
        sidecar: with ``trace``: the regime whose sidecar (and calibration) the replay uses
            (default sync-heavy).
        rate_scale / target_utilization: with ``trace``: replay it faster (every request
            kept), or at this mean offered work over the sidecar's capacity.
    """

    regimes: list[str] = field(default_factory=lambda: ["bursty", "non-periodic", "sync-heavy"])
    budgets_per_hour: list[float] = field(default_factory=lambda: list(DEFAULT_BUDGETS_PER_HOUR))
    budget_agents: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGET_AGENTS))
    free_agents: list[str] = field(default_factory=list)
    seeds: int = 20
    seed0: int = 0
    draws: int = 1000
    alpha: float = protocol.ALPHA
    calibration: str | None = None
    trace: str | None = None
    trace_format: str = "auto"
    window_s: float = 600.0
    sidecar: str | None = None
    rate_scale: float | None = None
    target_utilization: float | None = None
    #: run deployable agents in this process (``--in-process-agents``); default: sealed
    #: in a worker process apart from the env (:mod:`diloco_gym.eval.sealed`).
    in_process_agents: bool = False
    #: learner calibration file: every point also gets its model-quality price.
    learner_calibration: str | None = None

    @property
    def trace_sidecar(self) -> str:
        """The regime whose sidecar a trace replay uses (default sync-heavy)."""
        return self.sidecar or "sync-heavy"

    def __post_init__(self) -> None:
        if self.learner_calibration is not None:
            from diloco_gym.sim.learner_calibration import load_learner_calibration

            load_learner_calibration(self.learner_calibration)  # a bad file fails here
        if self.trace is None:
            for name in ("sidecar", "rate_scale", "target_utilization"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} applies to a trace replay (trace=...); synthetic "
                        f"regimes use their own sidecar and load"
                    )
        else:
            self.regimes = [f"replay:{Path(self.trace).stem}"]
            if self.sidecar is not None and self.sidecar not in REGIMES:
                raise ValueError(
                    f"unknown sidecar regime {self.sidecar!r}; valid regimes: {', '.join(REGIMES)}"
                )
            if self.rate_scale is not None and self.target_utilization is not None:
                raise ValueError("give rate_scale or target_utilization, not both")
            for name in ("rate_scale", "target_utilization", "window_s"):
                v = getattr(self, name)
                if v is not None and not (np.isfinite(v) and v > 0):
                    raise ValueError(f"{name} must be a positive number, got {v}")
        if not self.free_agents:
            from diloco_gym.agents.registry import HEURISTICS

            self.free_agents = list(HEURISTICS)
        if not self.regimes:
            raise ValueError("regimes: give at least one regime")
        unknown = [r for r in self.regimes if r not in REGIMES and self.trace is None]
        if unknown:
            raise ValueError(f"unknown regime(s) {unknown}; valid regimes: {', '.join(REGIMES)}")
        if len(set(self.regimes)) != len(self.regimes):
            raise ValueError(f"regimes: each regime once, got {self.regimes}")
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 for a paired test, got {self.seeds}")
        from diloco_gym.eval.seed_ranges import check_test_seeds

        check_test_seeds(self.seed0, self.seeds, "frontier seeds (--seed0, --seeds)")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not self.budgets_per_hour:
            raise ValueError("budgets: give at least one budget (merges per hour)")
        for b in self.budgets_per_hour:
            if not (np.isfinite(b) and b > 0):
                raise ValueError(f"budgets must be positive numbers of merges per hour, got {b}")
        self.budgets_per_hour = sorted(float(b) for b in self.budgets_per_hour)
        twice = sorted({b for b in self.budgets_per_hour if self.budgets_per_hour.count(b) > 1})
        if twice:
            raise ValueError(
                f"budgets given more than once: {', '.join(f'{b:g}' for b in twice)} "
                f"merges/h; give each budget once"
            )
        if not self.budget_agents and not self.free_agents:
            raise ValueError("give at least one agent")
        for name, lst in (("budget_agents", self.budget_agents), ("free_agents", self.free_agents)):
            if len(set(lst)) != len(lst):
                raise ValueError(f"{name}: each agent once, got {lst}")


#: One env per merge budget (``None``: the free-budget env) of a unit.
_Envs = dict[int | None, DiLoCoSyncEnv]


def _same_episode(ep: core.Episode, env: DiLoCoSyncEnv) -> core.Episode:
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


def _score(
    cache: dict[str, Any], ep, env: DiLoCoSyncEnv, merges, seed: int, draws: int
) -> dict[str, Any]:
    """Agent, matched random and oracle of one episode by the same exact replay; the draws
    depend on (seed, merges) only, as in the report."""
    scorer, counts = _scorer(cache, ep, env)
    m = len(merges)
    return protocol.score_episode(
        scorer, merges, draws, np.random.default_rng([seed, m, 7]), counts
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
            gen = REGIMES[regime].with_load(fitted)
            # One env per budget, reused across seeds (a synthetic regime's seeds are its
            # units).
            envs: _Envs = {None: DiLoCoSyncEnv(regime=gen, sidecar=fitted)}
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
    from diloco_gym.agents.registry import AGENTS

    def absolute(p: str | None) -> str | None:
        return None if p is None else str(Path(p).expanduser().resolve())

    def agents(names: list[str]) -> list[str]:
        return [a if a in AGENTS else str(absolute(a)) for a in names]

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


def _frontier_state(config: FrontierConfig) -> tuple[Any, list[_PlanEntry], list, list]:
    """This process's calibration, plan and (sealed) agents of ``config``, built once."""
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.cells import cached
    from diloco_gym.eval.sealed import seal_agents

    calib = cached(
        "frontier-calibration", config, None, lambda: cal.load_calibration(config.calibration)
    )
    plan = cached("frontier-plan", config, None, lambda: _plan(config, calib))
    free_agents, budget_agents = cached(
        "frontier-agents",
        config,
        None,
        lambda: tuple(
            seal_agents(make_agents(names) if names else [], config.in_process_agents)
            for names in (config.free_agents, config.budget_agents)
        ),
    )
    return calib, plan, free_agents, budget_agents


def run_frontier_cell(cell: FrontierCell) -> dict[str, list[dict]]:
    """Run one unit of a frontier (module-level: workers import it by name).

    Returns:
        ``{"rows": [...], "curves": [...]}``: the unit's rows (free agents, then budget
        agents per budget) and its curve points, in the serial order.
    """
    from diloco_gym.agents.registry import is_budget_aware
    from diloco_gym.eval.cells import cached

    config = cell.config
    _calib, plan, free_agents, budget_agents = _frontier_state(config)
    regime, calib_key, fitted, units, shared_envs = plan[cell.regime]
    # The scorer cache of the regime (reused across its units in this process).
    cache: dict[str, Any] = cached("frontier-scorers", config, regime, dict)
    rows: list[dict] = []
    curves: list[dict] = []
    seed, gen = units[cell.unit]
    envs: _Envs = (
        shared_envs
        if shared_envs is not None
        else {None: DiLoCoSyncEnv(regime=gen, sidecar=fitted or REGIMES[calib_key].sidecar)}
    )
    env = envs[None]
    # Built once, directly (no env reset): every agent runs on it and the curves
    # and the scoring read it.
    ep0 = core.episode_from_seed(
        env.generator,
        seed,
        env.params,
        env.sidecar,
        env.learner_params,
        rate_rps=env.reward_rate_rps,
    )
    budgets = {
        b: episode_budget(b, ep0.trace.duration_s, ep0.n_decisions, env.params)
        for b in config.budgets_per_hour
    }
    if len(set(budgets.values())) != len(budgets):
        raise ValueError(
            f"budgets {config.budgets_per_hour} merges/h round to the same merges per "
            f"episode ({list(budgets.values())}); give distinct budgets"
        )
    for m in budgets.values():
        if m not in envs:
            envs[m] = DiLoCoSyncEnv(regime=gen, sidecar=env.sidecar, merge_budget=m)
    runs = [(agent, env, "free", np.nan, np.nan) for agent in free_agents]
    runs += [
        (agent, envs[m], "budget", per_hour, m)
        for per_hour, m in budgets.items()
        for agent in budget_agents
    ]
    jobs = [(r[1], r[0], seed, _same_episode(ep0, r[1])) for r in runs]  # lockstep, on copies
    results = run_episodes(jobs, copies=True)
    for (agent, e, mode, per_hour, m_budget), (*_, ep), res in zip(
        runs, jobs, results, strict=True
    ):
        if mode == "budget" and int(res["merges"]) != m_budget:
            # The env's mask guarantees it; checked, never assumed.
            raise RuntimeError(
                f"{agent.name} made {res['merges']} merges with "
                f"merge_budget={m_budget} (seed {seed})"
            )
        scored = _score(cache, ep, e, res["merge_decisions"], seed, config.draws)
        held = "free" if mode == "free" else "budget-aware" if is_budget_aware(agent) else "mask"
        rows.append(
            {
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
                **quality_columns(config.learner_calibration, res),
                "unit": "seed" if config.trace is None else "window",
                # in the replayed (rate-scaled) trace's clock
                "window_start_replayed_s": getattr(gen, "start_s", np.nan)
                if config.trace is not None
                else np.nan,
            }
        )
    # The curves: random placement and the oracle at every feasible budget, drawn
    # exactly as score_episode draws them (same rng, same counts), so the curve at M
    # is every budget-held agent's matched random at M.
    ep = ep0
    scorer, counts = _scorer(cache, ep, env)
    lo, hi = budget_range(ep.n_decisions, env.params.h_min, env.params.h_max)
    for m in range(max(lo, 1), hi + 1):
        env_sched = sample_uniform(
            ep.n_decisions,
            env.params.h_min,
            env.params.h_max,
            m,
            config.draws,
            np.random.default_rng([seed, m, 7]),
            counts=counts,
        )
        mr = scorer.score(env_sched).exact_pct
        orc = protocol.oracle_score(ep, m, env.params, env.sidecar, scorer=scorer)
        curves.append(
            {
                "regime": regime,
                "seed": seed,
                "budget": m,
                "budget_per_hour": m * 3600.0 / ep.trace.duration_s,
                "matched_random_mean": float(mr.mean()),
                "oracle_pct": orc["exact_pct"],
                "oracle_exact_optimum": bool(orc["exact_optimum"]),
            }
        )
    return {"rows": rows, "curves": curves}


def run_frontier(
    config: FrontierConfig,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the free-budget points, the budget grid and the curves; compute the statistics.

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
    from diloco_gym.agents.registry import is_budget_aware, make_agents
    from diloco_gym.backends import run_cells
    from diloco_gym.eval.cells import cached, release_cached

    started = time.perf_counter()
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
        done = run_cells(
            run_frontier_cell,
            cells,
            backend=backend,
            jobs=jobs,
            ray_address=ray_address,
            progress=progress,
            desc="frontier",
        )
    finally:
        release_cached()  # this process's sealed agents' workers end with the run
    rows = [row for res in done for row in res["rows"]]
    curves = [point for res in done for point in res["curves"]]
    df = pd.DataFrame(rows)
    cv = pd.DataFrame(curves)
    budget_df = budget_stats(df[df["mode"] == "budget"], calib_verdicts, config.alpha)
    pair_df = pairwise_stats(df[df["mode"] == "budget"], config.alpha)
    dom_df = dominance(budget_df, pair_df, config.alpha)
    free_df = free_stats(df[df["mode"] == "free"], calib_verdicts, config.alpha)
    return {
        "rows": df,
        "curves": cv,
        "budgets": budget_df,
        "pairwise": pair_df,
        "dominance": dom_df,
        "free": free_df,
        "calibration": calib_verdicts,
        "config": asdict(config),
        "elapsed_s": time.perf_counter() - started,
    }


# ----------------------------------------------------------------------------- statistics
def gap_captured(
    agent: np.ndarray,
    random: np.ndarray,
    oracle: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = N_BOOT,
) -> dict[str, float]:
    """Share of the random-to-oracle gap an agent captures, with a bootstrap CI over units.

    ``gap = (mean(random) - mean(agent)) / (mean(random) - mean(oracle))``: 0 is random
    placement, 1 the oracle. The CI resamples the paired units (rows) with replacement and
    takes the 2.5th and 97.5th percentiles of the resampled ratio; resamples whose oracle is
    no better than random are left out. Undefined (NaN) when the oracle is no better than
    random on the units given.
    """
    a, r, o = (np.asarray(x, dtype=np.float64) for x in (agent, random, oracle))
    if not (a.shape == r.shape == o.shape) or a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"gap_captured needs three equal-length 1-D arrays, got shapes "
            f"{a.shape}, {r.shape}, {o.shape}"
        )
    den = r.mean() - o.mean()
    if not den > 1e-9:
        return {"gap": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    num_b = r[idx].mean(axis=1) - a[idx].mean(axis=1)
    den_b = r[idx].mean(axis=1) - o[idx].mean(axis=1)
    ok = den_b > 1e-9
    ratio = num_b[ok] / den_b[ok]
    lo, hi = np.percentile(ratio, [2.5, 97.5]) if ratio.size else (np.nan, np.nan)
    return {"gap": float((r.mean() - a.mean()) / den), "ci_low": float(lo), "ci_high": float(hi)}


def _holm(p: np.ndarray) -> np.ndarray:
    from diloco_gym.eval.report import holm

    return holm(p) if np.size(p) else np.asarray(p, dtype=np.float64)


def _agent_table(
    df: pd.DataFrame, keys: list[str], calib_verdicts: dict[str, str], alpha: float
) -> pd.DataFrame:
    """Per ``keys`` group of agents: means, paired test vs matched random, gap captured;
    Holm across the agents of each group (``keys`` minus ``agent``)."""
    out = []
    for key, g in df.groupby(keys, sort=False):
        g = g.sort_values("seed")
        diff = (g["sync_excess_pct"] - g["matched_random_mean"]).to_numpy()
        test = protocol.paired_test(diff, np.random.default_rng(0))
        gap = gap_captured(
            g["sync_excess_pct"].to_numpy(),
            g["matched_random_mean"].to_numpy(),
            g["oracle_same_budget_pct"].to_numpy(),
            np.random.default_rng(1),
        )
        out.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "held": g["held"].iloc[0],
                "deployable": bool(g["deployable"].all()),
                "units": len(g),
                "merges": g["merges"].mean(),
                "merges_per_hour": g["merges_per_hour"].mean(),
                "sync_excess_pct": g["sync_excess_pct"].mean(),
                "matched_random_pct": g["matched_random_mean"].mean(),
                "oracle_pct": g["oracle_same_budget_pct"].mean(),
                "diff_pp": test["mean"],
                "diff_ci_low": test["ci_low"],
                "diff_ci_high": test["ci_high"],
                "p_value": test["p_value"],
                "nonzero_units": test["nonzero"],
                "gap_captured": gap["gap"],
                "gap_ci_low": gap["ci_low"],
                "gap_ci_high": gap["ci_high"],
                "no_sync_violation_pct": g["no_sync_violation_pct"].mean(),
            }
        )
        if "quality_cost" in g:  # a learner calibration was given
            out[-1]["pred_loss"] = g["pred_loss"].mean()
            out[-1]["quality_cost"] = g["quality_cost"].mean()
    res = pd.DataFrame(out)
    if res.empty:
        return res
    family_keys = [k for k in keys if k != "agent"]
    res["p_holm"] = np.nan
    res["holm_family"] = 0
    res["verdict"] = ""
    for _, idx in res.groupby(
        family_keys if len(family_keys) > 1 else family_keys[0], sort=False
    ).groups.items():
        k = len(idx)
        res.loc[idx, "p_holm"] = _holm(res.loc[idx, "p_value"].to_numpy())
        res.loc[idx, "holm_family"] = k
        no_sync = res.loc[idx, "no_sync_violation_pct"].mean()
        for i in idx:
            r = res.loc[i]
            res.loc[i, "verdict"] = protocol.gate_verdict(
                calib_verdicts[r["regime"]],
                r["diff_pp"],
                r["p_holm"],
                alpha,
                n_units=int(r["units"]),
                n_nonzero=int(r["nonzero_units"]),
                n_tests=k,
                no_sync_violation_pct=no_sync,
            )
    return res


def budget_stats(
    rows: pd.DataFrame, calib_verdicts: dict[str, str], alpha: float = protocol.ALPHA
) -> pd.DataFrame:
    """One row per regime x budget x budget-held agent: sync-excess, matched random, oracle,
    the paired test against matched random (Holm across the agents at that budget), the
    verdict and the gap captured with its bootstrap CI."""
    if rows.empty:
        return pd.DataFrame()
    return _agent_table(
        rows, ["regime", "budget_per_hour", "budget", "agent"], calib_verdicts, alpha
    )


def free_stats(
    rows: pd.DataFrame, calib_verdicts: dict[str, str], alpha: float = protocol.ALPHA
) -> pd.DataFrame:
    """The free-budget points: one row per regime x agent at its own merges per hour
    (Holm across the free agents of a regime), as the report computes them."""
    if rows.empty:
        return pd.DataFrame()
    return _agent_table(rows, ["regime", "agent"], calib_verdicts, alpha)


def pairwise_stats(rows: pd.DataFrame, alpha: float = protocol.ALPHA) -> pd.DataFrame:
    """Every pair of budget-held agents at every regime x budget: paired test of
    ``A - B`` sync-excess over the seeds both ran, Holm across the pairs at that budget.

    ``best_p_holm`` is the smallest Holm-adjusted p the units could give (the family size
    times :func:`~diloco_gym.eval.protocol.min_achievable_p`); when it is not below ``alpha``
    no difference at that budget can be significant.
    """
    out = []
    if rows.empty:
        return pd.DataFrame()
    for (regime, per_hour, m), g in rows.groupby(
        ["regime", "budget_per_hour", "budget"], sort=False
    ):
        wide = g.pivot_table(index="seed", columns="agent", values="sync_excess_pct", sort=False)
        names = list(dict.fromkeys(g["agent"]))
        block = []
        for a, b in itertools.combinations(names, 2):
            both = wide[[a, b]].dropna()
            diff = (both[a] - both[b]).to_numpy()
            test = protocol.paired_test(diff, np.random.default_rng(2))
            block.append(
                {
                    "regime": regime,
                    "budget_per_hour": per_hour,
                    "budget": m,
                    "agent_a": a,
                    "agent_b": b,
                    "units": len(diff),
                    "mean_a": float(both[a].mean()),
                    "mean_b": float(both[b].mean()),
                    "diff_pp": test["mean"],
                    "diff_ci_low": test["ci_low"],
                    "diff_ci_high": test["ci_high"],
                    "p_value": test["p_value"],
                    "min_p": test["min_p"],
                }
            )
        if block:
            p_holm = _holm(np.array([r["p_value"] for r in block]))
            for r, ph in zip(block, p_holm, strict=True):
                r["p_holm"] = float(ph)
                r["holm_family"] = len(block)
                r["best_p_holm"] = min(1.0, len(block) * r["min_p"])
                r["significant"] = bool(np.isfinite(ph) and ph < alpha)
            out.extend(block)
    return pd.DataFrame(out)


def dominance(
    budgets: pd.DataFrame, pairwise: pd.DataFrame, alpha: float = protocol.ALPHA
) -> pd.DataFrame:
    """The dominance relation between budget-held agents, per regime.

    A dominates B when at every budget both ran A's mean sync-excess is no higher than B's
    and at least one of those differences is significant (pairwise Holm-adjusted
    p < ``alpha``). Otherwise: ``no dominance (order changes across budgets)`` when some
    difference is significant but the other agent is lower at another budget,
    ``no dominance (no significant difference)`` when no difference at any budget is
    significant (enough units to find one), and ``inconclusive (too few episodes)`` when no
    pairwise test at any budget could reach ``alpha`` with the units given (then a missing
    significance says nothing, and it is never called a tie).

    Args:
        budgets: :func:`budget_stats` (unused beyond the agents' order; kept for callers
            that pass both tables).
        pairwise: :func:`pairwise_stats`.

    Returns:
        One row per regime x ordered pair ``(agent_a, agent_b)`` (each unordered pair once,
        in the order of the input): ``relation`` (one of :data:`DOMINANCE_VERDICTS`, read
        "agent_a RELATION agent_b"), ``budgets`` compared, ``significant_budgets`` (where
        the pairwise difference is significant) and ``a_lower_at`` / ``b_lower_at``.
    """
    out = []
    if pairwise.empty:
        return pd.DataFrame(
            columns=[
                "regime",
                "agent_a",
                "agent_b",
                "relation",
                "budgets",
                "significant_budgets",
                "a_lower_at",
                "b_lower_at",
            ]
        )
    for (regime, a, b), g in pairwise.groupby(["regime", "agent_a", "agent_b"], sort=False):
        d = g["mean_a"].to_numpy() - g["mean_b"].to_numpy()
        sig = g["significant"].to_numpy(bool)
        bud = g["budget_per_hour"].to_numpy()
        reachable = bool((g["best_p_holm"] < alpha).any())
        a_le = bool(np.all(d <= 0))
        b_le = bool(np.all(d >= 0))
        if a_le and (sig & (d < 0)).any():
            rel = "dominates"
        elif b_le and (sig & (d > 0)).any():
            rel = "is dominated by"
        elif not reachable:
            rel = "inconclusive (too few episodes)"
        elif sig.any():
            rel = "no dominance (order changes across budgets)"
        else:
            rel = "no dominance (no significant difference)"
        out.append(
            {
                "regime": regime,
                "agent_a": a,
                "agent_b": b,
                "relation": rel,
                "budgets": len(g),
                "significant_budgets": [float(x) for x in bud[sig]],
                "a_lower_at": [float(x) for x in bud[d < 0]],
                "b_lower_at": [float(x) for x in bud[d > 0]],
            }
        )
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------- output
def _fmt(x: float, nd: int = 2) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{nd}f}"


def _fmt_p(p: float) -> str:
    if not np.isfinite(p):
        return "-"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


_SHORT = {
    "placement gain": "gain",
    "tied with matched random": "tie",
    "worse than matched random": "worse",
    "inconclusive (too few episodes)": "inconcl.",
    "no claim (saturated)": "no claim",
    "no claim (uncalibrated)": "no claim",
    "no claim (no SLO effect)": "no claim",
}


def render_markdown(result: dict[str, Any], figures: dict[str, str], command: str = "") -> str:
    """frontier.md: per regime the figure, the leaderboard (gap captured per budget with its
    CI and verdict), sync-excess per budget, the dominance relation and the free points."""
    cfg = result["config"]
    b, fr, dom = result["budgets"], result["free"], result["dominance"]
    lines = ["# Frontier: sync-excess against merge rate", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    if cfg.get("trace"):
        n_units = int(result["rows"]["seed"].nunique()) if len(result["rows"]) else 0
        units = (
            f"{n_units} disjoint windows of {cfg['window_s']:g} s of {cfg['trace']} "
            f"(independent units; {cfg.get('sidecar') or 'sync-heavy'} sidecar),"
        )
    else:
        units = (
            f"{cfg['seeds']} seeds per regime ({cfg['seed0']}..{cfg['seed0'] + cfg['seeds'] - 1}),"
        )
    lines += [
        f"{units} {cfg['draws']} matched-random draws per episode and budget, alpha "
        f"{cfg['alpha']}; wall time {result['elapsed_s']:.1f} s.",
        "",
        "Deployable agents: "
        + (
            "in-process (--in-process-agents: not sealed; an agent's code could reach the episode)."
            if cfg.get("in_process_agents")
            else "sealed, in a worker process with observations, action masks and "
            "public parameters only; the oracle runs in the evaluating process."
        ),
        "",
        "Every number is the exact replay (`protocol.EpisodeScorer`) of the agent's, the "
        "matched-random draws' and the oracle's schedules. **Gap captured** = (matched random"
        " - agent) / (matched random - oracle) at the same budget (0 = random placement, 1 = "
        "the oracle), 95 % bootstrap CI over units (seeds or windows); the oracle is the "
        "best exact schedule known at that budget (the exact optimum where merges cannot "
        "interact or every schedule was scored, else an exact local search from the "
        "additive optimum: an upper bound). Verdict against "
        "matched random: paired sign-flip test, Holm across the agents at that budget. Held: "
        "`budget-aware` agents steer by `budget_left`; `mask` agents follow their own rule "
        "and the env's budget mask forces or forbids merges to keep exactly the budget. A "
        "dominates B: at every budget A's sync-excess is no higher, at least one difference "
        "significant (pairwise Holm across the pairs at a budget).",
        "",
    ]
    for regime in cfg["regimes"]:
        lines += [f"## {regime}", ""]
        lines += [
            f"Calibration: {result['calibration'].get(regime, '-')}. "
            + _scoring_sentence(result["rows"], regime),
            "",
        ]
        if regime in figures:
            lines += [f"![frontier {regime}]({figures[regime]})", ""]
        g = b[b["regime"] == regime] if not b.empty else b
        if not g.empty:
            per_hours = sorted(g["budget_per_hour"].unique())
            head = "| agent | held | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |"
            lines += [
                "### Leaderboard: gap captured [95 % CI] (verdict vs matched random)",
                "",
                head,
                "|---|---|" + "---|" * len(per_hours),
            ]
            order = (
                g.groupby("agent", sort=False)["gap_captured"]
                .mean()
                .sort_values(ascending=False)
                .index
            )
            for agent in order:
                ga = g[g["agent"] == agent].set_index("budget_per_hour")
                cells = []
                for x in per_hours:
                    if x not in ga.index:
                        cells.append("-")
                        continue
                    r = ga.loc[x]
                    short = _SHORT.get(r["verdict"], r["verdict"])
                    cells.append(
                        f"{_fmt(r['gap_captured'])} [{_fmt(r['gap_ci_low'])}, "
                        f"{_fmt(r['gap_ci_high'])}] ({short})"
                    )
                lines.append(f"| {agent} | {ga['held'].iloc[0]} | " + " | ".join(cells) + " |")
            lines += [
                "",
                "### Sync-excess % per budget (agent mean over units)",
                "",
                "| agent | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |",
                "|---|" + "---|" * len(per_hours),
            ]
            for agent in order:
                ga = g[g["agent"] == agent].set_index("budget_per_hour")
                lines.append(
                    f"| {agent} | "
                    + " | ".join(
                        _fmt(ga.loc[x, "sync_excess_pct"]) if x in ga.index else "-"
                        for x in per_hours
                    )
                    + " |"
                )
            first = g.drop_duplicates("budget_per_hour").set_index("budget_per_hour")
            lines.append(
                "| *matched random* | "
                + " | ".join(_fmt(first.loc[x, "matched_random_pct"]) for x in per_hours)
                + " |"
            )
            lines.append(
                "| *oracle (non-deployable)* | "
                + " | ".join(_fmt(first.loc[x, "oracle_pct"]) for x in per_hours)
                + " |"
            )
            lines.append(
                "| *merges per episode* | "
                + " | ".join(f"{int(first.loc[x, 'budget'])}" for x in per_hours)
                + " |"
            )
            lines += ["", "Diff vs matched random (pp) and Holm p per budget:", ""]
            lines += [
                "| agent | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |",
                "|---|" + "---|" * len(per_hours),
            ]
            for agent in order:
                ga = g[g["agent"] == agent].set_index("budget_per_hour")
                lines.append(
                    f"| {agent} | "
                    + " | ".join(
                        f"{ga.loc[x, 'diff_pp']:+.2f} (p {_fmt_p(ga.loc[x, 'p_holm'])})"
                        if x in ga.index
                        else "-"
                        for x in per_hours
                    )
                    + " |"
                )
        d = dom[dom["regime"] == regime] if not dom.empty else dom
        if not d.empty:
            lines += ["", "### Dominance", ""]
            for rel in DOMINANCE_VERDICTS:
                dd = d[d["relation"] == rel]
                if dd.empty:
                    continue
                if rel in ("dominates", "is dominated by"):
                    pairs = [
                        (r.agent_a, r.agent_b) if rel == "dominates" else (r.agent_b, r.agent_a)
                        for r in dd.itertuples()
                    ]
                    lines += [f"* **{w}** dominates {lo_}" for w, lo_ in pairs]
                else:
                    lines.append(
                        f"* {rel}: "
                        + "; ".join(f"{r.agent_a} vs {r.agent_b}" for r in dd.itertuples())
                    )
            winners = _undominated(d)
            lines += ["", f"Not dominated by any budget-held agent: {', '.join(winners)}."]
        f = fr[fr["regime"] == regime] if not fr.empty else fr
        if not f.empty:
            lines += [
                "",
                "### Free-budget points (each agent at its own merges/h)",
                "",
                "| agent | merges/h | sync-excess % | matched random % | oracle % | "
                "gap captured [CI] | Holm p | verdict |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in f.sort_values("merges_per_hour").itertuples():
                name = r.agent + ("" if r.deployable else " (non-deployable)")
                lines.append(
                    f"| {name} | {r.merges_per_hour:.1f} | {_fmt(r.sync_excess_pct)} "
                    f"| {_fmt(r.matched_random_pct)} | {_fmt(r.oracle_pct)} | "
                    f"{_fmt(r.gap_captured)} [{_fmt(r.gap_ci_low)}, "
                    f"{_fmt(r.gap_ci_high)}] | {_fmt_p(r.p_holm)} | {r.verdict} |"
                )
        lines += _quality_lines(result["rows"], regime)
        lines.append("")
    return "\n".join(lines)


def _quality_lines(rows: pd.DataFrame, regime: str) -> list[str]:
    """The two-sided trade-off per agent and budget (with a learner calibration): SLO
    damage (sync-excess) next to the model-quality price."""
    g = rows[rows["regime"] == regime] if "quality_cost" in rows else rows.iloc[:0]
    if g.empty:
        return []
    lines = [
        "",
        "### Model quality (learner calibration)",
        "",
        "Predicted validation loss (nats/byte) after each episode's merges, and the quality "
        "cost: its excess over fixed H with the same number of merges over the same span.",
        "",
        "| agent | budget merges/h | merges/h | sync-excess % | predicted loss | quality cost |",
        "|---|---|---|---|---|---|",
    ]
    keys = ["agent", "mode", "budget_per_hour"]
    for (agent, mode, per_hour), a in g.groupby(keys, sort=False, dropna=False):
        budget = "free" if mode == "free" else f"{per_hour:g}"
        lines.append(
            f"| {agent} | {budget} | {a['merges_per_hour'].mean():.1f} | "
            f"{_fmt(a['sync_excess_pct'].mean())} | {a['pred_loss'].mean():.4f} | "
            f"{a['quality_cost'].mean():+.2e} |"
        )
    return lines


def _scoring_sentence(rows: pd.DataFrame, regime: str) -> str:
    """How a regime's rows were scored: where the oracle is the exact optimum, and the
    largest additive-exact gap (every number itself is the exact replay)."""
    g = rows[rows["regime"] == regime]
    if g.empty:
        return ""
    bound = int((g["oracle_schedule"] != protocol.ORACLE_EXACT).sum())
    oracle = (
        "the oracle is the exact optimum in every agent-episode"
        if bound == 0
        else f"the oracle is an upper bound on the exact optimum (exact replay of the "
        f"additive optimum) in {bound} of {len(g)} agent-episodes"
    )
    return (
        f"Scoring: exact replay; {oracle}; largest additive-exact gap "
        f"{g['additive_exact_gap_pp'].max():.3g} pp."
    )


def _undominated(d: pd.DataFrame) -> list[str]:
    """Agents of one regime's dominance table that no other agent dominates."""
    agents = list(dict.fromkeys(list(d["agent_a"]) + list(d["agent_b"])))
    losers = set(d.loc[d["relation"] == "dominates", "agent_b"]) | set(
        d.loc[d["relation"] == "is dominated by", "agent_a"]
    )
    return [a for a in agents if a not in losers]


def frontier_figure(result: dict[str, Any], regime: str):
    """The frontier of one regime (a matplotlib ``Figure``, drawn without pyplot):
    sync-excess against merges per hour; matched random's and the oracle's curves over
    every feasible budget, each budget-held agent's curve over the grid (solid:
    budget-aware, dashed: held by the mask), and every free agent's point."""
    from matplotlib.figure import Figure

    cv = result["curves"]
    c = (
        cv[cv["regime"] == regime]
        .groupby("budget_per_hour")[["matched_random_mean", "oracle_pct"]]
        .mean()
    )
    fig = Figure(figsize=(9.5, 5.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(
        c.index,
        c["matched_random_mean"],
        "-",
        color="tab:orange",
        lw=2.5,
        alpha=0.7,
        label="matched random (random placement)",
    )
    ax.plot(
        c.index,
        c["oracle_pct"],
        "-",
        color="black",
        lw=2.5,
        alpha=0.7,
        label="oracle (exact DP, non-deployable)",
    )
    b = result["budgets"]
    colors = iter(
        [
            "tab:blue",
            "tab:green",
            "tab:red",
            "tab:purple",
            "tab:brown",
            "tab:pink",
            "tab:olive",
            "tab:cyan",
            "tab:gray",
        ]
        * 4
    )
    if not b.empty:
        for agent, g in b[b["regime"] == regime].groupby("agent", sort=False):
            g = g.sort_values("budget_per_hour")
            aware = g["held"].iloc[0] == "budget-aware"
            ax.plot(
                g["budget_per_hour"],
                g["sync_excess_pct"],
                "-" if aware else "--",
                marker="o",
                ms=4,
                color=next(colors),
                lw=1.6,
                label=f"{agent} @ budget ({'budget-aware' if aware else 'held by mask'})",
            )
    fr = result["free"]
    if not fr.empty:
        f = fr[fr["regime"] == regime]
        ax.scatter(
            f["merges_per_hour"],
            f["sync_excess_pct"],
            marker="D",
            s=30,
            color="0.2",
            zorder=5,
            label="free-budget agents (own merges/h)",
        )
        # Labels in a column to the right of the curves, each at its point's height where
        # it can be, pushed apart just enough not to overprint (in the points' order, so
        # the leader lines do not cross each other much).
        order = f.sort_values("sync_excess_pct", ascending=False)
        y_lo, y_hi = ax.get_ylim()
        step = (y_hi - y_lo) * 0.05
        ty = order["sync_excess_pct"].to_numpy(dtype=float).copy()
        for i in range(1, ty.size):
            ty[i] = min(ty[i], ty[i - 1] - step)
        if ty.size and ty[-1] < y_lo + step:
            ty += y_lo + step - ty[-1]
        x_hi = max(float(c.index.max()), float(f["merges_per_hour"].max()))
        for r, y_text in zip(order.itertuples(), ty, strict=True):
            name = r.agent + ("" if r.deployable else " (non-dep.)")
            ax.annotate(
                name,
                (r.merges_per_hour, r.sync_excess_pct),
                xytext=(x_hi * 1.04, y_text),
                textcoords="data",
                fontsize=7,
                va="center",
                arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.6"},
            )
        ax.set_ylim(y_lo, max(y_hi, float(ty.max()) + step) if ty.size else y_hi)
        x_lo = min(float(c.index.min()), float(f["merges_per_hour"].min()))
        ax.set_xlim(x_lo * 0.9, x_hi * 1.35)
    for x in sorted(set(b["budget_per_hour"])) if not b.empty else []:
        ax.axvline(x, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("merges per hour (budget)")
    ax.set_ylabel("sync-excess (pp of requests)")
    n_units = int(cv.loc[cv["regime"] == regime, "seed"].nunique())
    kind = "windows" if result["config"].get("trace") else "seeds"
    ax.set_title(f"{regime}: frontier of sync-excess against merge rate ({n_units} {kind})")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _save_png(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=90)


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def write_frontier(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write frontier.csv, curves.csv, frontier.md, frontier.json and one figure per regime.

    The output directory follows the report's safety rules: it is checked by
    :func:`diloco_gym.eval.report.prepare_out_dir` (``force`` replaces only a directory holding
    the report marker, never the current, home or root directory), carries the report's
    marker file, and is written completely beside ``out`` before it replaces ``out``
    (:func:`diloco_gym.eval.report.write_output_dir`).

    Raises:
        FileExistsError: see :func:`diloco_gym.eval.report.prepare_out_dir`.
    """
    from diloco_gym.eval import report

    def fill(tmp: Path) -> None:
        result["rows"].to_csv(tmp / "frontier.csv", index=False)
        result["curves"].to_csv(tmp / "curves.csv", index=False)
        figures = {}
        for regime in result["config"]["regimes"]:
            name = f"frontier_{regime.replace(':', '_')}.png"
            _save_png(frontier_figure(result, regime), tmp / name)
            figures[regime] = name
        payload = {
            "config": result["config"],
            "command": command,
            "elapsed_s": result["elapsed_s"],
            "calibration": result["calibration"],
            "figures": figures,
            "budgets": result["budgets"].to_dict(orient="records"),
            "pairwise": result["pairwise"].to_dict(orient="records"),
            "dominance": result["dominance"].to_dict(orient="records"),
            "free": result["free"].to_dict(orient="records"),
        }
        (tmp / "frontier.json").write_text(json.dumps(payload, indent=2, default=_json_default))
        (tmp / "frontier.md").write_text(render_markdown(result, figures, command))

    return report.write_output_dir(out, force, fill)
