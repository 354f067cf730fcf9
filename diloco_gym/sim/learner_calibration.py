"""The learner surrogate calibrated against real DiLoCo runs, and its calibration file.

``diloco-gym calibrate-learners`` (:mod:`diloco_gym.lm.calibrate`) trains a tiny language
model with DiLoCo under many merge schedules and fits this surrogate to the measured
validation losses. Its unit of time is the trainer's *inner step* (one AdamW step of every
learner, ``tokens_per_inner_step`` bytes in all).

**Surrogate.** Merge ``m`` (0-based) at inner step ``s_m`` synchronises fragment
``m mod F`` (``F = 1``: the whole model); ``g_m`` is the number of inner steps since that
fragment was last synchronised (or since the start). The merge adds the *effective work*::

    w_m = (1 / F) * g_m * efficiency(g_m) * fragment_efficiency(F) * q_bits
    efficiency(g) = 1 / (1 + g / drift_steps + merge_overhead_steps / g)
    fragment_efficiency(F) = 1 / (1 + fragment_penalty * (F - 1))

where ``q_bits`` is ``quant_efficiency[bits]`` (1 at 32 bits, full precision). The global
model's validation loss after merges with total effective work ``W`` (inner steps) is::

    L(W) = loss_floor + loss_scale * (1 + W / work_scale_steps) ** (-loss_exponent)

With ``F = 1`` and 32 bits this is exactly the env's learner model
(:mod:`diloco_gym.sim.learners`): the same efficiency (``drift_s``, ``merge_overhead_s``)
and a power law in the merged work. ``drift_steps`` is the cost of long gaps (local models
drift apart); ``merge_overhead_steps`` the cost of short ones (each outer step with
Nesterov momentum overshoots, so merging very often wastes work; 0 in the env's default
model). ``fragment_penalty`` and ``quant_efficiency`` are the extra losses of
fragmented (Streaming DiLoCo) and quantised synchronisation: a multi-site env with
fragments or low-precision payloads multiplies a merge's effective work by them.

**Env units.** One inner step stands for ``env_steps_per_inner_step`` env training steps
of ``step_seconds`` each, so ``drift_s = drift_steps * env_steps_per_inner_step *
step_seconds`` (``merge_overhead_s`` likewise), and ``work_scale_steps`` maps to the
env's ``tokens_scale`` at the env's nominal total throughput (:func:`learner_params`):
the env's episode then follows the same loss curve as the real runs, in the trainer's loss
units (nats per byte).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.sim.learners import LearnerParams

__all__ = [
    "LearnerCalibration",
    "LearnerCalibrationError",
    "SCHEMA_RESOURCE",
    "SHIPPED",
    "shipped_path",
    "resolve_path",
    "learner_calibration_schema",
    "load_learner_calibration",
    "predict_losses",
    "predict_final_loss",
    "learner_params",
    "env_schedule_loss",
    "env_schedule_losses",
    "quality_cost",
]

SCHEMA_RESOURCE = "data/learner_calibration.schema.json"
PARAMS = (
    "loss_floor",
    "loss_scale",
    "loss_exponent",
    "work_scale_steps",
    "drift_steps",
    "merge_overhead_steps",
    "fragment_penalty",
)
QUANT_BITS = (16, 8, 4)
#: The range of every number of a learner calibration, ``(low, high, low_inclusive)``: the
#: JSON Schema states the same bounds (a test keeps them equal). The fit's own bounds
#: (:mod:`diloco_gym.lm.fit`) lie inside; the upper bounds keep every prediction finite
#: and of a plausible size (a loss of at most 200 nats per byte).
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "loss_floor": (0.0, 100.0, True),
    "loss_scale": (0.0, 100.0, False),
    "loss_exponent": (0.0, 100.0, False),
    "work_scale_steps": (0.0, 1e9, False),
    "drift_steps": (0.0, 1e9, False),
    "merge_overhead_steps": (0.0, 1e9, True),
    "fragment_penalty": (0.0, 1000.0, True),
    "quant_efficiency": (0.0, 10.0, False),
    "env_steps_per_inner_step": (1e-6, 1e6, True),
    "step_seconds": (1e-6, 3600.0, True),
}


def _check_bound(name: str, v: Any) -> None:
    """``ValueError`` naming ``LearnerCalibration.<name>`` unless ``v`` is a finite number
    in its :data:`BOUNDS` (a huge integer included: compared before any float conversion)."""
    lo, hi, inclusive = BOUNDS[name.split("[")[0]]
    ok = (
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, (bool, np.bool_))
        and (v >= lo if inclusive else v > lo)
        and v <= hi  # also refuses NaN
    )
    if not ok:
        low = f"{'>=' if inclusive else '>'} {lo:g}"
        shown = repr(v) if len(repr(v)) <= 40 else f"{repr(v)[:24]}... ({len(repr(v))} characters)"
        raise ValueError(
            f"LearnerCalibration.{name} must be a finite number {low} and <= {hi:g}, got {shown}"
        )


class LearnerCalibrationError(ValueError):
    """A learner calibration file is missing, unreadable, has duplicate keys or breaks the
    schema (``diloco_gym/data/learner_calibration.schema.json``)."""


@dataclass(frozen=True)
class LearnerCalibration:
    """The fitted surrogate (see the module docstring) and the env mapping.

    ``quant_efficiency`` maps bits (16, 8, 4) to the multiplier of a merge's effective
    work; 32 bits is 1. ``document`` is the whole calibration file (intervals, validation,
    metadata) when it was read from one.
    """

    loss_floor: float
    loss_scale: float
    loss_exponent: float
    work_scale_steps: float
    drift_steps: float
    merge_overhead_steps: float = 0.0
    fragment_penalty: float = 0.0
    quant_efficiency: Mapping[int, float] = field(default_factory=dict)
    env_steps_per_inner_step: float = 32.0
    step_seconds: float = 0.14
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in (*PARAMS, "env_steps_per_inner_step", "step_seconds"):
            _check_bound(name, getattr(self, name))
        for b, q in self.quant_efficiency.items():
            if b not in QUANT_BITS:
                raise ValueError(
                    f"LearnerCalibration.quant_efficiency[{b!r}] must be a bits value in "
                    f"{QUANT_BITS}, got {b!r}"
                )
            _check_bound(f"quant_efficiency[{b!r}]", q)

    def efficiency(self, bits: int) -> float:
        """``q_bits``: 1 at 32 bits; ``ValueError`` for bits the calibration did not fit."""
        if bits == 32:
            return 1.0
        if bits not in self.quant_efficiency:
            raise ValueError(
                f"bits={bits} has no fitted quantisation efficiency (fitted: 32, "
                f"{', '.join(str(b) for b in sorted(self.quant_efficiency))})"
            )
        return float(self.quant_efficiency[bits])

    @property
    def drift_s(self) -> float:
        """``drift_steps`` in env seconds."""
        return self.drift_steps * self.env_steps_per_inner_step * self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        """The parameters as the ``params`` block of a calibration file."""
        out: dict[str, Any] = {name: float(getattr(self, name)) for name in PARAMS}
        out["quant_efficiency"] = {
            str(b): float(q) for b, q in sorted(self.quant_efficiency.items())
        }
        return out


def _work(
    schedule: Sequence[float] | np.ndarray, cal: LearnerCalibration, fragments: int, bits: int
):
    s = np.asarray(schedule, dtype=np.float64)
    if s.ndim != 1 or len(s) == 0:
        raise ValueError("schedule must be a non-empty list of merge steps")
    if np.any(np.diff(s) <= 0) or s[0] <= 0:
        raise ValueError("schedule must be strictly increasing and positive")
    if isinstance(fragments, bool) or not isinstance(fragments, (int, np.integer)) or fragments < 1:
        raise ValueError(f"fragments must be an int >= 1, got {fragments!r}")
    last = np.zeros(fragments)
    gaps = np.empty_like(s)
    for m, t in enumerate(s):
        f = m % fragments
        gaps[m] = t - last[f]
        last[f] = t
    factor = cal.efficiency(bits) / (fragments * (1.0 + cal.fragment_penalty * (fragments - 1)))
    eff = 1.0 / (1.0 + gaps / cal.drift_steps + cal.merge_overhead_steps / gaps)
    return np.cumsum(factor * gaps * eff)


def _loss(work, cal: LearnerCalibration):
    return cal.loss_floor + cal.loss_scale * np.power(
        1.0 + np.asarray(work) / cal.work_scale_steps, -cal.loss_exponent
    )


def predict_losses(
    schedule: Sequence[float] | np.ndarray,
    cal: LearnerCalibration,
    fragments: int = 1,
    bits: int = 32,
) -> np.ndarray:
    """The predicted validation loss after each merge of ``schedule`` (inner steps)."""
    return _loss(_work(schedule, cal, fragments, bits), cal)


def predict_final_loss(
    schedule: Sequence[float] | np.ndarray,
    cal: LearnerCalibration,
    fragments: int = 1,
    bits: int = 32,
) -> float:
    """The predicted validation loss after the last merge of ``schedule``."""
    return float(predict_losses(schedule, cal, fragments, bits)[-1])


def learner_params(cal: LearnerCalibration, base: LearnerParams | None = None) -> LearnerParams:
    """The env's learner parameters with the calibrated loss curve and drift.

    ``base`` gives the learners and throughputs (default :class:`LearnerParams`); its
    nominal total throughput ``num_learners * throughput_tokens_per_s`` converts
    ``work_scale_steps`` into env tokens.
    """
    base = base or LearnerParams()
    seconds_per_inner = cal.env_steps_per_inner_step * cal.step_seconds
    rate = base.num_learners * base.throughput_tokens_per_s
    return replace(
        base,
        loss_floor=cal.loss_floor,
        loss_scale=cal.loss_scale,
        loss_exponent=cal.loss_exponent,
        tokens_scale=cal.work_scale_steps * seconds_per_inner * rate,
        drift_s=cal.drift_s,
        merge_overhead_s=cal.merge_overhead_steps * seconds_per_inner,
    )


def env_schedule_loss(
    merge_times_s: Sequence[float] | np.ndarray, cal: LearnerCalibration
) -> float:
    """The predicted validation loss after an env episode's merges (merge start times in
    seconds from the episode start): the env-second gaps in inner steps, then
    :func:`predict_final_loss`. No merge: the initial loss."""
    t = np.asarray(merge_times_s, dtype=np.float64)
    if len(t) == 0:
        return float(cal.loss_floor + cal.loss_scale)
    return predict_final_loss(t / (cal.env_steps_per_inner_step * cal.step_seconds), cal)


def env_schedule_losses(merge_times_s: np.ndarray, cal: LearnerCalibration) -> np.ndarray:
    """:func:`env_schedule_loss` of many env schedules with one number of merges at once:
    ``merge_times_s`` is ``(K, M)``, one schedule's merge start times (seconds) per row; the
    result is ``(K,)`` (the surrogate of one fragment at 32 bits, as
    :func:`env_schedule_loss`; equal to it up to the order of the sum). A matched-random
    control's draws are priced so, without a Python loop per draw."""
    t = np.asarray(merge_times_s, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"merge_times_s must be a (K, M) array, got shape {t.shape}")
    if t.shape[1] == 0:
        return np.full(t.shape[0], float(cal.loss_floor + cal.loss_scale))
    gaps = np.diff(t / (cal.env_steps_per_inner_step * cal.step_seconds), axis=1, prepend=0.0)
    if not np.all(gaps > 0):  # NaN too
        raise ValueError("schedule must be strictly increasing and positive")
    eff = 1.0 / (1.0 + gaps / cal.drift_steps + cal.merge_overhead_steps / gaps)
    return np.asarray(_loss((gaps * eff).sum(axis=1), cal), dtype=np.float64)


