"""The fleet report runs as the single host's does (``run_protocol``: a calibration cell
and a cell per episode, diloco_gym/eval/fleet.py ``fleet_cells``/``fleet_cell``): every
backend gives the serial report's rows and summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from diloco_gym.eval.cells import run_report_cells
from diloco_gym.eval.fleet import (
    FleetReportConfig,
    fleet_cell,
    fleet_cells,
    fleet_result,
    run_fleet_report,
)
from diloco_gym.eval.report import run_protocol, write_report

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fleet-v1", "fleet-rounds", "fleet-links", "fleet-cap"])
def test_a_process_pool_gives_the_serial_reports_rows(name):
    """One-instant, per-site timing, changing links and a site cap: the process pool's rows
    and summary are the serial report's, with the agents sealed in the workers."""
    cfg = FleetReportConfig(
        fleet=str(EXAMPLES / f"{name}.toml"),
        agents=["online-forecast", "pressure-gate"],
        seeds=3,
        draws=20,
    )
    serial = run_protocol(cfg)
    pool = run_protocol(cfg, backend="processes", jobs=2)
    pd.testing.assert_frame_equal(serial["rows"], pool["rows"])
    pd.testing.assert_frame_equal(serial["summary"], pool["summary"])
    assert list(pool["rows"]["seed"]) == [0, 0, 1, 1, 2, 2]


def test_a_cell_is_one_episodes_rows_in_agent_order():
    cfg = FleetReportConfig(
        fleet=str(EXAMPLES / "fleet-v1.toml"),
        agents=["pressure-gate", "online-forecast"],
        seeds=2,
        draws=10,
        seed0=3,
        in_process_agents=True,
    )
    cells = fleet_cells(cfg)
    assert [c.unit for c in cells] == [None, 0, 1]
    assert Path(cells[0].config.fleet).is_absolute()
    rows = fleet_cell(cells[2])["rows"]
    assert [r["agent"] for r in rows] == ["pressure-gate", "online-forecast"]
    assert {r["seed"] for r in rows} == {4}
    calibration = fleet_cell(cells[0])
    assert set(calibration) == {"verdict", "rows"} and len(calibration["rows"]) == 4
    done = run_report_cells(fleet_cell, cells)
    assert done[2]["rows"] == rows
    want = run_protocol(cfg, progress=False)
    got = fleet_result(cfg, done)
    pd.testing.assert_frame_equal(got["rows"], want["rows"])
    pd.testing.assert_frame_equal(got["summary"], want["summary"])
    assert list(want["rows"]["seed"]) == [3, 3, 4, 4]


def test_the_old_fleet_runner_warns_and_gives_the_reports_result(tmp_path):
    """``run_fleet_report`` is kept for one release: a FutureWarning, then the result of
    ``run_protocol``; a fleet result is written by the report's writer as a fleet report."""
    cfg = FleetReportConfig(
        fleet=str(EXAMPLES / "fleet-v1.toml"),
        agents=["online-forecast"],
        seeds=2,
        draws=10,
        in_process_agents=True,
    )
    with pytest.warns(FutureWarning, match="run_protocol"):
        old = run_fleet_report(cfg)
    new = run_protocol(cfg, progress=False)
    pd.testing.assert_frame_equal(old["rows"], new["rows"])
    pd.testing.assert_frame_equal(old["summary"], new["summary"])
    out = write_report(new, tmp_path / "r")
    assert (out / "report.md").read_text().startswith("# Fleet report")
