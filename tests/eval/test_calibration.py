"""Calibration files: one schema (data/calibration.schema.json), errors that name the field.

Modules under test (diloco_gym/eval/calibration/): schema.py and files.py here,
consistency.py here and in test_calibration_strict.py, transfer.py in
test_calibration_targets.py.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from diloco_gym.eval.calibration import (
    CalibrationFileError,
    calibration_schema,
    load_calibration,
    validate_calibration,
)
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.sidecar import SidecarParams

GOOD = {"source": "test", "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 1.5}}}


def _write(tmp_path, content) -> str:
    path = tmp_path / "cal.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _with(**changes) -> dict:
    doc = json.loads(json.dumps(GOOD))
    doc.update(changes)
    return doc


BAD = [
    # (id, document, field named, message fragment)
    (
        "cycle",
        _with(
            regimes={
                "bursty": {"calibrated_on": "non-periodic"},
                "non-periodic": {"calibrated_on": "bursty"},
            }
        ),
        "regimes.bursty.calibrated_on",
        "cycle (bursty -> non-periodic -> bursty)",
    ),
    (
        "self-cycle",
        _with(regimes={"bursty": {"calibrated_on": "bursty"}}),
        "regimes.bursty.calibrated_on",
        "cycle",
    ),
    ("regimes-list", _with(regimes=[{"p95_high_low": 1.0}]), "regimes", "must be an object"),
    (
        "entry-number",
        _with(regimes={"ordinary": 1.5}),
        "regimes.ordinary",
        "must be an object, got 1.5",
    ),
    (
        "complete-string",
        _with(complete="false"),
        "complete",
        'must be a JSON boolean (true or false), got "false"',
    ),
    ("complete-number", _with(complete=0), "complete", "JSON boolean"),
    (
        "unknown-regime",
        _with(regimes={"sync_heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 1.0}}),
        "regimes",
        "unknown key 'sync_heavy'; valid keys: ordinary, pressure-heavy, sync-heavy",
    ),
    (
        "huge-slowdown",
        _with(fitted_sidecar={"sync_slowdown": 1e300}),
        "fitted_sidecar.sync_slowdown",
        "outside the documented range [0, 100]",
    ),
    (
        "zero-slots",
        _with(fitted_sidecar={"slots": 0}),
        "fitted_sidecar.slots",
        "outside the documented range (0, 100000]",
    ),
    (
        "unknown-sidecar-field",
        _with(fitted_sidecar={"speed": 1.0}),
        "fitted_sidecar.speed",
        "fitted_sidecar has unknown field 'speed'; valid fields: ttft_ms",
    ),
    ("fitted-list", _with(fitted_sidecar=[1]), "fitted_sidecar", "an object or null"),
    (
        "huge-ratio",
        _with(regimes={"ordinary": {"p95_high_low": 1.0, "p95_sync_ratio": 1e9}}),
        "regimes.ordinary.p95_sync_ratio",
        "outside the documented range",
    ),
    (
        "nan-ratio",
        '{"source": "x", "regimes": {"ordinary": {"p95_high_low": NaN, "p95_sync_ratio": 1}}}',
        "regimes.ordinary.p95_high_low",
        "not a finite number",
    ),
    (
        "bool-ratio",
        _with(regimes={"ordinary": {"p95_high_low": True, "p95_sync_ratio": 1}}),
        "regimes.ordinary.p95_high_low",
        "must be a number",
    ),
    (
        "corr-out-of-range",
        _with(
            regimes={
                "ordinary": {"p95_high_low": 1, "p95_sync_ratio": 1, "pressure_latency_corr": 2}
            }
        ),
        "regimes.ordinary.pressure_latency_corr",
        "outside",
    ),
    (
        "missing-metric",
        _with(regimes={"ordinary": {"p95_high_low": 1}}),
        "regimes.ordinary.p95_sync_ratio",
        "required field is missing",
    ),
    (
        "calibrated-on-number",
        _with(regimes={"bursty": {"calibrated_on": 3}}),
        "regimes.bursty.calibrated_on",
        "must be a string",
    ),
    ("typo-top-level", _with(complet=False), "complet", "the file has unknown field 'complet'"),
    ("empty-source", _with(source=""), "source", "must not be empty"),
    ("top-level-list", [1, 2], None, "must be an object"),
    ("missing-source", {"regimes": {}}, "source", "required field is missing"),
    ("deep-nesting", "[" * 100000 + "]" * 100000, None, "nested too deeply to parse"),
    (
        "huge-integer-literal",
        '{"source": "x", "regimes": {}, "complete": ' + "9" * 5000 + "}",
        None,
        "not valid JSON",
    ),
    ("complete-null", _with(complete=None), "complete", "JSON boolean"),
    ("source-number", _with(source=5), "source", "must be a string"),
    (
        "undefined-unknown",
        _with(regimes={"ordinary": {"p95_high_low": 1, "p95_sync_ratio": 1, "undefined": ["p50"]}}),
        "regimes.ordinary.undefined[0]",
        "is not one of p95_high_low, p95_sync_ratio",
    ),
]


@pytest.mark.parametrize(
    ("content", "field", "fragment"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_structural_errors_name_the_field(tmp_path, content, field, fragment):
    path = _write(tmp_path, content)
    with pytest.raises(CalibrationFileError) as info:
        load_calibration(path)
    err = info.value
    assert err.path == path and err.field == field
    assert fragment in str(err)
    assert str(err).startswith(path)
    if field is not None:
        assert f"field {field!r}" in str(err) or "unknown field" in str(err)


def test_cycle_through_the_reference_entries_is_caught(tmp_path):
    # The reference has bursty calibrated on sync-heavy; a user file that points sync-heavy
    # back at bursty forms a cycle only once the two are merged.
    path = _write(tmp_path, _with(regimes={"sync-heavy": {"calibrated_on": "bursty"}}))
    with pytest.raises(CalibrationFileError, match="cycle") as info:
        load_calibration(path)
    assert info.value.field == "regimes.sync-heavy.calibrated_on"


def test_complete_flag_is_read_as_a_boolean(tmp_path):
    assert load_calibration(_write(tmp_path, _with(complete=False))).complete is False
    assert load_calibration(_write(tmp_path, _with(complete=True))).complete is True
    assert load_calibration(_write(tmp_path, GOOD)).complete is True  # absent: complete


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode())
    assert load_calibration(path).measured("sync-heavy")["p95_sync_ratio"] == 1.5


def test_error_is_a_value_error_for_old_callers(tmp_path):
    with pytest.raises(ValueError, match="cannot read calibration file"):
        load_calibration(str(tmp_path / "absent.json"))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(CalibrationFileError, match="cannot read"):
        load_calibration(binary)


def test_schema_matches_the_code():
    """The schema's regime names and sidecar fields are the code's, and the shipped
    reference file and every regime's default sidecar pass it."""
    schema = calibration_schema()
    regimes = schema["properties"]["regimes"]
    assert regimes["propertyNames"]["enum"] == list(REGIMES)
    assert regimes["additionalProperties"]["properties"]["calibrated_on"]["enum"] == list(REGIMES)
    sidecar = schema["properties"]["fitted_sidecar"]["properties"]
    assert list(sidecar) == [f.name for f in fields(SidecarParams)]
    load_calibration()
    for name, regime in REGIMES.items():
        doc = _with(
            fitted_sidecar={f.name: getattr(regime.sidecar, f.name) for f in fields(SidecarParams)}
        )
        validate_calibration(doc, name)