def quality_cost(merge_times_s: Sequence[float] | np.ndarray, cal: LearnerCalibration) -> float:
    """The model-quality price of an episode's schedule: its predicted loss minus that of
    fixed H with the same number of merges over the same span (evenly spaced, the last at
    the schedule's last merge); ``0`` with no merge. Without a merge overhead it is never
    negative (the merged work ``g * efficiency(g)`` is then concave in ``g``, so equal gaps
    merge the most); with ``merge_overhead_steps > 0`` it is convex for gaps below about
    ``merge_overhead_steps``, and uneven gaps there can merge more (a negative price)."""
    t = np.asarray(merge_times_s, dtype=np.float64)
    if len(t) == 0:
        return 0.0
    even = t[-1] * np.arange(1, len(t) + 1) / len(t)
    return env_schedule_loss(t, cal) - env_schedule_loss(even, cal)


#: The name that stands for the learner calibration shipped with the package
#: (``diloco_gym/data/learner_calibration_default.json``, the model ``DiLoCoSync-v2`` uses)
#: wherever a learner calibration file is asked for.
SHIPPED = "shipped"


def shipped_path() -> str:
    """The absolute path of the shipped learner calibration file."""
    return str(resources.files("diloco_gym").joinpath("data/learner_calibration_default.json"))


