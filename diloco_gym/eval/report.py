"""``diloco-gym report``: the protocol over regimes x agents x seeds, written to a directory.

The run is here (:class:`ReportConfig`, :func:`run_protocol`, :func:`write_report`); the
documents are in :mod:`~diloco_gym.eval.report_render`, the figures in
:mod:`~diloco_gym.eval.report_figures` and the output directory's rules in
:mod:`~diloco_gym.eval.output_dir`; this module re-exports their public names.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diloco_gym.envs.params import EnvParams
from diloco_gym.eval import calibration as cal
from diloco_gym.eval import protocol
from diloco_gym.eval.output_dir import (
    MARKER,
    clean_leftovers,
    is_report_dir,
    prepare_out_dir,
    write_output_dir,
)
from diloco_gym.eval.replay_options import ReplayOptions
from diloco_gym.eval.report_figures import write_figures
from diloco_gym.eval.report_render import (
    PAPER,
    console_summary,
    render_markdown,
    sandbox_record,
    sealing_mode,
)
from diloco_gym.eval.summary import (
    apply_gate,
    holm,
    holm_family,
    scoring_summary,
    summarise,
)
from diloco_gym.io import json_default
from diloco_gym.sim.regimes import REGIMES

if TYPE_CHECKING:
    from diloco_gym.eval.fleet import FleetReportConfig

__all__ = [
    # the summary statistics live in diloco_gym.eval.summary; re-exported here
    "summarise",
    "apply_gate",
    "holm",
    "scoring_summary",
    "ReportConfig",
    "run_protocol",
    "write_report",
    # the output directory (diloco_gym.eval.output_dir), re-exported here
    "prepare_out_dir",
    "write_output_dir",
    "clean_leftovers",
    "is_report_dir",
    "MARKER",
    # the documents (diloco_gym.eval.report_render), re-exported here
    "render_markdown",
    "console_summary",
    "sealing_mode",
    "PAPER",
]


@dataclass(frozen=True, kw_only=True)
class ReportConfig(ReplayOptions):
    """What a report runs: the shared replay options (:class:`ReplayOptions`: regimes,
    seeds, draws, trace, load, ...) and the report's own.

    Attributes:
        regimes: regime names, by default every regime (with ``trace``: ignored; the
            report's regime is ``replay:<file stem>``).
        agents: agent names or model paths (default: every heuristic).
        stride_s: distance between the starts of a trace's windows (``None``:
            ``window_s``, disjoint windows, independent units). A shorter stride overlaps
            the windows; the report and results then say the units are not independent.
        saturation_pct: no-merge violation % above which a replay gets
            ``no claim (saturated)`` (:data:`diloco_gym.eval.protocol.SATURATION_PCT`).
    """

    agents: list[str] = field(default_factory=list)
    stride_s: float | None = None
    saturation_pct: float = protocol.SATURATION_PCT

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.agents:
            from diloco_gym.agents.registry import HEURISTICS

            object.__setattr__(self, "agents", list(HEURISTICS))
        v = self.stride_s
        if v is not None and not (np.isfinite(v) and v > 0):
            raise ValueError(f"stride_s must be a positive number of seconds, got {v}")
        v = self.saturation_pct
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
            # NaN included: it compares false with every threshold and silently turned
            # the saturation gate off
            raise ValueError(f"saturation_pct must be a percentage in [0, 100], got {v!r}")

    def require_choice(self) -> None:
        """Refuse trace windows too short for H_max to be reached (``ValueError`` naming the
        minimum): in such a window no merge is ever required, every agent that minimises
        the excess never merges, matched random then draws the same empty schedule, and the
        comparison says nothing. ``run`` (one agent's table) allows them."""
        if self.trace is None:
            return
        p = EnvParams()
        sidecar = REGIMES[self.trace_sidecar].sidecar
        margin_s = p.merge_steps * p.step_seconds + sidecar.tail_s
        min_s = margin_s + (p.h_max + 1) * p.decision_seconds
        if self.window_s < min_s:
            raise ValueError(
                f"window_s (--window-s) {self.window_s:g} s is shorter than an episode that "
                f"reaches H_max ({p.h_max_steps} steps, {p.h_max * p.decision_seconds:g} s, "
                f"plus a {margin_s:.1f} s margin): no merge is ever required, so no agent has "
                f"a choice to be judged on; use a window of at least {min_s:.1f} s"
            )

    @property
    def overlapping(self) -> bool:
        """Trace windows overlap (a stride shorter than the window): not independent."""
        return self.stride_s is not None and self.stride_s < self.window_s - 1e-9


#: One regime of a report's plan: (regime, calibration key, fitted sidecar, units).
_PlanEntry = tuple[str, str, Any, int]


def run_protocol(
    config: ReportConfig | FleetReportConfig,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the protocol; returns ``{"rows", "summary", "calibration", "config", ...}``.

    ``config``: a single host's report (:class:`ReportConfig`: regimes or a replayed
    trace) or a fleet's (:class:`~diloco_gym.eval.fleet.FleetReportConfig`: the fleet file;
    the result then also has ``"fleet"``, ``"calibration_verdict"``, ``"verdict_seeds"``
    and ``"independent_units"``, :func:`~diloco_gym.eval.fleet.fleet_result`). Both run
    the same way.

    The statistical unit is the episode: a seed of a synthetic regime or fleet, or one
    window of a replayed trace (windows tile the trace, disjoint unless
    ``config.stride_s`` is shorter than the window); on a fleet with trace sites or link
    traces, the first seed of each tile of the traces. ``rows`` records each unit.

    The work is split into cells (:mod:`diloco_gym.eval.cells`: one per unit with all the
    agents, and one calibration cell per regime or fleet) run on ``backend`` (``serial``,
    ``processes`` or ``ray``; see :func:`diloco_gym.scale.run_cells`) with ``jobs``
    workers; the results are put back in the serial order, so everything but
    ``elapsed_s`` is the same for every backend and number of workers.
    """
    from diloco_gym.eval import fleet
    from diloco_gym.eval.cells import run_report_cells

    started = time.perf_counter()
    backend_kw = {"backend": backend, "jobs": jobs, "ray_address": ray_address}
    if isinstance(config, fleet.FleetReportConfig):
        fleet.agent_names(config)  # the fleet and its agents checked before any cell runs
        cells = fleet.fleet_cells(config)
        done = run_report_cells(fleet.fleet_cell, cells, progress, **backend_kw)
        result = fleet.fleet_result(config, done)
    else:
        result = _single_host(config, progress, backend_kw)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def _single_host(config: ReportConfig, progress: bool, backend: dict[str, Any]) -> dict[str, Any]:
    """A single host's report (:func:`run_protocol`), but its ``elapsed_s``."""
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.cells import ReportCell, cell_config, run_report_cell, run_report_cells

    make_agents(config.agents)  # unique names; the same agent twice is refused
    calib = cal.load_calibration(config.calibration)
    plan, loads = _plan(config, calib)
    shipped = cell_config(config)
    # Calibration cells first: each is one of the longest, and starting them early keeps
    # the workers busy to the end.
    cells = [ReportCell(shipped, regime, None) for regime, *_ in plan]
    cells += [ReportCell(shipped, regime, i) for regime, *_, n in plan for i in range(n)]
    done = run_report_cells(run_report_cell, cells, progress, **backend)
    by_cell = {(c.regime, c.unit): r for c, r in zip(cells, done, strict=True)}
    rows, calib_rows, timelines = _collect(calib, plan, loads, by_cell)
    df = pd.DataFrame(rows)
    summary = summarise(
        df,
        {r["regime"]: r["verdict"] for r in calib_rows},
        config.alpha,
        config.saturation_pct,
        across_settings=config.holm_across_settings,
    )
    return {
        "rows": df,
        "summary": summary,
        "calibration": pd.DataFrame(calib_rows),
        "config": asdict(config),
        "loads": loads,
        "calibration_source": calib.source,
        "calibration_complete": calib.complete,
        "timelines": timelines,
        "scoring": scoring_summary(df),
        "agent_sealing": sealing_mode(config.in_process_agents),
        "agent_sandbox": sandbox_record(config.in_process_agents),
    }


