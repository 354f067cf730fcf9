"""A sweep's output files (:func:`write_outputs`), from the cells stored in its
``cells.jsonl`` (:mod:`diloco_gym.scale.store`): the rows and summary of every point of
:mod:`diloco_gym.scale.sweep`'s plan, single-host and fleet points alike."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from diloco_gym.io import save_atomic, write_text_atomic
from diloco_gym.scale import fleet_points
from diloco_gym.scale.store import CellStore

__all__ = ["write_outputs", "describe", "cell_value"]


def describe(params: dict) -> str:
    """A point by its grid values (``a=1, b=x``; the only point of a sweep without axes)."""
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "the only point"


def cell_value(v: Any) -> Any:
    """A grid value as a table cell (a list: its items joined by spaces)."""
    return " ".join(map(str, v)) if isinstance(v, list) else v


def write_outputs(spec: Any, plan: list, store: CellStore, out: Path) -> None:
    """A sweep's output files from its stored cells (``spec``: its
    :class:`~diloco_gym.scale.sweep.SweepSpec`; ``plan``: each point with its
    calibration key and unit keys): results.csv and .parquet (every point's rows, led by
    the point's columns), summary.csv and summary.md (every point's summary, with Holm
    across every agent of every point), errors.csv (failed cells). A point whose cells are
    not all stored gets a note; a single-host point's summary is the report's over its
    stored units, a fleet point's the fleet report's (:mod:`diloco_gym.scale.fleet_points`)."""
    tables: list[pd.DataFrame] = []
    summaries: list[pd.DataFrame] = []
    errors: list[dict] = []
    notes: list[str] = []
    for pt, cal_key, keys in plan:
        lead = {
            "sweep": spec.name,
            "point": pt.index,
            **{f"grid.{k}": cell_value(v) for k, v in pt.params.items()},
        }
        where = f"point {pt.index} ({describe(pt.params)})"
        unit = "episode" if spec.fleet else "unit"
        named = [("calibration", cal_key), *((f"{unit} {i}", k) for i, k in enumerate(keys))]
        df, table = _stored_rows(named, store, lead, errors, notes, where)
        cal = store.records.get(cal_key)
        summ = None
        if df is not None and _can_summarise(cal, df, f"{unit}s", where, notes):
            assert cal is not None  # for mypy: _can_summarise checked it
            if spec.fleet:
                summ = fleet_points.fleet_point_summary(pt.config, df, cal["result"])
            else:
                summ = _report_summary(pt, df, cal["result"])
            summ = pd.concat([pd.DataFrame([lead] * len(summ)), summ], axis=1)
        tables += [table] if table is not None else []
        summaries += [summ] if summ is not None else []
    results = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    summary = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    if not summary.empty:
        # A sweep compares settings: besides the Holm family of one point (its agents),
        # a correction across every agent of every point.
        from diloco_gym.eval.summary import holm

        summary["p_holm_all_points"] = holm(summary["p_value"].to_numpy())
    write_text_atomic(out / "results.csv", results.to_csv(index=False))
    write_text_atomic(out / "summary.csv", summary.to_csv(index=False))
    error_cols = ["sweep", "point", *(f"grid.{k}" for k in spec.axes), "cell", "error"]
    write_text_atomic(
        out / "errors.csv", pd.DataFrame(errors, columns=error_cols).to_csv(index=False)
    )
    try:
        import pyarrow  # noqa: F401

        save_atomic(lambda tmp: results.to_parquet(tmp, index=False), out / "results.parquet")
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    from diloco_gym.scale.sweep_markdown import sweep_markdown

    text = sweep_markdown(spec.name, spec.path.name, len(spec.points), list(spec.axes), spec.fleet)
    write_text_atomic(out / "summary.md", text(summary, errors, notes))


def _stored_rows(
    named: list[tuple[str, str]],
    store: CellStore,
    lead: dict,
    errors: list[dict],
    notes: list[str],
    where: str,
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """A point's stored rows and its table (the rows led by the point's ``lead`` columns)
    from its cells ``named`` (``(name, key)``, the calibration first); a failed cell is
    appended to ``errors`` and missing ones noted (``where`` names the point). ``(None,
    None)`` without rows."""
    rows: list[dict] = []
    missing = 0
    for name, key in named:
        rec = store.records.get(key)
        if rec is None:
            missing += 1
        elif not rec["ok"]:
            errors.append({**lead, "cell": name, "error": rec["error"]})
        elif key.startswith("unit/"):
            rows.extend(rec["result"]["rows"])
    if missing:
        notes.append(f"{where}: {missing} cell(s) not run yet")
    if not rows:
        return None, None
    df = pd.DataFrame(rows)
    return df, pd.concat([pd.DataFrame([lead] * len(df)), df], axis=1)


def _can_summarise(
    cal: dict | None, df: pd.DataFrame, units: str, where: str, notes: list[str]
) -> bool:
    """Whether a point has a summary: its calibration cell stored and at least 2 units
    (else a note saying which is missing)."""
    if cal is not None and cal["ok"] and df["seed"].nunique() >= 2:
        return True
    why = (
        f"fewer than 2 {units}"
        if cal is not None and cal["ok"]
        else ("its calibration cell is missing or failed")
    )
    notes.append(f"{where}: no summary ({why})")
    return False


def _report_summary(pt: Any, df: pd.DataFrame, cal: dict) -> pd.DataFrame:
    """A single-host point's summary: the report's (:func:`~diloco_gym.eval.summary.summarise`)
    of its rows, with the calibration verdict of its stored calibration cell ``cal``."""
    from diloco_gym.eval import calibration as calibration_mod
    from diloco_gym.eval.summary import summarise

    calib = calibration_mod.load_calibration(pt.config.calibration)
    measured_key = pt.regime if pt.config.trace is None else pt.config.trace_sidecar
    sim = {k: (math.nan if v is None else v) for k, v in cal["sim"].items()}
    measured = calib.measured(measured_key)
    verdict = calibration_mod.transfer_verdict(
        sim, measured, interval=calibration_mod.measured_intervals(measured)
    )
    return summarise(df, {pt.regime: verdict}, pt.config.alpha, pt.config.saturation_pct)
