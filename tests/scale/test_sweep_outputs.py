"""diloco_gym/scale/sweep_outputs.py: a point's description, a grid value as a cell, and a
sweep's output files before any cell ran (every point noted, nothing summarised). Outputs
of run sweeps are checked with the runs (``tests/scale/test_sweep*.py``)."""

from __future__ import annotations

import pandas as pd

from diloco_gym.scale.store import CellStore
from diloco_gym.scale.sweep import load_sweep
from diloco_gym.scale.sweep_outputs import cell_value, describe, write_outputs


def test_a_point_is_described_by_its_grid_values():
    assert describe({}) == "the only point"
    assert describe({"regime": "bursty", "merge_budget": 8}) == "regime=bursty, merge_budget=8"


def test_a_list_value_is_one_cell():
    assert cell_value(["fixed-512", "pressure-gate"]) == "fixed-512 pressure-gate"
    assert cell_value(8) == 8 and cell_value("bursty") == "bursty"


def test_outputs_before_any_cell_ran_note_every_point(tmp_path):
    from diloco_gym.scale import sweep

    (tmp_path / "s.toml").write_text(
        'name = "s"\nagents = ["fixed-512"]\nseeds = 2\ndraws = 10\n'
        '[grid]\nregime = ["bursty", "ordinary"]\n'
    )
    spec = load_sweep(tmp_path / "s.toml")
    plan, _ = sweep._plan_cells(spec)
    out = tmp_path / "out"
    out.mkdir()
    write_outputs(spec, plan, CellStore(out / "cells.jsonl"), out)
    assert pd.read_csv(out / "errors.csv").empty
    assert (out / "results.csv").read_text().strip() == ""  # no rows yet
    md = (out / "summary.md").read_text()
    for point, regime in ((0, "bursty"), (1, "ordinary")):
        assert f"point {point} (regime={regime}): 3 cell(s) not run yet" in md


def test_a_points_failed_missing_and_stored_cells(tmp_path):
    """A failed cell is an error row, a missing one a note; a point with fewer than 2 units
    stored has its rows but no summary."""
    from diloco_gym.scale import sweep

    (tmp_path / "s.toml").write_text(
        'name = "s"\nagents = ["fixed-512"]\nseeds = 3\ndraws = 10\nregime = "bursty"\n'
    )
    spec = load_sweep(tmp_path / "s.toml")
    plan, cells = sweep._plan_cells(spec)
    (_, cal_key, keys) = plan[0]
    out = tmp_path / "out"
    out.mkdir()
    store = CellStore(out / "cells.jsonl")
    store.add({"key": cal_key, "ok": True, "result": sweep.run_sweep_cell(cells[cal_key])})
    rows = sweep.run_sweep_cell(cells[keys[0]])["rows"]  # what the sweep stores of a unit
    store.add({"key": keys[0], "ok": True, "result": {"rows": rows}})
    store.add({"key": keys[1], "ok": False, "error": "ValueError: boom"})
    write_outputs(spec, plan, store, out)
    errors = pd.read_csv(out / "errors.csv")
    assert errors[["cell", "error"]].values.tolist() == [["unit 1", "ValueError: boom"]]
    assert len(pd.read_csv(out / "results.csv")) == 1  # unit 0's row
    md = (out / "summary.md").read_text()
    assert "point 0 (the only point): 1 cell(s) not run yet" in md
    assert "point 0 (the only point): no summary (fewer than 2 units)" in md