def _plan(config: ReportConfig, calib: Any) -> tuple[list[_PlanEntry], dict[str, dict]]:
    """The report's regimes (or its trace replay) with their units, and each one's load."""
    from diloco_gym.eval.cells import regime_plan

    regimes = (
        [f"replay:{Path(config.trace).stem}"] if config.trace is not None else list(config.regimes)
    )
    plan: list[_PlanEntry] = []
    loads: dict[str, dict] = {}
    for regime in regimes:
        units, load, measured_key, fitted = regime_plan(config, regime, calib)
        plan.append((regime, measured_key, fitted, len(units)))
        loads[regime] = load
    return plan, loads


def _collect(
    calib: Any,
    plan: list[_PlanEntry],
    loads: dict[str, dict],
    by_cell: dict[tuple[str, int | None], dict],
) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """The cells' results in the serial order: the rows, the calibration rows and the
    first timeline of each regime."""
    rows: list[dict] = []
    calib_rows: list[dict] = []
    timelines: dict[str, Any] = {}
    for regime, measured_key, fitted, n_units in plan:
        got = by_cell[(regime, None)]
        calib_rows.append(_calibration_row(calib, regime, measured_key, fitted, got, loads[regime]))
        for i in range(n_units):
            got = by_cell[(regime, i)]
            rows.extend(got["rows"])
            if got["timeline"] is not None:
                timelines.setdefault(regime, got["timeline"])
    return rows, calib_rows, timelines


