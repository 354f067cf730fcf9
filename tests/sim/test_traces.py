"""diloco_gym/sim/traces.py: a Trace refuses what breaks its invariants (each error names the
row and the field), compares by value, and the pure helpers: window, random_window,
scale_rate and tile_starts (windows inside the trace, re-based, seeded; every request kept by
a rate change; disjoint tiles that partition the requests)."""

from __future__ import annotations

import numpy as np
import pytest
from loader_helpers import FIXTURES

from diloco_gym.sim.loaders import load_azure, load_mooncake, load_native
from diloco_gym.sim.traces import (
    PRESSURE_DT_S,
    Trace,
    TraceFormatError,
    random_window,
    scale_rate,
    tile_starts,
    validate_trace,
    window,
)


def test_trace_with_nan_tokens_says_not_finite() -> None:
    """NaN used to be cast to int64 first and reported as a negative token count."""
    with pytest.raises(TraceFormatError, match="token count nan is not a finite number") as info:
        Trace([0.0, 1.0], [1.0, float("nan")], [1, 1], 2.0)
    assert (info.value.row, info.value.field) == (2, "prompt_tokens")
    with pytest.raises(TraceFormatError, match="inf is not a finite number"):
        Trace([0.0], [1], [float("inf")], 2.0)
    with pytest.raises(TraceFormatError, match="not an integer"):
        Trace([0.0], [1.5], [1], 2.0)
    with pytest.raises(TraceFormatError, match="fit int64"):
        Trace([0.0], [10**30], [1], 2.0)


def test_window_of_fixture() -> None:
    trace = load_native(FIXTURES / "native_small.csv")  # arrivals 0, 0.5, 2.25, 7.75 in 10 s
    cut = window(trace, 0.5, 5.0)
    np.testing.assert_array_equal(cut.arrival_s, [0.0, 1.75])
    np.testing.assert_array_equal(cut.prompt_tokens, [200, 300])
    np.testing.assert_array_equal(cut.output_tokens, [20, 30])
    assert cut.duration_s == 5.0
    assert cut.meta["window_start_s"] == 0.5
    assert cut.meta["path"] == trace.meta["path"]


def test_empty_window_raises() -> None:
    trace = load_native(FIXTURES / "native_small.csv")
    with pytest.raises(TraceFormatError, match="is empty") as info:
        window(trace, 3.0, 4.0)
    assert trace.meta["path"] in str(info.value)
    with pytest.raises(TraceFormatError, match="not inside"):
        window(trace, 8.0, 5.0)


def test_random_window_is_seeded_and_inside() -> None:
    trace = load_azure(FIXTURES / "azure_small.csv")
    a = random_window(trace, 3.0, np.random.default_rng(5))
    b = random_window(trace, 3.0, np.random.default_rng(5))
    assert a == b
    assert a.duration_s == 3.0 and a.num_requests >= 1
    assert np.all((a.arrival_s >= 0) & (a.arrival_s < 3.0))
    assert 0.0 <= a.meta["window_start_s"] <= trace.duration_s - 3.0
    with pytest.raises(TraceFormatError, match="shorter"):
        random_window(trace, 30.0, np.random.default_rng(0))


@pytest.mark.parametrize("target", [0.25, 1.0, 40.0])
def test_scale_rate_keeps_requests_and_hits_target(target: float) -> None:
    trace = load_mooncake(FIXTURES / "mooncake_small.jsonl")
    scaled = scale_rate(trace, target)
    assert scaled.num_requests == trace.num_requests
    np.testing.assert_array_equal(scaled.prompt_tokens, trace.prompt_tokens)
    np.testing.assert_array_equal(scaled.output_tokens, trace.output_tokens)
    assert scaled.mean_rate_rps == pytest.approx(target, rel=1e-12)
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    assert scaled.arrival_s[-1] < scaled.duration_s
    with pytest.raises(ValueError):
        scale_rate(trace, 0.0)


