"""The report's cells: picklable tasks whose results depend only on their arguments.

Granularity: one cell is one *unit* (a seed of a synthetic regime, or one window of a
replayed trace) x **all** the report's agents, with each agent's matched-random envelope and
oracle. Keeping the agents of a unit together keeps the one
:class:`~diloco_gym.eval.protocol.EpisodeScorer` built per episode (the costly part of scoring:
the episode's exact replay state, the oracle) shared by every agent, as in a serial run;
splitting agents into cells would rebuild it once per agent. A unit is also the protocol's
statistical unit, so a cell never straddles two of them. Besides the unit cells, each regime
has one calibration cell (the simulated effect sizes behind its calibration verdict).

A cell carries only names, paths and parameters (the :class:`~diloco_gym.eval.report.ReportConfig`
with absolute paths, a regime name, a unit index): a worker rebuilds the environment, the
calibration and the agents itself, so the package (and any trace, calibration or model file
the report names) must be reachable on every worker. A worker caches what it rebuilt per
configuration, so a process that runs many cells of one report loads its trace and its
agents once.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ReportCell",
    "run_report_cell",
    "run_report_cells",
    "cell_config",
    "regime_plan",
    "UNIT_BATCH",
]


@dataclass(frozen=True)
class ReportCell:
    """One cell of a report.

    Attributes:
        config: the report's configuration, trace and calibration paths made absolute
            (workers may run in another directory).
        regime: the report's regime name (``replay:<stem>`` for a trace).
        unit: the unit's index within the regime; ``None`` for the regime's calibration cell.
        env: ``DiLoCoSyncEnv`` keyword overrides (``EnvParams`` fields such as
            ``merge_budget``) as sorted ``(name, value)`` pairs; empty for a report.
    """

    config: Any  # diloco_gym.eval.report.ReportConfig (not imported here: no import cycle)
    regime: str
    unit: int | None
    env: tuple[tuple[str, Any], ...] = ()


def cell_config(config):
    """``config`` with its trace, calibration and model paths absolute, for workers whose
    working directory may differ from this process's."""

    def absolute(p: str | None) -> str | None:
        return None if p is None else str(Path(p).expanduser().resolve())

    from diloco_gym.agents.registry import shipped_spec

    agents = [shipped_spec(a) for a in config.agents]
    return replace(
        config,
        trace=absolute(config.trace),
        calibration=absolute(config.calibration),
        agents=agents,
        **(
            {"learner_calibration": absolute(config.learner_calibration)}
            if getattr(config, "learner_calibration", None)
            else {}
        ),
    )


@functools.lru_cache(maxsize=4)
def _learner_calibration_file(path: str) -> Any:
    """A learner calibration file, read once per worker process."""
    from diloco_gym.sim.learner_calibration import load_learner_calibration

    return load_learner_calibration(path)


def quality_columns(
    learner_calibration: Any,
    res: dict[str, Any],
    control: Any = None,
    decision_seconds: float | None = None,
) -> dict[str, float]:
    """The model-quality price of an episode's schedule (``pred_loss``, ``quality_cost``;
    :mod:`diloco_gym.sim.learner_calibration`), or nothing without a learner calibration.

    With the episode's matched-random ``control`` (a :class:`~diloco_gym.eval.protocol.Control`
    at the agent's number of merges) and the env's ``decision_seconds``, also
    ``control_pred_loss`` and ``quality_vs_random``
    (:func:`diloco_gym.eval.quality_vs_random.control_quality_columns`)."""
    if not learner_calibration:
        return {}
    from diloco_gym.sim.learner_calibration import (
        env_schedule_loss,
        load_learner_calibration,
        quality_cost,
    )

    lc = (
        _learner_calibration_file(learner_calibration)
        if isinstance(learner_calibration, str)
        else load_learner_calibration(learner_calibration)
    )
    times = res["merge_times_s"]
    out = {"pred_loss": env_schedule_loss(times, lc), "quality_cost": quality_cost(times, lc)}
    if control is not None:
        from diloco_gym.eval.quality_vs_random import control_quality_columns

        if decision_seconds is None:
            raise ValueError("quality_columns: a control needs the env's decision_seconds")
        out.update(control_quality_columns(lc, out["pred_loss"], control, decision_seconds))
    return out


