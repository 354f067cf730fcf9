"""The calibration file's content from a run (:mod:`diloco_gym.live.document`): a valid
calibration, undefined effect sizes, out-of-range fits, no machine paths, the reasons a run
is uncertain, and the schema's intervals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from diloco_gym.eval.calibration import (
    CalibrationFileError,
    load_calibration,
    measured_intervals,
    transfer_verdict,
    validate_calibration,
)
from diloco_gym.live.calibrate import (
    CalibrationConfig,
)
from diloco_gym.live.document import build_document, finite

from .helpers import synthetic_document_run


@pytest.mark.parametrize("no_pressure", [False, True])
def test_document_of_a_run_is_a_valid_calibration(no_pressure):
    """The document of a complete run validates; an effect size whose class is empty is
    written as 1.0, listed under ``undefined`` and named in the note, without an interval."""
    from diloco_gym.eval.calibration import validate_calibration

    cfg = CalibrationConfig(bootstrap_resamples=50)
    doc = finite(build_document(synthetic_document_run(no_pressure), True, cfg))
    validate_calibration(doc, "synthetic")
    entry = doc["regimes"]["ordinary"]
    assert list(doc)[:3] == ["source", "regimes", "complete"] and doc["complete"] is True
    assert doc["requests"]["ok"] == 240 and doc["measured"]["intervals"]["repeats"] == 2
    assert entry["p95_sync_ratio"] == doc["measured"]["p95_sync_ratio"] > 1.5
    assert "p95_sync_ratio_ci" in entry and doc["fitted_sidecar"]
    if no_pressure:
        assert entry["p95_high_low"] == 1.0 and entry["undefined"] == ["p95_high_low"]
        assert "p95_high_low_ci" not in entry
        assert entry["note"] == (
            "live calibration; undefined (empty class), written as 1.0: p95_high_low"
        )
    else:
        assert "undefined" not in entry and entry["note"] == "live calibration"
        assert entry["p95_high_low"] == doc["measured"]["p95_high_low"]
    partial = build_document(synthetic_document_run(no_pressure), False, cfg, intervals=False)
    assert "(incomplete run)" in partial["regimes"]["ordinary"]["note"]
    assert "p95_sync_ratio_ci" not in partial["regimes"]["ordinary"]


def test_a_server_slower_than_the_slo_is_marked_out_of_range():
    """Every request takes over 5 s against a 1 s SLO: the document says so (``fit``
    and the regime's note), and the command warns (it wrote ``complete: true`` silently)."""

    from diloco_gym.eval.calibration import validate_calibration

    run = synthetic_document_run(False)
    slow = [dataclasses.replace(r, latency_s=r.latency_s + 5.0) for r in run.replayer.snapshot()]
    run.replayer = SimpleNamespace(snapshot=lambda: slow)  # type: ignore[assignment]
    cfg = CalibrationConfig(bootstrap_resamples=20)
    doc = finite(build_document(run, True, cfg))
    validate_calibration(doc, "synthetic")
    assert "SLO" in doc["fit"]["out_of_range"], doc["fit"]
    assert "outside the model's range" in doc["regimes"]["ordinary"]["note"]
    fast = finite(build_document(synthetic_document_run(False), True, cfg))
    assert "out_of_range" not in fast["fit"]


def test_the_document_records_no_machine_paths():
    run = synthetic_document_run(False)
    run.endpoint = {
        "kind": "transformers-serve",
        "model": "/tmp/diloco-gym-engine-abc/llama-1",
        "command": ["/work/venv/bin/transformers", "serve", "/tmp/diloco-gym-engine-abc/llama-1"],
        "url": "http://127.0.0.1:5000",
        "model_config": {"hidden_size": 128},
        "transformers": "5.24.0",
    }
    run.cluster = {"backend": "gloo", "checkpoint": True, "checkpoint_dir": "/tmp/merge-xyz"}
    doc = build_document(run, True, CalibrationConfig(bootstrap_resamples=20))
    text = json.dumps(doc["metadata"])
    assert "/tmp/" not in text and "/venv/" not in text, text
    endpoint = doc["metadata"]["endpoint"]
    assert endpoint["model"] == "llama-1" and "command" not in endpoint
    assert endpoint["url"] == "http://127.0.0.1:5000" and endpoint["model_config"]
    assert doc["metadata"]["merges"] == {"backend": "gloo", "checkpoint": True}


def test_uncertain_run_is_marked_with_each_reason_and_printed():
    """The busy-host run: the probe accepted 16.83 req/s on a retry after a failed step at
    that rate, the control p95 was 4.4 s (0.41 s in the probe at that load), and the
    measured p95 sync ratio 0.836 < 1 while the fitted sync_slowdown was 0.854."""
    from diloco_gym.eval.calibration import validate_calibration
    from diloco_gym.live.document import summary_lines, uncertain_reasons

    steps = [
        {"offered_rps": 8.4, "sustainable": True, "p95_s": 0.30},
        {"offered_rps": 16.83, "sustainable": False, "p95_s": None},
        {"offered_rps": 16.83, "sustainable": True, "p95_s": 0.41},
        {"offered_rps": 33.7, "sustainable": False, "p95_s": None},
    ]
    doc = {
        "capacity": {"capacity_rps": 16.83, "rate_rps": 9.09, "probe": {"steps": steps}},
        "measured": {"p95_control_ms": 4400.0, "p95_sync_ratio": 0.836},
        "fitted_sidecar": {"sync_slowdown": 0.854},
    }
    reasons = uncertain_reasons(doc)
    assert len(reasons) == 3
    assert "unstable capacity probe: the step at 16.830 req/s failed" in reasons[0]
    assert "control p95 4.400 s is 10.7x the probe's 0.410 s at 16.830 req/s" in reasons[1]
    assert "measured p95 sync ratio is 0.836" in reasons[2] and "0.854" in reasons[2]
    # A clean run has none.
    clean = {
        "capacity": {"capacity_rps": 16.83, "rate_rps": 9.09, "probe": {"steps": steps[2:]}},
        "measured": {"p95_control_ms": 600.0, "p95_sync_ratio": 1.4},
        "fitted_sidecar": {"sync_slowdown": 0.854},
    }
    assert uncertain_reasons(clean) == []
    # Printed on the terminal with the summary, and allowed by the file's schema.
    full = {
        "measured": {"p95_sync_ratio": 0.836, "p95_high_low": 1.0, "pressure_latency_corr": 0.1},
        "fitted_sidecar": {"sync_slowdown": 0.854},
        "fit": {"notes": []},
        "uncertain": reasons,
    }
    lines = summary_lines(full)
    assert [ln for ln in lines if ln.startswith("UNCERTAIN: ")] == [
        f"UNCERTAIN: {r}" for r in reasons
    ]
    ref = json.loads(
        (
            Path(__file__).resolve().parents[2] / "tests/fixtures/live_cpu_calibration.json"
        ).read_text()
    )
    ref["uncertain"] = reasons
    validate_calibration(ref, "cal.json")


def test_transfer_verdict_says_uncertain_when_the_interval_is_too_wide():
    sim = {"p95_high_low": 1.2, "p95_sync_ratio": 1.5}
    measured = {"p95_high_low": 1.2, "p95_sync_ratio": 1.52}
    assert transfer_verdict(sim, measured) == "calibrated"
    assert transfer_verdict(sim, measured, interval=None) == "calibrated"  # unchanged
    narrow = {"p95_sync_ratio": (1.49, 1.54)}
    assert transfer_verdict(sim, measured, interval=narrow) == "calibrated"
    wide = {"p95_sync_ratio": (1.1, 2.0)}
    assert transfer_verdict(sim, measured, interval=wide) == "uncertain"
    # an interval reaching the no-effect band makes "uncalibrated" uncertain too
    far = {"p95_high_low": 1.2, "p95_sync_ratio": 1.3}
    assert transfer_verdict(sim, far) == "uncalibrated"
    assert transfer_verdict(sim, far, interval={"p95_sync_ratio": (1.25, 1.35)}) == "uncalibrated"
    assert transfer_verdict(sim, far, interval={"p95_sync_ratio": (1.0, 1.6)}) == "uncertain"
    assert measured_intervals({"p95_sync_ratio": 1.5, "p95_sync_ratio_ci": [1.4, 1.6]}) == {
        "p95_sync_ratio": (1.4, 1.6)
    }
    assert measured_intervals({"p95_sync_ratio": 1.5}) == {}


def test_schema_accepts_intervals_and_capacity_and_rejects_bad_ones(tmp_path):
    doc = {
        "source": "live",
        "regimes": {
            "sync-heavy": {
                "p95_high_low": 1.1,
                "p95_sync_ratio": 1.3,
                "p95_sync_ratio_ci": [1.1, 1.6],
            }
        },
        "capacity": {
            "capacity_rps": 3.2,
            "target_utilization": 0.5,
            "utilization": 0.49,
            "rate_rps": 1.6,
            "rate_source": "x",
            "probe": {"steps": []},
        },
    }
    validate_calibration(doc, "f.json")
    bad = json.loads(json.dumps(doc))
    bad["regimes"]["sync-heavy"]["p95_sync_ratio_ci"] = [1.1, 1.2, 1.3]
    with pytest.raises(CalibrationFileError, match="2 to 2 items, got 3"):
        validate_calibration(bad, "f.json")
    bad = json.loads(json.dumps(doc))
    bad["capacity"]["target_utilization"] = 1.5
    with pytest.raises(CalibrationFileError, match="capacity.target_utilization"):
        validate_calibration(bad, "f.json")
    # the shipped reference file (without the new fields) still loads
    assert load_calibration().regimes


def test_a_spoiled_live_measurement_skips_with_the_reason_and_nothing_else_does(tmp_path):
    """The live tests' ``check_measured``: a p95 ratio that the consistency check calls
    implausible (a loaded machine's short run) is a skip that quotes the check; any other
    refusal of the file still fails."""
    import copy

    from diloco_gym.eval.calibration import CalibrationFileError, load_calibration

    from .helpers import check_measured

    cfg = CalibrationConfig(bootstrap_resamples=20)
    doc = finite(build_document(synthetic_document_run(False), True, cfg))

    def written(d: dict) -> Path:
        path = tmp_path / f"cal{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(d))
        return path

    assert check_measured(load_calibration, written(doc)).complete is True
    spoiled = copy.deepcopy(doc)
    entry = next(iter(spoiled["regimes"].values()))
    entry["p95_sync_ratio"] = 0.3
    entry.pop("p95_sync_ratio_ci", None)
    with pytest.raises(pytest.skip.Exception, match="invalid on this machine.*implausible"):
        check_measured(load_calibration, written(spoiled))
    broken = copy.deepcopy(doc)
    broken["complete"], broken["error"] = True, "the server died"
    with pytest.raises(CalibrationFileError, match="complete: true"):
        check_measured(load_calibration, written(broken))
