"""Fleet points of ``diloco-gym sweep``: a sweep file that sets ``fleet = "FILE"`` (at the
top level, or as a grid axis ``fleet = ["a.toml", "b.toml"]``; paths relative to the sweep
file) runs the fleet protocol at each point instead of the single-host report.

A fleet point is the fleet report of ``report --fleet`` (:mod:`diloco_gym.eval.fleet`):
every agent on the point's fleet episodes (deployable agents sealed in their own worker
process), exact matched random at the agent's number of syncs, the oracle at the same
number, the paired test, Holm over the point's agents and the fleet's calibration verdict.
As a single-host point, it runs as the report's cells (:func:`~diloco_gym.eval.fleet.fleet_cells`,
run by :func:`~diloco_gym.eval.fleet.fleet_cell`): one per episode (all the agents on it)
and one for the fleet's calibration,
each keyed by a fingerprint of what it reads and the fleet file's bytes, so a rerun skips
what is stored, a stopped sweep resumes episode by episode, the episodes of a point run in
parallel on a pool, and an edited fleet file runs again. The point's summary is the
report's (:func:`~diloco_gym.eval.fleet.report_summary`) over the episodes stored.

Keys of a fleet sweep: ``fleet``, ``agents``, ``seeds``, ``seed0``, ``draws``, ``alpha``,
``calibration`` (the file the fleet's calibration verdict is judged against, as ``report
--fleet --calibration``), ``in_process_agents``, ``merge_budget`` (fragment syncs per
episode) and ``env.NAME`` (an ``EnvParams`` field, or a ``FleetParams`` field such as
``env.bits``, ``env.fragments``, ``env.grace_s`` or ``env.quorum``, overriding the fleet
file). A fleet with per-site timing (``timing = "rounds"``) is scored as ``report --fleet``
scores it; ``merge_budget`` then counts rounds and an agent named ``X+own`` runs ``X`` with
the own-forecast site rule. The single-host keys
(:data:`NOT_WITH_FLEET`) are refused: a fleet's sites set their own traffic, traces,
windows and sidecars in the fleet file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from diloco_gym.eval.fleet import FleetReportConfig

__all__ = [
    "FLEET_KEYS",
    "NOT_WITH_FLEET",
    "fleet_env_field",
    "fleet_point_config",
    "fleet_point_cells",
    "run_fleet_cell",
    "fleet_point_summary",
    "MARKDOWN_COLUMNS",
]

#: The settings a fleet point reads (``env.NAME`` besides).
FLEET_KEYS = (
    "fleet",
    "agents",
    "seeds",
    "seed0",
    "draws",
    "alpha",
    "calibration",
    "in_process_agents",
    "merge_budget",
)
#: Single-host settings that have no meaning for a fleet (its file sets them per site).
NOT_WITH_FLEET = (
    "regime",
    "trace",
    "trace_format",
    "window_s",
    "stride_s",
    "sidecar",
    "rate_scale",
    "target_utilization",
    "saturation_pct",
)
#: The summary's columns in summary.md for a fleet sweep (after the point and its axes).
MARKDOWN_COLUMNS = [
    "agent",
    "units",
    "nonzero_units",
    "syncs_per_hour",
    "sync_excess_pct",
    "matched_random_mean",
    "oracle_same_budget_pct",
    "diff_pp",
    "worst_site_sync_excess_pct",
    "p_holm",
    "p_holm_all_points",
    "verdict",
]


def fleet_env_field(name: str) -> bool:
    """Whether ``name`` may follow ``env.`` in a fleet sweep: an ``EnvParams`` field or a
    ``FleetParams`` field other than ``sites`` (the sites are the fleet file's)."""
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.sim.fleet import FleetParams

    valid = {f.name for f in fields(EnvParams)} | {f.name for f in fields(FleetParams)}
    return name in valid - {"sites"}


def fleet_point_config(
    settings: dict[str, Any], base: Path, env: dict[str, Any]
) -> FleetReportConfig:
    """The fleet report of one point: ``settings`` (its fleet keys; ``fleet`` and
    ``calibration`` relative to ``base``), ``env`` (``merge_budget`` and the ``env.NAME``
    overrides). The fleet file is read and the env built once here, so that a bad file or
    value fails before any cell runs.

    Raises:
        FileNotFoundError: the fleet file does not exist.
        FleetConfigError: a malformed fleet file (a ``ValueError``).
        TypeError, ValueError: a bad setting or env value.
    """
    from diloco_gym.agents.fleet_rounds import check_site_rules
    from diloco_gym.agents.registry import HEURISTICS
    from diloco_gym.eval.fleet import FleetReportConfig, fleet_cell_config, protocol_env

    kwargs = {k: v for k, v in settings.items() if k in FLEET_KEYS and k != "merge_budget"}
    cal = kwargs.get("calibration")
    kwargs["calibration"] = None if cal in (None, "reference", "none") else str(cal)
    agents = kwargs.get("agents", list(HEURISTICS))  # report --fleet's default
    kwargs["agents"] = [agents] if isinstance(agents, str) else [str(a) for a in agents]
    kwargs["fleet"] = str(kwargs["fleet"])
    # a model run, a file, the fleet and the calibration absolute against the sweep file
    config = fleet_cell_config(FleetReportConfig(**kwargs, env=dict(env)), base)
    if not Path(config.fleet).is_file():
        raise FileNotFoundError(f"fleet file {config.fleet} does not exist")
    rounds = protocol_env(config, "a fleet sweep point").fleet.per_site_timing
    check_site_rules(config.agents, rounds)  # '+own' needs timing = 'rounds'
    return config


def _fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def fleet_point_cells(config: FleetReportConfig) -> tuple[str, list[str], dict[str, Any]]:
    """A fleet point's cells: ``(calibration key, episode keys, cells by key)``. An
    episode's key fingerprints what its rows read (the fleet file's bytes, the agents, the
    draws, the env overrides, how the agents run, its seed); the calibration's the fleet
    file, the env overrides and the calibration file. Points that share an episode share
    its cell."""
    from diloco_gym.eval.cells import ReportCell
    from diloco_gym.eval.fleet import FLEET_SETTING

    digest = hashlib.sha256(Path(config.fleet).read_bytes()).hexdigest()
    cfg = asdict(config)
    cal_key = "fleet-cal/" + _fingerprint(
        "fleet-calibration", cfg["fleet"], digest, cfg["env"], cfg["calibration"]
    )
    unit = {k: cfg[k] for k in ("fleet", "agents", "draws", "env", "in_process_agents")}
    cells: dict[str, Any] = {cal_key: ReportCell(config, FLEET_SETTING, None)}
    keys = []
    for i in range(config.seeds):
        seed = config.seed0 + i
        key = "unit/fleet-" + _fingerprint("fleet-episode", unit, digest, seed)
        cells[key] = ReportCell(config, FLEET_SETTING, i)
        keys.append(key)
    return cal_key, keys, cells


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"cannot store {type(o).__name__} in a sweep record")


