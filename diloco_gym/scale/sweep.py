"""``diloco-gym sweep``: a grid of protocol runs, as cells on a backend, resumable.

A sweep file (TOML; YAML when PyYAML is installed) holds fixed settings at the top level
and the grid's axes under ``[grid]``; every combination of the axes (in the file's order)
is one *point*, a complete protocol run::

    name = "budgets"
    agents = ["fixed-512", "wa-diloco"]   # every cell runs all of them
    seeds = 20
    draws = 1000

    [env]                                  # EnvParams fields fixed for every point
    decision_interval = 8

    [grid]
    regime = ["bursty", "sync-heavy"]      # or trace = ["a.csv", "b.jsonl"]
    merge_budget = [8, 16, 32]             # an EnvParams field (the env's merge_budget)
    rate_scale = [0.5, 1.0]                # or target_utilization = [...]
    calibration = ["reference", "cal.json"]
    "env.excess_weight" = [1.0, 2.0]       # any EnvParams field as env.NAME

Keys (top level or grid axes): ``regime``, ``trace``, ``trace_format``, ``window_s``,
``stride_s``, ``sidecar``, ``rate_scale``, ``target_utilization``, ``calibration``
(``"reference"``: the shipped one), ``agents``, ``seeds``, ``seed0``, ``draws``, ``alpha``,
``saturation_pct``, ``in_process_agents`` (``true``: agents run in the evaluating process,
not sealed), ``merge_budget`` and ``env.NAME``. Relative paths (trace, calibration, fleet
file, a learned agent's run directory) are relative to the sweep file.

A fleet sweep sets ``fleet = "FILE"`` (top level, or a grid axis ``fleet = ["a.toml",
"b.toml"]``): each point then runs the fleet protocol of ``report --fleet`` (a cell per
episode and one for the fleet's calibration; keys and rules in
:mod:`diloco_gym.scale.fleet_points`), the single-host keys
(``regime``, ``trace``, ``sidecar``...) are an error naming the key, ``env.NAME`` may also
name a ``FleetParams`` field (``env.bits``), and the summary carries each agent's
worst-site sync-excess (``worst_site_sync_excess_pct``) and the fleet's calibration verdict.

Each point is split into the report's cells (:mod:`diloco_gym.eval.cells`). A cell's
record is appended to ``OUT/cells.jsonl`` (and flushed to disk) the moment it finishes, keyed
by a fingerprint of everything it depends on: a rerun skips every stored cell, so an
interrupted sweep loses at most the cells that were running, and a changed grid reuses the
cells it shares with the old one. A cell that raises is stored with its error and the sweep
goes on (``retry_failed`` runs such cells again). A line of the store that is not a cell
record (corrupted or edited) is moved to ``OUT/cells.rejected.jsonl`` with a warning naming
the file and the line; every other stored cell is kept and that line's cell runs again.
Outputs, rewritten after every run from the stored records (so a resumed sweep writes
exactly what an uninterrupted one does): ``results.csv`` / ``results.parquet`` (one row
per point x unit x agent, the point's parameters first as ``grid.AXIS`` columns),
``summary.csv`` (the report's summary statistics per point x agent), ``errors.csv`` and
``summary.md``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict

from diloco_gym.scale import fleet_points
from diloco_gym.scale.store import REJECTED_FILE, CellStore, SweepStoreWarning
from diloco_gym.scale.sweep_outputs import describe, write_outputs
from diloco_gym.tables import Table, TableError, validate_table

if TYPE_CHECKING:
    pass

__all__ = [
    "SweepSpec",
    "SweepPoint",
    "SweepStoreWarning",
    "REJECTED_FILE",
    "load_sweep",
    "run_sweep",
    "run_sweep_cell",
]

_REPORT_KEYS = (
    "regime",
    "trace",
    "trace_format",
    "window_s",
    "stride_s",
    "sidecar",
    "rate_scale",
    "target_utilization",
    "calibration",
    "agents",
    "seeds",
    "seed0",
    "draws",
    "alpha",
    "saturation_pct",
    "in_process_agents",
)
_PATH_KEYS = ("trace", "calibration")
#: Fields a calibration cell does not depend on (cells that differ only in them share one).
#: Options of the summary statistics only: no cell depends on them (kept out of the
#: fingerprints, so stored cells stay valid).
_NOT_CELL = ("holm_across_settings",)
_NOT_CALIBRATION = ("agents", "seeds", "draws", "alpha", "saturation_pct", *_NOT_CELL)


def _agent_path(agent: object, base: Path) -> object:
    """A relative model or agent-file path of a sweep file (``model.zip``,
    ``my_sched.py:Name``), relative to the file's folder (like its trace and calibration);
    agent names, ``module:attr`` and other values are left to the config's checks."""
    from diloco_gym.agents.registry import AGENTS, shipped_spec

    if not isinstance(agent, str) or agent in AGENTS:
        return agent
    return shipped_spec(agent, base)


