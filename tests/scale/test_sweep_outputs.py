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
