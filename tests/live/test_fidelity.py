"""Measured against predicted on held-out settings (:mod:`diloco_gym.live.fidelity`):
synthetic phases whose latencies come from a known sidecar model, no engine."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from diloco_gym.live.fidelity import (
    EFFECT_METRICS,
    EFFECT_PHASE,
    METRICS,
    PhaseSample,
    failures,
    fidelity_rows,
    markdown_section,
    measured_metrics,
    plot_fidelity,
    predicted_metrics,
)
from diloco_gym.live.fit import replay_requests
from diloco_gym.sim.sidecar import SidecarParams

#: A server near saturation at 4 req/s, so that merges build a backlog (a visible cost).
TRUE = SidecarParams(
    ttft_ms=40.0, prefill_ms_per_token=0.1, decode_ms_per_token=8.0, slots=2.0,
    sync_slowdown=0.8, slo_ms=1500.0,
)  # fmt: skip
MERGES = [(5.0, 8.0), (15.0, 18.0), (25.0, 28.0)]


def _phase(params: SidecarParams, seed: int, merges: list, duration: float = 30.0) -> PhaseSample:
    """A phase whose measured latencies are the model's own replay of its sends."""
    rng = np.random.default_rng(seed)
    n = int(4 * duration)
    offsets = np.sort(rng.uniform(0, duration, n))
    prompt = rng.integers(20, 200, n)
    output = rng.integers(10, 100, n)
    res = replay_requests(offsets, prompt, output, duration, merges or None, params)
    return PhaseSample(offsets, res.latency_s, np.ones(n, bool), prompt, output, merges, duration)


def _setting(params: SidecarParams, repeats: int, seed: int = 0) -> dict[str, list[PhaseSample]]:
    return {
        "control": [_phase(params, seed + 2 * k, []) for k in range(repeats)],
        "sync": [_phase(params, seed + 2 * k + 1, MERGES) for k in range(repeats)],
    }


def _by_key(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["phase"], r["metric"]): r for r in rows}


def test_the_true_model_predicts_the_measurement_exactly():
    samples = _setting(TRUE, repeats=2)
    rows = fidelity_rows(samples, TRUE, TRUE.slo_s, n_boot=200)
    keys = [(r["phase"], r["metric"]) for r in rows]
    assert keys == [("control", m) for m in METRICS] + [("sync", m) for m in METRICS] + [
        (EFFECT_PHASE, m) for m in EFFECT_METRICS
    ]
    for r in rows:
        assert r["abs_error"] == 0.0, r
        assert r["fails"] is False, r
        both = r["phase"] == EFFECT_PHASE  # a merge-cost row counts both phases' requests
        assert r["n_repeats"] == 2 and r["requests"] == (480 if both else 240)
        assert r["failed_requests"] == 0
    effect = _by_key(rows)
    # the merges cost something in this setting (the rows are not trivially 1 and 0)
    assert effect[(EFFECT_PHASE, "p95_ratio")]["measured"] > 1.2
    assert effect[(EFFECT_PHASE, "violation_diff_pp")]["measured"] > 0
    assert failures("steady U=0.8", rows) == []


def test_a_model_with_double_decode_cost_misses_and_overpredicts():
    samples = _setting(TRUE, repeats=2)
    wrong = replace(TRUE, decode_ms_per_token=2 * TRUE.decode_ms_per_token)
    rows = _by_key(fidelity_rows(samples, wrong, TRUE.slo_s, n_boot=50))
    for phase in ("control", "sync"):
        for m in ("p50_ms", "p95_ms", "p99_ms"):
            r = rows[(phase, m)]
            assert r["fails"] is True
            assert r["abs_error"] > 0 and r["rel_error"] > 0.25  # predicted too slow
            assert r["predicted"] == pytest.approx(r["measured"] + r["abs_error"])
        assert rows[(phase, "violation_pct")]["abs_error"] > 0
    sentences = failures("bursty U=0.8", list(rows.values()))
    assert any(s.startswith("bursty U=0.8, sync p99: predicted ") for s in sentences)
    assert all(s.endswith("%)") for s in sentences)


def test_no_merge_slowdown_underpredicts_the_merge_cost():
    samples = _setting(TRUE, repeats=2)
    rows = _by_key(fidelity_rows(samples, replace(TRUE, sync_slowdown=0.0), TRUE.slo_s, n_boot=0))
    ratio = rows[(EFFECT_PHASE, "p95_ratio")]
    assert ratio["predicted"] < ratio["measured"] and ratio["rel_error"] < -0.25
    assert ratio["fails"] is True
    assert rows[("control", "p95_ms")]["abs_error"] == 0.0  # control has no merges
    assert "sync vs control p95 ratio: predicted" in " ".join(
        failures("steady", [ratio, rows[("control", "p95_ms")]])
    )


