"""The ranges of :class:`~diloco_gym.sim.sidecar.SidecarParams`' fields and their check.

Every field is a finite number, at least 0 and at most :data:`SIDECAR_MAX`: the ranges of
a live calibration's ``fitted_sidecar`` (``diloco_gym/data/calibration.schema.json``; a
test keeps them equal), so that a fleet site's ``sidecar`` override, a calibration file
and code get the same bounds (``tail_s = 1e308`` asked for an endless episode). ``slots``,
``slo_ms`` and ``serving_capacity_rps`` are above 0 and ``high_pressure`` is in (0, 1].
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

__all__ = ["SIDECAR_MAX", "check_sidecar_fields"]

#: The largest value of each ``SidecarParams`` field.
SIDECAR_MAX: dict[str, float] = {
    "ttft_ms": 600_000.0,
    "prefill_ms_per_token": 1000.0,
    "decode_ms_per_token": 10_000.0,
    "slots": 100_000.0,
    "sync_slowdown": 100.0,
    "pressure_gain": 100.0,
    "slo_ms": 3_600_000.0,
    "serving_capacity_rps": 1_000_000.0,
    "high_pressure": 1.0,
    "tail_s": 3600.0,
}


def _finite(value: object) -> bool:
    """A finite number (an integer too large for a float is not)."""
    try:
        return bool(np.isfinite(float(value)))  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False


def check_sidecar_fields(params: Any) -> None:
    """Refuse a ``SidecarParams`` whose field is out of its range (a ``ValueError`` naming
    ``SidecarParams.<field>``)."""
    for f in fields(params):
        value = getattr(params, f.name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not _finite(value):
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:24]}..."
            raise ValueError(f"SidecarParams.{f.name} must be a finite number, got {shown}")
        if value < 0:
            raise ValueError(f"SidecarParams.{f.name} must be >= 0, got {value!r}")
        if value > SIDECAR_MAX[f.name]:
            raise ValueError(
                f"SidecarParams.{f.name} must be at most {SIDECAR_MAX[f.name]:g}, got {value!r}"
            )
    for name in ("slots", "slo_ms", "serving_capacity_rps"):
        if getattr(params, name) <= 0:
            raise ValueError(f"SidecarParams.{name} must be > 0, got {getattr(params, name)!r}")
    if not 0 < params.high_pressure <= 1:
        raise ValueError(
            f"SidecarParams.high_pressure must be in (0, 1], got {params.high_pressure!r}"
        )
