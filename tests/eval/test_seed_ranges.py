"""diloco_gym/eval/seed_ranges.py: the test, validation and training seed ranges are
disjoint and ordered, and check_test_seeds refuses (naming the range) any test seed outside
``[0, VALIDATION_SEED0)``, right up to the boundary."""

from __future__ import annotations

import pytest

from diloco_gym.eval import seed_ranges
from diloco_gym.eval.seed_ranges import (
    TRAIN_SEED_HIGH,
    TRAIN_SEED_LOW,
    VALIDATION_SEED0,
    check_test_seeds,
)


def test_the_ranges_are_ordered_and_disjoint():
    test = range(0, VALIDATION_SEED0)
    validation = range(VALIDATION_SEED0, TRAIN_SEED_LOW)
    train = range(TRAIN_SEED_LOW, TRAIN_SEED_HIGH)
    assert 0 < VALIDATION_SEED0 < TRAIN_SEED_LOW < TRAIN_SEED_HIGH
    for a, b in ((test, validation), (validation, train), (test, train)):
        assert a.stop <= b.start  # ranges are half-open: no seed in both
    assert len(validation) >= 1000  # room for the tune and training validation episodes
    assert TRAIN_SEED_HIGH <= 2**31 - 1  # a training seed fits a signed 32-bit seed


def test_the_documented_values():
    assert (VALIDATION_SEED0, TRAIN_SEED_LOW, TRAIN_SEED_HIGH) == (900_000, 10**6, 2**30)
    assert seed_ranges.__all__ == [
        "TRAIN_SEED_LOW",
        "TRAIN_SEED_HIGH",
        "VALIDATION_SEED0",
        "check_test_seeds",
    ]


@pytest.mark.parametrize(
    ("seed0", "n"),
    [(0, 1), (0, VALIDATION_SEED0), (VALIDATION_SEED0 - 1, 1), (0, 0), (123, 20)],
)
def test_seeds_below_the_validation_range_pass(seed0, n):
    assert check_test_seeds(seed0, n) is None


@pytest.mark.parametrize(
    ("seed0", "n", "last"),
    [
        (0, VALIDATION_SEED0 + 1, VALIDATION_SEED0),
        (VALIDATION_SEED0 - 1, 2, VALIDATION_SEED0),
        (VALIDATION_SEED0, 1, VALIDATION_SEED0),
        (TRAIN_SEED_LOW, 5, TRAIN_SEED_LOW + 4),
    ],
)
def test_a_seed_in_the_validation_or_training_range_is_refused(seed0, n, last):
    with pytest.raises(ValueError) as info:
        check_test_seeds(seed0, n, "frontier seeds")
    msg = str(info.value)
    assert msg.startswith(f"frontier seeds {seed0}..{last} reach {VALIDATION_SEED0}: ")
    assert f"from {TRAIN_SEED_LOW} training seeds" in msg
    assert f"test seeds stay below {VALIDATION_SEED0}" in msg


def test_the_default_label_is_episode_seeds():
    with pytest.raises(ValueError, match=r"^episode seeds 899999\.\.900000 reach 900000"):
        check_test_seeds(VALIDATION_SEED0 - 1, 2)


@pytest.mark.parametrize("seed0", [-1, -100])
def test_a_negative_seed0_is_refused_with_its_value(seed0):
    with pytest.raises(ValueError, match=rf"^seed0 must be >= 0, got {seed0}$"):
        check_test_seeds(seed0, 1)


def test_the_report_and_the_frontier_refuse_a_validation_seed():
    """The protocol's configurations call the check (the split holds on every backend)."""
    from diloco_gym.eval.frontier import FrontierConfig
    from diloco_gym.eval.report import ReportConfig

    ReportConfig(seed0=VALIDATION_SEED0 - 2, seeds=2)  # the last two test seeds: fine
    with pytest.raises(ValueError, match="test seeds .*899999..900000 reach 900000"):
        ReportConfig(seed0=VALIDATION_SEED0 - 1, seeds=2)
    # One validator (ReplayOptions): the frontier says it in the report's words.
    with pytest.raises(ValueError, match=r"test seeds \(--seed0, --seeds\) 900000..900001 reach"):
        FrontierConfig(seed0=VALIDATION_SEED0, seeds=2)
