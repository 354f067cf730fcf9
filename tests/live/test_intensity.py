"""Interference at several sync intensities (:mod:`diloco_gym.live.intensity`): the fit of
the fleet model's interference function, the ``interference`` block of a run's document,
the fleet reading it back (``calibration = FILE`` for a site), and (``slow``) a tiny CPU run
against the built-in engine at two link shares."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from diloco_gym.eval.calibration import validate_calibration
from diloco_gym.live.calibrate import CalibrationConfig, run_calibration
from diloco_gym.live.document import build_document, finite, summary_lines
from diloco_gym.live.intensity import fit_interference
from diloco_gym.live.merges import MergeConfig
from diloco_gym.live.plan import phase_key
from diloco_gym.live.replay import RequestRecord
from diloco_gym.live.state import RunState
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import fleet_toml
from diloco_gym.sim.sidecar import SidecarParams

from .helpers import assert_no_children

# --------------------------------------------------------------------------- the fit


def _law(h: float, gamma: float, shares: list[float], base: float = 0.8) -> list[float]:
    return [fl.sync_slowdown(base, u, h, gamma) for u in shares]


def test_the_fit_recovers_a_known_function():
    """Exact slowdowns from the fleet model's own function give back its parameters: with
    three shares both are fitted, with two the exponent is kept at 1."""
    shares = [1.0, 0.5, 0.25]
    fit = fit_interference(shares, _law(0.3, 1.7, shares))
    assert fit.exponent_fitted and fit.residual < 1e-6
    assert fit.host_share == pytest.approx(0.3, abs=1e-4)
    assert fit.share_exponent == pytest.approx(1.7, abs=1e-3)
    two = fit_interference([1.0, 0.25], _law(0.4, 1.0, [1.0, 0.25]))
    assert not two.exponent_fitted and two.share_exponent == 1.0
    assert two.host_share == pytest.approx(0.4) and two.notes == ()


def test_a_fit_outside_the_function_is_clipped_and_said():
    """A throttled merge that slows serving *less* than the linear term allows (or more
    than at the full rate) clips host_share to [0, 1], with a note."""
    low = fit_interference([1.0, 0.25], [0.5, 0.0])
    assert low.host_share == 0.0 and "clipped to 0" in low.notes[0]
    high = fit_interference([1.0, 0.5], [0.5, 0.9])
    assert high.host_share == 1.0 and "above" in high.notes[0]


def test_no_slowdown_at_the_full_rate_leaves_the_function_undetermined():
    fit = fit_interference([1.0, 0.5], [0.0, 0.0])
    assert math.isnan(fit.host_share) and math.isnan(fit.share_exponent)
    assert "undetermined" in fit.notes[0]
    nan = fit_interference([1.0, 0.5], [0.5, float("nan")])
    assert math.isnan(nan.host_share) and "no share below 1" in nan.notes[0]


@pytest.mark.parametrize(
    ("shares", "message"),
    [([0.5, 0.25], "needs the share 1"), ([1.0], "needs the share 1"), ([1.0, 1.5], r"\(0, 1\]")],
)
def test_the_fit_needs_the_full_share_and_one_below(shares, message):
    with pytest.raises(ValueError, match=message):
        fit_interference(shares, [0.5] * len(shares))


# --------------------------------------------------------------------------- the document


def _shares_run(slow_by_share: dict[float, float], repeats: int = 3) -> RunState:
    """A run with a control phase and one sync phase per share per repeat: requests sent
    inside a merge window are ``1 + slow`` times slower (scripted)."""
    rng = np.random.default_rng(4)
    run = RunState(t0=0.0, started_utc="2026-01-01T00:00:00+00:00", label="sync-heavy")
    run.plan = [(1.0, 2.0), (5.0, 2.0)]
    records: list[RequestRecord] = []
    origin = 0.0
    merge_id = 0
    for rep in range(repeats):
        names = ["control"] + [("sync" if u == 1 else f"sync@{u:g}") for u in slow_by_share]
        for name in names:
            run.phases[phase_key(name, rep)] = {
                "name": name,
                "repeat": rep,
                "origin_s": origin,
                "duration_s": 8.0,
            }
            run.order.append((name, rep))
            share = 1.0 if name in ("sync", "control") else float(name.split("@")[1])
            if name != "control":
                for start, length in run.plan:
                    entry = {"merge_id": merge_id, "repeat": rep, "start_s": origin + start,
                             "end_s": origin + start + length}  # fmt: skip
                    if share < 1:
                        entry.update(phase=name, link_share=share, achieved_share=share * 0.9)
                    run.merges.append(entry)
                    merge_id += 1
            for i in range(80):
                t = i * 0.1
                active = name != "control" and any(s <= t < s + n for s, n in run.plan)
                factor = 1.0 + (slow_by_share[share] if active else 0.0)
                records.append(
                    RequestRecord(
                        i, name, origin + t, 20, 20, send_s=origin + t,
                        latency_s=float(rng.uniform(0.18, 0.22) * factor), status=200,
                        error="", merge_active=active, merge_id=0 if active else -1,
                        inflight=0, repeat=rep,
                    )
                )  # fmt: skip
            origin += 20.0
    run.replayer = SimpleNamespace(snapshot=lambda: records)  # type: ignore[assignment]
    return run


def test_the_document_of_a_run_at_three_shares_has_a_valid_interference_block():
    """Merge-active requests 2x slower at the full rate, 1.5x at 0.5, 1.25x at 0.25: the
    measured ratios fall with the share, each share's slowdown is refitted, the function
    fitted with intervals; the document is a valid calibration file and the summary prints
    the block."""
    run = _shares_run({1.0: 1.0, 0.5: 0.5, 0.25: 0.25})
    cfg = CalibrationConfig(
        link_shares=(1.0, 0.5, 0.25), interference_resamples=12, bootstrap_resamples=200
    )
    doc = finite(build_document(run, True, cfg))
    validate_calibration(doc, "synthetic")
    assert list(doc).index("interference") == list(doc).index("fit") + 1
    block = doc["interference"]
    rows = block["levels"]
    assert [r["link_share"] for r in rows] == [1.0, 0.5, 0.25]
    assert [r["achieved_share"] for r in rows] == [None, pytest.approx(0.45), 0.225]
    ratios = [r["p95_sync_ratio"] for r in rows]
    assert ratios[0] > ratios[1] > ratios[2] > 1.0
    # The full share is the regime entry's own measurement and fit, interval included.
    assert rows[0]["sync_slowdown"] == doc["fitted_sidecar"]["sync_slowdown"]
    assert rows[0]["p95_sync_ratio_ci"] == doc["regimes"]["sync-heavy"]["p95_sync_ratio_ci"]
    assert rows[0]["sync_slowdown_interval"] == doc["fit"]["sync_slowdown_interval"]
    slow = [r["sync_slowdown"] for r in rows]
    assert slow[0] > slow[1] > slow[2] >= 0
    assert block["share_exponent_fitted"] and 0 <= block["host_share"] <= 1
    lo, hi = block["host_share_interval"]
    assert 0 <= lo <= block["host_share"] <= hi <= 1
    assert block["bootstrap"]["resamples"] == 12
    # The classic entry is measured on the full-rate phases only.
    assert doc["regimes"]["sync-heavy"]["p95_sync_ratio"] == pytest.approx(ratios[0])
    lines = summary_lines(doc)
    assert any(line.startswith("interference: host_share ") for line in lines), lines
    assert any(line.startswith("  link share 0.25 (achieved 0.225)") for line in lines), lines


def test_without_shares_below_one_the_document_has_no_interference_block():
    run = _shares_run({1.0: 1.0}, repeats=2)
    doc = build_document(run, True, CalibrationConfig(bootstrap_resamples=20))
    assert "interference" not in doc


# --------------------------------------------------------------------------- the fleet


def _calibration_file(tmp_path: Path, **interference: object) -> Path:
    ref = json.loads(
        (
            Path(__file__).resolve().parents[2] / "tests/fixtures/live_cpu_calibration.json"
        ).read_text()
    )
    ref["fitted_sidecar"] = {**ref["fitted_sidecar"], "sync_slowdown": 0.6, "slots": 6.0}
    if interference:
        ref["interference"] = {"model": "...", "levels": [], **interference}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(ref))
    return path


def test_a_fleet_site_uses_the_fitted_interference_function(tmp_path):
    """``calibration = FILE``: the site's sidecar is the file's fitted one and its syncs
    slow serving by the fitted function; a site without a file keeps the fleet's."""
    path = _calibration_file(tmp_path, host_share=0.6, share_exponent=2.0)
    fl.site_calibration.cache_clear()
    site = fl.SiteConfig(name="cal", calibration=str(path))
    plain = fl.SiteConfig(name="plain")
    fleet = fl.FleetParams(sites=(site, plain), mode="streamed", fragments=8, bits=4)
    sidecars = [site.sidecar_params(SidecarParams()), plain.sidecar_params(SidecarParams())]
    assert (sidecars[0].sync_slowdown, sidecars[0].slots) == (0.6, 6.0)
    plan = fl.sync_plan(fleet, sidecars, 0.14)
    assert 0 < plan.link_share < 1
    assert plan.slowdowns[0] == pytest.approx(0.6 * (0.6 + 0.4 * plan.link_share**2.0))
    assert plan.slowdowns[1] == pytest.approx(
        fl.sync_slowdown(sidecars[1].sync_slowdown, plan.link_share, 0.25, 1.0)
    )
    # From a TOML file: the path resolves against the file's folder.
    toml = tmp_path / "fleet.toml"
    toml.write_text('[[site]]\nname = "a"\ncalibration = "cal.json"\n')
    loaded, _ = fleet_toml.load_fleet_toml(toml)
    assert loaded.sites[0].calibration == str(path)
    assert loaded.sites[0].interference(loaded) == (0.6, 2.0)


