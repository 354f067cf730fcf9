"""The compiled checks of a trace's arrays: one pass each that says whether they hold the
invariants :func:`diloco_gym.sim.traces.validate_trace` asks for, so that a valid trace (the
generators' at every reset) costs a few calls; where one does not hold, ``validate_trace``
finds and names the first violation with its NumPy checks. Compiled with numba
(``cache=True``) as :mod:`diloco_gym.sim.jit`; imported on first use."""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit_cache import njit

__all__ = ["arrivals_ok", "nonnegative", "in_unit_interval"]


@njit(cache=True)
def arrivals_ok(arrival, duration_s):  # pragma: no cover - compiled
    """Whether every arrival is finite, none is before the one ahead of it, and all lie in
    ``[0, duration_s)``."""
    n = arrival.size
    for i in range(n):
        x = arrival[i]
        if not np.isfinite(x):
            return False
        if i > 0 and x < arrival[i - 1]:
            return False
    return n == 0 or (arrival[0] >= 0.0 and arrival[n - 1] < duration_s)


@njit(cache=True)
def nonnegative(x):  # pragma: no cover - compiled
    """Whether no value of ``x`` is negative."""
    for i in range(x.size):
        if x[i] < 0:
            return False
    return True


@njit(cache=True)
def in_unit_interval(x):  # pragma: no cover - compiled
    """Whether every value of ``x`` is in ``[0, 1]`` (NaN is not)."""
    for i in range(x.size):
        if not (x[i] >= 0.0 and x[i] <= 1.0):
            return False
    return True
