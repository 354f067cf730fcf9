"""Fleet points of ``diloco-gym sweep``: a sweep file that sets ``fleet = "FILE"`` (at the
top level, or as a grid axis ``fleet = ["a.toml", "b.toml"]``; paths relative to the sweep
file) runs the fleet protocol at each point instead of the single-host report.

A fleet point is :func:`~diloco_gym.eval.fleet.run_fleet_report`, the code of ``report
--fleet``: every agent on the point's fleet episodes (deployable agents sealed in their own
worker process), exact matched random at the agent's number of syncs, the oracle at the same
number, the paired test, Holm over the point's deployable agents and the fleet's calibration
verdict. One point is one cell (the report's statistics need all its episodes), keyed by a
fingerprint of its configuration and the fleet file's bytes, so a rerun skips it and an
edited fleet file runs again.

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
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from diloco_gym.eval.fleet import FleetReportConfig

__all__ = [
    "FLEET_KEYS",
    "NOT_WITH_FLEET",
    "FleetCell",
    "fleet_env_field",
    "fleet_point_config",
    "fleet_cell_key",
    "run_fleet_cell",
    "fleet_point_tables",
    "fleet_point_outputs",
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


@dataclass(frozen=True)
class FleetCell:
    """One fleet point's work: the fleet report of ``config`` (paths absolute)."""

    config: FleetReportConfig


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
    from diloco_gym.eval.fleet import FleetReportConfig, protocol_env

    def resolve(value: Any) -> str:
        p = Path(str(value)).expanduser()
        return str((p if p.is_absolute() else base / p).resolve())

    kwargs = {k: v for k, v in settings.items() if k in FLEET_KEYS and k != "merge_budget"}
    kwargs["fleet"] = resolve(kwargs["fleet"])
    if not Path(kwargs["fleet"]).is_file():
        raise FileNotFoundError(f"fleet file {kwargs['fleet']} does not exist")
    cal = kwargs.get("calibration")
    kwargs["calibration"] = None if cal in (None, "reference", "none") else resolve(cal)
    agents = kwargs.get("agents", list(HEURISTICS))  # report --fleet's default
    agents = [agents] if isinstance(agents, str) else list(agents)
    kwargs["agents"] = [_shipped(str(a), base) for a in agents]  # a model run, a file
    config = FleetReportConfig(**kwargs, env=dict(env))
    rounds = protocol_env(config, "a fleet sweep point").fleet.per_site_timing
    check_site_rules(config.agents, rounds)  # '+own' needs timing = 'rounds'
    return config


def _shipped(spec: str, base: Path) -> str:
    """An agent of a fleet point as a worker reads it (a model run or an agent file made
    absolute against ``base``), its ``+own`` site rule (a rounds fleet's) kept as the
    suffix."""
    from diloco_gym.agents.fleet_rounds import OWN_SUFFIX, split_rule
    from diloco_gym.agents.registry import shipped_spec

    name, rule = split_rule(spec)
    return shipped_spec(name, base) + (OWN_SUFFIX if rule == "own-forecast" else "")


def fleet_cell_key(config: FleetReportConfig) -> str:
    """The cell's fingerprint: its configuration and the fleet file's bytes."""
    digest = hashlib.sha256(Path(config.fleet).read_bytes()).hexdigest()
    text = json.dumps(["fleet-report", asdict(config), digest], sort_keys=True, default=str)
    return "fleet/" + hashlib.sha256(text.encode()).hexdigest()[:20]


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"cannot store {type(o).__name__} in a sweep record")


def run_fleet_cell(cell: FleetCell) -> dict[str, Any]:
    """Run one fleet point; its record as JSON would store it (so a fresh run and a rerun
    from ``cells.jsonl`` write the same bytes): per-episode rows, the per-agent summary,
    the calibration verdict and the independent units. The run's time is left out."""
    from diloco_gym.eval.fleet import run_fleet_report

    res = run_fleet_report(cell.config)
    record = {
        "rows": res["rows"].to_dict(orient="records"),
        "summary": res["summary"].to_dict(orient="records"),
        "calibration_verdict": res["calibration_verdict"],
        "independent_units": res["independent_units"],
        "agent_sealing": res["agent_sealing"],
    }
    return json.loads(json.dumps(record, default=_plain))


def fleet_point_tables(
    lead: dict[str, Any], record: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A stored fleet point's rows and summary, each led by the point's ``lead`` columns
    (sweep, point, ``grid.AXIS``); the summary also carries the fleet's calibration verdict
    and how the agents ran (sealed or in process)."""
    import pandas as pd

    rows = pd.DataFrame(record["rows"])
    summary = pd.DataFrame(record["summary"])
    summary["calibration_verdict"] = record["calibration_verdict"]
    summary["agent_sealing"] = record["agent_sealing"]
    return (
        pd.concat([pd.DataFrame([lead] * len(rows)), rows], axis=1),
        pd.concat([pd.DataFrame([lead] * len(summary)), summary], axis=1),
    )


def fleet_point_outputs(
    rec: dict[str, Any] | None,
    lead: dict[str, Any],
    where: str,
    errors: list[dict],
    notes: list[str],
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """A fleet point's rows and summary from its one stored cell ``rec``
    (:func:`fleet_point_tables`); ``(None, None)`` with its error appended to ``errors``
    when it failed, or a note that it has not run yet (``where`` names the point)."""
    if rec is None:
        notes.append(f"{where}: its fleet report not run yet")
        return None, None
    if not rec["ok"]:
        errors.append({**lead, "cell": "fleet report", "error": rec["error"]})
        return None, None
    return fleet_point_tables(lead, rec["result"])