def test_tile_starts():
    from diloco_gym.sim.traces import tile_starts

    assert tile_starts(3502.0, 600.0) == [0.0, 600.0, 1200.0, 1800.0, 2400.0]
    assert tile_starts(1200.0, 600.0) == [0.0, 600.0]  # an exact fit keeps the last window
    assert tile_starts(1500.0, 600.0, 300.0) == [0.0, 300.0, 600.0, 900.0]
    assert tile_starts(3000.0, 600.0, 1000.0) == [0.0, 1000.0, 2000.0]
    with pytest.raises(ValueError, match="holds no window of 600.0 s"):
        tile_starts(599.0, 600.0)
    with pytest.raises(ValueError, match="stride_s must be a positive"):
        tile_starts(1000.0, 100.0, -1.0)


# --------------------------------------------------------------------------- Trace
def _trace(n: int = 20, duration: float = 20.0, pressure: bool = False, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, duration, n))
    samples = int(np.ceil(duration / PRESSURE_DT_S))
    series = rng.uniform(0.0, 1.0, samples) if pressure else None
    return Trace(
        arrivals,
        rng.integers(1, 500, n),
        rng.integers(1, 50, n),
        duration,
        network=series,
        checkpoint=None if series is None else series[::-1].copy(),
        name="t",
        meta={"path": "mem.csv"},
    )


def test_trace_format_error_names_path_row_and_field():
    err = TraceFormatError("a.csv", "bad value", row=3, field="prompt_tokens")
    assert isinstance(err, ValueError)
    assert str(err) == "a.csv, row 3, field 'prompt_tokens': bad value"
    assert (err.path, err.row, err.field, err.reason) == ("a.csv", 3, "prompt_tokens", "bad value")
    assert str(TraceFormatError("a.csv", "empty")) == "a.csv: empty"
    assert str(TraceFormatError("a.csv", "x", field="f")) == "a.csv, field 'f': x"


def test_a_trace_casts_its_arrays():
    tr = Trace([0.0, 1.5], [1.0, 2.0], np.array([3, 4], dtype=np.int32), 2.0, network=[0, 1])
    assert tr.arrival_s.dtype == np.float64 and tr.network.dtype == np.float64
    assert tr.prompt_tokens.dtype == np.int64 and tr.output_tokens.dtype == np.int64
    np.testing.assert_array_equal(tr.prompt_tokens, [1, 2])
    assert tr.num_requests == 2 and tr.mean_rate_rps == 1.0


def test_an_empty_trace_is_valid_and_has_no_rate():
    tr = Trace([], [], [], 5.0)
    assert tr.num_requests == 0 and tr.mean_rate_rps == 0.0
    assert tr.num_pressure_samples == 5


def test_one_request():
    tr = Trace([0.0], [7], [1], 0.5)
    assert tr.num_requests == 1 and tr.mean_rate_rps == 2.0
    assert tr.num_pressure_samples == 1


@pytest.mark.parametrize(
    ("duration", "samples"), [(10.0, 10), (10.5, 11), (0.2, 1), (10.0 + 1e-12, 10)]
)
def test_pressure_samples_cover_the_window(duration, samples):
    assert Trace([0.0], [1], [1], duration).num_pressure_samples == samples


def test_unsorted_arrivals_are_refused_at_the_first_out_of_order_row():
    with pytest.raises(TraceFormatError, match="arrivals are not sorted") as info:
        Trace([0.0, 2.0, 3.0, 1.0, 0.5], [1] * 5, [1] * 5, 10.0)
    assert (info.value.row, info.value.field) == (4, "arrival_s")


@pytest.mark.parametrize(("arrivals", "row"), [([-0.1, 1.0], 1), ([0.0, 5.0], 2), ([1.0, 7.0], 2)])
def test_an_arrival_outside_the_window_is_refused(arrivals, row):
    with pytest.raises(TraceFormatError, match=r"outside the window \[0, 5.0\)") as info:
        Trace(arrivals, [1, 1], [1, 1], 5.0)
    assert (info.value.row, info.value.field) == (row, "arrival_s")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_arrival_is_refused(bad):
    with pytest.raises(TraceFormatError, match="arrival time is not finite") as info:
        Trace([0.0, 1.0, bad], [1] * 3, [1] * 3, 10.0)
    assert (info.value.row, info.value.field) == (3, "arrival_s")


@pytest.mark.parametrize("name", ["prompt_tokens", "output_tokens"])
def test_a_negative_token_count_is_refused(name):
    tokens = {"prompt_tokens": [1, 2, 3], "output_tokens": [1, 2, 3]}
    tokens[name] = [4, 0, -2]
    with pytest.raises(TraceFormatError, match="negative token count") as info:
        Trace([0.0, 1.0, 2.0], duration_s=3.0, **tokens)
    assert (info.value.row, info.value.field) == (3, name)