def name_problem(name: str) -> str | None:
    """Why ``name`` (a sweep's or a tune's) cannot name its default output directory
    (``sweep-NAME``, ``tune-NAME`` in the working directory), or ``None``: it must be a
    plain file name, of at most 100 printable characters with no path separator, and not
    ``.`` or ``..``; a ``../`` in it would write outside the working directory."""
    if not name:
        return "is empty"
    if len(name) > 100:
        return f"has {len(name)} characters (at most 100)"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "is not a plain file name (no '/', no '\\', not '.' or '..')"
    if not name.isprintable():
        return "holds a control character"
    return None


def check_name(path: Path, name: str, error: type[ValueError]) -> str:
    """``name`` (the file's ``name`` key or its stem), or ``error`` naming the file and the
    key when it is not a plain file name (:func:`name_problem`)."""
    why = name_problem(name)
    if why is not None:
        raise error(
            f"{path}: name {name[:60]!r} {why}: it names the output directory (the default "
            f"--out is the name with a prefix); use letters, digits, '-', '_' or '.'"
        )
    return name


class SweepFileError(ValueError):
    """A malformed sweep file (the message names the file and the key)."""


class SweepDataError(SweepFileError):
    """A file a sweep point names (trace, calibration) is missing or malformed, or a point
    cannot be planned on its data (a trace too short for its window): a data error."""


@dataclass
class SweepPoint:
    """One combination of the grid's axes.

    Attributes:
        index: its position in the grid (file order of the axes, last axis fastest).
        params: the axes' values at this point (the table's leading columns).
        config: the protocol's configuration (paths absolute).
        env: ``EnvParams`` overrides (``merge_budget`` and ``env.NAME`` keys).
        regime: the report regime name (``replay:<stem>`` for a trace).
    """

    index: int
    params: dict[str, Any]
    config: Any
    env: dict[str, Any]
    regime: str


@dataclass
class SweepSpec:
    """A parsed sweep file."""

    name: str
    path: Path
    axes: dict[str, list]
    points: list[SweepPoint]
    #: every point runs the fleet protocol (``fleet`` is set).
    fleet: bool = False


def read_settings_file(path: Path) -> dict:
    """The table of a TOML, JSON or YAML settings file (a sweep file; tune files too).

    The file is read and parsed within the size limits (:mod:`diloco_gym.sim.parsing`): at
    most ``DILOCO_GYM_MAX_SETTINGS_BYTES`` bytes, ``DILOCO_GYM_MAX_NESTING`` levels deep,
    and, for YAML, ``DILOCO_GYM_MAX_YAML_NODES`` values with its aliases expanded.
    """
    from diloco_gym.sim import parsing
    from diloco_gym.sim.limits import LimitError

    if not path.is_file():
        raise SweepFileError(f"{path}: no such sweep file")
    try:
        text = parsing.read_text(path)
    except LimitError as exc:
        raise SweepFileError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepFileError(f"{path}: cannot read: {exc}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SweepFileError(
                f"{path}: YAML sweep files need PyYAML (pip install pyyaml); "
                f"or write the sweep as TOML"
            ) from None
        try:
            data = parsing.parse_yaml(text, str(path))
        except LimitError as exc:
            raise SweepFileError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise SweepFileError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10: the same parser as the package tomli
            import tomli as tomllib

        try:
            data = parsing.parse_toml(text, str(path))
        except LimitError as exc:
            raise SweepFileError(str(exc)) from None
        except tomllib.TOMLDecodeError as exc:
            raise SweepFileError(f"{path}: not valid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise SweepFileError(
            f"{path}: a sweep file is a table of settings, got {type(data).__name__}"
        )
    return data


def _env_field(path: Path, key: str, fleet: bool = False) -> str:
    from diloco_gym.envs.params import EnvParams

    name = key[4:] if key.startswith("env.") else key
    valid = {f.name for f in fields(EnvParams)}
    if fleet and fleet_points.fleet_env_field(name):
        return name
    if name not in valid:
        raise SweepFileError(
            f"{path}: unknown env parameter {name!r} (key {key!r}); valid: "
            f"{', '.join(sorted(valid))}"
        )
    return name


