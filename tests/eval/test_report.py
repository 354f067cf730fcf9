"""The report's units and verdicts: disjoint trace windows, honest n (inconclusive), the
user's load, saturation, and the sidecar that carries the calibration verdict."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diloco_gym import DiLoCoSyncEnv
from diloco_gym.cli import main
from diloco_gym.eval import protocol
from diloco_gym.eval.calibration import simulated_effect_sizes
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
from diloco_gym.sim.loaders import load_trace, save_native
from diloco_gym.sim.regimes import REGIMES, trace_utilization
from diloco_gym.sim.traces import Trace

#: The real public traces: ``$DILOCO_GYM_REAL_TRACES``, else ``shared/traces/real`` beside the
#: repository (or beside its parent, for a git worktree); tests skip when absent.
REAL = (
    Path(os.environ["DILOCO_GYM_REAL_TRACES"])
    if os.environ.get("DILOCO_GYM_REAL_TRACES")
    else next(
        (
            p / "shared" / "traces" / "real"
            for p in Path(__file__).resolve().parents[3:5]
            if (p / "shared" / "traces" / "real").is_dir()
        ),
        Path(__file__).resolve().parents[3] / "shared" / "traces" / "real",
    )
)
AGENTS = ["fixed-512", "offline-oracle"]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    """A 1,800 s bursty trace (no pressure columns) saved in the native format."""
    gen = replace(REGIMES["bursty"], duration_s=1800.0)
    tr = gen(np.random.default_rng(11))
    path = tmp_path_factory.mktemp("traces") / "long.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    return path


def _trace_report(path: Path, **kw):
    kw.setdefault("agents", AGENTS)
    kw.setdefault("draws", 40)
    return run_protocol(ReportConfig(trace=str(path), trace_format="native", **kw), progress=False)


# ----------------------------------------------------------------- windows as units
def test_trace_windows_tile_the_trace_disjointly(long_trace):
    res = _trace_report(long_trace, seeds=20)
    rows = res["rows"]
    units = rows.drop_duplicates("seed").sort_values("seed")
    # 1,800 s in 600 s windows: three disjoint units, whatever --seeds says.
    assert units["window_start_s"].tolist() == [0.0, 600.0, 1200.0]
    assert units["window_end_s"].tolist() == [600.0, 1200.0, 1800.0]
    assert units["seed"].tolist() == [0, 1, 2]
    assert (rows["unit"] == "window").all() and rows["independent"].all()
    src = load_trace(long_trace)
    for _, u in units.iterrows():
        inside = np.sum(
            (src.arrival_s >= u["window_start_s"]) & (src.arrival_s < u["window_end_s"])
        )
        assert u["requests"] == inside  # each episode replays exactly its window
    s = res["summary"]
    assert (s["units"] == 3).all() and (s["unit"] == "window").all()
    assert s["independent"].all()


def test_overlapping_stride_is_flagged_not_independent(long_trace, tmp_path):
    res = _trace_report(long_trace, stride_s=300.0)
    rows = res["rows"]
    assert sorted(rows["window_start_s"].unique()) == [0.0, 300.0, 600.0, 900.0, 1200.0]
    assert not rows["independent"].any()
    assert not res["summary"]["independent"].any()
    out = write_report(res, tmp_path / "rep")
    md = (out / "report.md").read_text()
    assert "overlapping windows: not independent" in md
    assert "not independent" in md.split("## replay:long")[1]
    csv = pd.read_csv(out / "results.csv")
    assert {"unit", "window_start_s", "window_end_s", "independent"} <= set(csv.columns)
    assert not csv["independent"].any()
    data = json.loads((out / "report.json").read_text())
    assert all(r["independent"] is False for r in data["summary"])


def test_a_window_longer_than_the_trace_is_a_clear_error(long_trace):
    with pytest.raises(ValueError, match=r"long\.csv: a trace of 1800\.0 s holds no window"):
        _trace_report(long_trace, window_s=2000.0)
    with pytest.raises(ValueError, match="stride_s must be a positive"):
        ReportConfig(trace=str(long_trace), stride_s=0.0)


# ----------------------------------------------------------------- honest n
@pytest.mark.slow
def test_too_few_seeds_are_inconclusive_never_tied(tmp_path):
    """5 seeds cannot give p < 0.05 (best exact p 2/32, times 2 agents after Holm): the
    oracle's clear gain and fixed-512's tie are both 'inconclusive', with the n needed."""
    res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=AGENTS, seeds=5, draws=50), progress=False
    )
    s = res["summary"].set_index("agent")
    assert s.loc["offline-oracle", "diff_pp"] < -2.0  # a large gain ...
    assert s.loc["offline-oracle", "p_value"] == pytest.approx(2 / 32)  # ... at the floor
    assert (s["verdict"] == "inconclusive (too few episodes)").all()
    assert np.allclose(s["best_p_holm"], 2 * 2 / 32)
    assert (s["units_needed"] == 7).all()  # 2 * 2 / 2**7 = 0.031 < 0.05
    md = (write_report(res, tmp_path / "rep") / "report.md").read_text()
    assert "At least 7 independent seeds with a non-zero difference are needed" in md
    # With the n it asked for, the same gate can decide.
    res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=AGENTS, seeds=7, draws=50), progress=False
    )
    s = res["summary"].set_index("agent")
    assert s.loc["offline-oracle", "verdict"] == "placement gain"
    assert "inconclusive" not in s.loc["fixed-512", "verdict"]


def test_three_windows_are_inconclusive(long_trace):
    s = _trace_report(long_trace)["summary"]
    assert (s["verdict"] == "inconclusive (too few episodes)").all()
    assert (s["units_needed"] == 7).all()


# ----------------------------------------------------------------- load
def test_rate_scale_compresses_the_trace_and_keeps_the_files_clock(long_trace):
    res = _trace_report(long_trace, rate_scale=2.0)
    rows = res["rows"].drop_duplicates("seed")
    # 1,800 s replayed twice as fast is 900 s: one 600 s window = [0, 1200) s of the file.
    assert rows["window_start_s"].tolist() == [0.0]
    assert rows["window_end_s"].tolist() == [1200.0]
    src = load_trace(long_trace)
    assert rows["requests"].iloc[0] == np.sum(src.arrival_s < 1200.0)
    cal = res["calibration"].iloc[0]
    assert cal["rate_scale"] == 2.0
    assert cal["utilization"] == pytest.approx(
        2 * trace_utilization(src, REGIMES["sync-heavy"].sidecar)
    )


def test_target_utilization_sets_the_replayed_load(long_trace):
    res = _trace_report(long_trace, target_utilization=0.2, window_s=300.0)
    cal = res["calibration"].iloc[0]
    assert cal["utilization"] == pytest.approx(0.2)
    assert res["loads"]["replay:long"]["utilization"] == pytest.approx(0.2)


def test_rate_scale_on_synthetic_regimes():
    base = run_protocol(
        ReportConfig(regimes=["sync-heavy"], agents=["fixed-512"], seeds=2, draws=20),
        progress=False,
    )
    double = run_protocol(
        ReportConfig(
            regimes=["sync-heavy"], agents=["fixed-512"], seeds=2, draws=20, rate_scale=2.0
        ),
        progress=False,
    )
    assert double["rows"]["requests"].sum() == pytest.approx(
        2 * base["rows"]["requests"].sum(), rel=0.05
    )
    assert double["calibration"].iloc[0]["utilization"] == pytest.approx(
        2 * REGIMES["sync-heavy"].utilization()
    )
    # The calibration verdict is the sidecar's at its calibrated load: unchanged.
    assert (
        double["calibration"].iloc[0]["sim_p95_sync_ratio"]
        == base["calibration"].iloc[0]["sim_p95_sync_ratio"]
    )
    with pytest.raises(ValueError, match="not both"):
        ReportConfig(rate_scale=2.0, target_utilization=0.5)
    with pytest.raises(ValueError, match="rate_scale must be a positive"):
        ReportConfig(rate_scale=-1.0)


def test_low_capacity_calibration_is_replayed_at_the_same_utilization(tmp_path):
    """A fitted sidecar with a quarter of the slots (capacity ~5.7 req/s) used to replay
    sync-heavy at 10 req/s: nearly every request violated with no merge at all. Its load
    is now the regime's utilization on that sidecar."""
    low = replace(REGIMES["sync-heavy"].sidecar, slots=4.0)
    env = DiLoCoSyncEnv("sync-heavy", sidecar=low)
    env.reset(seed=0)
    assert env.episode.baseline.violation_pct > 90.0  # the old overload
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "source": "unit-test small host",
                "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 1.9}},
                "fitted_sidecar": {"sync_slowdown": 0.5, "slots": 4.0},
            }
        )
    )
    res = run_protocol(
        ReportConfig(
            regimes=["sync-heavy"], agents=["fixed-512"], seeds=2, draws=20, calibration=str(path)
        ),
        progress=False,
    )
    cal = res["calibration"].iloc[0]
    assert cal["sidecar"].startswith("fitted")
    assert cal["utilization"] == pytest.approx(REGIMES["sync-heavy"].utilization())
    assert cal["capacity_rps"] == pytest.approx(REGIMES["sync-heavy"].capacity_rps() / 4)
    assert res["rows"]["no_sync_violation_pct"].max() < 20.0
    assert not res["summary"]["saturated"].any()
    assert res["summary"]["sync_excess_pct"].iloc[0] > 0.5  # merges matter again


