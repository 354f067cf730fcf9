"""The fleet report's episodes on the single host's backends (diloco_gym/eval/fleet.py,
``run_fleet_cells``): every backend gives the serial report's rows and summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from diloco_gym.eval.fleet import (
    FleetCell,
    FleetReportConfig,
    fleet_episode_cell,
    run_fleet_cells,
    run_fleet_report,
)

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
    serial = run_fleet_report(cfg)
    pool = run_fleet_report(cfg, backend="processes", jobs=2)
    pd.testing.assert_frame_equal(serial["rows"], pool["rows"])
    pd.testing.assert_frame_equal(serial["summary"], pool["summary"])
    assert list(pool["rows"]["seed"]) == [0, 0, 1, 1, 2, 2]


def test_a_cell_is_one_episodes_rows_in_agent_order():
    cfg = FleetReportConfig(
        fleet=str(EXAMPLES / "fleet-v1.toml"),
        agents=["pressure-gate", "online-forecast"],
        seeds=2,
        draws=10,
        in_process_agents=True,
    )
    rows = fleet_episode_cell(FleetCell(cfg, 1))
    assert [r["agent"] for r in rows] == ["pressure-gate", "online-forecast"]
    assert {r["seed"] for r in rows} == {1}
    both = run_fleet_cells(cfg, [0, 1], "serial")
    pd.testing.assert_frame_equal(pd.DataFrame(both[2:]), pd.DataFrame(rows))
    want = run_fleet_report(cfg)["rows"]
    pd.testing.assert_frame_equal(pd.DataFrame(both), want)