def resolve_path(source: str | Path) -> str | Path:
    """``source`` with the name :data:`SHIPPED` replaced by :func:`shipped_path` (any other
    value unchanged; a file of that name is reached as ``./shipped``)."""
    return shipped_path() if isinstance(source, str) and source == SHIPPED else source


def learner_calibration_schema() -> dict:
    """The JSON Schema of learner calibration files (shipped as package data)."""
    return json.loads(resources.files("diloco_gym").joinpath(SCHEMA_RESOURCE).read_text())


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise LearnerCalibrationError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> float:
    raise LearnerCalibrationError(f"{name} is not a number JSON allows")


def load_learner_calibration(
    source: str | Path | Mapping[str, Any] | LearnerCalibration,
) -> LearnerCalibration:
    """A learner calibration from a file (JSON, utf-8 with or without BOM), a parsed
    document or an existing :class:`LearnerCalibration`.

    The document is validated against the shipped JSON Schema (with ``jsonschema``);
    duplicate keys and NaN/Infinity are refused. Raises :class:`LearnerCalibrationError`
    naming the file and the field at fault.
    """
    if isinstance(source, LearnerCalibration):
        return source
    where = "learner calibration"
    if isinstance(source, Mapping):
        doc: Any = dict(source)
    else:
        from diloco_gym.sim import parsing
        from diloco_gym.sim.limits import LimitError

        source = resolve_path(source)
        where = str(source)
        try:  # at most DILOCO_GYM_MAX_CALIBRATION_BYTES, DILOCO_GYM_MAX_NESTING levels deep
            text = parsing.read_text(
                source,
                limit_name="CALIBRATION_BYTES",
                encoding="utf-8-sig",
                what="learner calibration size in bytes",
            )
            doc = parsing.parse_json(
                text, where, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
            )
        except LimitError as exc:
            raise LearnerCalibrationError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LearnerCalibrationError(f"{where}: cannot read: {exc}") from None
        except LearnerCalibrationError as exc:
            raise LearnerCalibrationError(f"{where}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise LearnerCalibrationError(f"{where}: not valid JSON: {exc}") from None
    import jsonschema

    validator = jsonschema.Draft202012Validator(learner_calibration_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise LearnerCalibrationError(f"{where}: field {path}: {e.message}")
    p = doc["params"]
    env = doc["env_mapping"]
    try:
        return LearnerCalibration(
            loss_floor=p["loss_floor"],
            loss_scale=p["loss_scale"],
            loss_exponent=p["loss_exponent"],
            work_scale_steps=p["work_scale_steps"],
            drift_steps=p["drift_steps"],
            merge_overhead_steps=p["merge_overhead_steps"],
            fragment_penalty=p["fragment_penalty"],
            quant_efficiency={int(b): float(q) for b, q in p["quant_efficiency"].items()},
            env_steps_per_inner_step=env["env_steps_per_inner_step"],
            step_seconds=env["step_seconds"],
            document=doc,
        )
    except (ValueError, OverflowError) as exc:
        raise LearnerCalibrationError(f"{where}: {exc}") from None
