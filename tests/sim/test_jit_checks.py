"""The compiled checks of a trace's arrays against their NumPy statements, on valid arrays
and on each way to break one (the error each leads to is tested in test_traces)."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.sim import compiled_checks


def _arrivals_numpy(a: np.ndarray, duration_s: float) -> bool:
    return bool(
        np.isfinite(a).all()
        and not (a[1:] < a[:-1]).any()
        and (a.size == 0 or (a[0] >= 0 and a[-1] < duration_s))
    )


@pytest.mark.parametrize(
    "arrival",
    [
        [],
        [0.0],
        [0.0, 0.0, 1.5, 9.999],
        [0.5, 0.4],
        [-0.1, 1.0],
        [1.0, 10.0],
        [1.0, np.nan, 2.0],
        [1.0, np.inf],
        [-np.inf, 1.0],
        [3.0, 2.0, np.nan],
    ],
)
def test_arrivals_ok_says_what_numpy_says(arrival):
    a = np.array(arrival, dtype=np.float64)
    assert compiled_checks().arrivals_ok(a, 10.0) == _arrivals_numpy(a, 10.0)


def test_arrivals_ok_on_random_arrays():
    rng = np.random.default_rng(0)
    checks = compiled_checks()
    seen = set()
    for _ in range(300):
        a = np.sort(rng.uniform(-0.5, 10.5, int(rng.integers(0, 6))))
        if rng.random() < 0.3 and a.size > 1:
            a = a[::-1].copy()  # not sorted
        if rng.random() < 0.1 and a.size:
            a[int(rng.integers(a.size))] = np.nan
        want = _arrivals_numpy(a, 10.0)
        seen.add(want)
        assert checks.arrivals_ok(a, 10.0) == want, a
        assert checks.arrivals_ok(a[::2], 10.0) == _arrivals_numpy(a[::2], 10.0)  # a view
    assert seen == {True, False}


@pytest.mark.parametrize(
    ("values", "nonneg", "unit"),
    [
        ([], True, True),
        ([0.0, 1.0, 0.5], True, True),
        ([0.0, -1e-300], False, False),
        ([1.0, 1.0000001], True, False),
        ([0.2, np.nan], True, False),
        ([np.inf], True, False),
    ],
)
def test_nonnegative_and_in_unit_interval(values, nonneg, unit):
    x = np.array(values, dtype=np.float64)
    checks = compiled_checks()
    assert checks.nonnegative(x) == nonneg == bool(not (x < 0).any())
    assert checks.in_unit_interval(x) == unit
    if x.size and np.isfinite(x).all() and (x == np.round(x)).all():
        assert checks.nonnegative(x.astype(np.int64)) == nonneg  # token counts are ints
