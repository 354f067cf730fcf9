"""Power of a paired comparison of two merge schedules, and the statistics of the learner
calibration's validation.

The learner calibration compares schedules *within* a seed: every schedule of a seed starts
from the same initial model and each learner draws the same batches in the same order (common
random numbers), so the difference of two schedules' final losses on one seed is free of the
seed-to-seed variance that dominates unpaired comparisons. The seeds are the independent
units. With ``n`` seeds whose paired differences have standard deviation ``sd``, a two-sided
paired t-test at level ``alpha`` detects a true mean difference ``delta`` with probability

    power = P(|T| > t_{1 - alpha/2, n - 1}),   T ~ noncentral t(df = n - 1, nc = delta sqrt(n) / sd)

(:func:`paired_power`). :func:`seeds_needed` inverts it for ``n``, :func:`detectable_effect`
for ``delta`` (the smallest effect the design detects with the stated power).

:func:`spearman_permutation` gives Spearman's rho with its permutation p (exact up to
:data:`EXACT_PERMUTATIONS_MAX` items, Monte Carlo above), :func:`mean_interval` a bootstrap
interval of a mean over independent units.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "paired_power",
    "seeds_needed",
    "detectable_effect",
    "spearman_permutation",
    "mean_interval",
    "EXACT_PERMUTATIONS_MAX",
]

#: Up to this many items :func:`spearman_permutation` enumerates every permutation (8! =
#: 40,320); above, it draws ``draws`` random ones.
EXACT_PERMUTATIONS_MAX = 8


def _check(sd: float, alpha: float, power: float | None = None) -> None:
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a finite number > 0, got {sd!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if power is not None and not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")


def paired_power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The power of a two-sided paired t-test at level ``alpha`` on ``n`` units whose
    differences have standard deviation ``sd``, when their true mean is ``delta``."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    _check(sd, alpha)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an int >= 2 (a paired t-test needs two units), got {n!r}")
    df = int(n) - 1
    crit = float(student_t.ppf(1 - alpha / 2, df))
    nc = abs(delta) * math.sqrt(n) / sd
    return float(nct.sf(crit, df, nc) + nct.cdf(-crit, df, nc))


def seeds_needed(
    delta: float, sd: float, power: float = 0.8, alpha: float = 0.05, max_n: int = 10_000
) -> int:
    """The fewest units (seeds) whose paired t-test detects ``delta`` with ``power``.

    Raises:
        ValueError: ``delta`` is 0 or not even ``max_n`` units reach ``power``.
    """
    _check(sd, alpha, power)
    if not (math.isfinite(delta) and delta != 0):
        raise ValueError(f"delta must be a finite non-zero difference, got {delta!r}")
    lo, hi = 2, 2
    while paired_power(delta, sd, hi, alpha) < power:
        if hi >= max_n:
            raise ValueError(f"more than {max_n} seeds are needed to detect {delta} (sd {sd})")
        lo, hi = hi, min(2 * hi, max_n)
    while lo < hi:  # power grows with n: the first n that reaches it
        mid = (lo + hi) // 2
        if paired_power(delta, sd, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def detectable_effect(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference (> 0) a paired t-test on ``n`` units of standard
    deviation ``sd`` detects with ``power`` at level ``alpha``."""
    from scipy.optimize import brentq

    _check(sd, alpha, power)
    hi = sd
    while paired_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(brentq(lambda d: paired_power(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-12))


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def spearman_permutation(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    draws: int = 20_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Spearman's rho of ``x`` and ``y`` and its two-sided permutation p: the share of
    permutations of ``y`` whose ``|rho|`` is at least the observed one (exact enumeration up
    to :data:`EXACT_PERMUTATIONS_MAX` items; above, ``draws`` random permutations from
    ``numpy.random.default_rng(seed)``, the observed order counted among them so p is never
    0). Needs at least 3 pairs."""
    rx, ry = _ranks(np.asarray(x, dtype=np.float64)), _ranks(np.asarray(y, dtype=np.float64))
    n = rx.size
    if n != ry.size:
        raise ValueError(f"x and y differ in length ({n} and {ry.size})")
    if n < 3:
        raise ValueError(f"Spearman's rho needs at least 3 pairs, got {n}")
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        raise ValueError("Spearman's rho is undefined when x or y is constant")
    cx, cy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float(cx @ cx) * float(cy @ cy))
    rho = float(cx @ cy) / norm
    obs = abs(rho) - 1e-12
    if n <= EXACT_PERMUTATIONS_MAX:
        perms = np.array(list(itertools.permutations(range(n))))
        stats = np.abs(cy[perms] @ cx) / norm
        return rho, float(np.mean(stats >= obs))
    rng = np.random.default_rng(seed)
    hits = sum(int(abs(float(cy[rng.permutation(n)] @ cx)) / norm >= obs) for _ in range(draws))
    return rho, (hits + 1) / (draws + 1)


def mean_interval(
    values: Sequence[float], reps: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of ``values`` (independent units)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        raise ValueError(f"an interval needs at least 2 units, got {v.size}")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(reps, v.size))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)
