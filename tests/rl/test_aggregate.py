"""Tests of :mod:`diloco_gym.rl.aggregate` against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.rl.aggregate import iqm, probability_of_improvement, stratified_bootstrap_ci


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    # five scores: a quarter of 5 is 1 (rounded down) cut at each end -> mean(2, 3, 4)
    assert iqm(np.array([100.0, 1.0, 3.0, 2.0, 4.0])) == pytest.approx(3.0)
    # 2 runs x 4 tasks = 8 scores: cut 2 at each end -> mean of 3, 4, 5, 6
    assert iqm(np.array([[1, 2, 3, 4], [5, 6, 7, 8]])) == pytest.approx(4.5)
    # a run that failed does not drag the IQM as it drags the mean
    scores = np.array([0.70, 0.71, 0.69, 0.72, -2.0])
    assert iqm(scores) == pytest.approx(0.70) and scores.mean() < 0.2


def test_probability_of_improvement_counts_pairs() -> None:
    # x = 1, 3, 5 against y = 2, 4: x wins (3>2), (5>2), (5>4): 3 of 6 pairs
    x = np.array([[1.0], [3.0], [5.0]])
    y = np.array([[2.0], [4.0]])
    assert probability_of_improvement(x, y) == pytest.approx(0.5)
    # ties count one half; two tasks are averaged: task 1 4/4 wins, task 2 half ties
    x2 = np.array([[9.0, 1.0], [8.0, 2.0]])
    y2 = np.array([[0.0, 1.0], [0.0, 2.0]])
    # task 2 pairs: (1,1) tie, (1,2) loss, (2,1) win, (2,2) tie -> (1 + 0.5 + 0.5) / 4 = 0.5
    assert probability_of_improvement(x2, y2) == pytest.approx((1.0 + 0.5) / 2)
    # against one deterministic baseline: the share of runs above it
    runs = np.array([0.6, 0.7, 0.8, 0.9, 0.5])[:, None]
    assert probability_of_improvement(runs, np.array([[0.75]])) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="x has 2 tasks and y 1"):
        probability_of_improvement(x2, y)


def test_the_bootstrap_resamples_runs_within_tasks() -> None:
    """Two runs, one task, the mean: a resample is (a, a), (a, b), (b, a) or (b, b), so the
    mean takes a, (a + b) / 2, b with probabilities 1/4, 1/2, 1/4 and the 95 % interval's
    ends are a and b."""
    m = np.array([[1.0], [3.0]])
    point, low, high = stratified_bootstrap_ci(np.mean, m, reps=4000, rng=np.random.default_rng(0))
    assert (point, low, high) == (2.0, 1.0, 3.0)
    # runs are resampled per task: with the statistic "first task's mean minus second's",
    # identical columns still vary (independent strata), so the interval is not a point
    two = np.array([[1.0, 1.0], [3.0, 3.0]])
    _, lo2, hi2 = stratified_bootstrap_ci(
        lambda a: a[:, 0].mean() - a[:, 1].mean(), two, reps=2000, rng=np.random.default_rng(1)
    )
    assert lo2 == -2.0 and hi2 == 2.0
    # same seed, same interval; identical runs give a point interval
    again = stratified_bootstrap_ci(np.mean, m, reps=4000, rng=np.random.default_rng(0))
    assert again == (point, low, high)
    assert stratified_bootstrap_ci(iqm, np.full((5, 3), 0.4), rng=np.random.default_rng(2)) == (
        pytest.approx(0.4),
        pytest.approx(0.4),
        pytest.approx(0.4),
    )


def test_bad_scores_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        iqm(np.array([0.1, np.nan]))
    with pytest.raises(ValueError, match="runs x tasks"):
        iqm(np.zeros((2, 2, 2)))
