"""Effect-size transfer (docs/calibration.md): every regime's default sidecar parameters reproduce
the reference's real-sidecar effect sizes on held-out seeds, and the verdicts follow."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from diloco_gym import REGIMES
from diloco_gym.eval.calibration import (
    TOLERANCE,
    fit_sidecar,
    load_calibration,
    simulated_effect_sizes,
    transfer_verdict,
)

#: The reference's real-sidecar numbers (docs/paper.md#real-sidecar-effect-sizes; high/low,
#: sync ratio).
REFERENCE_TARGETS = {
    "ordinary": (1.00, 1.00),
    "pressure-heavy": (1.546, 1.00),
    "sync-heavy": (1.00, 1.556),
}
#: Bursty and non-periodic take the sync-heavy interference (docs/calibration.md).
TARGET_OF = {
    "ordinary": "ordinary",
    "pressure-heavy": "pressure-heavy",
    "sync-heavy": "sync-heavy",
    "bursty": "sync-heavy",
    "non-periodic": "sync-heavy",
}
#: Seeds the sidecar parameters were not fitted on (the fit uses range(8)).
HELD_OUT = range(100, 108)
EXPECTED_VERDICT = {
    "ordinary": "no measurable SLO effect",
    "pressure-heavy": "no measurable SLO effect",
    "sync-heavy": "calibrated",
    "bursty": "calibrated",
    "non-periodic": "calibrated",
}


@pytest.fixture(scope="module")
def simulated() -> dict[str, dict]:
    return {name: simulated_effect_sizes(name, seeds=HELD_OUT) for name in REGIMES}


def test_shipped_reference_matches_the_spec():
    cal = load_calibration()
    for name, target in TARGET_OF.items():
        measured = cal.measured(name)
        high_low, sync = REFERENCE_TARGETS[target]
        assert measured["p95_high_low"] == pytest.approx(high_low, abs=0.005)
        assert measured["p95_sync_ratio"] == pytest.approx(sync, abs=0.005)
        if target != name:
            assert measured["calibrated_on"] == target


@pytest.mark.parametrize("name", list(REGIMES))
def test_default_parameters_reproduce_the_reference_on_held_out_seeds(name, simulated):
    high_low, sync = REFERENCE_TARGETS[TARGET_OF[name]]
    sim = simulated[name]
    assert sim["p95_high_low"] == pytest.approx(high_low, abs=0.05)
    assert sim["p95_sync_ratio"] == pytest.approx(sync, abs=0.05)


def test_the_interference_shows_where_it_should(simulated):
    """Pressure, not sync, drives latency in pressure-heavy; sync, not pressure, elsewhere."""
    assert simulated["pressure-heavy"]["pressure_latency_corr"] > 0.5
    for name in ("ordinary", "sync-heavy"):
        assert abs(simulated[name]["pressure_latency_corr"]) < 0.1
    for name in REGIMES:
        assert simulated[name]["p95_ms"] > 0


@pytest.mark.parametrize("name", list(REGIMES))
def test_transfer_verdicts(name, simulated):
    cal = load_calibration()
    assert transfer_verdict(simulated[name], cal.measured(name)) == EXPECTED_VERDICT[name]


def test_miscalibrated_parameters_are_caught():
    cal = load_calibration()
    weak = replace(REGIMES["sync-heavy"].sidecar, sync_slowdown=0.2)
    sim = simulated_effect_sizes("sync-heavy", seeds=HELD_OUT, sidecar=weak)
    assert sim["p95_sync_ratio"] < 1.556 - TOLERANCE
    assert transfer_verdict(sim, cal.measured("sync-heavy")) == "uncalibrated"
    # The verdict only looks at the measured sync ratio to call "no measurable effect".
    assert (
        transfer_verdict(
            {"p95_high_low": 3.0, "p95_sync_ratio": 3.0},
            {"p95_high_low": 1.0, "p95_sync_ratio": 1.0},
        )
        == "no measurable SLO effect"
    )
    # A NaN simulated metric (an empty class) is skipped, not a failure.
    assert (
        transfer_verdict(
            {"p95_high_low": float("nan"), "p95_sync_ratio": 1.55},
            {"p95_high_low": 1.0, "p95_sync_ratio": 1.556},
        )
        == "calibrated"
    )


def test_fit_recovers_the_shipped_sync_slowdown():
    measured = load_calibration().measured("sync-heavy")
    fitted = fit_sidecar("sync-heavy", measured, seeds=range(8), iters=10)
    assert fitted.sync_slowdown == pytest.approx(
        REGIMES["sync-heavy"].sidecar.sync_slowdown, abs=0.03
    )
    assert fitted.pressure_gain == 0.0  # measured high/low is 1: no pressure effect


def test_simulated_effect_sizes_are_seeded():
    a = simulated_effect_sizes("bursty", seeds=range(2))
    b = simulated_effect_sizes("bursty", seeds=range(2))
    assert a == b
    c = simulated_effect_sizes("bursty", seeds=range(2, 4))
    assert a != c
    # Without calibrated_on, bursty uses its own (bursty) traces: a different number.
    d = simulated_effect_sizes("bursty", seeds=range(2), calibrated_on=False)
    assert d["p95_sync_ratio"] != a["p95_sync_ratio"]


# --------------------------------------------------------------------------- bad files
def _write(tmp_path, content) -> str:
    path = tmp_path / "cal.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


GOOD = {"source": "test", "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 1.5}}}


@pytest.mark.parametrize(
    "content, field",
    [
        ("{not json", "not valid JSON"),
        ({"regimes": {}}, "source"),
        ({"source": "x"}, "regimes"),
        (
            {"source": "x", "regimes": {"sync-heavy": {"p95_high_low": 1.0}}},
            "regimes.sync-heavy.p95_sync_ratio",
        ),
        (
            {"source": "x", "regimes": {"ordinary": {"p95_high_low": -1.0, "p95_sync_ratio": 1.0}}},
            "regimes.ordinary.p95_high_low",
        ),
        (
            {
                "source": "x",
                "regimes": {"ordinary": {"p95_high_low": "1.0", "p95_sync_ratio": 1.0}},
            },
            "regimes.ordinary.p95_high_low",
        ),
        (
            {"source": "x", "regimes": {"bursty": {"calibrated_on": "nowhere"}}},
            "regimes.bursty.calibrated_on",
        ),
    ],
)
def test_bad_calibration_files_name_file_and_field(tmp_path, content, field):
    path = _write(tmp_path, content)
    with pytest.raises(ValueError) as info:
        load_calibration(path)
    assert path in str(info.value)
    assert field in str(info.value)


def test_missing_calibration_file(tmp_path):
    path = str(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="absent.json"):
        load_calibration(path)


def test_good_custom_calibration_file(tmp_path):
    cal = load_calibration(_write(tmp_path, GOOD))
    assert cal.source == "test"
    assert cal.measured("sync-heavy")["p95_sync_ratio"] == 1.5
    # A user file overrides the reference entry by entry: bursty (calibrated on sync-heavy)
    # follows the user's sync-heavy numbers; an unknown regime still raises.
    assert cal.measured("bursty")["p95_sync_ratio"] == 1.5
    assert cal.measured("bursty")["calibrated_on"] == "sync-heavy"
    with pytest.raises(KeyError, match="nope"):
        cal.measured("nope")


def test_calibration_regimes_exist():
    cal = load_calibration()
    assert set(cal.regimes) == set(REGIMES)
    assert all(np.isfinite(cal.measured(n)["p95_sync_ratio"]) for n in REGIMES)


def test_a_smaller_fitted_sidecar_is_simulated_at_the_regimes_utilization():
    """A fitted sidecar with a quarter of the capacity: the calibration simulates sync-heavy
    at the same utilization (2.5 req/s), so the effect sizes are measured, not drowned in an
    overload (at 10 req/s nearly every request would violate with no merge)."""
    from diloco_gym import DiLoCoSyncEnv

    low = replace(REGIMES["sync-heavy"].sidecar, slots=4.0)
    sim = simulated_effect_sizes("sync-heavy", seeds=HELD_OUT[:4], sidecar=low)
    assert sim["p95_sync_ratio"] > 1.3  # the slowdown shows; an overload flattens it
    assert sim["p95_ms"] < 3000.0
    env = DiLoCoSyncEnv(REGIMES["sync-heavy"].with_load(low), sidecar=low)
    env.reset(seed=HELD_OUT[0])
    assert env.episode.trace.mean_rate_rps == pytest.approx(2.5, rel=0.1)
    assert env.episode.baseline.violation_pct < 20.0


def test_a_live_file_is_judged_at_the_utilization_it_was_measured_at(tmp_path):
    """A live calibration records its replayed rate and mean sent tokens: the verdict's
    simulation runs the fitted sidecar at that utilization, not at the regime's."""
    from diloco_gym.eval.calibration import measured_utilization
    from diloco_gym.eval.report import ReportConfig, run_protocol

    fitted = {
        "ttft_ms": 47.0,
        "prefill_ms_per_token": 0.15,
        "decode_ms_per_token": 1.3,
        "slots": 1.1,
        "sync_slowdown": 0.9,
    }
    doc = {
        "source": "unit-test live file",
        "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 2.35}},
        "fitted_sidecar": fitted,
        "metadata": {
            "trace": {
                "rate_rps": 1.5,
                "sent_prompt_tokens_mean": 252.0,
                "sent_output_tokens_mean": 48.0,
                "requests": 17,
                "duration_s": 10.0,
            }
        },
    }
    path = tmp_path / "live.json"
    path.write_text(json.dumps(doc))
    cal = load_calibration(path)
    u = measured_utilization(path, cal.fitted_sidecar)
    assert u == pytest.approx(1.5 * (47.0 + 0.15 * 252 + 1.3 * 48) / 1000 / 1.1)
    assert measured_utilization(None, cal.fitted_sidecar) is None
    del doc["metadata"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    assert measured_utilization(bare, cal.fitted_sidecar) is None
    res = run_protocol(
        ReportConfig(
            regimes=["sync-heavy"], agents=["fixed-512"], seeds=2, draws=10, calibration=str(path)
        ),
        progress=False,
    )
    row = res["calibration"].iloc[0]
    assert row["calibration_utilization"] == pytest.approx(u)
    at_u = simulated_effect_sizes(
        "sync-heavy", seeds=range(8), sidecar=cal.fitted_sidecar, utilization=u
    )
    assert row["sim_p95_sync_ratio"] == at_u["p95_sync_ratio"]
    # The episodes themselves run at the regime's own utilization on that sidecar.
    assert row["utilization"] == pytest.approx(REGIMES["sync-heavy"].utilization())


def test_a_live_file_is_judged_with_the_merges_it_was_measured_with(tmp_path):
    """A sync ratio depends on how long the merges are and how close together: the
    verdict's simulation replays merges of the live plan's length at its mean spacing."""
    from diloco_gym.eval.calibration import measured_merge_plan, simulate_as_measured

    fitted = {"ttft_ms": 47.0, "decode_ms_per_token": 1.3, "slots": 1.1, "sync_slowdown": 0.9}
    doc = {
        "source": "unit-test live file",
        "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 2.35}},
        "fitted_sidecar": fitted,
        "schedule": [
            {"start_s": 2.0, "length_s": 4.0},
            {"start_s": 10.0, "length_s": 4.0},
            {"start_s": 22.0, "length_s": 4.0},
        ],
    }
    path = tmp_path / "live.json"
    path.write_text(json.dumps(doc))
    assert measured_merge_plan(path) == (4.0, 10.0)
    assert measured_merge_plan(None) is None
    for plan in ([], [{"start_s": 2.0, "length_s": 4.0}], [{"start_s": "x"}] * 2):
        path.write_text(json.dumps(doc | {"schedule": plan}))
        assert measured_merge_plan(path) is None, plan
    path.write_text(json.dumps(doc))
    sidecar = load_calibration(path).fitted_sidecar
    seeds = HELD_OUT[:2]
    sim, u_cal = simulate_as_measured("sync-heavy", path, sidecar, seeds)
    assert u_cal is None  # no recorded load in this file: the regime's own
    assert sim == simulated_effect_sizes(
        "sync-heavy", seeds=seeds, sidecar=sidecar, merge_seconds=4.0, merge_every_s=10.0
    )
    default = simulated_effect_sizes("sync-heavy", seeds=seeds, sidecar=sidecar)
    assert sim["p95_sync_ratio"] != default["p95_sync_ratio"]
    # Without a fitted sidecar (the shipped reference) nothing is read from the file.
    ref, _ = simulate_as_measured("sync-heavy", path, None, seeds)
    assert ref == simulated_effect_sizes("sync-heavy", seeds=seeds)


@pytest.mark.slow
def test_a_measured_cpu_calibration_replays_at_the_intended_load():
    """A calibration measured on this project's CPU host (transformers serve, one-thread
    engine, 2 gloo workers, target utilization 0.6; per-request records left out) gives a
    report whose replays run at the regimes' intended loads: no request over the SLO on an
    idle sidecar and no saturated regime. Its transfer verdict is whatever the simulator
    makes of it (here it cannot reproduce the host's ratio: no SLO claim)."""
    from pathlib import Path

    from diloco_gym.eval.report import ReportConfig, run_protocol

    path = Path(__file__).resolve().parents[1] / "fixtures" / "live_cpu_calibration.json"
    res = run_protocol(
        ReportConfig(
            regimes=["sync-heavy", "bursty"],
            agents=["fixed-512", "wa-diloco"],
            seeds=3,
            draws=20,
            calibration=str(path),
        ),
        progress=False,
    )
    cal_rows = res["calibration"].set_index("regime")
    for regime in ("sync-heavy", "bursty"):
        row = cal_rows.loc[regime]
        assert row["sidecar"] == "fitted (calibration file)"
        assert row["idle_violation_pct"] == 0.0
        assert row["utilization"] == pytest.approx(REGIMES[regime].utilization(), rel=1e-6)
        assert 0.3 < row["calibration_utilization"] < 0.8  # the measured load, as replayed
    summary = res["summary"]
    assert not summary["saturated"].any()
    assert (summary["no_sync_violation_pct"] < 20.0).all()
    assert not summary["verdict"].str.contains("saturated").any()