def run_fleet_cell(cell: Any) -> dict[str, Any]:
    """One cell of a fleet point (:func:`~diloco_gym.eval.fleet.fleet_cell`, the fleet
    report's), as JSON would store it (so a fresh run and a rerun from ``cells.jsonl``
    write the same bytes): an episode's rows (``{"rows": [...]}``) or the fleet's
    calibration (``{"verdict", "rows"}``)."""
    from diloco_gym.eval.fleet import fleet_cell

    return json.loads(json.dumps(fleet_cell(cell), default=_plain))


def fleet_point_summary(
    config: FleetReportConfig, df: pd.DataFrame, calibration: dict[str, Any]
) -> pd.DataFrame:
    """A fleet point's summary from its stored episodes' rows ``df`` and its stored
    calibration (``{"verdict", "rows"}``): the fleet report's
    (:func:`~diloco_gym.eval.fleet.report_summary`) over the episodes stored, their
    independent ones its units, with the fleet's calibration verdict and how the agents
    ran."""
    from diloco_gym.eval.fleet import protocol_env, report_summary, verdict_seeds_of
    from diloco_gym.eval.sealed import IN_PROCESS, SEALED

    env = protocol_env(config, "a fleet sweep point")
    seeds = sorted(set(df["seed"].tolist()))
    period = env.setup.unit_period(env.build_episode(config.seed0).n_decisions)
    units = verdict_seeds_of(seeds, period)
    verdict = calibration["verdict"]
    names = list(dict.fromkeys(df["agent"].tolist()))  # the agents, in the rows' order
    summary = report_summary(env, df, names, units, verdict, config.alpha)
    summary["calibration_verdict"] = verdict
    summary["agent_sealing"] = IN_PROCESS if config.in_process_agents else SEALED
    return summary
