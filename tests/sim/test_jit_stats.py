"""The compiled percentiles (:mod:`diloco_gym.sim.jit_stats`, through
:func:`diloco_gym.sim.percentiles`) against NumPy's ``np.percentile``, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest


def _bits(values) -> bytes:
    return np.asarray(values, dtype=np.float64).tobytes()


def test_compiled_percentiles_equal_numpy_percentile_bit_for_bit():
    """``sim.percentiles`` gives ``np.percentile``'s default (linear) values exactly: random,
    tied, sorted, reversed and heavy-tailed samples of many sizes, one or several ``q`` in
    any order, the bounds 0 and 100 included."""
    from diloco_gym.sim import percentiles

    rng = np.random.default_rng(7)
    grid = [0, 1, 2.5, 5, 25, 50, 75, 95, 97.5, 99, 99.9, 100]
    for trial in range(3000):
        n = int(rng.integers(1, 40)) if trial % 2 else int(rng.integers(1, 6000))
        x = [
            rng.random(n),
            rng.integers(0, 4, n).astype(float),
            rng.lognormal(size=n) * 1e3,
            np.sort(rng.standard_normal(n)),
            np.sort(rng.standard_normal(n))[::-1],
        ][trial % 5]
        q = list(rng.choice(grid, size=int(rng.integers(1, 5)), replace=False))
        kept = x.copy()
        assert _bits(percentiles(x, q)) == _bits(np.percentile(x, q)), (n, q)
        assert _bits(percentiles(x, (q[0],))) == _bits(float(np.percentile(x, q[0])))
        assert x.tobytes() == kept.tobytes()  # the input is left as it was


def test_compiled_percentiles_edge_cases():
    """Sizes 1 and 2, infinities (NumPy's NaN from ``inf - inf`` included), a NaN (NaN
    everywhere), an empty sample (NaN), a 2-D sample (all its values) and q outside
    [0, 100] (NumPy's error)."""
    from diloco_gym.sim import percentiles

    q = [0, 10, 50, 95, 99, 100]
    cases = [[3.0], [1.0, 2.0], [2.0, 1.0], [1.0, np.inf], [np.inf, np.inf], [-np.inf, 1.0]]
    for x in map(np.array, cases):
        with np.errstate(invalid="ignore"):  # NumPy's inf - inf
            want = np.percentile(x, q)
        assert _bits(percentiles(x, q)) == _bits(want), x
    assert all(np.isnan(percentiles(np.array([1.0, np.nan, 2.0]), q)))
    assert all(np.isnan(percentiles(np.zeros(0), q)))
    x2 = np.random.default_rng(0).random((3, 50))
    assert _bits(percentiles(x2, q)) == _bits(np.percentile(x2, q))
    x2.setflags(write=False)  # a read-only sample (an episode's arrays are)
    assert _bits(percentiles(x2[1], q)) == _bits(np.percentile(x2[1], q))
    assert _bits(percentiles(x2[:, 3], q)) == _bits(np.percentile(x2[:, 3], q))  # strided
    for bad in ([101], [-1], [50, float("nan")]):
        with pytest.raises(ValueError, match="range"):
            percentiles(np.ones(3), bad)