def regime_plan(
    config, regime: str, calib=None, env: dict | None = None
) -> tuple[list, dict, str, Any]:
    """The units and load of one regime of a report: ``(units, load, measured_key, fitted)``.

    ``measured_key`` is the regime whose calibration applies (a trace replay's sidecar
    regime) and ``fitted`` the calibration file's fitted sidecar for it, or ``None``.
    ``env`` overrides ``EnvParams`` fields of every unit's environment (a sweep's
    ``merge_budget``, for example).
    """
    from diloco_gym.eval import calibration as cal
    from diloco_gym.eval.units import synthetic_units, trace_units
    from diloco_gym.sim.regimes import REGIMES

    calib = calib if calib is not None else cal.load_calibration(config.calibration)
    measured_key = regime if config.trace is None else config.trace_sidecar
    fitted = calib.sidecar_for(measured_key)
    if config.trace is None:
        units, load = synthetic_units(config, regime, fitted)
    else:
        units, load = trace_units(config, fitted or REGIMES[measured_key].sidecar)
    if env:
        from diloco_gym.envs.env import DiLoCoSyncEnv

        rebuilt: dict[int, Any] = {}  # units that shared an env keep sharing one
        for unit in units:
            old = unit.env
            if id(old) not in rebuilt:
                rebuilt[id(old)] = DiLoCoSyncEnv(
                    regime=old.generator, sidecar=old.sidecar, learners=old.learner_params, **env
                )
            unit.env = rebuilt[id(old)]
    return units, load, measured_key, fitted


# Per-process cache of what a worker rebuilt: the key is the configuration itself.
_CACHE: dict[str, Any] = {}
_CACHE_MAX = 8


def cached(kind: str, config, regime: str | None, build, env: tuple = ()):
    key = json.dumps([kind, asdict(config), regime, env], sort_keys=True, default=str)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = build()
    return _CACHE[key]


def release_cached() -> None:
    """Empty this process's cache, stopping the worker processes of the sealed agents it
    holds (a report or frontier run through the Python API leaves none running after it
    returns; a process-pool worker's sealed agents end with the worker)."""
    from diloco_gym.eval.sealed import SealedAgent

    def close(value: Any) -> None:
        if isinstance(value, SealedAgent):
            value.close()
        elif isinstance(value, list | tuple):
            for v in value:
                close(v)

    for value in _CACHE.values():
        close(value)
    _CACHE.clear()
    _AHEAD.clear()


#: Units of a synthetic regime whose episodes the serial backend runs together (the sealed
#: agents then answer a message per decision time for all of them; memory: an env copy
#: per agent and unit of the group).
UNIT_BATCH = 10


def run_report_cells(
    fn: Any, cells: list[Any], progress: bool = False, **backend: Any
) -> list[dict[str, Any]]:
    """Run a report's ``cells`` with ``fn`` (:func:`run_report_cell`, or a fleet's
    :func:`~diloco_gym.eval.fleet.fleet_cell`) on the backend (``backend``, ``jobs``,
    ``ray_address``: :func:`~diloco_gym.backends.run_cells`); their results in the cells'
    order. This process's sealed agents' workers end with the run."""
    from diloco_gym.backends import run_cells

    # On the serial backend the units of a synthetic regime run their episodes in groups,
    # so that the sealed agents answer all of a group's agents at a decision time in one
    # message (the results are each unit's own; a pool's workers take cells one by one).
    serial = backend.get("backend", "serial") == "serial"
    set_unit_batch(UNIT_BATCH if serial else 1)
    try:
        return run_cells(fn, cells, desc="report", progress=progress, **backend)
    finally:
        set_unit_batch(1)
        release_cached()


