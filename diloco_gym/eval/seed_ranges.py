"""Disjoint episode-seed ranges: evaluation never sees a training or validation episode.

| range | used by |
|---|---|
| ``[0, VALIDATION_SEED0)`` | ``report``, ``run``, ``frontier``, ``sweep``: test episodes |
| ``[VALIDATION_SEED0, TRAIN_SEED_LOW)`` | validation during training and tuning |
| ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)`` | training episodes |

The protocol refuses seeds at or above :data:`VALIDATION_SEED0`, so the split holds by
construction on every backend.
"""

from __future__ import annotations

__all__ = ["TRAIN_SEED_LOW", "TRAIN_SEED_HIGH", "VALIDATION_SEED0", "check_test_seeds"]

#: Training episode seeds are drawn from ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)``.
TRAIN_SEED_LOW = 10**6
TRAIN_SEED_HIGH = 2**30
#: First validation seed (validation during training and tuning).
VALIDATION_SEED0 = 900_000


def check_test_seeds(seed0: int, n: int, what: str = "episode seeds") -> None:
    """Refuse test seeds ``seed0 .. seed0 + n - 1`` outside ``[0, VALIDATION_SEED0)``.

    Raises:
        ValueError: naming the range, when any seed is negative or would be a validation
            or training seed.
    """

    def short(x: int) -> str:  # a 400-digit seed, shown by its length
        return str(x) if len(str(x)) <= 20 else f"{str(x)[:8]}... ({len(str(x))} digits)"

    if seed0 < 0:
        raise ValueError(f"seed0 must be >= 0, got {short(seed0)}")
    if seed0 + n > VALIDATION_SEED0:
        raise ValueError(
            f"{what} {short(seed0)}..{short(seed0 + n - 1)} reach {VALIDATION_SEED0}: seeds "
            f"from {VALIDATION_SEED0} are validation seeds and from "
            f"{TRAIN_SEED_LOW} training seeds of learned agents; test seeds "
            f"stay below {VALIDATION_SEED0}"
        )
