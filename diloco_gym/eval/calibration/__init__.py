"""Effect-size transfer (docs/calibration.md): simulated vs real-sidecar effect sizes.

The simulator supports an SLO claim in a regime only when its effect sizes match what a
real sidecar showed. The real measurements ship as ``data/calibration_reference.json``
(the reference implementation's result files, GitHub maincodeMax/workload-aware-diloco);
a user can pass their own file with the same layout (``diloco-gym report --calibration
FILE``). Every file is validated against ``data/calibration.schema.json``.

Simulated effect sizes are measured on a fixed-256 schedule (merges every 256 steps),
pooling the requests of several seeds so that the p95s are stable.

Verdicts per regime:

* ``no measurable SLO effect``: the real sync ratio is within ``tolerance`` of 1, so merges
  did not measurably slow the real sidecar and no SLO claim about merges is possible;
* ``calibrated``: the simulated sync ratio and high/low ratio are both within
  ``tolerance`` of the real ones;
* ``uncalibrated``: otherwise.

The package's modules: :mod:`~diloco_gym.eval.calibration.schema` (the schema, strict JSON
reading, :class:`CalibrationFileError`), :mod:`~diloco_gym.eval.calibration.consistency`
(the contradictions the schema cannot express), :mod:`~diloco_gym.eval.calibration.files`
(:func:`load_calibration`) and :mod:`~diloco_gym.eval.calibration.transfer` (simulated
effect sizes, verdicts, the sidecar fit). Every public name is importable from here.
"""

from __future__ import annotations

from diloco_gym.eval.calibration.consistency import MIN_PLAUSIBLE_RATIO, check_consistency
from diloco_gym.eval.calibration.files import Calibration, load_calibration, slower_than_slo
from diloco_gym.eval.calibration.schema import (
    METRICS,
    SCHEMA_RESOURCE,
    CalibrationFileError,
    calibration_schema,
    read_json_file,
    validate_calibration,
    validate_schema,
)
from diloco_gym.eval.calibration.transfer import (
    TOLERANCE,
    fit_sidecar,
    fixed_schedule,
    main,
    measured_intervals,
    measured_merge_plan,
    measured_utilization,
    simulate_as_measured,
    simulated_effect_sizes,
    transfer_verdict,
)

__all__ = [
    "load_calibration",
    "simulated_effect_sizes",
    "transfer_verdict",
    "fit_sidecar",
    "measured_intervals",
    "Calibration",
    "CalibrationFileError",
    "calibration_schema",
    "validate_calibration",
    "measured_utilization",
    "measured_merge_plan",
    "simulate_as_measured",
    "read_json_file",
    "check_consistency",
    "slower_than_slo",
    "validate_schema",
    "fixed_schedule",
    "main",
    "METRICS",
    "MIN_PLAUSIBLE_RATIO",
    "SCHEMA_RESOURCE",
    "TOLERANCE",
]
