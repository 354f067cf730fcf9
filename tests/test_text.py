"""The leaf diloco_gym.text: numbers as text for tables and console lines."""

from __future__ import annotations

import math

import numpy as np

from diloco_gym.text import finite, fmt, fmt_p


def test_fmt_rounds_finite_numbers_and_marks_the_rest() -> None:
    assert fmt(1.23456) == "1.23"
    assert fmt(np.float64(2.5), 3) == "2.500"
    assert fmt(np.int64(7), 1) == "7.0"
    for missing in (None, math.nan, math.inf, -np.inf, "text"):
        assert fmt(missing) == "n/a", missing
    assert fmt(None, missing="-") == "-"
    assert finite(0.0) and not finite(math.nan) and not finite("1") and not finite(None)


def test_fmt_p_three_decimals_a_floor_and_missing() -> None:
    assert fmt_p(0.04567) == "0.046"
    assert fmt_p(0.001) == "0.001"
    assert fmt_p(0.000999) == "<0.001"
    assert fmt_p(math.nan) == "n/a"


def test_count_says_the_noun_in_the_plural_unless_one():
    from diloco_gym.text import count

    assert [count(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]