def test_failed_requests_count_as_violations():
    # 5 sent; one failed, one over the 1 s SLO: 2 of 5 violate; percentiles over the four
    # successful ones (100, 200, 500, 2000 ms): p50 = 350, p95 = 500 + 0.85 * 1500 = 1775
    sample = PhaseSample(
        np.array([0.0, 1.0, 2.0, 3.0, 4.0]),
        np.array([0.1, 0.2, np.nan, 0.5, 2.0]),
        np.array([True, True, False, True, True]),
        np.zeros(5, np.int64),
        np.ones(5, np.int64),
        [],
        5.0,
    )
    m = measured_metrics(sample, slo_s=1.0)
    assert m["violation_pct"] == pytest.approx(40.0)
    assert m["p50_ms"] == pytest.approx(350.0)
    assert m["p95_ms"] == pytest.approx(1775.0)
    none_ok = replace(sample, ok=np.zeros(5, bool), latency_s=np.full(5, np.nan))
    m = measured_metrics(none_ok, slo_s=1.0)
    assert np.isnan(m["p50_ms"]) and np.isnan(m["p99_ms"]) and m["violation_pct"] == 100.0


def test_the_prediction_replays_failed_requests_and_the_merge_windows():
    # requests 10 s apart on an idle server: latency = base = 50 ms + 10 ms per output token
    p = SidecarParams(ttft_ms=50.0, prefill_ms_per_token=0.0, decode_ms_per_token=10.0,
                      slots=4.0, sync_slowdown=0.5, slo_ms=1000.0)  # fmt: skip
    output = np.array([10, 20, 30, 200, 40])  # 150, 250, 350, 2050, 450 ms
    ok = np.array([True, True, True, False, True])  # the slow one failed live
    sample = PhaseSample(
        np.arange(5) * 10.0, np.array([0.15, 0.25, 0.35, np.nan, 0.45]), ok,
        np.zeros(5, np.int64), output, [], 50.0,
    )  # fmt: skip
    pred = predicted_metrics(sample, p)
    assert pred["violation_pct"] == pytest.approx(20.0)  # the failed one too: 1 of 5
    assert pred["p50_ms"] == pytest.approx(350.0)  # over all five (four would give 300)
    merged = predicted_metrics(replace(sample, merges_s=[(19.0, 21.0)]), p)
    # request 2 (350 ms) now runs 1.5x slower: 150, 250, 450, 525, 2050 -> p50 450
    assert merged["p50_ms"] == pytest.approx(450.0)


def test_one_repeat_has_no_interval():
    rows = fidelity_rows(_setting(TRUE, repeats=1), TRUE, TRUE.slo_s, n_boot=100)
    for r in rows:
        assert r["n_repeats"] == 1
        assert r["measured_ci"] is None and r["abs_error_ci"] is None
        assert r["rel_error_ci"] is None and r["within_interval"] is None


def test_three_repeats_give_intervals_around_the_pooled_value():
    wrong = replace(TRUE, decode_ms_per_token=1.3 * TRUE.decode_ms_per_token)
    rows = fidelity_rows(_setting(TRUE, repeats=3, seed=7), wrong, TRUE.slo_s, n_boot=400)
    for r in rows:
        assert r["n_repeats"] == 3
        for name, value in (("measured", "measured"), ("abs_error", "abs_error")):
            lo, hi = r[f"{name}_ci" if name != "measured" else "measured_ci"]
            assert lo <= r[value] <= hi, (r["phase"], r["metric"], name)
        assert isinstance(r["within_interval"], bool)
    p95 = _by_key(rows)[("sync", "p95_ms")]
    assert p95["measured_ci"][0] < p95["measured_ci"][1]  # repeats differ: not one point


def test_the_bootstrap_is_reproducible_by_seed():
    samples = _setting(TRUE, repeats=3, seed=3)
    a = fidelity_rows(samples, TRUE, TRUE.slo_s, rng_seed=5, n_boot=100)
    b = fidelity_rows(samples, TRUE, TRUE.slo_s, rng_seed=5, n_boot=100)
    assert a == b


