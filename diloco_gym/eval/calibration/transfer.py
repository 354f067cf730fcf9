"""Effect-size transfer: the simulator's effect sizes (replayed under the conditions a live
calibration was measured at, when it records them), the transfer verdicts and the sidecar
fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from diloco_gym.envs.episode import build_episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.schedule import replay_schedule
from diloco_gym.eval.calibration.files import load_calibration
from diloco_gym.eval.calibration.schema import METRICS, read_json_file
from diloco_gym.sim.learners import LearnerParams
from diloco_gym.sim.regimes import REGIMES, get_regime
from diloco_gym.sim.sidecar import SidecarParams, effect_sizes, percentile

#: Largest accepted difference between simulated and measured effect sizes.
TOLERANCE = 0.05


def measured_utilization(path: str | Path | None, sidecar: SidecarParams) -> float | None:
    """The utilization a live calibration file was measured at, under ``sidecar``.

    ``diloco-gym calibrate`` records the replayed rate and the mean prompt and output
    tokens it sent (``metadata.trace``); the nominal service time is linear in the tokens,
    so the mean offered work over capacity is
    ``rate * base_latency(mean prompt, mean output) / slots`` exactly. ``None`` for the
    shipped reference (measured on the regimes' own loads) or a file without those fields.
    """
    return _utilization_of(_live_document(path), sidecar)


def _live_document(path: str | Path | None) -> dict:
    """A calibration file's JSON, read once for the fields of a live run (``{}`` for the
    shipped reference). Read as strictly as :func:`load_calibration` reads it (a byte-order
    mark is fine); an unreadable file is an error, never an empty document.

    Raises:
        CalibrationFileError: the file cannot be read or parsed.
    """
    if path is None:
        return {}
    doc = read_json_file(path)
    return doc if isinstance(doc, dict) else {}


def _utilization_of(doc: dict, sidecar: SidecarParams) -> float | None:
    """:func:`measured_utilization` of a parsed file."""
    try:
        trace = doc.get("metadata", {}).get("trace", {})
        rate = trace.get("rate_rps")
        if rate is None and trace.get("duration_s"):
            rate = trace["requests"] / trace["duration_s"]
        prompt, output = trace["sent_prompt_tokens_mean"], trace["sent_output_tokens_mean"]
        rate, prompt, output = float(rate), float(prompt), float(output)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(np.isfinite(v) and v >= 0 for v in (rate, prompt, output)) or rate == 0:
        return None
    service = (
        sidecar.ttft_ms
        + sidecar.prefill_ms_per_token * prompt
        + sidecar.decode_ms_per_token * output
    ) / 1000.0
    return rate * service / sidecar.slots


def measured_merge_plan(path: str | Path | None) -> tuple[float, float] | None:
    """``(merge_seconds, start_to_start_seconds)`` of a live calibration's merge plan.

    ``diloco-gym calibrate`` records its per-phase plan as ``schedule`` (start and length of
    each merge within a sync phase). A sync ratio depends on how long the merges are and
    how close together (a merge's backlog spills into the requests before the next one), so the
    simulated side of the transfer check replays merges of the measured length at the
    measured mean spacing. ``None`` for the shipped reference, a file without a plan, or a
    plan of fewer than two merges.
    """
    return _plan_of(_live_document(path))


def _plan_of(doc: dict) -> tuple[float, float] | None:
    """:func:`measured_merge_plan` of a parsed file."""
    try:
        plan = doc.get("schedule", [])
        starts = [float(m["start_s"]) for m in plan]
        lengths = [float(m["length_s"]) for m in plan]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if len(starts) < 2 or not all(np.isfinite(starts + lengths)) or min(lengths) <= 0:
        return None
    spacing = float(np.mean(np.diff(starts)))
    return (float(np.mean(lengths)), spacing) if spacing > 0 else None


def simulate_as_measured(
    regime: str,
    path: str | Path | None,
    sidecar: SidecarParams | None,
    seeds=range(8),
) -> tuple[dict, float | None]:
    """The simulated effect sizes a calibration's transfer check compares with, and the
    utilization they were simulated at.

    For a live file (``path`` with a recorded load and merge plan) the fitted ``sidecar``
    is replayed under the conditions of the measurement: the measured utilization
    (:func:`measured_utilization`) and merges of the measured length and spacing
    (:func:`measured_merge_plan`). Otherwise the regime's own load and the default
    schedule (8 s merges every 256 steps).
    """
    doc = _live_document(path) if sidecar is not None else {}
    u_cal = _utilization_of(doc, sidecar) if sidecar is not None else None
    plan = _plan_of(doc)
    sim = simulated_effect_sizes(
        regime,
        seeds=seeds,
        sidecar=sidecar,
        utilization=u_cal,
        merge_seconds=plan[0] if plan else None,
        merge_every_s=plan[1] if plan else None,
    )
    return sim, u_cal


def fixed_schedule(n: int, every: int, h_min: int, h_max: int) -> list[int]:
    """Merges every ``every`` decisions (clamped to the corridor)."""
    every = min(max(every, h_min), h_max)
    return list(range(every, n, every))


def simulated_effect_sizes(
    regime: str,
    seeds=range(8),
    sidecar: SidecarParams | None = None,
    params: EnvParams | None = None,
    calibrated_on: bool = True,
    utilization: float | None = None,
    merge_seconds: float | None = None,
    merge_every_s: float | None = None,
) -> dict:
    """Effect sizes of the simulator for ``regime``, pooled over ``seeds``.

    With ``calibrated_on`` the trace comes from the regime the parameters were fitted on
    (for bursty: sync-heavy traces with the bursty sidecar parameters). The trace regime
    runs at its own utilization on ``sidecar`` (:meth:`SyntheticRegime.with_load`): a
    fitted sidecar of lower capacity sees proportionally lower rates, the load its effect
    sizes were measured at relative to its capacity, instead of an overload; with the
    regimes' default sidecars the traces are unchanged. ``utilization`` replays it at that
    utilization instead (the load a live calibration was measured at,
    :func:`measured_utilization`).

    Merges last ``params.merge_seconds`` and start every 256 steps; ``merge_seconds`` and
    ``merge_every_s`` (a live calibration's plan, :func:`measured_merge_plan`) replace
    both, with merges every ``merge_every_s`` rounded to whole decisions (the schedule of
    the measurement, not an agent's, so the training corridor does not apply).
    """
    params = params or EnvParams()
    if merge_seconds is not None:
        params = replace(params, merge_seconds=merge_seconds)
    reg = get_regime(regime)
    trace_regime = get_regime(reg.calibrated_on) if calibrated_on and reg.calibrated_on else reg
    sidecar = sidecar or reg.sidecar
    trace_regime = trace_regime.with_load(sidecar, target_utilization=utilization)
    lat, act, prs = [], [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        ep = build_episode(trace_regime(rng), params, sidecar, LearnerParams(), rng, seed)
        if merge_every_s is not None:
            every = max(1, round(merge_every_s / params.decision_seconds))
            merges = list(range(every, ep.n_decisions, every))
        else:
            merges = fixed_schedule(
                ep.n_decisions, 256 // params.decision_interval, params.h_min, params.h_max
            )
        res = replay_schedule(ep, merges, params, sidecar)
        lat.append(res.latency_s)
        act.append(res.sync_active)
        prs.append(res.pressure)
    from diloco_gym.sim.sidecar import ReplayResult

    pooled = ReplayResult(
        np.concatenate(lat), np.zeros(0, bool), np.concatenate(act), np.concatenate(prs)
    )
    out = effect_sizes(pooled, sidecar.high_pressure)
    out["p95_ms"] = percentile(pooled.latency_s * 1000, 95)
    return out


def transfer_verdict(
    simulated: dict, measured: dict, tolerance: float = TOLERANCE, interval: dict | None = None
) -> str:
    """``calibrated``, ``uncalibrated`` or ``no measurable SLO effect`` (see module doc).

    Args:
        simulated / measured: effect sizes (``p95_high_low``, ``p95_sync_ratio``).
        tolerance: largest accepted difference.
        interval: optional confidence intervals of the measured effect sizes,
            ``{metric: (lo, hi)}`` (a live run's ``p95_sync_ratio_ci`` ... fields, see
            :func:`measured_intervals`). When the verdict at either end of an interval
            differs from the verdict at the measured value, the interval is too wide to
            decide and the verdict is ``"uncertain"``. Without it (or with no finite
            interval) the verdict is exactly the point verdict.
    """
    verdict = _point_verdict(simulated, measured, tolerance)
    for metric, bounds in (interval or {}).items():
        if bounds is None or metric not in measured:
            continue
        for end in bounds:
            if end is None or not np.isfinite(end):
                continue
            if _point_verdict(simulated, {**measured, metric: float(end)}, tolerance) != verdict:
                return "uncertain"
    return verdict


def measured_intervals(entry: dict) -> dict[str, tuple[float, float]]:
    """The confidence intervals a calibration entry carries (``{metric: (lo, hi)}``; empty
    for entries without them, such as the shipped reference)."""
    out = {}
    for metric in METRICS:
        ci = entry.get(f"{metric}_ci")
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            out[metric] = (float(ci[0]), float(ci[1]))
    return out


def _point_verdict(simulated: dict, measured: dict, tolerance: float) -> str:
    if abs(measured["p95_sync_ratio"] - 1.0) <= tolerance:
        return "no measurable SLO effect"
    ok = all(
        abs(simulated[m] - measured[m]) <= tolerance
        for m in METRICS
        if np.isfinite(simulated.get(m, np.nan))
    )
    return "calibrated" if ok else "uncalibrated"


def fit_sidecar(regime: str, measured: dict, seeds=range(8), iters: int = 18) -> SidecarParams:
    """Fit ``sync_slowdown`` and ``pressure_gain`` of a regime to measured ratios (bisection).

    Each ratio grows monotonically with its own parameter, so the two are fitted one after
    the other (sync first, then pressure, then sync again).
    """
    sidecar = get_regime(regime).sidecar

    def solve(field: str, metric: str, target: float, current: SidecarParams) -> SidecarParams:
        if target <= 1.0 + 1e-3:
            return replace(current, **{field: 0.0})
        lo, hi = 0.0, 3.0
        for _ in range(iters):
            mid = (lo + hi) / 2
            got = simulated_effect_sizes(regime, seeds, replace(current, **{field: mid}))[metric]
            lo, hi = (mid, hi) if got < target else (lo, mid)
        return replace(current, **{field: round((lo + hi) / 2, 3)})

    for field, metric in (
        ("sync_slowdown", "p95_sync_ratio"),
        ("pressure_gain", "p95_high_low"),
        ("sync_slowdown", "p95_sync_ratio"),
    ):
        sidecar = solve(field, metric, measured[metric], sidecar)
    return sidecar


def main() -> None:  # pragma: no cover - a maintenance command
    """Print the fitted sidecar parameters per regime: ``python -m diloco_gym.eval.calibration``."""
    cal = load_calibration()
    for name in REGIMES:
        if REGIMES[name].calibrated_on not in ("", name):
            continue
        fitted = fit_sidecar(name, cal.measured(name))
        sim = simulated_effect_sizes(name, sidecar=fitted)
        print(
            f"{name:15s} sync_slowdown={fitted.sync_slowdown:.3f} "
            f"pressure_gain={fitted.pressure_gain:.3f} -> "
            + " ".join(f"{k}={v:.3f}" for k, v in sim.items())
        )
