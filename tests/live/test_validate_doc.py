"""The validation's output (:mod:`diloco_gym.live.validate_doc`): a schema-checked JSON
document, written atomically, partial runs beside it, a Markdown page."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diloco_gym.live.validate_doc import (
    jsonable,
    load_schema,
    markdown_page,
    validate_document,
    write_outputs,
)
from diloco_gym.sim.sidecar import SidecarParams


def _doc(**kw):
    from dataclasses import asdict

    doc = {
        "format": "diloco-gym-validate",
        "version": 1,
        "complete": True,
        "error": None,
        "command": "diloco-gym validate --modes fidelity",
        "modes": ["fidelity"],
        "config": {},
        "started_utc": "2026-12-06T21:00:00+00:00",
        "elapsed_s": 61.0,
        "endpoint": {"url": "http://127.0.0.1:8000", "model": "m", "kind": "external"},
        "cluster": {},
        "capacity": {"capacity_rps": 4.0},
        "timings_s": {"calibration": 30.0},
        "calibration": {
            "source": "file",
            "slo_ms": 500.0,
            "slo_source": "--slo-ms",
            "fitted_sidecar": asdict(SidecarParams(slo_ms=500.0)),
        },
        "fidelity": None,
        "verdicts": None,
    }
    doc.update(kw)
    return doc


def test_jsonable_turns_numpy_and_non_finite_values_into_json():
    out = jsonable({"a": np.float64(1.5), "b": np.arange(3), "c": float("nan"), 4: (1, math.inf)})
    assert out == {"a": 1.5, "b": [0, 1, 2], "c": None, "4": [1, None]}
    json.dumps(out, allow_nan=False)


def test_the_schema_names_the_first_bad_field():
    assert load_schema()["properties"]["format"]["const"] == "diloco-gym-validate"
    validate_document(jsonable(_doc()))
    with pytest.raises(ValueError, match=r"^x.json: field calibration/slo_ms: "):
        validate_document(
            jsonable(_doc(calibration={**_doc()["calibration"], "slo_ms": -1})), "x.json"
        )
    with pytest.raises(ValueError, match=r"field modes/0: 'bogus' is not one of"):
        validate_document(jsonable(_doc(modes=["bogus"])))
    bad = _doc()
    del bad["endpoint"]
    with pytest.raises(ValueError, match=r"field \(top level\): 'endpoint' is a required"):
        validate_document(jsonable(bad))


def test_a_complete_document_is_written_with_its_page_and_a_stale_partial_goes(tmp_path):
    out = tmp_path / "v.json"
    stale = tmp_path / "v.partial.json"
    stale.write_text("{}")
    written = write_outputs(_doc(), out)
    assert written[:2] == [out, tmp_path / "v.md"]
    assert json.loads(out.read_text())["complete"] is True
    assert not stale.exists()
    page = (tmp_path / "v.md").read_text()
    assert page.startswith("# Simulator fidelity against a real engine")
    assert "## Calibration" not in page  # a file's fit: one line, no calibration section
    assert "a calibration file's fit (not refitted here); SLO 500 ms (--slo-ms)" in page
    assert "took 1.0 min" in page


def test_an_incomplete_document_goes_beside_the_target_never_over_it(tmp_path):
    out = tmp_path / "v.json"
    out.write_text('{"complete": true}')
    written = write_outputs(_doc(complete=False, error="overload"), out)
    assert written == [tmp_path / "v.partial.json"]
    assert json.loads(out.read_text()) == {"complete": True}
    assert json.loads(written[0].read_text())["error"] == "overload"


def test_a_complete_document_that_breaks_the_schema_writes_nothing(tmp_path):
    out = tmp_path / "v.json"
    with pytest.raises(ValueError, match="field version"):
        write_outputs(_doc(version=2), out)
    assert not list(tmp_path.iterdir())


def test_the_page_has_a_calibration_section_for_an_in_session_fit():
    cal = {
        **_doc()["calibration"],
        "source": "sync-heavy",
        "utilization": 0.5,
        "rate_rps": 2.0,
        "repeats": 3,
        "duration_s": 30.0,
        "slo_source": "the calibration's control-phase p99",
    }
    page = "\n".join(markdown_page(jsonable(_doc(calibration=cal))))
    assert "## Calibration" in page
    assert "Fitted on sync-heavy at 0.5 of the capacity (2.00 req/s), 3 sync/control pairs" in page