def run_report_cell(cell: ReportCell) -> dict[str, Any]:
    """Run one cell (module-level: workers import it by name).

    Returns:
        A unit cell: ``{"rows": [...], "timeline": dict | None}``, the unit's rows in agent
        order and, for the first unit of ``bursty`` or of a trace replay, the schedules the
        report draws on its timeline. A calibration cell: ``{"sim", "trace_sim", "u_cal"}``.
    """
    from diloco_gym.eval import calibration as cal

    config = cell.config
    calib = cached("calibration", config, None, lambda: cal.load_calibration(config.calibration))
    units, _load, measured_key, fitted = cached(
        "units",
        config,
        cell.regime,
        lambda: regime_plan(config, cell.regime, calib, dict(cell.env)),
        cell.env,
    )
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.sealed import seal_agents

    # Built (the sealed agents' worker started) at a process's first cell, so the worker
    # starts while a calibration cell runs.
    agents = cached(
        "agents",
        config,
        None,
        lambda: seal_agents(
            make_agents(config.agents), getattr(config, "in_process_agents", False)
        ),
    )
    if cell.unit is None:
        return _calibration_cell(config, measured_key, fitted, units)
    ran = _batched_episodes(config, cell, units)
    return _unit_cell(config, cell.regime, units, cell.unit, agents, ran)


#: Units of a synthetic regime whose episodes run together (:func:`set_unit_batch`): the
#: serial backend's report sets it, so that its sealed agents answer one message per
#: decision time for several seeds at once instead of one per seed. 1 (the default, and on
#: process pools and Ray, whose workers take cells one by one): each unit alone.
_UNIT_BATCH = 1
#: Episodes run ahead for the cells still to come: (report key, unit) -> (episode, results).
_AHEAD: dict[tuple[str, int], tuple[Any, list]] = {}


def set_unit_batch(n: int) -> None:
    """Run the episodes of up to ``n`` units of a synthetic regime together in this
    process's report cells (the serial backend). The results are those of each unit alone:
    every agent has a copy of its own per unit, each attached to one episode, and the
    copies of one worker are asked in decision order, all units at one decision time in
    one message. The units are independent seeds, so an agent's copy finds in its worker no
    observation of its own episode later than the decision it is asked about; a replayed
    trace's windows (each the next one's past) always run one at a time."""
    global _UNIT_BATCH
    _UNIT_BATCH = max(1, int(n))
    _AHEAD.clear()


def _batched_episodes(config, cell: ReportCell, units: list) -> tuple[Any, list] | None:
    """The episode of ``cell``'s unit and each agent's result on it, run together with the
    next units' (whose results wait here for their cells); None when units run alone."""
    if _UNIT_BATCH <= 1 or config.trace is not None or cell.unit is None:
        return None
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.rollout import env_copies, run_episodes
    from diloco_gym.eval.sealed import seal_agents

    key = json.dumps([asdict(config), cell.regime, cell.env], sort_keys=True, default=str)
    if (key, cell.unit) in _AHEAD:
        return _AHEAD.pop((key, cell.unit))

    def build() -> list[list] | None:  # one worker holds every copy
        flat = [a for _ in range(_UNIT_BATCH) for a in make_agents(config.agents)]
        if len({id(a) for a in flat}) < len(flat):  # an agent object given in Python
            return None  # has no copies: its units run one at a time
        sealed = seal_agents(flat, getattr(config, "in_process_agents", False))
        n = len(sealed) // _UNIT_BATCH
        return [sealed[k * n : (k + 1) * n] for k in range(_UNIT_BATCH)]

    copies = cached("agent-copies", config, None, build)
    if copies is None:
        return None
    batch = range(cell.unit, min(cell.unit + _UNIT_BATCH, len(units)))
    used: dict[int, int] = {}  # env -> copies of it taken so far (units may share an env)
    runs, episodes, envs = [], [], []
    for k, u in enumerate(batch):
        unit, agents = units[u], copies[k]
        at = used.get(id(unit.env), 0)
        mine = env_copies(unit.env, at + len(agents))[at:]
        used[id(unit.env)] = at + len(agents)
        episodes.append(unit.episode())
        envs += mine
        runs += [(e, a, unit.seed, episodes[-1]) for e, a in zip(mine, agents, strict=True)]
    results = run_episodes(runs)
    for e in envs:  # streamed: the envs hold no episode once the batch has run
        e.episode = None
    n = len(copies[0])
    for k, u in enumerate(batch):
        _AHEAD[(key, u)] = (episodes[k], results[k * n : (k + 1) * n])
    return _AHEAD.pop((key, cell.unit))


