"""Where a run's measurements go (:mod:`diloco_gym.live.output`): the partial path beside
the target, atomic writes of JSON-safe documents, and a failed save that never masks the
error being handled."""

from __future__ import annotations

import json
import math

import numpy as np

from diloco_gym.live.config import CalibrationConfig
from diloco_gym.live.output import (
    CalibrationResult,
    partial_path,
    save_document,
    save_partial,
    write_atomic,
)
from diloco_gym.live.state import RunState


def test_the_partial_file_lies_beside_the_target(tmp_path):
    assert partial_path(tmp_path / "cal.json") == tmp_path / "cal.partial.json"
    assert partial_path(tmp_path / "CAL.JSON") == tmp_path / "CAL.partial.json"
    assert partial_path(tmp_path / "cal") == tmp_path / "cal.partial.json"


def test_atomic_write_makes_the_document_json_safe_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "deep" / "cal.json"
    write_atomic(out, {"nan": float("nan"), "inf": math.inf, "n": np.int64(3), "ok": np.True_})
    assert json.loads(out.read_text()) == {"nan": None, "inf": None, "n": 3, "ok": True}
    write_atomic(out, {"second": 1})  # replaces the file whole
    assert json.loads(out.read_text()) == {"second": 1}
    assert [p.name for p in out.parent.iterdir()] == ["cal.json"]


def test_a_run_that_measured_nothing_still_saves_a_partial_file(tmp_path):
    run = RunState(t0=0.0, started_utc="2026-01-01T00:00:00+00:00", label="sync-heavy")
    run.error = "the endpoint refused"
    doc = save_document(tmp_path / "p.json", run, False, CalibrationConfig(), intervals=False)
    assert doc["complete"] is False and doc["error"] == "the endpoint refused"
    assert doc["regimes"] == {} and doc["requests"]["planned"] == 0
    assert json.loads((tmp_path / "p.json").read_text())["stage"] == "setup"


def test_a_failed_partial_save_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder should be
    lines: list[str] = []
    run = RunState(t0=0.0, started_utc="now")
    assert not save_partial(blocker / "p.json", run, CalibrationConfig(), lines.append)
    assert len(lines) == 1 and lines[0].startswith("could not save the partial measurements")
    assert save_partial(tmp_path / "p.json", run, CalibrationConfig(), lines.append)
    assert lines[-1] == f"partial measurements saved to {tmp_path / 'p.json'} (complete: false)"


def test_the_result_reads_its_document():
    result = CalibrationResult("c.json", {"complete": True, "fit": {"out_of_range": "slow"}})
    assert result.complete and result.out_of_range == "slow"
    assert (result.measured, result.fitted_sidecar) == ({}, {})
    assert not CalibrationResult("c.json", {}).complete