@pytest.mark.parametrize("duration", [0.0, -1.0, np.nan, np.inf])
def test_a_non_positive_or_non_finite_duration_is_refused(duration):
    with pytest.raises(TraceFormatError, match=f"duration_s must be positive, got {duration}"):
        Trace([], [], [], duration)


def test_token_arrays_of_the_wrong_length_are_refused():
    with pytest.raises(TraceFormatError, match=r"output_tokens has shape \(1,\), expected \(2,\)"):
        Trace([0.0, 1.0], [1, 1], [1], 2.0)
    with pytest.raises(TraceFormatError, match="one-dimensional"):
        Trace([[0.0, 1.0]], [1, 1], [1, 1], 2.0)
    # A 2-D arrival column is named as such, not as a token column of the "wrong" length.
    with pytest.raises(TraceFormatError, match=r"arrival_s.*got shape \(1, 1\)") as exc:
        Trace([[0.0]], [[1]], [[1]], 2.0)
    assert exc.value.field == "arrival_s"


def test_pressure_series_of_the_wrong_length_or_range_are_refused():
    with pytest.raises(TraceFormatError, match=r"network has \(2,\) samples, expected \(3,\)"):
        Trace([0.0], [1], [1], 3.0, network=[0.0, 0.5])
    for bad in ([0.0, 1.5, 0.0], [0.0, -0.1, 0.0], [0.0, np.nan, 0.0]):
        with pytest.raises(TraceFormatError, match=r"pressure outside \[0, 1\] or NaN") as info:
            Trace([0.0], [1], [1], 3.0, checkpoint=bad)
        assert info.value.field == "checkpoint"


def test_validate_trace_names_the_file_it_is_given():
    tr = _trace()
    object.__setattr__(tr, "output_tokens", -tr.output_tokens)  # broken after construction
    with pytest.raises(TraceFormatError) as info:
        validate_trace(tr, "traces/x.csv")
    assert str(info.value).startswith("traces/x.csv, row 1, field 'output_tokens': ")
    validate_trace(_trace(), "ok.csv")  # a valid trace passes


def test_equality_is_by_value_not_meta():
    a, b = _trace(pressure=True), _trace(pressure=True)
    b.meta["extra"] = 1
    assert a == b and a is not b
    assert a != _trace(pressure=True, seed=1)
    assert a != _trace(pressure=False)  # pressure given vs unknown
    assert a != Trace(a.arrival_s, a.prompt_tokens, a.output_tokens + 1, a.duration_s)
    assert (a == "trace") is False
    with pytest.raises(TypeError):
        hash(a)


# --------------------------------------------------------------------------- window
def test_window_is_pure_and_re_based():
    tr = _trace(pressure=True)
    before = tr.arrival_s.copy()
    cut = window(tr, 4.0, 8.0)
    np.testing.assert_array_equal(tr.arrival_s, before)  # the input is untouched
    inside = (before >= 4.0) & (before < 12.0)
    np.testing.assert_allclose(cut.arrival_s, before[inside] - 4.0)
    np.testing.assert_array_equal(cut.prompt_tokens, tr.prompt_tokens[inside])
    assert cut.duration_s == 8.0 and cut.name == "t"
    np.testing.assert_array_equal(cut.network, tr.network[4:12])
    np.testing.assert_array_equal(cut.checkpoint, tr.checkpoint[4:12])
    assert cut.meta == {"path": "mem.csv", "window_start_s": 4.0}


def test_window_of_the_whole_trace_is_the_trace():
    tr = _trace(pressure=True)
    assert window(tr, 0.0, tr.duration_s) == tr


def test_a_window_past_the_end_is_refused_naming_the_trace():
    tr = _trace()
    for start, length in ((15.0, 6.0), (-1.0, 2.0), (0.0, 0.0)):
        with pytest.raises(TraceFormatError, match="is not inside the trace") as info:
            window(tr, start, length)
        assert str(info.value).startswith("mem.csv: ")


