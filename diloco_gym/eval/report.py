"""``diloco-gym report``: the protocol over regimes x agents x seeds, written to a directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diloco_gym.envs import core
from diloco_gym.eval import calibration as cal
from diloco_gym.eval import protocol
from diloco_gym.eval.outlock import (
    lock_out_dir,
    out_target,
    release_out_lock,
    remove_stale_lock,
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
from diloco_gym.text import fmt as _fmt
from diloco_gym.text import fmt_p as _fmt_p

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    # the summary statistics live in diloco_gym.eval.summary; re-exported here
    "summarise",
    "apply_gate",
    "holm",
    "scoring_summary",
    "ReportConfig",
    "run_protocol",
    "write_report",
    "prepare_out_dir",
    "write_output_dir",
    "clean_leftovers",
    "is_report_dir",
    "console_summary",
    "MARKER",
    "PAPER",
]

#: The paper's / reference's sync-excess % per regime and policy (docs/paper.md).
PAPER: dict[str, dict[str, float]] = {
    "sync-heavy": {
        "fixed-256": 19.2,
        "fixed-512": 11.0,
        "pressure-gate": 13.7,
        "wa-diloco": 6.46,
        "matched random (WA budget)": 6.38,
    },
    "bursty": {
        "fixed-256": 19.0,
        "fixed-512": 10.9,
        "pressure-gate": 12.7,
        "wa-diloco": 6.92,
        "matched random (WA budget)": 6.26,
        "offline-oracle": 4.45,
        "online-forecast": 5.09,
        "matched random (online budget)": 6.54,
    },
}


@dataclass
class ReportConfig:
    """What a report runs.

    Attributes:
        regimes: regime names (with ``trace``: ignored; the report's regime is
            ``replay:<file stem>``).
        agents: agent names or model paths.
        seeds: episodes per synthetic regime (seeds ``seed0 .. seed0 + seeds - 1``); with
            ``trace`` the episodes are the trace's windows instead and ``seeds`` is unused.
        seed0: first episode seed (with ``trace``: window ``i`` uses seed ``seed0 + i`` for
            the pressure series added to it).
        draws: matched-random draws per episode (K).
        calibration: calibration file (``None``: the shipped reference measurements).
        trace / trace_format: replay a trace file instead of the synthetic regimes.
        window_s: length of each replayed window of ``trace`` (one episode each).
        stride_s: distance between window starts (``None``: ``window_s``, disjoint windows,
            independent units). A shorter stride overlaps the windows; the report and
            results then say the units are not independent.
        sidecar: with ``trace``: the regime whose sidecar (and calibration) the replay uses;
            ``calibration`` replaces it with the file's fitted sidecar when the file measured
            that regime.
        rate_scale: multiply the offered load (a synthetic regime's rates; a trace is
            replayed this many times faster, every request kept).
        target_utilization: instead of ``rate_scale``: the mean offered work over the
            sidecar's capacity to replay at (see :mod:`diloco_gym.sim.regimes`).
        alpha: significance level of the gate.
        saturation_pct: no-merge violation % above which a replay gets
            ``no claim (saturated)`` (:data:`diloco_gym.eval.protocol.SATURATION_PCT`).
        in_process_agents: run deployable agents in the evaluating process (the opt-out
            ``--in-process-agents``); by default they run sealed in a worker process
            (:mod:`diloco_gym.eval.sealed`).
    """

    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    agents: list[str] = field(default_factory=list)
    seeds: int = 20
    seed0: int = 0
    draws: int = 1000
    calibration: str | None = None
    trace: str | None = None
    trace_format: str = "auto"
    window_s: float = 600.0
    stride_s: float | None = None
    sidecar: str | None = None
    rate_scale: float | None = None
    target_utilization: float | None = None
    alpha: float = protocol.ALPHA
    saturation_pct: float = protocol.SATURATION_PCT
    in_process_agents: bool = False
    #: Holm-correct across every regime (setting) of the report instead of within each
    #: (``--holm-across-settings``): the verdicts then hold for the whole comparison.
    holm_across_settings: bool = False
    #: learner calibration file: adds the model-quality price (predicted validation loss of
    #: each schedule, and its excess over fixed H with as many merges) next to sync-excess.
    learner_calibration: str | None = None

    def __post_init__(self) -> None:  # noqa: C901 - one check per option, in sequence
        if self.learner_calibration is not None:
            from diloco_gym.sim.learner_calibration import load_learner_calibration

            load_learner_calibration(self.learner_calibration)  # a bad file fails here
        if not self.agents:
            from diloco_gym.agents.registry import HEURISTICS

            self.agents = list(HEURISTICS)
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 for a paired test, got {self.seeds}")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        from diloco_gym.eval.seed_ranges import check_test_seeds

        check_test_seeds(
            self.seed0, self.seeds if self.trace is None else 1, "test seeds (--seed0, --seeds)"
        )
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.rate_scale is not None and self.target_utilization is not None:
            raise ValueError(
                "give rate_scale (--rate-scale) or target_utilization "
                "(--target-utilization), not both"
            )
        for name in ("rate_scale", "target_utilization"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v}")
        for name in ("window_s", "stride_s"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {v}")
        if self.trace is None:
            unknown = [r for r in self.regimes if r not in REGIMES]
            if unknown:
                raise ValueError(
                    f"unknown regime(s) {unknown}; valid regimes: {', '.join(REGIMES)}"
                )
            if self.sidecar is not None:
                raise ValueError(
                    "sidecar (--sidecar) chooses the sidecar of a --trace "
                    "replay; synthetic regimes use their own (or --calibration)"
                )
        elif self.sidecar is not None and self.sidecar not in REGIMES:
            raise ValueError(
                f"unknown sidecar regime {self.sidecar!r}; valid regimes: {', '.join(REGIMES)}"
            )
        else:
            min_s = core.min_episode_seconds(core.EnvParams(), REGIMES[self.trace_sidecar].sidecar)
            if self.window_s < min_s:
                raise ValueError(
                    f"window_s (--window-s) {self.window_s:g} s is too short: an "
                    f"episode needs at least {min_s:.1f} s"
                )

    def require_choice(self) -> None:
        """Refuse trace windows too short for H_max to be reached (``ValueError`` naming the
        minimum): in such a window no merge is ever required, every agent that minimises
        the excess never merges, matched random then draws the same empty schedule, and the
        comparison says nothing. ``run`` (one agent's table) allows them."""
        if self.trace is None:
            return
        p = core.EnvParams()
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
    def trace_sidecar(self) -> str:
        """The regime whose sidecar a trace replay uses (default sync-heavy)."""
        return self.sidecar or "sync-heavy"

    @property
    def overlapping(self) -> bool:
        """Trace windows overlap (a stride shorter than the window): not independent."""
        return self.stride_s is not None and self.stride_s < self.window_s - 1e-9


def run_protocol(
    config: ReportConfig,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the protocol; returns ``{"rows", "summary", "calibration", "config", ...}``.

    The statistical unit is the episode: a seed of a synthetic regime, or one window of a
    replayed trace (windows tile the trace, disjoint unless ``config.stride_s`` is shorter
    than the window). ``rows`` records each unit's kind, window and independence.

    The work is split into cells (:mod:`diloco_gym.eval.cells`: one per unit with all the
    agents, and one calibration cell per regime) run on ``backend`` (``serial``,
    ``processes`` or ``ray``; see :func:`diloco_gym.scale.run_cells`) with ``jobs`` workers;
    the results are put back in the serial order, so everything but ``elapsed_s`` is the
    same for every backend and number of workers.
    """
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.backends import run_cells
    from diloco_gym.eval.cells import (
        ReportCell,
        cell_config,
        regime_plan,
        release_cached,
        run_report_cell,
    )

    make_agents(config.agents)  # unique names; the same agent twice is refused
    calib = cal.load_calibration(config.calibration)
    regimes = (
        [f"replay:{Path(config.trace).stem}"] if config.trace is not None else list(config.regimes)
    )
    rows: list[dict] = []
    calib_rows: list[dict] = []
    timelines: dict[str, Any] = {}
    loads: dict[str, dict] = {}
    started = time.perf_counter()
    plan = []
    for regime in regimes:
        units, load, measured_key, fitted = regime_plan(config, regime, calib)
        plan.append((regime, measured_key, fitted, len(units)))
        loads[regime] = load
    shipped = cell_config(config)
    # Calibration cells first: each is one of the longest, and starting them early keeps
    # the workers busy to the end.
    cells = [ReportCell(shipped, regime, None) for regime in regimes]
    cells += [ReportCell(shipped, regime, i) for regime, *_, n in plan for i in range(n)]
    try:
        done = run_cells(
            run_report_cell,
            cells,
            backend=backend,
            jobs=jobs,
            ray_address=ray_address,
            progress=progress,
            desc="report",
        )
    finally:
        release_cached()  # this process's sealed agents' workers end with the run
    by_cell = {(c.regime, c.unit): r for c, r in zip(cells, done, strict=True)}
    for regime, measured_key, fitted, n_units in plan:
        got = by_cell[(regime, None)]
        calib_rows.append(_calibration_row(calib, regime, measured_key, fitted, got, loads[regime]))
        for i in range(n_units):
            got = by_cell[(regime, i)]
            rows.extend(got["rows"])
            if got["timeline"] is not None:
                timelines.setdefault(regime, got["timeline"])
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
        "elapsed_s": time.perf_counter() - started,
    }


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


def sealing_mode(in_process: bool) -> str:
    """How deployable agents ran (report.json ``agent_sealing``, the report's header)."""
    from diloco_gym.eval.sealed import IN_PROCESS, SEALED

    return IN_PROCESS if in_process else SEALED


def _regime_scoring(result: dict[str, Any], regime: str) -> str:
    """One sentence on how a regime's rows were scored."""
    rows = result["rows"]
    sc = scoring_summary(rows[rows["regime"] == regime])
    n = sc["agent_episodes"]
    oracle = (
        "exact optimum in every episode"
        if sc["oracle_upper_bound"] == 0
        else f"upper bound in {sc['oracle_upper_bound']} of {n} agent-episodes"
    )
    return (
        f"Scoring: exact replay, proven equal to additive in {sc['proven_additive']} of "
        f"{n} agent-episodes; largest additive-exact gap "
        f"{sc['largest_additive_exact_gap_pp']:.3g} pp; oracle: {oracle}."
    )


# ----------------------------------------------------------------------------- output
#: The file every report directory holds; ``--force`` replaces only directories that have it.
MARKER = ".diloco-gym-report"
_MARKER_TEXT = "diloco-gym report directory: `diloco-gym report --force` may replace it.\n"
#: The marker's line before the names of the files the report wrote (one a line).
_MARKER_FILES = "files written:\n"
#: The files a report or a frontier writes (a directory of only these, from a version that
#: wrote no marker or a marker without the file list, is also recognised as one).
_REPORT_FILE = re.compile(
    r"^(report\.md|report\.json|results\.csv|(fig|timeline|frontier)_.+\.png"
    r"|frontier\.(md|csv|json)|curves\.csv)$"
)
#: Sibling directories of a report being written (``partial``) or replaced (``old``).
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)$")


def is_report_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a diloco-gym report or frontier and nothing
    else: it has the :data:`MARKER` file and only the files the marker lists (or, for a
    marker without the list, only files a report writes), or, with no marker, it holds
    only files a report writes."""
    return _foreign_entries(Path(path)) == []


def _written_files(path: Path) -> set[str] | None:
    """The names the marker of ``path`` lists (``None``: no marker or no list)."""
    try:
        text = (path / MARKER).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith(_MARKER_TEXT[:24]) or _MARKER_FILES not in text:
        return None
    return {line for line in text.split(_MARKER_FILES, 1)[1].splitlines() if line}


def _foreign_entries(path: Path) -> list[str] | None:
    """The entries of ``path`` that no report wrote (``[]``: it is a report directory and
    nothing else), or ``None`` when ``path`` is no report directory at all."""
    if not path.is_dir():
        return None
    entries = sorted(path.iterdir())
    marked = (path / MARKER).is_file()
    listed = _written_files(path) if marked else None

    def foreign(p: Path) -> bool:
        if p.name == MARKER and marked:
            return False
        if p.is_symlink() or not p.is_file():
            return True  # a report writes plain files only
        return p.name not in listed if listed is not None else not _REPORT_FILE.match(p.name)

    out = [
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries if foreign(p)
    ]
    if not marked:
        names = {p.name for p in entries}
        is_old_report = {"report.md", "results.csv"} <= names or "frontier.md" in names
        if out or not is_old_report:
            return None
    return out


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers (an earlier call in this process) are stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_leftovers(out: str | Path) -> list[Path]:
    """Remove what an interrupted or killed ``write_report`` to ``out`` left beside it.

    These are the hidden siblings ``.NAME.partial-PID`` (a report being written) and
    ``.NAME.old-PID`` (the previous report being replaced) of a process that is no longer
    running, and a lock file ``.NAME.lock`` nobody holds; only directories that are
    empty or carry the report marker are removed.

    Returns:
        The directories removed.
    """
    out = Path(os.path.abspath(out))
    remove_stale_lock(out)  # the lock file of a killed run (nobody holds it)
    parent = out.parent
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        m = _LEFTOVER.match(p.name)
        if not m or m["name"] != out.name or not p.is_dir() or p.is_symlink():
            continue
        if _pid_alive(int(m["pid"])):
            continue  # another report run is writing there right now
        if (p / MARKER).is_file() or not any(p.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def prepare_out_dir(out: str | Path, force: bool) -> Path:
    """Check ``out`` before any work, and clean a killed earlier run's leftovers.

    A missing or empty directory is fine. An existing report needs ``force``; ``force``
    never replaces the current directory, the home directory, a filesystem root, a
    directory that contains the current one, a directory that is not a diloco-gym
    report (no :data:`MARKER`), or a report directory that also holds anything the report
    did not write (the marker lists its files; the message names the others), so that no
    user file can be lost. Takes the output's lock (:mod:`diloco_gym.eval.outlock`): a
    second process writing the same directory is refused.

    Raises:
        FileExistsError: ``out`` exists and may not be replaced (the message says why).
    """
    out = Path(out)
    full = out_target(out)
    cwd = Path.cwd().resolve()
    special = {cwd: "the current directory", Path.home().resolve(): "the home directory"}
    if out.exists():
        resolved = out.resolve()
        why = special.get(resolved)
        if why is None and resolved.parent == resolved:
            why = "a filesystem root"
        if why is None and resolved in cwd.parents:
            why = "a directory that contains the current directory"
        if why is not None:
            raise FileExistsError(
                f"refusing to write the report to {out}: it is {why}; "
                f"choose a new directory with --out"
            )
        if not out.is_dir():
            raise FileExistsError(
                f"refusing to write the report to {out}: it exists and is not a directory"
            )
    lock_out_dir(out)  # one writer at a time: a second process is refused here
    clean_leftovers(full)
    if not out.exists() or not any(out.iterdir()):
        return out
    foreign = _foreign_entries(out)
    if foreign is None:
        entries = sorted(p.name for p in out.iterdir())
        raise FileExistsError(
            f"refusing to replace {out}: it holds {len(entries)} file(s) (e.g. "
            f"{entries[0]!r}) but no diloco-gym report marker ({MARKER}); "
            f"--force replaces only a previous report. Choose another --out"
        )
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise FileExistsError(
            f"refusing to replace {out}: besides a previous report it holds {len(foreign)} "
            f"entr{'y' if len(foreign) == 1 else 'ies'} no report wrote ({shown}); "
            f"--force replaces only a report's own files: move them out or choose another --out"
        )
    if not force:
        raise FileExistsError(f"report directory {out} already exists; pass --force to replace it")
    return out


def write_output_dir(out: str | Path, force: bool, fill: Callable[[Path], None]) -> Path:
    """Fill a new output directory with ``fill(tmp)`` and put it at ``out`` atomically.

    The directory is written completely to the hidden sibling ``.OUT.partial-PID`` (the
    marker file first, then ``fill``); only then is an existing output renamed aside to
    ``.OUT.old-PID``, the new one renamed into place, and the old one deleted. An
    interrupted run removes its partial directory and puts the old output back; a killed
    one leaves marked siblings that the next run (:func:`clean_leftovers`) removes, and
    ``out`` itself is always either the old or the new complete output. The marker lists
    the files written, so that a later ``force`` replaces only a directory holding nothing
    else. The lock file ``.OUT.lock`` (:mod:`diloco_gym.eval.outlock`) is held from the
    check to the end, so a concurrent second writer is refused. When ``out`` is a symbolic
    link, the link is kept and its target is replaced. Used by the report and the
    frontier.

    Raises:
        FileExistsError: see :func:`prepare_out_dir`.
    """
    out = Path(out)
    try:
        prepare_out_dir(out, force)
        _write_output_dir(out_target(out), fill)
    finally:
        release_out_lock(out)
    return out


def _write_output_dir(full: Path, fill: Callable[[Path], None]) -> None:
    """Write ``full`` through its ``.partial-PID`` sibling (see :func:`write_output_dir`)."""
    full.parent.mkdir(parents=True, exist_ok=True)
    tmp = full.parent / f".{full.name}.partial-{os.getpid()}"
    old = full.parent / f".{full.name}.old-{os.getpid()}"
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir()
    moved_aside = False
    try:
        (tmp / MARKER).write_text(_MARKER_TEXT)  # first: a killed run's leftover is marked
        fill(tmp)
        written = sorted(p.name for p in tmp.iterdir() if p.name != MARKER)
        (tmp / MARKER).write_text(_MARKER_TEXT + _MARKER_FILES + "".join(n + "\n" for n in written))
        if full.exists():
            os.replace(full, old)
            moved_aside = True
        os.replace(tmp, full)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if moved_aside and not full.exists():
            os.replace(old, full)
        raise
    if moved_aside:
        shutil.rmtree(old, ignore_errors=True)


def write_report(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write report.md, results.csv, report.json and figures to ``out`` atomically
    (:func:`write_output_dir`).

    Raises:
        FileExistsError: see :func:`prepare_out_dir`.
    """

    def fill(tmp: Path) -> None:
        result["rows"].to_csv(tmp / "results.csv", index=False)
        figures = _figures(result, tmp)
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
            "holm_family": holm_family(result["config"]),
        }
        (tmp / "report.json").write_text(json.dumps(payload, indent=2, default=json_default))
        (tmp / "report.md").write_text(render_markdown(result, figures, command))

    return write_output_dir(out, force, fill)


#: Console summary columns: (summary column, heading, formatter).
_CONSOLE_COLUMNS: list[tuple[str, str, Any]] = [
    ("regime", "regime", str),
    ("agent", "agent", str),
    ("merges_per_hour", "merges/h", lambda x: _fmt(x, 1)),
    ("sync_excess_pct", "sync-excess %", lambda x: _fmt(x, 3)),
    ("matched_random_pct", "matched random %", lambda x: _fmt(x, 3)),
    ("oracle_same_budget_pct", "oracle @ budget %", lambda x: _fmt(x, 3)),
    ("n_nonzero", "n (non-zero)", str),
    ("p_value", "p", _fmt_p),
    ("p_holm", "p (Holm)", _fmt_p),
    ("verdict", "verdict", str),
]


def _holm_note(result: dict[str, Any]) -> str:
    """What the Holm family leaves out, for report.md's reading guide."""
    if result["config"].get("holm_across_settings"):
        return ""
    n_regimes = result["summary"]["regime"].nunique() if len(result["summary"]) else 0
    if n_regimes < 2:
        return ", not several reports or settings"
    return (
        f"; this report compares {n_regimes} regimes: report.json's "
        "p_holm_all_settings corrects across all of them, and --holm-across-settings makes "
        "the verdicts use it"
    )


def console_summary(summary: pd.DataFrame) -> str:
    """The summary table the ``report`` command prints: merge rate in merges/h and p-values
    as in report.md (``<0.001`` below 0.001); non-deployable agents are marked."""
    summary = summary.copy()
    if "deployable" in summary:
        summary["agent"] = [
            a if dep else f"{a} (non-deployable)"
            for a, dep in zip(summary["agent"], summary["deployable"], strict=True)
        ]
    summary["n_nonzero"] = (
        [
            f"{int(n)} ({int(k)})"
            for n, k in zip(summary["units"], summary["nonzero_units"], strict=True)
        ]
        if "nonzero_units" in summary
        else summary.get("units", "")
    )
    table = pd.DataFrame(
        {head: [fmt(v) for v in summary[col]] for col, head, fmt in _CONSOLE_COLUMNS}
    )
    return table.to_string(index=False)


def render_markdown(result: dict[str, Any], figures: list[str], command: str = "") -> str:
    """The human-readable report."""
    cfg = result["config"]
    s = result["summary"]
    lines = ["# diloco-gym calibration report", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [
        _units_sentence(result) + f" {cfg['draws']} matched-random draws per episode, "
        f"gate at p < {cfg['alpha']}. Ran in {result['elapsed_s']:.1f} s.",
        "",
        f"Deployable agents: {result.get('agent_sealing', sealing_mode(False))}."
        + (
            " **They ran in the evaluating process, where an agent's code can reach the "
            "env, the episode's trace, its merge costs and its seed: nothing enforces "
            "that they used observations only.**"
            if cfg.get("in_process_agents")
            else " Each ran in a worker process that held no env, trace, episode or "
            "seed and received only observations, action masks and the public "
            "parameters; the oracle ran in the evaluating process."
        ),
        "",
    ]
    if cfg.get("trace") and not bool(s["independent"].all()):
        lines += [
            "**Overlapping windows: not independent.** The stride is shorter than the "
            "window, so neighbouring episodes share requests. Every number, p-value and "
            "verdict in the tables below comes from the disjoint windows only (picked "
            "greedily from the first: each starts at or after the previous one's end); "
            "the other windows appear only in the rows marked 'descriptive', which carry "
            "no p-value and no verdict.",
            "",
        ]
    lines += [
        "Sync-excess = SLO violation % of the replay with the agent's merges minus the "
        "same replay without merges (percentage points of requests). Matched random = "
        "schedules drawn uniformly among all feasible schedules with the agent's own "
        "number of merges in each episode. Diff = agent minus matched random (paired "
        "over episodes; exact sign-flip test; 95 % bootstrap CI; the verdict uses p "
        f"Holm-adjusted across {holm_family(result['config'])}"
        f"{_holm_note(result)}). n (non-zero) = "
        "independent units in the test (those whose difference is not exactly zero; "
        "only they can carry evidence). Gap captured = "
        "(matched random - agent) / (matched random - oracle at the same budget).",
        "",
        "## Effect-size transfer",
        "",
        f"Real-sidecar measurements: {result['calibration_source']}",
        "",
    ]
    if not result.get("calibration_complete", True):
        lines += [
            "**Warning: the calibration file is marked incomplete (an interrupted live "
            "run); its numbers rest on partial measurements.**",
            "",
        ]
    lines += [
        "The verdict is the sidecar's: its simulated effect sizes on the regime it was "
        "measured on, at the utilization it was measured at ('calibrated at U': a live "
        "file's recorded load, otherwise the regime's own load relative to the sidecar's "
        "capacity), against the real measurements. Capacity = slots / mean nominal "
        "service time of the "
        "replayed token mix (req/s); utilization = mean offered work / capacity, as "
        "replayed; over SLO when idle = requests whose nominal service time alone "
        "exceeds the SLO.",
        "",
        "| regime | measured on | simulated sidecar | real p95 high/low | sim | "
        "real p95 sync ratio | sim | calibrated at U | capacity req/s | utilization | "
        "rate scale | over SLO when idle % | verdict |",
        "|" + "---|" * 13,
    ]
    for _, r in result["calibration"].iterrows():
        lines.append(
            f"| {r['regime']} | {r['measured_on']} | {r['sidecar']} | "
            f"{_fmt(r['real_p95_high_low'], 3)} | "
            f"{_fmt(r['sim_p95_high_low'], 3)} | {_fmt(r['real_p95_sync_ratio'], 3)} | "
            f"{_fmt(r['sim_p95_sync_ratio'], 3)} | "
            f"{_fmt(r.get('calibration_utilization'), 3)} | "
            f"{_fmt(r.get('capacity_rps'), 1)} | "
            f"{_fmt(r.get('utilization'), 3)} | {_fmt(r.get('rate_scale'), 3)} | "
            f"{_fmt(r.get('idle_violation_pct'), 1)} | {r['verdict']} |"
        )
    trace_rows = [
        r
        for _, r in result["calibration"].iterrows()
        if np.isfinite(r.get("trace_sim_p95_sync_ratio", np.nan))
    ]
    for r in trace_rows:
        lines += [
            "",
            f"For information only (not the verdict): on {r['regime']}'s own windows "
            f"a fixed-256 schedule gives p95 high/low {_fmt(r['trace_sim_p95_high_low'], 3)}"
            f" and p95 sync ratio {_fmt(r['trace_sim_p95_sync_ratio'], 3)}; the trace's "
            f"token mix and load, not the sidecar, set these.",
        ]
    for regime, g in s.groupby("regime", sort=False):
        lines += [
            "",
            f"## {regime}",
            "",
            f"No-sync violation rate: {g['no_sync_violation_pct'].mean():.2f} %. "
            f"Calibration: {g['calibration'].iloc[0]}. {_regime_scoring(result, regime)}",
            "",
        ]
        lines += _verdict_notes(g, cfg, result.get("loads", {}).get(regime, {}))
        lines += [
            "| agent | merges/h | sync-excess % | matched random % [5-95 %] | oracle @ same "
            "budget % | diff pp [95 % CI] | n (non-zero) | p | p (Holm) | req / 10 min | "
            "gap captured | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for _, r in g.sort_values("sync_excess_pct").iterrows():
            lines.append(
                f"| {r['agent']}{'' if r.get('deployable', True) else ' (non-deployable)'} | "
                f"{r['merges_per_hour']:.1f} | {r['sync_excess_pct']:.2f} | "
                f"{r['matched_random_pct']:.2f} [{r['matched_random_p05']:.2f}-"
                f"{r['matched_random_p95']:.2f}] | {r['oracle_same_budget_pct']:.2f} | "
                f"{r['diff_pp']:+.2f} [{r['diff_ci_low']:+.2f}, {r['diff_ci_high']:+.2f}] | "
                f"{int(r['units'])} ({int(r['nonzero_units'])}) | "
                f"{_fmt_p(r['p_value'])} | {_fmt_p(r['p_holm'])} | "
                f"{r['diff_requests_per_10min']:+.1f} | "
                f"{_fmt(r['gap_captured'])} | {r['verdict']} |"
            )
        if not bool(g["independent"].all()):
            lines += [
                "",
                "Descriptive only (all overlapping windows, not independent: no p-value, "
                "no verdict):",
                "",
                "| agent | windows | mean diff pp |",
                "|---|---|---|",
            ]
            lines += [
                f"| {r['agent']} (descriptive) | {int(r['units_all'])} | "
                f"{r['diff_pp_all_units']:+.2f} |"
                for _, r in g.sort_values("sync_excess_pct").iterrows()
            ]
        if "quality_cost" in g:
            lines += _quality_table(g)
        fig = f"fig_{regime.replace(':', '_')}.png"
        if fig in figures:
            lines += ["", f"![{regime}]({fig})"]
        if regime in PAPER:
            lines += [
                "",
                "Paper / reference (docs/paper.md), sync-excess %: "
                + ", ".join(f"{k} {v}" for k, v in PAPER[regime].items())
                + ".",
            ]
    if any(f.startswith("timeline_") for f in figures):
        lines += ["", "## One episode", ""] + [
            f"![timeline]({f})" for f in figures if f.startswith("timeline_")
        ]
    sc = result.get("scoring") or scoring_summary(result["rows"])
    max_gap, n_rows = sc["largest_additive_exact_gap_pp"], sc["agent_episodes"]
    n_proven, n_bound = sc["proven_additive"], sc["oracle_upper_bound"]
    lines += [
        "",
        "## Notes",
        "",
        "- Scoring: the agent, every matched-random draw and the oracle's schedule are "
        "scored by the same exact replay of the queue (a merge's backlog is followed "
        "until it drains, and merges that start before the previous one's backlog has "
        "drained are replayed together). In "
        f"{n_proven} of {n_rows} agent-episodes every scored schedule was proven "
        "equal to the sum of its merges' isolated costs (each merge drains before the "
        "next one starts; 'additive (proven equal)' in results.csv); in the others "
        "('exact') some merge interacts with the previous one or its backlog outlives "
        "its isolated cost window, and those windows were replayed. Largest "
        "additive-exact gap over "
        f"all scored schedules: {max_gap:.3g} pp.",
        "- Oracle @ same budget: the best exact schedule known. It is the exact optimum "
        "where every merge of the episode drains within H_min (then every schedule's "
        "exact sync-excess equals its additive one and the additive optimum, found by "
        "dynamic programming, is exact) or where every feasible schedule could be "
        "scored; otherwise it is the best schedule an exact local search (single-merge "
        "moves and suffix shifts, each scored by the exact replay) reaches from the "
        "additive optimum, an upper bound on the exact optimum with no certified lower "
        f"bound ({n_bound} of {n_rows} agent-episodes). Gap captured uses it.",
        "- 'no claim' rows: the regime's real sidecar showed no measurable merge effect "
        "(or the simulator is uncalibrated), so no SLO claim is made whatever the "
        "numbers say.",
        f"- 'no claim (saturated)': more than {cfg.get('saturation_pct', 50):g} % of "
        "requests violate their SLO with no merge at all; the median request already "
        "fails, the sidecar is overloaded, and sync-excess cannot tell whether a "
        "schedule protects a working service.",
        "- 'inconclusive (too few episodes)': with k independent paired units whose "
        "difference is not exactly zero (a zero difference carries no evidence) an exact "
        "two-sided sign-flip test cannot give p below 2/2^k (times the number of agents "
        "after the Holm correction), so a tie cannot be told from a gain; the section "
        "says how many non-zero units would be needed.",
        "",
    ]
    return "\n".join(lines)


def _quality_table(g: pd.DataFrame) -> list[str]:
    """The two-sided trade-off of a regime's agents: SLO damage (sync-excess) next to the
    model-quality price from the learner calibration."""
    lines = [
        "",
        "Model quality (learner calibration): predicted validation loss (nats/byte) after "
        "the episode's merges, and the quality cost, its excess over fixed H with the same "
        "number of merges over the same span.",
        "",
        "| agent | merges/h | sync-excess % | predicted loss | quality cost |",
        "|---|---|---|---|---|",
    ]
    for _, r in g.sort_values("sync_excess_pct").iterrows():
        lines.append(
            f"| {r['agent']} | {r['merges_per_hour']:.1f} | {r['sync_excess_pct']:.2f} | "
            f"{r['pred_loss']:.4f} | {r['quality_cost']:+.2e} |"
        )
    return lines


def _units_sentence(result: dict[str, Any]) -> str:
    """What the statistical units of the report are."""
    cfg = result["config"]
    if not cfg.get("trace"):
        last_seed = cfg["seed0"] + cfg["seeds"] - 1
        return (
            f"{cfg['seeds']} episodes per regime (independent units: seeds "
            f"{cfg['seed0']}..{last_seed})."
        )
    load: dict[str, Any] = next(iter(result.get("loads", {}).values()), {})
    if not load:
        return "Trace windows as episodes."
    kind = (
        "disjoint windows, independent units"
        if load["independent"]
        else "overlapping windows: not independent"
    )
    plural = "" if load["windows"] == 1 else "s"
    return (
        f"{load['windows']} window{plural} of {load['window_s']:g} s every "
        f"{load['stride_s']:g} s ({kind}) of the {load['trace_duration_s']:.0f} s trace "
        f"replayed {_speed(load['rate_scale'])} ({load['replayed_duration_s']:.0f} s, "
        f"{load['mean_rate_rps']:.2f} req/s, utilization {load['utilization']:.2f}); one "
        f"episode per window, window i seeded {cfg['seed0']} + i for the added pressure "
        f"series."
    )


def _speed(scale: float) -> str:
    """``at its own rate``, ``2x faster``, ``0.5x as fast``."""
    if scale == 1:
        return "at its own rate"
    return f"{scale:.3g}x faster" if scale > 1 else f"at {scale:.3g}x its rate"


def _verdict_notes(g: pd.DataFrame, cfg: dict, load: dict) -> list[str]:
    """Why a regime's verdicts are what they are, when that is not the test alone."""
    out = []
    r = g.iloc[0]
    if bool(r["saturated"]):
        idle = load.get("idle_violation_pct", np.nan)
        text = (
            f"**No claim (saturated)**: {g['no_sync_violation_pct'].mean():.1f} % of "
            f"requests violate their SLO with no merge (threshold "
            f"{cfg.get('saturation_pct', 50):g} %). "
        )
        if np.isfinite(idle) and idle > cfg.get("saturation_pct", 50) / 2:
            text += (
                f"{idle:.1f} % of the requests exceed the SLO even on an idle sidecar "
                f"(their nominal service time alone): no load makes this replay "
                f"meaningful; it needs a sidecar (or SLO) that fits these requests."
            )
        else:
            text += (
                "Lower the load (--rate-scale, --target-utilization) or use a sidecar "
                "with more capacity."
            )
        out.append(text)
    for _, r in g[g["verdict"] == "inconclusive (too few episodes)"].iterrows():
        n, k = int(r["units"]), int(r["nonzero_units"])
        out.append(
            f"**{r['agent']}: inconclusive (too few episodes)**: {n} independent "
            f"{r['unit']}{'' if n == 1 else 's'}, {k} with a non-zero difference; the "
            f"best p an exact test on them can give, Holm-adjusted over "
            f"{int(r['holm_family'])} agents, is {_fmt_p(r['best_p_holm'])}, not below "
            f"{cfg['alpha']}. At least {int(r['units_needed'])} independent "
            f"{r['unit']}s with a non-zero difference are needed"
            + (" (a longer trace, or shorter windows)." if r["unit"] == "window" else " (--seeds).")
        )
    if not bool(g["independent"].all()):
        out.append(
            f"Windows overlap (stride shorter than the window): **not independent**; the "
            f"test uses the {int(r['independent_units'])} disjoint windows among the "
            f"{int(r['units_all'])}, and the other windows are descriptive only."
        )
    return out + ([""] if out else [])


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A matplotlib Figure on its own Agg canvas.

    Built directly rather than through pyplot, so that writing a report neither switches
    the calling process's backend (``matplotlib.use``) nor registers figures with pyplot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _figures(result: dict[str, Any], out: Path) -> list[str]:
    s = result["summary"]
    names: list[str] = []
    for regime, g in s.groupby("regime", sort=False):
        g = g.sort_values("sync_excess_pct")
        fig = _new_figure((12, 4.2))
        ax, ax2 = fig.subplots(1, 2)
        why = _no_claim_reason(g)
        if why is not None:
            # A bar chart of zeros on an auto-scaled +-0.04 axis reads like a result; the
            # honest content of such a panel is the absence of a claim.
            for a, title, note in (
                (ax, f"{regime}: agent vs its matched-random envelope", why),
                (ax2, "sync-excess vs merge rate", ""),
            ):
                a.set_axis_off()
                a.set_title(title)
                a.text(
                    0.5,
                    0.6,
                    "no claim: no SLO effect",
                    ha="center",
                    va="center",
                    fontsize=16,
                    transform=a.transAxes,
                )
                a.text(
                    0.5,
                    0.42,
                    textwrap.fill(note, 60),
                    ha="center",
                    va="center",
                    fontsize=9,
                    transform=a.transAxes,
                )
            _save(fig, out, f"fig_{regime.replace(':', '_')}.png", names)
            continue
        x = np.arange(len(g))
        yerr = np.vstack(
            [
                g["sync_excess_pct"] - (g["matched_random_pct"] + g["diff_ci_low"]),
                (g["matched_random_pct"] + g["diff_ci_high"]) - g["sync_excess_pct"],
            ]
        )
        ax.bar(
            x,
            g["sync_excess_pct"],
            color="tab:blue",
            alpha=0.8,
            label="agent",
            yerr=np.clip(yerr, 0, None),
            capsize=3,
        )
        ax.errorbar(
            x + 0.3,
            g["matched_random_pct"],
            yerr=[
                g["matched_random_pct"] - g["matched_random_p05"],
                g["matched_random_p95"] - g["matched_random_pct"],
            ],
            fmt="o",
            color="tab:orange",
            label="matched random (mean, 5-95 %)",
        )
        ax.plot(x, g["oracle_same_budget_pct"], "k_", markersize=14, label="oracle @ same budget")
        ax.set_xticks(x, g["agent"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("sync-excess SLO violations (pp)")
        ax.set_title(f"{regime}: agent vs its matched-random envelope")
        ax.legend(fontsize=7)
        # The frontier as the report samples it: matched random's and the oracle's
        # sync-excess at each agent's own merge rate (exact, from the same replays), so a
        # point below the orange line gains by placement, not by merging less. The full
        # curves on a budget grid, with budget-held agents: ``diloco-gym frontier``.
        by_rate = g.sort_values("merges_per_hour")
        ax2.plot(
            by_rate["merges_per_hour"],
            by_rate["matched_random_pct"],
            "o--",
            color="tab:orange",
            markersize=4,
            label="matched random at the agent's rate",
        )
        ax2.plot(
            by_rate["merges_per_hour"],
            by_rate["oracle_same_budget_pct"],
            "s:",
            color="black",
            markersize=4,
            label="oracle at the agent's rate",
        )
        ax2.scatter(g["merges_per_hour"], g["sync_excess_pct"], color="tab:blue")
        _annotate_points(
            fig,
            ax2,
            g["merges_per_hour"].to_numpy(),
            g["sync_excess_pct"].to_numpy(),
            list(g["agent"]),
        )
        ax2.set_xlabel("merges per hour (budget)")
        ax2.set_ylabel("sync-excess (pp)")
        ax2.set_title("sync-excess vs merge rate (below orange: placement gain)")
        ax2.legend(fontsize=7)
        fig.tight_layout()
        _save(fig, out, f"fig_{regime.replace(':', '_')}.png", names)
    for regime, tl in result.get("timelines", {}).items():
        from diloco_gym.envs.render import plot_timeline_panels

        fig = _new_figure((12, 3 + 0.4 * len(tl["schedules"])))
        plot_timeline_panels(fig, tl["episode"], tl["schedules"], tl["params"], tl["sidecar"])
        fig.suptitle(
            f"{regime}, seed {tl['seed']}: request rate (top); each agent's merge "
            f"windows (bars) and the requests that miss their SLO only because of "
            f"a merge (black ticks)",
            fontsize=10,
        )
        fig.subplots_adjust(left=0.12, right=0.88, top=0.88, bottom=0.08)
        _save(fig, out, f"timeline_{regime.replace(':', '_')}.png", names)
    return names


def _save(fig, out: Path, name: str, names: list[str]) -> None:
    fig.savefig(out / name, dpi=90)
    names.append(name)


def _no_claim_reason(g: pd.DataFrame) -> str | None:
    """Why a regime's panels carry no chart (``None``: draw it).

    Args:
        g: the regime's summary rows.
    """
    if g["verdict"].astype(str).str.startswith("no claim (no SLO effect)").all():
        return (
            "the real sidecar showed no measurable merge effect in this regime, so no "
            "agent's SLO numbers are a claim"
        )
    values = g[
        ["sync_excess_pct", "matched_random_pct", "matched_random_p95", "oracle_same_budget_pct"]
    ].to_numpy(dtype=float)
    if np.all(np.abs(values[np.isfinite(values)]) < 1e-9):
        return (
            "merges cause no extra SLO violations here: every agent, matched random and "
            "the oracle are at 0.00 pp"
        )
    return None


def _annotate_points(
    fig, ax, x: np.ndarray, y: np.ndarray, labels: list[str], fontsize: float = 7.0
) -> None:
    """Label scatter points without overprinting.

    Points within a few points of each other on the page share one label (their names
    joined); a label that would overlap one already placed moves down line by line, with
    a thin leader line to its point.
    """
    fig.tight_layout()
    ax.set_xlim(ax.get_xlim())  # freeze the limits: the labels must not move them
    ax.set_ylim(ax.get_ylim())
    pos = ax.get_position()
    w_pt = pos.width * fig.get_figwidth() * 72.0
    h_pt = pos.height * fig.get_figheight() * 72.0
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    px = (np.asarray(x, float) - x0) / (x1 - x0) * w_pt
    py = (np.asarray(y, float) - y0) / (y1 - y0) * h_pt
    line_pt = fontsize * 1.3
    char_pt = fontsize * 0.6
    groups: list[list[int]] = []
    for i in sorted(range(len(labels)), key=lambda k: (-py[k], px[k])):
        for grp in groups:
            j = grp[0]
            if abs(px[i] - px[j]) < 6.0 and abs(py[i] - py[j]) < 6.0:
                grp.append(i)
                break
        else:
            groups.append([i])
    placed: list[tuple[float, float, float]] = []  # (x start, x end, y) of labels, in points

    # the points themselves are obstacles too: a label must not sit on another point
    dots = list(zip(px, py, strict=True))

    def free(x_lo: float, x_hi: float, yy: float) -> bool:
        return (
            x_lo >= 0.0
            and x_hi <= w_pt
            and 0.0 <= yy <= h_pt
            and not any(x_lo < b1 and a0 < x_hi and abs(yy - y2) < line_pt for a0, b1, y2 in placed)
            and not any(
                x_lo - 3.0 < dx < x_hi + 3.0 and abs(yy - dy) < line_pt * 0.8 for dx, dy in dots
            )
        )

    # right of the point, a line below or above it, left of it, then further down
    candidates = [
        (1, 3.0),
        (1, 3.0 - line_pt),
        (1, 3.0 + line_pt),
        (-1, 3.0),
        (-1, 3.0 - line_pt),
    ] + [(side, 3.0 - k * line_pt) for k in range(2, 40) for side in (1, -1)]
    for grp in groups:
        j = grp[0]
        text = ", ".join(labels[k] for k in grp)
        width = char_pt * len(text)
        side, dy, x_lo = 1, 3.0, px[j] + 5.0
        for cand_side, cand_dy in candidates:
            lo = px[j] + 5.0 if cand_side > 0 else px[j] - 5.0 - width
            if free(lo, lo + width, py[j] + cand_dy):
                side, dy, x_lo = cand_side, cand_dy, lo
                break
        placed.append((x_lo, x_lo + width, py[j] + dy))
        ax.annotate(
            text,
            (x[j], y[j]),
            xytext=(5.0 * side, dy),
            textcoords="offset points",
            fontsize=fontsize,
            va="center",
            ha="left" if side > 0 else "right",
            arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.35"}
            if abs(dy - 3.0) > line_pt / 2
            else None,
        )
