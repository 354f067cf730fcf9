"""diloco_gym/eval/units.py: the protocol's statistical units. Synthetic seeds (consecutive
from seed0, one shared env, the load described), trace windows (tiled from the file,
disjoint by default so they partition the requests; overlapping windows mark a greedy
disjoint subset as the verdict's units), episodes built the same on every call, the seed
check on window seeds, and episode_budget's rounding and feasible range."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from diloco_gym.eval.report import ReportConfig
from diloco_gym.eval.seed_ranges import VALIDATION_SEED0
from diloco_gym.eval.units import episode_budget, synthetic_units, trace_units
from diloco_gym.sim.loaders import load_trace
from diloco_gym.sim.regimes import REGIMES

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "bursty.csv")  # 600 s


def _synthetic(**kw) -> SimpleNamespace:
    base = dict(
        seeds=3,
        seed0=5,
        rate_scale=None,
        target_utilization=None,
        trace=None,
        trace_format="auto",
        window_s=600.0,
        stride_s=None,
        overlapping=False,
    )
    return SimpleNamespace(**{**base, **kw})


# --------------------------------------------------------------------------- synthetic
def test_synthetic_units_are_consecutive_seeds_on_one_env():
    units, load = synthetic_units(_synthetic(), "bursty", None)
    assert [u.seed for u in units] == [5, 6, 7]
    assert len({id(u.env) for u in units}) == 1
    assert units[0].fields == {
        "unit": "seed",
        "window_start_s": units[0].fields["window_start_s"],
        "window_end_s": units[0].fields["window_end_s"],
        "independent": True,
        "independent_units": 3,
        "verdict_unit": True,
    }
    assert np.isnan(units[0].fields["window_start_s"]) and np.isnan(units[0].fields["window_end_s"])
    assert load["rate_scale"] == pytest.approx(1.0)
    assert load["mean_rate_rps"] == pytest.approx(REGIMES["bursty"].mean_rate_rps)
    assert 0.0 < load["utilization"] and load["capacity_rps"] > 0.0


def test_one_synthetic_unit():
    units, _ = synthetic_units(_synthetic(seeds=1, seed0=0), "sync-heavy", None)
    assert [u.seed for u in units] == [0] and units[0].fields["independent_units"] == 1


def test_synthetic_load_follows_the_rate_scale():
    _, base = synthetic_units(_synthetic(), "bursty", None)
    _, double = synthetic_units(_synthetic(rate_scale=2.0), "bursty", None)
    assert double["rate_scale"] == pytest.approx(2.0)
    assert double["mean_rate_rps"] == pytest.approx(2.0 * base["mean_rate_rps"])
    assert double["utilization"] > base["utilization"]


def test_a_units_episode_is_the_same_on_every_call_and_differs_between_seeds():
    units, _ = synthetic_units(_synthetic(seeds=2), "bursty", None)
    a, b, other = units[0].episode(), units[0].episode(), units[1].episode()
    assert a is not b and a.trace == b.trace and a.n_decisions == b.n_decisions
    np.testing.assert_array_equal(a.merge_cost, b.merge_cost)
    assert a.trace != other.trace


# --------------------------------------------------------------------------- trace
def test_disjoint_trace_windows_partition_the_trace():
    config = ReportConfig(trace=TRACE, window_s=200.0, seed0=3, agents=["fixed-512"])
    units, load = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    assert [u.seed for u in units] == [3, 4, 5]
    assert [(u.fields["window_start_s"], u.fields["window_end_s"]) for u in units] == [
        (0.0, 200.0),
        (200.0, 400.0),
        (400.0, 600.0),
    ]
    assert all(u.fields["independent"] and u.fields["verdict_unit"] for u in units)
    assert {u.fields["independent_units"] for u in units} == {3}
    assert len({id(u.env) for u in units}) == 3  # one env per window
    assert (load["windows"], load["window_s"], load["stride_s"]) == (3, 200.0, 200.0)
    assert load["rate_scale"] == 1.0 and load["trace_duration_s"] == pytest.approx(600.0)
    # Every request of the file is in exactly one window's episode.
    tr = load_trace(TRACE)
    eps = [u.episode() for u in units]
    got = np.concatenate([e.trace.arrival_s + 200.0 * i for i, e in enumerate(eps)])
    np.testing.assert_allclose(got, tr.arrival_s, atol=1e-9)


def test_overlapping_windows_pick_a_greedy_disjoint_subset_for_the_verdict():
    config = ReportConfig(trace=TRACE, window_s=300.0, stride_s=150.0, agents=["fixed-512"])
    assert config.overlapping
    units, load = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    assert [u.fields["window_start_s"] for u in units] == [0.0, 150.0, 300.0]
    assert [u.fields["verdict_unit"] for u in units] == [True, False, True]
    assert {u.fields["independent_units"] for u in units} == {2}
    assert not any(u.fields["independent"] for u in units) and load["independent"] is False


def test_window_times_are_in_the_files_clock_at_a_rate_scale():
    """At rate scale 2 the file is replayed twice as fast: a 150 s window covers 300 s of
    the file."""
    config = ReportConfig(trace=TRACE, window_s=150.0, rate_scale=2.0, agents=["fixed-512"])
    units, load = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    assert load["rate_scale"] == pytest.approx(2.0)
    assert load["replayed_duration_s"] == pytest.approx(300.0)
    assert [(u.fields["window_start_s"], u.fields["window_end_s"]) for u in units] == [
        (0.0, 300.0),
        (300.0, 600.0),
    ]


def test_window_seeds_must_stay_test_seeds():
    config = ReportConfig(trace=TRACE, window_s=200.0, seed0=VALIDATION_SEED0 - 2)
    with pytest.raises(ValueError, match=r"window seeds \(--seed0 \+ window index\) 899998"):
        trace_units(config, REGIMES[config.trace_sidecar].sidecar)


def test_a_window_longer_than_the_trace_names_the_file_and_its_length():
    config = ReportConfig(trace=TRACE, window_s=900.0)
    with pytest.raises(ValueError) as info:
        trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    msg = str(info.value)
    assert msg.startswith(f"{TRACE}: ") and "the trace lasts 600 s" in msg


# --------------------------------------------------------------------------- budget
PARAMS = SimpleNamespace(h_min=2, h_max=8)  # 100 decisions: 12..49 merges feasible


@pytest.mark.parametrize(
    ("per_hour", "duration_s", "merges"),
    [(20.0, 3600.0, 20), (30.0, 1800.0, 15), (26.0, 1800.0, 13), (12.0, 3600.0, 12)],
)
def test_episode_budget_rounds_merges_per_hour_to_the_episode(per_hour, duration_s, merges):
    assert episode_budget(per_hour, duration_s, 100, PARAMS) == merges


def test_episode_budget_refuses_an_infeasible_budget_naming_the_range():
    with pytest.raises(ValueError) as info:
        episode_budget(5.0, 3600.0, 100, PARAMS)
    assert str(info.value) == (
        "budget 5 merges/h is 5 merges in a 3600 s episode, outside the feasible 12..49 "
        "(12..49 merges/h)"
    )
    with pytest.raises(ValueError, match=r"outside the feasible 12\.\.49 \(24\.\.98 merges/h\)"):
        episode_budget(200.0, 1800.0, 100, PARAMS)


# --------------------------------------------------------------------------- effect sizes
def test_trace_effect_sizes_pool_the_windows_and_are_repeatable():
    from diloco_gym.eval.units import trace_effect_sizes

    config = ReportConfig(trace=TRACE, window_s=200.0, agents=["fixed-512"])
    units, _ = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    pooled = trace_effect_sizes(units)
    assert set(pooled) == {"p95_high_low", "p95_sync_ratio", "pressure_latency_corr"}
    assert pooled == trace_effect_sizes(units)  # no randomness: the same numbers
    assert pooled["p95_sync_ratio"] > 1.0  # merges slow requests down on this trace
    assert pooled != trace_effect_sizes(units[:1])  # every window is pooled, not only one