def _calibration_cell(config, measured_key: str, fitted, units: list) -> dict[str, Any]:
    from diloco_gym.eval import calibration as cal
    from diloco_gym.eval.units import trace_effect_sizes

    calib_seeds = range(config.seed0, config.seed0 + 8)
    # The verdict belongs to the sidecar on the load it was calibrated on: the measured
    # regime's own traces at its capacity-relative load (not the user's --rate-scale).
    # A live file records the load and the merge plan it was measured with: simulate the
    # fitted sidecar under those.
    sim, u_cal = cal.simulate_as_measured(measured_key, config.calibration, fitted, calib_seeds)
    trace_sim = (
        trace_effect_sizes(units[:8])
        if config.trace is not None
        else dict.fromkeys(cal.METRICS, np.nan)
    )
    return {"sim": sim, "trace_sim": trace_sim, "u_cal": u_cal}


def _unit_cell(
    config, regime: str, units: list, index: int, agents: list, ran: tuple | None = None
) -> dict[str, Any]:
    from diloco_gym.eval import protocol
    from diloco_gym.eval.rollout import env_copies, run_episodes

    unit = units[index]
    env, seed = unit.env, unit.seed
    p, sc = env.params, env.sidecar
    lc = getattr(config, "learner_calibration", None)  # priced with its control when given
    rows: list[dict] = []
    timeline = None
    counts = scorer = None
    # The matched-random control by (merges, table): its draws depend on (seed, merges)
    # and the completion table only, so agents with equal merges share one, scored once.
    controls: dict[tuple[int, int], protocol.Control] = {}
    if ran is not None:  # run with the next units' (set_unit_batch)
        (ep, results), envs = ran, []
    else:
        ep = unit.episode()  # built once, through the kernel: every agent runs on it
        envs = env_copies(env, len(agents))  # the agents step in lockstep, one env each
        results = run_episodes([(e, a, seed, ep) for e, a in zip(envs, agents, strict=True)])
    for agent, res in zip(agents, results, strict=True):
        m = int(res["merges"])
        if counts is None or counts.shape[0] <= m or counts.shape[1] != ep.n_decisions:
            counts = protocol.counts_for(ep.n_decisions, p, max(m, 40))
        # Agent, control and oracle by the same exact replay (one scorer per episode,
        # reused across agents). Draws depend on (episode, budget) only: the same report
        # for any agent order, and equal budgets share an envelope.
        if scorer is None or not scorer.matches(ep):
            scorer, controls = protocol.EpisodeScorer(ep, p, sc), {}
        key = (m, counts.m_max)
        if key not in controls:
            controls[key] = protocol.episode_control(scorer, m, config.draws, seed, counts)
        scored = protocol.score_episode(
            scorer,
            res["merge_decisions"],
            config.draws,
            np.random.default_rng([seed, m, 7]),
            counts,
            control=controls[key],
        )
        dur_min = ep.trace.duration_s / 60.0
        rows.append(
            {
                "regime": regime,
                "agent": agent.name,
                "deployable": res["deployable"],
                "seed": seed,
                "merges": m,
                "merges_per_hour": m * 60.0 / dur_min,
                **scored,
                "no_sync_violation_pct": res["no_sync_violation_pct"],
                "violation_pct": res["violation_pct"],
                "p95_ms": res["p95_ms"],
                "requests": res["requests"],
                "excess_requests": res["sync_excess_requests"],
                "return": res["return"],
                "duration_s": ep.trace.duration_s,
                **quality_columns(lc, res, controls[key], p.decision_seconds),
            }
        )
        rows[-1].update(unit.fields)
        if (regime == "bursty" or config.trace is not None) and index == 0:
            # The episode object stays valid after the env's next reset.
            if timeline is None:
                timeline = {
                    "seed": seed,
                    "schedules": {},
                    "episode": ep,
                    "params": p,
                    "sidecar": sc,
                }
            timeline["schedules"][agent.name] = res["merge_decisions"]
    for e in envs:  # streamed: a finished unit's envs hold no episode (the timeline its own)
        e.episode = None
    return {"rows": rows, "timeline": timeline}
