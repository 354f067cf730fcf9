"""Aggregate measures across training runs (Agarwal et al., "Deep Reinforcement Learning at
the Edge of the Statistical Precipice", NeurIPS 2021).

A score matrix holds one score per training run (rows: runs, i.e. training seeds) and task
(columns: regime x budget, say). The measures:

* :func:`iqm`: the interquartile mean, the mean of the middle half of all scores
  (:func:`scipy.stats.trim_mean` with a quarter cut at each end): robust to a run that
  failed or excelled, and less noisy than the median with few runs;
* :func:`probability_of_improvement`: ``P(X > Y)`` of a run of algorithm X against a run of
  Y on a task (ties count one half; the Mann-Whitney ``U`` over ``n * m``), averaged over
  the tasks;
* :func:`stratified_bootstrap_ci`: a percentile confidence interval that resamples the runs
  with replacement *within each task* (the tasks are strata, fixed), as the paper does for
  few runs.

The ``rliable`` package implements the same measures; it is not a dependency because its
pinned ``arch`` release fails to import with the pandas this project installs (pandas 3).
The formulas are few and tested against hand computations (``tests/rl/test_aggregate.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["iqm", "probability_of_improvement", "stratified_bootstrap_ci"]


def _matrix(scores: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(scores, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{what}: need a runs x tasks score matrix, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: scores must be finite numbers")
    return a


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of every score of a runs x tasks matrix (or a vector)."""
    from scipy.stats import trim_mean

    return float(trim_mean(_matrix(scores, "iqm").ravel(), proportiontocut=0.25))


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """``P(X > Y)`` averaged over tasks: for each task, the share of (run of x, run of y)
    pairs in which x's score is higher, ties counting one half.

    Args:
        x, y: runs x tasks score matrices with the same tasks (any numbers of runs; a
            deterministic baseline is one run).
    """
    a, b = _matrix(x, "probability_of_improvement x"), _matrix(y, "probability_of_improvement y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"probability_of_improvement: x has {a.shape[1]} tasks and y {b.shape[1]}")
    diff = a[:, None, :] - b[None, :, :]  # runs_x x runs_y x tasks
    wins = (diff > 0).mean(axis=(0, 1)) + 0.5 * (diff == 0).mean(axis=(0, 1))
    return float(wins.mean())


def stratified_bootstrap_ci(
    statistic: Callable[..., float],
    *matrices: np.ndarray,
    reps: int = 2000,
    rng: np.random.Generator,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """``(point, low, high)``: ``statistic(*matrices)`` and its percentile interval over
    ``reps`` stratified bootstrap resamples, each matrix's runs resampled with replacement
    independently within each task.

    Args:
        statistic: maps the (resampled) runs x tasks matrices to a number.
        matrices: one score matrix per algorithm the statistic reads.
        reps: bootstrap resamples.
        rng: the resampling generator (same seed, same interval).
        alpha: one minus the interval's coverage.
    """
    mats = [_matrix(m, "stratified_bootstrap_ci") for m in matrices]
    if reps < 1 or not 0 < alpha < 1:
        raise ValueError(f"need reps >= 1 and 0 < alpha < 1, got {reps} and {alpha}")
    point = float(statistic(*mats))
    values = np.empty(reps)
    for r in range(reps):
        resampled = []
        for m in mats:
            rows = rng.integers(0, m.shape[0], size=m.shape)  # per task (column) independently
            resampled.append(np.take_along_axis(m, rows, axis=0))
        values[r] = statistic(*resampled)
    low, high = np.percentile(values, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return point, float(low), float(high)