def test_fitted_sidecar_in_range_loads(tmp_path):
    cal = load_calibration(
        _write(tmp_path, _with(fitted_sidecar={"sync_slowdown": 0.7, "slots": 4}))
    )
    assert cal.fitted_sidecar == SidecarParams(sync_slowdown=0.7, slots=4)
    assert cal.sidecar_for("bursty") == cal.fitted_sidecar  # bursty is measured on sync-heavy
    assert cal.sidecar_for("ordinary") is None


@pytest.mark.slow
def test_report_announces_an_incomplete_calibration(tmp_path, capsys):
    """An incomplete calibration is said on the terminal and recorded in report.json."""
    from diloco_gym.cli import main

    path = _write(tmp_path, _with(complete=False))
    base = [
        "report",
        "--seeds",
        "2",
        "--regimes",
        "sync-heavy",
        "--agents",
        "fixed-512",
        "--draws",
        "20",
        "--no-progress",
    ]
    assert main([*base, "--out", str(tmp_path / "inc"), "--calibration", path]) == 0
    err = capsys.readouterr().err
    assert err.count("marked incomplete") == 1 and path in err
    assert (
        json.loads((tmp_path / "inc" / "report.json").read_text())["calibration_complete"] is False
    )
    assert main([*base, "--out", str(tmp_path / "ok")]) == 0
    assert "incomplete" not in capsys.readouterr().err
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["calibration_complete"] is True