def test_a_file_without_or_with_an_undetermined_function(tmp_path):
    fl.site_calibration.cache_clear()
    plain = _calibration_file(tmp_path)
    site = fl.SiteConfig(calibration=str(plain))
    assert site.interference(fl.FleetParams(host_share=0.1)) == (0.1, 1.0)  # the fleet's
    (tmp_path / "b").mkdir()
    bad = _calibration_file(tmp_path / "b", host_share=None, share_exponent=None,
                            notes=["no slowdown at the full link share"])  # fmt: skip
    with pytest.raises(fl.FleetConfigError, match="interference function is undetermined"):
        fl.SiteConfig(calibration=str(bad)).interference(fl.FleetParams())
    (tmp_path / "c").mkdir()
    wrong = _calibration_file(tmp_path / "c", host_share=1.5, share_exponent=1.0)
    with pytest.raises(fl.FleetConfigError, match=r"field interference.host_share: 1.5"):
        fl.SiteConfig(calibration=str(wrong)).interference(fl.FleetParams())
    with pytest.raises(fl.FleetConfigError, match="cannot read the calibration file"):
        fl.site_calibration(str(tmp_path / "missing.json"))


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_tiny_cpu_run_at_two_link_shares_calibrates_the_fleet(tmp_path):
    """The built-in engine, two gloo workers all-reducing 8 MiB, 2 repeats of a control,
    a full-rate and a quarter-rate sync phase: the file validates, the throttled merges
    occupied about a quarter of their windows, the function is fitted, and a fleet site
    reads it."""
    pytest.importorskip("torch")
    out = tmp_path / "cal.json"
    cfg = CalibrationConfig(
        seed=1,
        rate_rps=3.0,
        merge=MergeConfig(workers=2, merge_mb=8),
        merge_seconds=2.0,
        gap_seconds=(1.0, 1.5),
        lead_seconds=0.5,
        warmup_requests=1,
        progress_every_s=60.0,
        engine="builtin-fallback",
        probe=None,
        repeats=2,
        link_shares=(1.0, 0.25),
        interference_resamples=40,
    )
    lines: list[str] = []
    result = run_calibration(None, "sync-heavy", 8.0, out, config=cfg, progress=lines.append)
    doc = json.loads(out.read_text())
    validate_calibration(doc, str(out))
    assert result.complete
    phases = {p["name"] for p in doc["metadata"]["phases"].values()}
    assert phases == {"sync", "sync@0.25", "control"}
    throttled = [m for m in doc["merges"] if m.get("phase") == "sync@0.25"]
    assert throttled and all(m["link_share"] == 0.25 for m in throttled)
    assert all(0.1 <= m["achieved_share"] <= 0.45 for m in throttled), throttled
    assert all("phase" not in m for m in doc["merges"] if m not in throttled)
    block = doc["interference"]
    assert [r["link_share"] for r in block["levels"]] == [1.0, 0.25]
    assert any(line.startswith("interference:") for line in lines)
    fl.site_calibration.cache_clear()
    if block["host_share"] is None:  # no slowdown at the full rate on this host: said so
        assert "undetermined" in " ".join(block["notes"])
        with pytest.raises(fl.FleetConfigError, match="undetermined"):
            fl.SiteConfig(calibration=str(out)).interference(fl.FleetParams())
    else:
        site = fl.SiteConfig(calibration=str(out))
        assert site.interference(fl.FleetParams()) == (
            block["host_share"],
            block["share_exponent"],
        )
        assert (
            site.sidecar_params(SidecarParams()).sync_slowdown
            == (doc["fitted_sidecar"]["sync_slowdown"])
        )
    assert_no_children()
