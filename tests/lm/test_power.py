"""The power of a paired comparison and the validation statistics
(``diloco_gym/lm/power.py``): checked against Monte Carlo simulation, the normal
approximation, scipy, and by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import spearmanr, ttest_rel

from diloco_gym.lm.power import (
    detectable_effect,
    mean_interval,
    paired_power,
    seeds_needed,
    spearman_permutation,
)


def test_paired_power_matches_a_simulated_paired_t_test():
    rng = np.random.default_rng(1)
    delta, sd, n = 0.02, 0.013, 6
    d = rng.normal(delta, sd, size=(20_000, n))
    base = rng.normal(2.6, 0.05, size=(20_000, n))
    p = ttest_rel(base + d, base, axis=1).pvalue
    simulated = float(np.mean(p < 0.05))
    assert paired_power(delta, sd, n) == pytest.approx(simulated, abs=0.015)


def test_power_is_alpha_at_no_effect_and_grows_with_n_and_delta():
    assert paired_power(0.0, 1.0, 10) == pytest.approx(0.05, abs=1e-9)
    assert paired_power(0.5, 1.0, 10) < paired_power(0.5, 1.0, 20) < paired_power(0.8, 1.0, 20)
    assert paired_power(-0.5, 1.0, 10) == pytest.approx(paired_power(0.5, 1.0, 10))


def test_seeds_needed_is_the_first_n_that_reaches_the_power():
    n = seeds_needed(0.5, 1.0, power=0.8)
    assert paired_power(0.5, 1.0, n) >= 0.8 > paired_power(0.5, 1.0, n - 1)
    # the normal approximation ((z_a/2 + z_b) sd / delta)^2 = 31.4, the t-test needs a bit more
    assert 32 <= n <= 35


def test_detectable_effect_inverts_the_power():
    mde = detectable_effect(0.013, 10)
    assert paired_power(mde, 0.013, 10) == pytest.approx(0.8, abs=1e-9)
    assert detectable_effect(0.013, 40) < mde  # more seeds detect less


@pytest.mark.parametrize(
    "call",
    [
        lambda: paired_power(0.1, 0.0, 5),
        lambda: paired_power(0.1, 1.0, 1),
        lambda: paired_power(0.1, 1.0, 5, alpha=1.5),
        lambda: seeds_needed(0.0, 1.0),
        lambda: seeds_needed(1e-9, 1.0, max_n=100),
        lambda: detectable_effect(1.0, 5, power=1.0),
    ],
)
def test_bad_arguments_are_value_errors(call):
    with pytest.raises(ValueError):
        call()


def test_spearman_permutation_exact_p_counts_permutations_by_hand():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [1.0, 2.0, 3.0, 5.0, 4.0]
    rho, p = spearman_permutation(x, y)
    assert rho == pytest.approx(spearmanr(x, y)[0])
    hits = sum(
        abs(spearmanr(x, list(perm))[0]) >= abs(rho) - 1e-12 for perm in itertools.permutations(y)
    )
    assert p == pytest.approx(hits / 120)


def test_spearman_permutation_monte_carlo_is_never_zero_and_small_for_a_strong_rank():
    x = np.arange(12.0)
    rho, p = spearman_permutation(x, x + 0.1 * np.sin(x), draws=2000)
    assert rho == pytest.approx(1.0) and 0 < p <= 2 / 2001
    rho2, p2 = spearman_permutation(x, np.random.default_rng(3).permutation(12), draws=2000)
    assert p2 > 0.05 and abs(rho2) < 0.6


def test_spearman_refuses_constant_or_short_input():
    with pytest.raises(ValueError, match="constant"):
        spearman_permutation([1, 2, 3], [1, 1, 1])
    with pytest.raises(ValueError, match="at least 3"):
        spearman_permutation([1, 2], [1, 2])


def test_mean_interval_contains_the_mean_and_needs_two_units():
    v = [0.1, 0.3, 0.2, 0.5]
    lo, hi = mean_interval(v)
    assert lo <= np.mean(v) <= hi and lo >= min(v) and hi <= max(v)
    with pytest.raises(ValueError, match="2 units"):
        mean_interval([1.0])