def test_bad_input_is_one_line_naming_the_field():
    good = _phase(TRUE, 0, [])
    n = good.offset_s.size
    cases = {
        "latency_s": dict(latency_s=good.latency_s[:-1]),
        "ok": dict(ok=np.ones(n)),
        "output_tokens": dict(output_tokens=np.zeros(n + 1, np.int64)),
        "prompt_tokens": dict(prompt_tokens=np.full(n, 1.5)),
        "offset_s": dict(offset_s=np.full(n, np.nan)),
        "merges_s": dict(merges_s=[(3.0, 1.0)]),
        "duration_s": dict(duration_s=-1.0),
    }
    fields = dict(
        offset_s=good.offset_s, latency_s=good.latency_s, ok=good.ok,
        prompt_tokens=good.prompt_tokens, output_tokens=good.output_tokens,
        merges_s=good.merges_s, duration_s=good.duration_s,
    )  # fmt: skip
    for field, change in cases.items():
        with pytest.raises(ValueError, match=f"PhaseSample.{field}") as err:
            PhaseSample(**{**fields, **change})
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="request 0 succeeded"):
        PhaseSample(**{**fields, "latency_s": np.full(n, np.nan)})
    with pytest.raises(ValueError, match="params.slo_s"):
        fidelity_rows({"control": [good]}, TRUE, 2 * TRUE.slo_s)
    with pytest.raises(ValueError, match="'sync' has no repeats"):
        fidelity_rows({"control": [good], "sync": []}, TRUE, TRUE.slo_s)


def test_rows_are_strict_json_with_none_for_undefined_values():
    samples = _setting(TRUE, repeats=2)
    dead = samples["sync"][0]
    samples["sync"] = [
        replace(s, ok=np.zeros(s.ok.size, bool), latency_s=np.full(s.ok.size, np.nan))
        for s in (dead, dead)
    ]  # the engine answered nothing in the sync phase
    rows = fidelity_rows(samples, TRUE, TRUE.slo_s, n_boot=50)
    text = json.dumps(rows, allow_nan=False)
    back = _by_key(json.loads(text))
    p99 = back[("sync", "p99_ms")]
    assert p99["measured"] is None and p99["rel_error"] is None and p99["fails"] is True
    assert back[("sync", "violation_pct")]["measured"] == 100.0
    assert back[("sync", "p50_ms")]["failed_requests"] == dead.ok.size * 2
    assert "measured n/a" in " ".join(failures("dead", rows))


def test_the_failure_sentence_reads_as_specified():
    row = {
        "phase": "sync", "metric": "p99_ms", "measured": 1430.0, "predicted": 812.0,
        "abs_error": -618.0, "rel_error": -618.0 / 1430.0, "fails": True,
    }  # fmt: skip
    assert failures("bursty U=0.6", [row, {**row, "fails": False}]) == [
        "bursty U=0.6, sync p99: predicted 812 ms, measured 1,430 ms (-43 %)"
    ]
    viol = {**row, "metric": "violation_pct", "measured": 8.0, "predicted": 2.0,
            "abs_error": -6.0, "rel_error": -0.75}  # fmt: skip
    assert failures("x", [viol]) == [
        "x, sync violations: predicted 2.0 %, measured 8.0 % (-6.0 pp, -75 %)"
    ]


def _block(rows_held: list[dict], rows_cal: list[dict]) -> dict:
    return {
        "calibration": {"name": "calibration window", "regime": "steady", "utilization": 0.5,
                        "rate_rps": 4.0, "duration_s": 30.0, "repeats": 2, "rows": rows_cal},
        "settings": [{"name": "bursty U=0.8", "regime": "bursty", "utilization": 0.8,
                      "rate_rps": 6.4, "duration_s": 30.0, "repeats": 2, "rows": rows_held}],
        "failures": failures("bursty U=0.8", rows_held),
    }  # fmt: skip


def test_markdown_section_has_the_tables_and_the_failures():
    samples = _setting(TRUE, repeats=2)
    good = fidelity_rows(samples, TRUE, TRUE.slo_s, n_boot=50)
    wrong = replace(TRUE, decode_ms_per_token=2 * TRUE.decode_ms_per_token)
    bad = fidelity_rows(samples, wrong, TRUE.slo_s, n_boot=50)
    lines = markdown_section(_block(bad, good))
    text = "\n".join(lines)
    header = (
        "| metric | phase | measured [95 % CI] | predicted | error | relative error | verdict |"
    )
    assert text.count(header) == 2  # the calibration setting's and the held-out one's
    assert "### bursty U=0.8 (bursty, U=0.80, 6.40 req/s, 30 s, 2 repeats)" in text
    assert "### Where the model fails" in text
    for sentence in failures("bursty U=0.8", bad):
        assert f"- {sentence}" in lines
    assert "| misses |" in text and "| ok |" in text
    clean = markdown_section(_block(good, good))
    assert clean[-1] == "None at 25 %."


def test_plot_writes_a_png(tmp_path):
    samples = _setting(TRUE, repeats=2)
    wrong = replace(TRUE, decode_ms_per_token=1.5 * TRUE.decode_ms_per_token)
    block = _block(fidelity_rows(samples, wrong, TRUE.slo_s, n_boot=50), [])
    path = tmp_path / "fidelity.png"
    plot_fidelity(block, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["fidelity.png"]  # no partial file left