class _Settings(Table):
    """A sweep point's settings (the top level's fixed values, or one value of a grid axis;
    ``env.NAME`` keys are checked against :class:`EnvParams`). Values are checked further,
    per point, by the report's configuration."""

    regime: str | None = None
    trace: str | None = None
    trace_format: str | None = None
    window_s: float | None = None
    stride_s: float | None = None
    sidecar: str | None = None
    rate_scale: float | None = None
    target_utilization: float | None = None
    calibration: str | None = None
    agents: list[str] | str | None = None
    seeds: int | None = None
    seed0: int | None = None
    draws: int | None = None
    alpha: float | None = None
    saturation_pct: float | None = None
    in_process_agents: bool | None = None
    merge_budget: int | None = None
    fleet: str | None = None


class _SweepFile(Table):
    """A sweep file's structure: its name, the ``[grid]`` axes and the ``[env]`` table."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    grid: dict[str, Any] = {}
    env: dict[str, Any] = {}


_VALID_KEYS = f"{', '.join(_REPORT_KEYS)}, merge_budget, fleet, env.NAME"


def _check_settings(path: Path, settings: dict[str, Any], what: str, fleet: bool = False) -> None:
    """One line naming the file and the key for an unknown key or a value of the wrong
    type (``what``: ``"key"`` at the top level, ``"grid axis"`` under ``[grid]``)."""
    try:
        validate_table(_Settings, {k: v for k, v in settings.items() if not k.startswith("env.")})
    except TableError as err:
        key = (err.key or "").split(".")[0]
        if err.kind == "unknown":
            valid = "valid keys" if what == "key" else "valid axes"
            raise SweepFileError(
                f"{path}: unknown {what} {key!r}; {valid}: {_VALID_KEYS}"
            ) from None
        if key == "agents":
            raise SweepFileError(
                f"{path}: {what} agents must be a name or a list of names, got {settings[key]!r}"
            ) from None
        raise SweepFileError(f"{path}: {what} {key!r} {err.message}") from None
    for key in settings:
        if key.startswith("env."):
            _env_field(path, key, fleet)
        elif fleet and key in fleet_points.NOT_WITH_FLEET:
            raise SweepFileError(
                f"{path}: {what} {key!r} is not used with fleet (a fleet's sites set their "
                f"traffic, traces and sidecars in the fleet file); keys of a fleet sweep: "
                f"{', '.join(fleet_points.FLEET_KEYS)}, env.NAME"
            )


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; every point's configuration is validated here.

    The file's structure and each setting's type are declarative models (pydantic), so a
    wrong type is refused before any point is built.

    Raises:
        SweepFileError: (a ``ValueError``) a missing or malformed file, an unknown key, an
            empty axis, or a point whose settings are invalid (named by its parameters).
    """
    path = Path(path)
    data = read_settings_file(path)
    try:
        top = validate_table(_SweepFile, data)
    except TableError as err:
        if (err.key or "").split(".")[0] == "name":
            raise SweepFileError(f"{path}: name {err.message}") from None
        raise SweepFileError(f"{path}: [grid] and [env] must be tables") from None
    name = check_name(path, path.stem if top.name is None else top.name, SweepFileError)
    grid = top.grid
    fixed: dict[str, Any] = {
        **(top.model_extra or {}),
        **{f"env.{k}": v for k, v in top.env.items()},
    }
    fleet = "fleet" in fixed or "fleet" in grid
    _check_settings(path, fixed, "key", fleet)
    axes: dict[str, list] = {}
    for key, values in grid.items():
        _check_settings(path, {key: None}, "grid axis", fleet)
        if not isinstance(values, list) or not values:
            raise SweepFileError(f"{path}: grid axis {key!r} must be a non-empty list")
        axes[key] = values
    _check_grid_points(path, axes)
    for key, values in axes.items():
        for value in values:
            _check_settings(path, {key: value}, "grid axis", fleet)
    if fleet:
        combos = enumerate(itertools.product(*axes.values()))
        points = [_fleet_point(path, i, dict(zip(axes, c, strict=True)), fixed) for i, c in combos]
        return SweepSpec(name, path, axes, points, fleet=True)
    if "regime" in {**fixed, **axes} and "trace" in {**fixed, **axes}:
        raise SweepFileError(f"{path}: give regime or trace, not both")
    if (
        "regime" not in fixed
        and "regime" not in axes
        and "trace" not in fixed
        and "trace" not in axes
    ):
        raise SweepFileError(
            f"{path}: no regime or trace (give regime = [...] or "
            f"trace = [...] under [grid], or one at the top level)"
        )
    points = [
        _point(path, index, dict(zip(axes, combo, strict=True)), fixed)
        for index, combo in enumerate(itertools.product(*axes.values()))
    ]
    return SweepSpec(name, path, axes, points)


