"""The replay options the report and the frontier share (:mod:`diloco_gym.eval.replay_options`):
one validator, so a bad value is refused by both configs with the same message naming the
field, and the load options mean the same in both."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from diloco_gym.eval import calibration as cal
from diloco_gym.eval import frontier as fr
from diloco_gym.eval.frontier_render import _units
from diloco_gym.eval.replay_options import ReplayOptions
from diloco_gym.eval.report import ReportConfig
from diloco_gym.eval.seed_ranges import VALIDATION_SEED0
from diloco_gym.eval.units import synthetic_units
from diloco_gym.sim.regimes import REGIMES

CONFIGS = [ReplayOptions, ReportConfig, fr.FrontierConfig]

#: (options, the field the message must name, a pattern of the message).
BAD = [
    ({"seeds": 1}, "seeds", r"seeds must be >= 2 for a paired test, got 1"),
    ({"seed0": -1}, "seed0", r"seed0 must be >= 0, got -1"),
    ({"seed0": VALIDATION_SEED0 - 1}, "seed0", r"^test seeds \(--seed0, --seeds\) 899999\.\."),
    ({"draws": 0}, "draws", r"draws must be >= 1, got 0"),
    ({"alpha": 1.0}, "alpha", r"alpha must be in \(0, 1\), got 1.0"),
    ({"alpha": 0.0}, "alpha", r"alpha must be in \(0, 1\)"),
    ({"rate_scale": -1.0}, "rate_scale", r"rate_scale must be a positive number, got -1.0"),
    ({"rate_scale": float("nan")}, "rate_scale", r"rate_scale must be a positive number"),
    ({"target_utilization": 0.0}, "target_utilization", r"must be a positive number, got 0.0"),
    ({"rate_scale": 2.0, "target_utilization": 0.5}, "target_utilization", r"not both"),
    ({"window_s": 0.0}, "window_s", r"window_s must be a positive number of seconds"),
    ({"window_s": float("inf")}, "window_s", r"window_s must be a positive number of seconds"),
    ({"regimes": []}, "regimes", r"regimes: give at least one regime"),
    ({"regimes": ["burst"]}, "regimes", r"unknown regime\(s\) \['burst'\]"),
    ({"regimes": ["bursty", "bursty"]}, "regimes", r"regimes: each regime once"),
    ({"sidecar": "sync-heavy"}, "sidecar", r"sidecar \(--sidecar\) chooses the sidecar of a"),
    ({"trace": "t.csv", "sidecar": "steady"}, "sidecar", r"unknown sidecar regime 'steady'"),
    ({"trace": "t.csv", "trace_format": "parquet"}, "trace_format", r"'parquet' is not a trace"),
    ({"trace": "t.csv", "window_s": 1.0}, "window_s", r"window_s \(--window-s\) 1 s is too short"),
]


@pytest.mark.parametrize(("options", "name", "pattern"), BAD)
def test_each_bad_value_is_refused_by_both_configs_with_one_message(options, name, pattern):
    messages = set()
    for config in CONFIGS:
        with pytest.raises(ValueError, match=pattern) as err:
            config(**options)
        messages.add(str(err.value))
    assert len(messages) == 1, messages  # the same check, word for word
    assert name in messages.pop()  # the message names the field


def test_both_configs_are_the_shared_options_plus_their_own():
    shared = {f.name for f in dataclasses.fields(ReplayOptions)}
    assert {"rate_scale", "target_utilization", "trace", "seeds", "draws"} <= shared
    for config in (ReportConfig, fr.FrontierConfig):
        assert issubclass(config, ReplayOptions)
        assert shared <= {f.name for f in dataclasses.fields(config)}
    assert {f.name for f in dataclasses.fields(ReportConfig)} - shared == {
        "agents",
        "stride_s",
        "saturation_pct",
    }
    assert {f.name for f in dataclasses.fields(fr.FrontierConfig)} - shared == {
        "budgets_per_hour",
        "budget_agents",
        "free_agents",
    }


def test_defaults_and_each_configs_own_checks_are_kept():
    assert ReportConfig().regimes == list(REGIMES)
    assert fr.FrontierConfig().regimes == ["bursty", "non-periodic", "sync-heavy"]
    assert ReportConfig().agents and fr.FrontierConfig().free_agents  # the heuristics
    assert fr.FrontierConfig(trace="dir/t.csv").regimes == ["replay:t"]
    assert fr.FrontierConfig(budgets_per_hour=[96, 60]).budgets_per_hour == [60.0, 96.0]
    with pytest.raises(ValueError, match="stride_s must be a positive number of seconds"):
        ReportConfig(stride_s=-1.0)
    with pytest.raises(ValueError, match="budgets given more than once"):
        fr.FrontierConfig(budgets_per_hour=[60, 60])


def test_the_configs_are_frozen_and_replace_checks_again():
    config = ReportConfig(regimes=["bursty"], seeds=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seeds = 1  # type: ignore[misc]
    assert dataclasses.replace(config, seeds=3).seeds == 3
    with pytest.raises(ValueError, match="seeds must be >= 2"):
        dataclasses.replace(config, seeds=1)
    again = fr.FrontierConfig(**dataclasses.asdict(fr.FrontierConfig(regimes=["bursty"])))
    assert again == fr.FrontierConfig(regimes=["bursty"])
    for config in CONFIGS:  # keyword-only: a positional value cannot land in another field
        with pytest.raises(TypeError):
            config(["bursty"])  # type: ignore[misc]


@pytest.mark.parametrize(
    ("load", "expected"), [({"rate_scale": 2.0}, 2.0), ({"rate_scale": 0.5}, 0.5)]
)
def test_rate_scale_on_a_synthetic_regime_scales_both_the_same(load, expected):
    """Without a trace, ``rate_scale`` multiplies the regime's rates: in the report and,
    with the same options, in the frontier (which refused it before)."""
    calib = cal.load_calibration(None)
    report_config = ReportConfig(regimes=["bursty"], seeds=2, **load)
    _units_, report_load = synthetic_units(report_config, "bursty", calib.sidecar_for("bursty"))
    assert report_load["rate_scale"] == pytest.approx(expected)
    frontier_config = fr.FrontierConfig(regimes=["bursty"], seeds=2, **load)
    ((_label, _key, _fitted, units, _envs),) = fr._plan(frontier_config, calib)
    base = REGIMES["bursty"].with_load(calib.sidecar_for("bursty"))
    assert units[0][1].mean_rate_rps == pytest.approx(expected * base.mean_rate_rps)
    assert units[0][1].mean_rate_rps == pytest.approx(report_load["mean_rate_rps"])
    # the frontier's document says so; without a load option it says nothing of it
    result = {"config": dataclasses.asdict(frontier_config), "rows": pd.DataFrame()}
    assert f"offered load x{expected:g} (--rate-scale)" in _units(result)
    result["config"]["rate_scale"] = None
    assert "load" not in _units(result)