def _calibration_row(
    calib: Any, regime: str, measured_key: str, fitted: Any, got: dict, load: dict
) -> dict[str, Any]:
    """One regime's effect-size transfer row: the real measurements beside the simulated
    ones (``got``: the regime's calibration cell), its load and the transfer verdict."""
    measured = calib.measured(measured_key)
    sim, trace_sim, u_cal = got["sim"], got["trace_sim"], got["u_cal"]
    verdict = cal.transfer_verdict(sim, measured, interval=cal.measured_intervals(measured))
    on = calib.measured_on(measured_key)
    own = on in calib.user_regimes or calib.path.startswith("diloco_gym/")
    return {
        "regime": regime,
        "measured_on": on + ("" if own else " (reference)"),
        "sidecar": ("fitted (calibration file)" if fitted else f"{measured_key} default"),
        **{f"real_{k}": measured.get(k) for k in cal.METRICS},
        **{f"sim_{k}": v for k, v in sim.items()},
        **{f"trace_sim_{k}": trace_sim.get(k) for k in cal.METRICS},
        "capacity_rps": load["capacity_rps"],
        "utilization": load["utilization"],
        "rate_scale": load["rate_scale"],
        "idle_violation_pct": load["idle_violation_pct"],
        "calibration_utilization": (
            u_cal
            if u_cal is not None
            else REGIMES[measured_key].with_load(fitted).utilization(fitted)
        ),
        "verdict": verdict,
    }


def write_report(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write report.md, results.csv, report.json and figures to ``out`` atomically
    (:func:`write_output_dir`); a fleet report's (a result with ``"fleet"``) as
    :func:`~diloco_gym.eval.fleet_render.write_fleet_report` writes it.

    Raises:
        FileExistsError: see :func:`prepare_out_dir`.
    """
    if "fleet" in result:
        from diloco_gym.eval.fleet_render import write_fleet_report

        return write_fleet_report(result, out, force=force, command=command)

    def fill(tmp: Path) -> None:
        result["rows"].to_csv(tmp / "results.csv", index=False)
        figures = write_figures(result, tmp)
        payload = {
            "config": result["config"],
            "command": command,
            "calibration_source": result["calibration_source"],
            "calibration_complete": bool(result.get("calibration_complete", True)),
            "elapsed_s": result["elapsed_s"],
            "calibration": result["calibration"].to_dict(orient="records"),
            "summary": result["summary"].to_dict(orient="records"),
            "paper": PAPER,
            "figures": figures,
            "loads": result.get("loads", {}),
            "scoring": result.get("scoring") or scoring_summary(result["rows"]),
            "agent_sealing": result.get("agent_sealing"),
            "agent_sandbox": result.get("agent_sandbox"),
            "holm_family": holm_family(result["config"]),
        }
        (tmp / "report.json").write_text(json.dumps(payload, indent=2, default=json_default))
        (tmp / "report.md").write_text(render_markdown(result, figures, command))

    return write_output_dir(out, force, fill)