def _check_grid_points(path: Path, axes: dict[str, list]) -> None:
    """The grid's points (the product of its axes' lengths, counted before any point is
    built) must be within ``DILOCO_GYM_MAX_GRID_POINTS``."""
    from diloco_gym.sim.limits import LimitError, check_limit

    sizes = [f"{len(values):,} {key}" for key, values in axes.items()]
    shown = " x ".join(sizes) if len(sizes) <= 6 else f"{len(sizes)} axes"
    points = math.prod(len(values) for values in axes.values())
    try:
        check_limit("GRID_POINTS", points, f"{path}: grid points ({shown or 'no axes'})")
    except LimitError as exc:
        raise SweepFileError(str(exc)) from None


def _point(path: Path, index: int, params: dict[str, Any], fixed: dict[str, Any]) -> SweepPoint:
    """Point ``index`` of the grid (its axes' values ``params`` over the ``fixed``
    settings), its configuration checked; errors name the point by its parameters."""
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.eval.cells import cell_config
    from diloco_gym.eval.report import ReportConfig
    from diloco_gym.sim.regimes import REGIMES

    settings = {**fixed, **params}
    where = f"{path}: point {index} ({describe(params)})"
    env: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "merge_budget" or key.startswith("env."):
            env[_env_field(path, key)] = value
        elif key in _PATH_KEYS:
            if value is None or (key == "calibration" and value in ("reference", "none")):
                kwargs[key] = None
            else:
                p = Path(str(value)).expanduser()
                kwargs[key] = str(p if p.is_absolute() else path.parent / p)
        else:
            kwargs[key] = value
    regime = kwargs.pop("regime", None)
    if regime is not None:
        if regime not in REGIMES:
            raise SweepFileError(
                f"{where}: unknown regime {regime!r}; valid regimes: {', '.join(REGIMES)}"
            )
        kwargs["regimes"] = [regime]
    if isinstance(kwargs.get("agents"), str):
        kwargs["agents"] = [kwargs["agents"]]
    if isinstance(kwargs.get("agents"), list):  # a learned agent's run directory: a path
        kwargs["agents"] = [_agent_path(a, path.parent) for a in kwargs["agents"]]
    try:
        EnvParams(**env)
        config = cell_config(ReportConfig(**kwargs))
        config.require_choice()
    except (TypeError, ValueError) as exc:
        raise SweepFileError(f"{where}: {' '.join(str(exc).split())}") from None
    if config.trace is not None and not Path(config.trace).is_file():
        raise SweepDataError(f"{where}: trace file {config.trace} does not exist")
    if config.calibration is not None:
        _check_calibration(where, config.calibration)
    report_regime = f"replay:{Path(config.trace).stem}" if config.trace is not None else regime
    return SweepPoint(index, params, config, env, report_regime)


def _fleet_point(
    path: Path, index: int, params: dict[str, Any], fixed: dict[str, Any]
) -> SweepPoint:
    """Point ``index`` of a fleet sweep (:mod:`diloco_gym.scale.fleet_points`); a missing
    or malformed fleet file is a :class:`SweepDataError`, a bad value a
    :class:`SweepFileError`, each naming the point."""
    from diloco_gym.sim.fleet import FleetConfigError

    settings = {**fixed, **params}
    where = f"{path}: point {index} ({describe(params)})"
    env = {
        _env_field(path, k, fleet=True): v
        for k, v in settings.items()
        if k == "merge_budget" or k.startswith("env.")
    }
    try:
        config = fleet_points.fleet_point_config(settings, path.parent, env)
    except (FileNotFoundError, FleetConfigError) as exc:
        raise SweepDataError(f"{where}: {' '.join(str(exc).split())}") from None
    except (TypeError, ValueError) as exc:
        raise SweepFileError(f"{where}: {' '.join(str(exc).split())}") from None
    if config.calibration is not None:
        _check_calibration(where, config.calibration)
    return SweepPoint(index, params, config, env, f"fleet:{Path(config.fleet).stem}")