# ----------------------------------------------------------------- saturation
def test_saturated_replay_gets_no_claim_with_the_rate_shown(long_trace, tmp_path):
    res = _trace_report(long_trace, target_utilization=1.5, window_s=300.0)
    s = res["summary"]
    no_sync = res["rows"]["no_sync_violation_pct"].mean()
    assert no_sync > protocol.SATURATION_PCT
    assert s["saturated"].all()
    assert (s["verdict"] == "no claim (saturated)").all()
    md = (write_report(res, tmp_path / "rep") / "report.md").read_text()
    assert f"**No claim (saturated)**: {no_sync:.1f} % of requests violate" in md


def test_default_regimes_are_not_saturated():
    """pressure-heavy violates ~40 % with no merge: below the 50 % threshold, so it keeps
    its calibration verdict (no SLO effect) rather than 'saturated'."""
    res = run_protocol(
        ReportConfig(regimes=["pressure-heavy"], agents=["fixed-512"], seeds=3, draws=20),
        progress=False,
    )
    s = res["summary"].iloc[0]
    assert 30.0 < s["no_sync_violation_pct"] < protocol.SATURATION_PCT
    assert not s["saturated"]
    assert s["verdict"] == "no claim (no SLO effect)"


# ----------------------------------------------------------------- calibration of a replay
def test_trace_calibration_verdict_is_the_chosen_sidecars(long_trace):
    res = _trace_report(long_trace, agents=["fixed-512"])
    cal = res["calibration"].iloc[0]
    ref = simulated_effect_sizes("sync-heavy", seeds=range(8))
    # The verdict compares the sync-heavy sidecar on sync-heavy's load with its measurements;
    # the trace's own effect sizes are information only.
    assert cal["sim_p95_sync_ratio"] == ref["p95_sync_ratio"]
    assert cal["verdict"] == "calibrated"
    assert np.isfinite(cal["trace_sim_p95_sync_ratio"])
    assert cal["sidecar"] == "sync-heavy default"
    res = _trace_report(long_trace, agents=["fixed-512"], sidecar="ordinary")
    cal = res["calibration"].iloc[0]
    assert cal["measured_on"] == "ordinary" and cal["verdict"] == "no measurable SLO effect"
    assert res["summary"]["verdict"].iloc[0] == "no claim (no SLO effect)"
    assert res["rows"]["sync_excess_pct"].abs().max() < 1e-9  # ordinary: merges are free
    with pytest.raises(ValueError, match="unknown sidecar regime 'steady'"):
        ReportConfig(trace=str(long_trace), sidecar="steady")
    with pytest.raises(ValueError, match="--trace"):
        ReportConfig(sidecar="ordinary")


