"""Calibration files are read strictly: nothing contradictory or impossible is accepted, a
byte-order mark changes nothing, a file that measured nothing is refused, a slower-than-SLO
fit is marked out of range, and a file records no machine paths."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from diloco_gym.eval import calibration as cal

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "live_cpu_calibration.json"
BASE = json.loads(FIXTURE.read_text())


def _write(tmp_path: Path, doc: dict | None = None, text: str | None = None, **kw) -> Path:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc) if text is None else text, encoding=kw.get("enc", "utf-8"))
    return path


def _doc(mutate) -> dict:
    doc = copy.deepcopy(BASE)
    mutate(doc)
    return doc


def _refused(path: Path, field: str | None, match: str) -> str:
    with pytest.raises(cal.CalibrationFileError) as err:
        cal.load_calibration(path)
    msg = str(err.value)
    assert msg.startswith(str(path)), msg
    assert err.value.field == field, (err.value.field, msg)
    assert re.search(match, msg), msg
    return msg


def test_the_shipped_fixture_loads():
    calib = cal.load_calibration(FIXTURE)
    assert calib.complete and calib.out_of_range is None
    assert calib.regimes["sync-heavy"]["p95_sync_ratio"] == pytest.approx(3.6344681006915796)


def test_duplicate_keys_are_refused(tmp_path):
    """``p95_sync_ratio`` 1.4 then 999 used 999; ``complete`` false then true gave
    complete."""
    text = json.dumps(BASE).replace(
        '"p95_sync_ratio": 3.6344681006915796', '"p95_sync_ratio": 1.4, "p95_sync_ratio": 999', 1
    )
    _refused(_write(tmp_path, text=text), None, "duplicate key 'p95_sync_ratio'")
    text = json.dumps(_doc(lambda d: d.pop("complete"))).replace(
        '"source":', '"complete": false, "complete": true, "source":', 1
    )
    _refused(_write(tmp_path, text=text), None, "duplicate key 'complete'")


def test_complete_beside_an_error_is_refused(tmp_path):
    path = _write(tmp_path, _doc(lambda d: d.update(error="endpoint refused", complete=True)))
    _refused(path, "error", "complete: true but records an error")
    partial = _write(tmp_path, _doc(lambda d: d.update(error="endpoint refused", complete=False)))
    assert not cal.load_calibration(partial).complete  # a partial file may carry its error


@pytest.mark.parametrize(
    ("ci", "match"),
    [([5.0, 0.5], r"\[5.0, 0.5\] is reversed"), ([5.0, 6.0], "does not contain its point")],
)
def test_impossible_intervals_are_refused(tmp_path, ci, match):
    path = _write(tmp_path, _doc(lambda d: d["regimes"]["sync-heavy"].update(p95_sync_ratio_ci=ci)))
    _refused(path, "regimes.sync-heavy.p95_sync_ratio_ci", match)


def test_implausible_ratio_is_refused(tmp_path):
    def low(d):
        d["regimes"]["sync-heavy"].update(p95_sync_ratio=0.01)
        d["regimes"]["sync-heavy"].pop("p95_sync_ratio_ci")

    _refused(_write(tmp_path, _doc(low)), "regimes.sync-heavy.p95_sync_ratio", "implausible")


def test_a_file_that_measured_nothing_is_refused_unless_allowed(tmp_path):
    path = _write(tmp_path, _doc(lambda d: d.update(regimes={}, complete=False)))
    _refused(path, "regimes", "measured nothing")
    calib = cal.load_calibration(path, allow_empty=True)
    assert calib.regimes == cal.load_calibration().regimes  # the reference's numbers


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        ([{"start_s": "x"}], "schedule[0]"),
        ([{"start_s": 1.0, "length_s": -4.0}], "schedule[0].length_s"),
        (
            [{"start_s": 9.0, "length_s": 4.0}, {"start_s": 2.0, "length_s": 4.0}],
            "schedule[1].start_s",
        ),
        (["garbage"], "schedule[0]"),
    ],
)
def test_a_garbage_schedule_is_refused(tmp_path, schedule, field):
    path = _write(tmp_path, _doc(lambda d: d.update(schedule=schedule)))
    with _no_warning():
        _refused(path, field, ".")


class _no_warning:
    """No warning may escape (a raw NumPy RuntimeWarning did, for a garbage schedule)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def test_a_non_finite_trace_rate_is_refused_naming_the_file(tmp_path):
    path = _write(tmp_path, _doc(lambda d: d["metadata"]["trace"].update(rate_rps=1e300)))
    _refused(path, "metadata.trace.rate_rps", "finite number")


def test_a_tail_that_leaves_no_episode_is_refused_naming_the_file(tmp_path):
    path = _write(tmp_path, _doc(lambda d: d["fitted_sidecar"].update(tail_s=3600.0)))
    _refused(path, "fitted_sidecar.tail_s", "leaves no room for an episode")


def test_a_bom_changes_nothing(tmp_path):
    """A BOM-prefixed live file loaded but dropped its measured utilisation and merge plan
    (the simulated sync ratio moved from 4.92 to 8.17)."""
    plain = FIXTURE
    bom = tmp_path / "bom.json"
    bom.write_text(FIXTURE.read_text(), encoding="utf-8-sig")
    assert bom.read_bytes()[:3] == b"\xef\xbb\xbf"
    a, b = cal.load_calibration(plain), cal.load_calibration(bom)
    assert a.regimes == b.regimes and a.fitted_sidecar == b.fitted_sidecar
    assert cal.measured_merge_plan(bom) == cal.measured_merge_plan(plain) is not None
    fitted = a.fitted_sidecar
    assert fitted is not None
    u = cal.measured_utilization(plain, fitted)
    assert u is not None and cal.measured_utilization(bom, fitted) == u


def test_live_fields_are_never_read_leniently(tmp_path):
    """An unreadable file is an error, never an empty document (the parse error was
    swallowed)."""
    broken = _write(tmp_path, text='{"source": "x", "regimes": {')
    with pytest.raises(cal.CalibrationFileError, match="not valid JSON"):
        cal.measured_merge_plan(broken)
    with pytest.raises(cal.CalibrationFileError, match="cannot read"):
        cal.measured_merge_plan(tmp_path / "missing.json")


def test_a_slower_than_slo_fit_is_marked_out_of_range(tmp_path):
    path = _write(tmp_path, _doc(lambda d: d["fitted_sidecar"].update(ttft_ms=5002.0)))
    calib = cal.load_calibration(path)
    assert calib.out_of_range and "SLO" in calib.out_of_range and "5,002" in calib.out_of_range


def test_calibration_files_hold_no_machine_paths():
    """The shipped fixture (and what calibrate writes, tests/live) names no temporary
    directory or virtual-environment executable."""
    text = FIXTURE.read_text()
    for needle in ("/tmp/", "/venv/", "/bin/", "/home/", "checkpoint_dir", '"command"'):
        assert needle not in text, needle
    endpoint = BASE["metadata"]["endpoint"]
    assert endpoint["model_config"] and endpoint["transformers"] and endpoint["torch"]