def _check_calibration(where: str, path: str) -> None:
    """A calibration file must exist and be valid before any cell runs (read once)."""
    from diloco_gym.eval.calibration import load_calibration

    if path in _CHECKED_CALIBRATIONS:
        return
    try:
        load_calibration(path)
    except (ValueError, OSError) as exc:
        raise SweepDataError(f"{where}: {' '.join(str(exc).split())}") from None
    _CHECKED_CALIBRATIONS.add(path)


_CHECKED_CALIBRATIONS: set[str] = set()


def _fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def run_sweep_cell(cell) -> dict[str, Any]:
    """One sweep cell (a report cell with the point's env overrides); module-level so that
    workers import it by name."""
    from diloco_gym.eval.cells import run_report_cell
    from diloco_gym.eval.fleet import FleetReportConfig

    if isinstance(cell.config, FleetReportConfig):  # a fleet point's episode or calibration
        return fleet_points.run_fleet_cell(cell)
    return run_report_cell(cell)


class _Stop(Exception):
    """Raised by the store callback after ``max_cells`` cells (a chunked sweep)."""


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    retry_failed: bool = False,
    max_cells: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) a sweep into ``out``; returns counts and the output paths.

    Args:
        spec: from :func:`load_sweep`.
        out: the sweep's directory (created; the stored cells of an earlier run are kept;
            a non-empty directory without them is refused).
        backend, jobs, ray_address: see :func:`diloco_gym.scale.run_cells`.
        progress: a cells done / total bar.
        retry_failed: run cells stored with an error again.
        max_cells: stop after this many cells finish (rerun to continue).

    Returns:
        ``{"cells", "run", "skipped", "failed", "complete", "out", "failure_summary"}``:
        cells in the grid, cells run now, cells skipped (stored by an earlier run), failed
        cells stored, whether every cell is stored, the directory, and the failed cells'
        distinct errors in one line.

    Raises:
        SweepDataError: a point cannot be planned (nothing runs then).
        FileExistsError: another process is running a sweep into ``out`` now (its lock file
            ``.OUT.lock``, :mod:`diloco_gym.eval.outlock`, is held), or ``out`` is a file or a
            non-empty directory that is not a sweep's (:func:`check_sweep_dir`).
    """
    from diloco_gym.eval.outlock import lock_out_dir, release_out_lock

    out = Path(out)
    lock_out_dir(out, "sweep")
    try:
        return _run_sweep(spec, out, backend, jobs, ray_address, progress, retry_failed, max_cells)
    finally:
        release_out_lock(out)


#: The record of finished cells: a directory holding it is a sweep's (and is resumed).
CELLS_FILE = "cells.jsonl"


def check_sweep_dir(out: Path) -> None:
    """A sweep writes into a missing or empty directory, or resumes one holding its
    :data:`CELLS_FILE`; it never writes its results among someone else's files (a
    ``results.csv`` or ``summary.md`` of the user's would be overwritten):
    :func:`diloco_gym.eval.output_dir.owned_entries`.

    Raises:
        FileExistsError: ``out`` is a file, or a non-empty directory that is not a sweep's
            (the message names it and a few of its entries).
    """
    from diloco_gym.eval.output_dir import owned_entries

    owned_entries(
        out,
        CELLS_FILE,
        "a sweep's directory",
        "choose another --out or empty it (a sweep resumes only its own directory)",
    )


def _run_sweep(
    spec: SweepSpec,
    out: Path,
    backend: str,
    jobs: int | None,
    ray_address: str | None,
    progress: bool,
    retry_failed: bool,
    max_cells: int | None,
) -> dict[str, Any]:
    """:func:`run_sweep` with the output's lock held."""
    check_sweep_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    store = CellStore(out / CELLS_FILE)
    plan, cells = _plan_cells(spec)
    todo = [
        k for k in cells if k not in store.records or (retry_failed and not store.records[k]["ok"])
    ]
    new = _run_todo(cells, todo, store, max_cells, backend, jobs, ray_address, progress)
    write_outputs(spec, plan, store, out)
    failed = sum(
        1
        for _, c, ks in plan
        for k in [c, *ks]
        if k in store.records and not store.records[k]["ok"]
    )
    complete = all(k in store.records for _, c, ks in plan for k in [c, *ks] if k)
    return {
        "failure_summary": _failure_summary(plan, store),
        "cells": len(cells),
        "run": new,
        "skipped": len(cells) - len(todo),
        "failed": failed,
        "complete": complete,
        "out": out,
    }


