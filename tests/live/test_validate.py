"""``diloco-gym validate`` end to end, in smoke form (:mod:`diloco_gym.live.validate`): the
three modes in one session against an endpoint and against the built-in engine, on the
env's clock run 20x as fast. These check the outputs' structure and the invariants that
hold whatever the machine's timing, not their values."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from diloco_gym.cli import main
from diloco_gym.eval.protocol import min_achievable_p
from diloco_gym.live.engine import engine_available
from diloco_gym.live.errors import CalibrationError
from diloco_gym.live.replay import RequestRecord
from diloco_gym.live.session import PhaseRun
from diloco_gym.live.validate import (
    ValidateConfig,
    bare,
    run_validation,
    scaled_env,
    violation_pct,
)
from diloco_gym.sim.regimes import get_regime
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import window

from .helpers import fast_config

SMOKE = ValidateConfig(
    calibration_source="sync-heavy",
    duration_s=3.0,
    repeats=2,
    held_out=(("ordinary", 0.5),),
    regime="bursty",
    windows=2,
    window_s=4.0,
    draws=1,
    time_scale=0.05,
    seed=0,
)


def _config(**kw):
    base = dict(
        rate_rps=None,
        warmup_requests=0,
        merge_seconds=0.3,
        gap_seconds=(0.3, 0.5),
        lead_seconds=0.2,
        timeout_s=3.0,
    )
    base.update(kw)
    return fast_config(**base)


def _check_document(doc: dict, out) -> None:
    """What every complete validation document holds, whatever the timings."""
    assert doc["complete"] is True and doc["error"] is None
    on_disk = json.loads(out.read_text())
    assert on_disk["complete"] is True and on_disk["modes"] == list(SMOKE.modes)
    for suffix in (".md", "_fidelity.png", "_verdicts.png"):
        path = out.with_name(out.stem + suffix) if suffix != ".md" else out.with_suffix(".md")
        assert path.is_file() and path.stat().st_size > 0
    assert out.with_name(out.stem + "_fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cal = on_disk["calibration"]
    assert cal["slo_ms"] > 0 and cal["fitted_sidecar"]["slo_ms"] == cal["slo_ms"]
    assert {r["phase"] for r in cal["rows"]} >= {"control", "sync"}
    (setting,) = on_disk["fidelity"]["settings"]
    assert setting["name"] == "ordinary U=0.5" and setting["repeats"] == 2
    metrics = {(r["phase"], r["metric"]) for r in setting["rows"]}
    for phase in ("control", "sync"):
        for metric in ("p50_ms", "p95_ms", "p99_ms", "violation_pct"):
            assert (phase, metric) in metrics
    windows = on_disk["verdicts"]["windows"]
    assert [w["window"] for w in windows] == [0, 1]
    for w in windows:
        kinds = [s["kind"] for s in w["schedules"]]
        assert kinds[:3] == ["agent", "random", "closed-loop"]
        assert sorted(w["order"]) == sorted(["control", "agent", "random-1", "closed-loop"])
        agent, random = w["schedules"][0], w["schedules"][1]
        # matched random: the agent's number of merges, by construction
        assert random["merges"] == agent["merges"] == len(agent["decisions"])
        for s in w["schedules"]:
            assert len(s["recorded_merges_s"]) == s["merges"]  # every planned merge ran
            assert s["live_excess_pp"] == pytest.approx(
                s["live_violation_pct"] - w["control_violation_pct"]
            )
        loop = w["schedules"][2]  # read its telemetry at or after each decision's time
        assert 0 <= loop["decision_lateness_s"]["median"] <= loop["decision_lateness_s"]["max"]
    summary = on_disk["verdicts"]["summary"]
    # Two windows can never reach p < 0.05: inconclusive, never "tied".
    assert summary["windows"] == 2
    assert summary["power"]["min_p"] == min_achievable_p(summary["live"]["nonzero"]) >= 0.5
    assert summary["live"]["verdict"] == "inconclusive (too few windows)"
    assert on_disk["verdicts"]["closed_loop"]["vs_replay"] is not None
    assert set(on_disk["timings_s"]) == {"calibration", "fidelity", "verdicts"}
    page = out.with_suffix(".md").read_text()
    for heading in ("## Calibration", "## Fidelity on held-out settings", "## Verdicts replayed"):
        assert heading in page


def test_all_three_modes_against_an_endpoint(queue_server, tmp_path):
    url = queue_server(slots=4, service_s=0.01)
    out = tmp_path / "v.json"
    doc = run_validation(url, SMOKE, _config(), str(out), capacity_rps=40.0)
    _check_document(doc, out)
    assert doc["endpoint"]["kind"] == "external" and doc["endpoint"]["url"] == url
    assert doc["capacity"]["capacity_source"] == "given"


@pytest.mark.slow
@pytest.mark.skipif(
    not engine_available(), reason='needs the live extra: pip install "diloco-gym[live]"'
)
def test_all_three_modes_against_the_built_in_engine_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "v.json"
    argv = ["validate", "--out", str(out), "--capacity", "4", "--duration", "3",
            "--repeats", "2", "--held-out", "ordinary:0.5", "--windows", "2",
            "--window-seconds", "4", "--draws", "1", "--time-scale", "0.05",
            "--merge-mb", "2", "--merge-seconds", "0.3", "--gap-seconds", "0.3", "0.5",
            "--timeout", "5", "--agent", "fixed-256"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    _check_document(doc, out)
    assert doc["endpoint"]["engine"] == "transformers"
    for w in doc["verdicts"]["windows"]:  # fixed-256: a merge every 32 decisions of 53
        assert w["schedules"][0]["decisions"] == [32]
        assert w["schedules"][2]["decisions"] == [32]  # and so in the closed loop
    assert "wrote" in capsys.readouterr().out


def test_a_failed_run_leaves_its_partial_document(queue_server, tmp_path):
    url = queue_server(slots=1, service_s=0.01, stall_after=3)  # answers 3, then hangs
    out = tmp_path / "v.json"
    cfg = _config(timeout_s=0.5, overload_timeout_fraction=0.1)
    with pytest.raises(CalibrationError) as exc:
        run_validation(url, replace(SMOKE, modes=("fidelity",)), cfg, str(out), capacity_rps=40.0)
    assert not out.exists()
    partial = tmp_path / "v.partial.json"
    assert exc.value.path == str(partial)
    doc = json.loads(partial.read_text())
    assert doc["complete"] is False and "overload" in doc["error"]


def test_live_violations_count_failures_and_late_answers():
    ok = dict(status=200, error="")
    recs = [
        RequestRecord(0, "p", 0.0, 1, 1, send_s=0.0, latency_s=0.1, **ok),
        RequestRecord(1, "p", 0.1, 1, 1, send_s=0.1, latency_s=0.6, **ok),
        RequestRecord(2, "p", 0.2, 1, 1, send_s=0.2, status=0, error="timed out"),
        RequestRecord(3, "p", 0.3, 1, 1, send_s=0.3, latency_s=0.5, **ok),
    ]
    run = PhaseRun("p", 0, 0.0, 1.0, recs)
    assert violation_pct(run, 0.5) == 50.0  # 0.6 s is late, the timeout failed; 0.5 is on time
    assert np.isnan(violation_pct(PhaseRun("p", 0, 0.0, 1.0, []), 0.5))


def test_the_simulated_window_is_the_live_one():
    trace = window(get_regime("bursty")(np.random.default_rng(0)), 0.0, 30.0)
    assert trace.network is not None and trace.network.any()  # the regime has pressure
    b = bare(trace)
    assert not b.network.any() and not b.checkpoint.any()
    np.testing.assert_array_equal(b.arrival_s, trace.arrival_s)
    params, sidecar = scaled_env(replace(SMOKE, time_scale=0.5), SidecarParams(pressure_gain=2.0))
    assert params.step_seconds == pytest.approx(0.07) and params.merge_steps == 57
    assert sidecar.pressure_gain == 0.0 and sidecar.tail_s == pytest.approx(6.0)


def test_verdicts_alone_replay_no_closed_loop_and_no_fidelity(queue_server, tmp_path):
    url = queue_server(slots=4, service_s=0.01)
    out = tmp_path / "v.json"
    vcfg = replace(SMOKE, modes=("verdicts",), windows=1)
    doc = run_validation(url, vcfg, _config(), str(out), capacity_rps=40.0)
    assert doc["fidelity"] is None and doc["verdicts"]["closed_loop"] is None
    (w,) = doc["verdicts"]["windows"]
    assert [s["kind"] for s in w["schedules"]] == ["agent", "random"]
    assert sorted(w["order"]) == ["agent", "control", "random-1"]
    assert set(doc["timings_s"]) == {"calibration", "verdicts"}
    assert not out.with_name("v_fidelity.png").exists()
    assert out.with_name("v_verdicts.png").is_file()


def test_a_missing_bootstrap_interval_is_written_as_null():
    """A short or loaded calibration run may leave the bootstrap without an interval
    (fewer than two repeats, or an empty class): the document says null, not a crash."""
    from diloco_gym.live.validate import interval

    assert interval(None) is None
    assert interval((0.5, float("inf"))) == [0.5, None]
    assert interval([1.0, 2.0]) == [1.0, 2.0]