def test_tiled_windows_partition_the_requests():
    tr = _trace(n=200, duration=100.0, pressure=True)
    starts = tile_starts(tr.duration_s, 10.0)
    cuts = [window(tr, s, 10.0) for s in starts]
    got = np.concatenate([c.arrival_s + s for c, s in zip(cuts, starts, strict=True)])
    np.testing.assert_allclose(got, tr.arrival_s, atol=1e-9)  # each request once, in order
    assert sum(c.num_requests for c in cuts) == tr.num_requests
    np.testing.assert_array_equal(np.concatenate([c.network for c in cuts]), tr.network)


# --------------------------------------------------------------------------- random_window
def test_random_window_depends_only_on_the_generator():
    tr = _trace(n=200, duration=100.0)
    a = [random_window(tr, 10.0, np.random.default_rng(s)).meta["window_start_s"] for s in range(5)]
    b = [random_window(tr, 10.0, np.random.default_rng(s)).meta["window_start_s"] for s in range(5)]
    assert a == b and len(set(a)) == 5
    assert all(0.0 <= s <= 90.0 for s in a)


def test_random_window_of_the_trace_length_starts_at_zero():
    tr = _trace()
    assert random_window(tr, tr.duration_s, np.random.default_rng(3)) == tr


def test_random_window_refuses_a_trace_with_no_non_empty_window():
    tr = Trace([], [], [], 100.0)  # every window is empty
    with pytest.raises(TraceFormatError, match="no non-empty window found"):
        random_window(tr, 1.0, np.random.default_rng(0))


# --------------------------------------------------------------------------- scale_rate
def test_scale_rate_stretches_time_and_resamples_pressure():
    tr = _trace(n=20, duration=20.0, pressure=True)  # 1 request/s
    fast = scale_rate(tr, 2.0)
    assert fast.duration_s == pytest.approx(10.0) and fast.num_pressure_samples == 10
    np.testing.assert_allclose(fast.arrival_s, tr.arrival_s / 2.0)
    np.testing.assert_array_equal(fast.network, tr.network[::2])  # every other sample
    assert fast.meta["rate_scale"] == pytest.approx(2.0)
    slow = scale_rate(tr, 0.5)
    assert slow.duration_s == pytest.approx(40.0)
    np.testing.assert_array_equal(slow.network, np.repeat(tr.network, 2))
    assert tr.duration_s == 20.0 and "rate_scale" not in tr.meta  # the input is untouched


@pytest.mark.parametrize("target", [0.0, -1.0, np.nan, np.inf])
def test_scale_rate_refuses_a_bad_target_naming_it(target):
    with pytest.raises(ValueError, match=f"target_rate_rps must be positive, got {target}"):
        scale_rate(_trace(), target)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_scale_rate_refuses_an_infinite_stretch():
    with pytest.raises(ValueError, match="not a finite number of seconds"):
        scale_rate(_trace(), 1e-308)


# --------------------------------------------------------------------------- tile_starts
@pytest.mark.parametrize(
    ("duration", "win", "stride"),
    [(3600.0, 600.0, None), (3601.0, 60.0, None), (1000.0, 100.0, 30.0), (1000.0, 50.0, 200.0)],
)
def test_tiles_fit_inside_and_step_by_the_stride(duration, win, stride):
    starts = tile_starts(duration, win, stride)
    step = stride or win
    np.testing.assert_allclose(np.diff(starts), step)
    assert starts[0] == 0.0 and starts[-1] + win <= duration
    assert starts[-1] + step + win > duration  # no further window fits


def test_default_tiles_are_disjoint():
    starts = tile_starts(3000.0, 600.0)
    ends = [s + 600.0 for s in starts]
    assert all(end <= nxt for end, nxt in zip(ends, starts[1:], strict=False))


def test_one_tile_when_the_trace_is_one_window_long():
    assert tile_starts(600.0, 600.0) == [0.0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1000.0, 0.0), "window_s must be a positive number of seconds, got 0.0"),
        ((1000.0, np.nan), "window_s must be a positive number of seconds, got nan"),
        ((1000.0, 100.0, 0.0), "stride_s must be a positive number of seconds, got 0.0"),
        ((np.nan, 100.0), "the trace lasts nan s"),
    ],
)
def test_tile_starts_names_the_bad_length(args, match):
    with pytest.raises(ValueError, match=match):
        tile_starts(*args)