# ----------------------------------------------------------------- CLI
def test_cli_trace_options(long_trace, tmp_path, capsys):
    out = tmp_path / "r"
    assert (
        main(
            [
                "report",
                "--out",
                str(out),
                "--trace",
                str(long_trace),
                "--format",
                "native",
                "--agents",
                "fixed-512",
                "--draws",
                "20",
                "--window-s",
                "450",
                "--stride-s",
                "450",
                "--target-utilization",
                "0.3",
                "--no-progress",
            ]
        )
        == 0
    )
    csv = pd.read_csv(out / "results.csv")
    scale = 0.3 / trace_utilization(load_trace(long_trace), REGIMES["sync-heavy"].sidecar)
    n = int(1800.0 / scale // 450.0)  # windows in the replayed (stretched) trace
    assert n == 4
    np.testing.assert_allclose(csv["window_start_s"], np.arange(n) * 450.0 * scale)
    data = json.loads((out / "report.json").read_text())
    assert data["config"]["target_utilization"] == 0.3
    assert data["calibration"][0]["utilization"] == pytest.approx(0.3)
    with pytest.raises(SystemExit):  # argparse: mutually exclusive
        main(
            [
                "report",
                "--out",
                str(tmp_path / "x"),
                "--rate-scale",
                "2",
                "--target-utilization",
                "0.5",
            ]
        )
    with pytest.raises(SystemExit, match="--trace"):
        main(
            [
                "report",
                "--out",
                str(tmp_path / "y"),
                "--sidecar",
                "ordinary",
                "--regimes",
                "bursty",
                "--seeds",
                "2",
                "--no-progress",
            ]
        )
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "--agent",
                "fixed-512",
                "--trace",
                str(long_trace),
                "--format",
                "native",
                "--window-s",
                "600",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "on long (3 disjoint windows of 600 s), 3 episodes" in printed


# ----------------------------------------------------------------- real traces
@pytest.mark.skipif(
    not (REAL / "AzureLLMInferenceTrace_conv.csv").is_file(),
    reason=f"real traces not present under {REAL}",
)
def test_real_azure_conv_is_five_disjoint_windows_and_inconclusive():
    res = run_protocol(
        ReportConfig(
            trace=str(REAL / "AzureLLMInferenceTrace_conv.csv"),
            trace_format="azure",
            agents=["offline-oracle"],
            draws=20,
        ),
        progress=False,
    )
    rows = res["rows"]
    assert rows["window_start_s"].tolist() == [0.0, 600.0, 1200.0, 1800.0, 2400.0]
    assert rows["independent"].all()
    s = res["summary"].iloc[0]
    assert s["units"] == 5 and s["min_p"] >= 2 / 32
    assert s["verdict"] == "inconclusive (too few episodes)"


@pytest.mark.slow
@pytest.mark.skipif(
    not (REAL / "AzureLLMInferenceTrace_code.csv").is_file(),
    reason=f"real traces not present under {REAL}",
)
def test_real_azure_code_zero_differences_make_the_oracle_inconclusive(tmp_path):
    """Azure code in 300 s windows: 11 disjoint windows, but the oracle's difference is
    exactly zero in 5 of them (no merge there costs anything), so 6 units carry evidence:
    8 agents x 2/2**6 = 0.25 at best. It was called 'tied' when all 11 were counted."""
    res = run_protocol(
        ReportConfig(
            trace=str(REAL / "AzureLLMInferenceTrace_code.csv"),
            trace_format="azure",
            window_s=300.0,
            draws=200,
        ),
        progress=False,
    )
    s = res["summary"].set_index("agent")
    o = s.loc["offline-oracle"]
    assert o["units"] == 11 and o["nonzero_units"] == 6
    assert o["best_p_holm"] == pytest.approx(8 * 2 / 64)
    assert o["verdict"] == "inconclusive (too few episodes)"
    assert s.loc["fixed-512", "verdict"] == "inconclusive (too few episodes)"
    out = write_report(res, tmp_path / "rep")
    data = json.loads((out / "report.json").read_text())
    assert {r["agent"]: r["nonzero_units"] for r in data["summary"]}["offline-oracle"] == 6
    md = (out / "report.md").read_text()
    assert "11 (6)" in md and "with a non-zero difference are needed" in md


def test_saturation_from_the_requests_themselves_is_explained(tmp_path):
    """Requests whose nominal service time alone exceeds the SLO (300 output tokens at
    6 ms each): saturated at any load, and the report says that no load fixes it."""
    rng = np.random.default_rng(0)
    arrivals = np.sort(rng.uniform(0.0, 1200.0, 1200))
    tr = Trace(arrivals, np.full(1200, 500), np.full(1200, 300), 1200.0)
    path = tmp_path / "slow.csv"
    save_native(tr, path)
    res = _trace_report(path, agents=["fixed-512"], target_utilization=0.1)
    assert res["loads"]["replay:slow"]["idle_violation_pct"] == 100.0
    assert res["summary"]["verdict"].iloc[0] == "no claim (saturated)"
    md = (write_report(res, tmp_path / "rep") / "report.md").read_text()
    assert "100.0 % of the requests exceed the SLO even on an idle sidecar" in md


def test_many_overlapping_windows_do_not_buy_significance(long_trace, tmp_path):
    """21 windows of 600 s every 60 s over 1,800 s hold 3 disjoint ones: the p-value and
    the verdict come from those 3 only; the 21 give a descriptive mean, never a p."""
    res = _trace_report(long_trace, stride_s=60.0, agents=["offline-oracle"], draws=20)
    s = res["summary"].iloc[0]
    rows = res["rows"]
    assert s["units_all"] == 21 and s["units"] == 3 and s["independent_units"] == 3
    assert not s["independent"]
    picked = rows[rows["verdict_unit"]]
    assert picked["window_start_s"].tolist() == [0.0, 600.0, 1200.0]
    diff = (picked["sync_excess_pct"] - picked["matched_random_mean"]).to_numpy()
    all_diff = (rows["sync_excess_pct"] - rows["matched_random_mean"]).to_numpy()
    # The pseudo-replicated test on all 21 windows would have claimed significance ...
    assert protocol.paired_test(all_diff, np.random.default_rng(0))["p_value"] < 0.05
    # ... the reported p is the disjoint windows' own.
    assert s["p_value"] == pytest.approx(
        protocol.paired_test(diff, np.random.default_rng(0))["p_value"]
    )
    assert s["p_value"] >= 2 / 8 and s["diff_pp"] == pytest.approx(diff.mean())
    assert s["diff_pp_all_units"] == pytest.approx(all_diff.mean())
    assert s["verdict"] == "inconclusive (too few episodes)"
    md = (write_report(res, tmp_path / "rep") / "report.md").read_text()
    assert "offline-oracle (descriptive) | 21 |" in md
    assert "the test uses the 3 disjoint windows among the 21" in md


def test_overlapping_windows_never_carry_a_verdict_by_themselves(long_trace):
    """With a stride that does not divide the window the disjoint subset is picked greedily
    (starts 0, 700, ... for 250 s strides of 600 s windows would not tile): every tested
    window starts at or after the previous tested one's end."""
    res = _trace_report(long_trace, stride_s=250.0, agents=["fixed-512"], draws=10)
    rows = res["rows"]
    starts = rows.loc[rows["verdict_unit"], "window_start_s"].to_numpy()
    assert starts.tolist() == [0.0, 750.0]
    assert np.all(np.diff(starts) >= 600.0)
    assert res["summary"].iloc[0]["units"] == 2


def test_report_seeds_never_reach_validation_or_training_seeds(tmp_path):
    from diloco_gym.eval.seed_ranges import VALIDATION_SEED0

    ReportConfig(seeds=2, seed0=VALIDATION_SEED0 - 2)  # the last two test seeds: allowed
    with pytest.raises(ValueError, match="validation seeds"):
        ReportConfig(seeds=2, seed0=VALIDATION_SEED0 - 1)
    with pytest.raises(ValueError, match="seed0 must be >= 0"):
        ReportConfig(seeds=2, seed0=-1)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "report",
                "--out",
                str(tmp_path / "r"),
                "--seeds",
                "2",
                "--seed0",
                str(VALIDATION_SEED0),
                "--no-progress",
            ]
        )
    assert exc.value.code == 2


def test_wording_of_load_and_seed_messages():
    from diloco_gym.eval.report_render import _speed

    assert _speed(1.0) == "at its own rate"
    assert _speed(2.0) == "2x faster" and _speed(0.5) == "at 0.5x its rate"
    with pytest.raises(ValueError, match=r"^test seeds \(--seed0, --seeds\) 900000\.\.") as e:
        ReportConfig(seed0=900000, seeds=2)
    assert "report" not in str(e.value)  # run and report share the check