def _failure_summary(plan: list, store: CellStore, shown: int = 3) -> str:
    """The distinct errors of the failed cells, most frequent first, each with its count and
    the points it hit: one line."""
    by_error: dict[str, list[int]] = {}
    for pt, c, ks in plan:
        for k in [c, *ks]:
            rec = store.records.get(k) if k else None
            if rec is not None and not rec["ok"]:
                by_error.setdefault(rec["error"], []).append(pt.index)
    ranked = sorted(by_error.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    parts = [
        f"{len(points)}x {error} (point(s) {', '.join(map(str, sorted(set(points))))})"
        for error, points in ranked[:shown]
    ]
    if len(ranked) > shown:
        parts.append(f"and {len(ranked) - shown} other error(s)")
    return "; ".join(parts)


def _plan_cells(
    spec: SweepSpec,
) -> tuple[list[tuple[SweepPoint, str | None, list[str]]], dict[str, Any]]:
    """Each point's cells, keyed by fingerprint: ``(plan, cells)``, the plan one ``(point,
    calibration key, unit keys)`` per point. Every point is planned before any cell runs;
    points that cannot be planned (a trace too short for its window...) raise one
    :class:`SweepDataError` naming each of them."""
    from diloco_gym.eval.cells import ReportCell, regime_plan

    plan: list[tuple[SweepPoint, str | None, list[str]]] = []
    cells: dict[str, Any] = {}
    bad: list[str] = []
    for pt in spec.points:
        if spec.fleet:  # a cell per episode, and the fleet's calibration
            cal_key, keys, point_cells = fleet_points.fleet_point_cells(pt.config)
            for key, cell in point_cells.items():
                cells.setdefault(key, cell)
            plan.append((pt, cal_key, keys))
            continue
        env = tuple(sorted(pt.env.items()))
        try:
            units = regime_plan(pt.config, pt.regime, env=pt.env)[0]
        except (ValueError, KeyError, OSError) as exc:
            text = " ".join(str(exc.args[0] if isinstance(exc, KeyError) else exc).split())
            bad.append(f"point {pt.index} ({describe(pt.params)}): {text}")
            continue
        cal_cfg = {k: v for k, v in asdict(pt.config).items() if k not in _NOT_CALIBRATION}
        cal_key = "cal/" + _fingerprint(cal_cfg, pt.regime, env)
        cells.setdefault(cal_key, ReportCell(pt.config, pt.regime, None, env))
        keys = []
        for i in range(len(units)):
            unit_cfg = {k: v for k, v in asdict(pt.config).items() if k not in _NOT_CELL}
            key = "unit/" + _fingerprint(unit_cfg, pt.regime, env, i)
            cells.setdefault(key, ReportCell(pt.config, pt.regime, i, env))
            keys.append(key)
        plan.append((pt, cal_key, keys))
    if bad:
        raise SweepDataError(
            f"{spec.path}: {len(bad)} of {len(spec.points)} point(s) cannot run, nothing was "
            f"run: {'; '.join(bad)}"
        )
    return plan, cells


def _run_todo(
    cells: dict[str, Any],
    todo: list[str],
    store: CellStore,
    max_cells: int | None,
    backend: str,
    jobs: int | None,
    ray_address: str | None,
    progress: bool,
) -> int:
    """Run the ``todo`` cells on the backend, storing each the moment it finishes (its
    error too); stops after ``max_cells``. Returns how many were stored."""
    from diloco_gym.backends import CellError, run_cells

    new = 0

    def stored(i: int, res: Any) -> None:
        nonlocal new
        key = todo[i]
        if isinstance(res, CellError):
            store.add({"key": key, "ok": False, "error": str(res)})
        else:
            store.add(
                {
                    "key": key,
                    "ok": True,
                    "result": {"rows": res["rows"]} if key.startswith("unit/") else res,
                }
            )
        new += 1
        if max_cells is not None and new >= max_cells and new < len(todo):
            raise _Stop

    from diloco_gym.eval.cells import release_cached

    try:
        run_cells(
            run_sweep_cell,
            [cells[k] for k in todo],
            backend=backend,
            jobs=jobs,
            ray_address=ray_address,
            progress=progress,
            desc="sweep",
            on_result=stored,
            capture_errors=True,
        )
    except _Stop:
        pass
    finally:
        release_cached()  # this process's sealed agents' workers end with the run
    return new
