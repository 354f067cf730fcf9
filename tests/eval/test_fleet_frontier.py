"""The budget frontier on a fleet (diloco_gym/eval/fleet_frontier.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.fleet_frontier import (
    FleetFrontierConfig,
    gap_captured,
    run_fleet_frontier,
    write_fleet_frontier,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"


def _config() -> FleetFrontierConfig:
    report = FleetReportConfig(
        fleet=str(EXAMPLE), agents=["pressure-gate"], seeds=2, draws=20, in_process_agents=True
    )
    return FleetFrontierConfig(report=report, budgets=[60, 40])


def test_fleet_frontier_outputs_matched_syncs_and_determinism(tmp_path):
    a = run_fleet_frontier(_config())
    f = a["frontier"]
    assert list(f["budget"]) == [40, 60]
    # every episode has exactly the budget's syncs; matched random is drawn at that count
    assert (a["rows"]["syncs"] == a["rows"]["budget"]).all()
    assert (f["oracle_same_budget_pct"] <= f["matched_random_mean"] + 1e-9).all()
    write_fleet_frontier(a, tmp_path / "one")
    write_fleet_frontier(run_fleet_frontier(_config()), tmp_path / "two")
    for name in ("frontier.csv", "frontier.json", "frontier.md", "frontier.png"):
        assert (tmp_path / "one" / name).is_file()
    png = (tmp_path / "one" / "frontier.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    # two panels side by side: 11 x 4.8 inches at 90 dpi
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (990, 432)
    assert "![fleet frontier](frontier.png)" in (tmp_path / "one" / "frontier.md").read_text()
    # the configuration records the report's env, not the first budget's merge_budget
    saved = json.loads((tmp_path / "one" / "frontier.json").read_text())
    assert saved["config"]["env"] == {} and saved["config"]["budgets"] == [40, 60]
    one = (tmp_path / "one" / "frontier.csv").read_bytes()
    assert one == (tmp_path / "two" / "frontier.csv").read_bytes()
    with pytest.raises(FileExistsError):
        write_fleet_frontier(a, tmp_path / "one")


def test_fleet_frontier_config_errors():
    report = _config().report
    with pytest.raises(ValueError, match="at least one budget"):
        FleetFrontierConfig(report=report, budgets=[])
    with pytest.raises(ValueError, match="integers >= 1"):
        FleetFrontierConfig(report=report, budgets=[0, 4])
    with pytest.raises(ValueError, match="distinct"):
        FleetFrontierConfig(report=report, budgets=[4, 4])


def test_gap_captured():
    assert gap_captured(agent=1.0, random=2.0, oracle=0.0) == 0.5
    assert math.isnan(gap_captured(agent=1.0, random=1.0, oracle=1.0))