def test_schema_validation_is_full_json_schema_with_one_line_errors():
    """The schema is checked with the jsonschema library (draft 2020-12): keywords a
    hand-written subset would skip (pattern, const, multipleOf, anyOf) are enforced too,
    and every error stays one line naming the field."""
    from jsonschema import Draft202012Validator

    from diloco_gym.eval.calibration import (
        CalibrationFileError,
        calibration_schema,
        validate_schema,
    )

    Draft202012Validator.check_schema(calibration_schema())  # the shipped schema is valid
    schema = {
        "type": "object",
        "properties": {
            "host": {"type": "string", "pattern": "^[a-z]+$"},
            "version": {"const": 2},
            "step": {"type": "number", "multipleOf": 0.5},
            "mode": {"anyOf": [{"type": "integer"}, {"enum": ["auto"]}]},
        },
    }
    validate_schema({"host": "abc", "version": 2, "step": 1.5, "mode": "auto"}, schema, "f.json")
    for doc, field in (
        ({"host": "ABC"}, "host"),
        ({"version": 3}, "version"),
        ({"step": 0.3}, "step"),
        ({"mode": "manual"}, "mode"),
    ):
        with pytest.raises(CalibrationFileError) as err:
            validate_schema(doc, schema, "f.json")
        assert err.value.field == field and "\n" not in str(err.value)
        assert str(err.value).startswith(f"f.json: field '{field}': ")
    with pytest.raises(CalibrationFileError, match="field 'a.b': NaN is not a finite number"):
        validate_schema({"a": {"b": float("nan")}}, {"type": "object"}, "f.json")


def test_each_consistency_check_family_refuses_its_own_contradiction() -> None:
    """``check_consistency`` is one check per documented family; each refuses its case
    alone, naming the field, and the old import path gives the same function."""
    from diloco_gym.eval import calibration
    from diloco_gym.eval.calibration import consistency as cc

    assert calibration.check_consistency is cc.check_consistency
    cases = [
        (cc.check_completeness, ({"complete": True, "error": "boom"}, "f"), "error"),
        (cc.check_ratios, ({"p95_sync_ratio": 0.2}, "f", "regimes.x"), "regimes.x.p95_sync_ratio"),
        (
            cc.check_ratios,
            ({"p95_sync_ratio": 1.5, "p95_sync_ratio_ci": [1.6, 1.4]}, "f", "regimes.x"),
            "regimes.x.p95_sync_ratio_ci",
        ),
        (cc.check_schedule, ([{"start_s": 5, "length_s": 1}, {"start_s": 1, "length_s": 1}], "f"),
         "schedule[1].start_s"),
        (cc.check_trace_load, ({"metadata": {"trace": {"rate_rps": -1}}}, "f"),
         "metadata.trace.rate_rps"),
    ]  # fmt: skip
    for check, args, field in cases:
        with pytest.raises(CalibrationFileError) as info:
            check(*args)
        assert info.value.field == field, (check.__name__, info.value)
    cc.check_completeness({"complete": False, "error": "boom"}, "f")  # a partial run may
    cc.check_schedule(None, "f")
    cc.check_trace_load({"metadata": {"trace": {"rate_rps": 3.0}}}, "f")
