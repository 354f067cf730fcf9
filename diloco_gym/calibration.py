"""Effect-size transfer (SPEC.md §4.1): simulated vs real-sidecar effect sizes.

The simulator supports an SLO claim in a regime only when its effect sizes match what a
real sidecar showed. The real measurements ship as ``data/calibration_reference.json``
(the reference implementation's result files, as quoted in SPEC.md §5); a user can pass
their own file with the same layout (``diloco-gym report --calibration FILE``).

Simulated effect sizes are measured on a fixed-256 schedule (merges every 256 steps),
pooling the requests of several seeds so that the p95s are stable.

Verdicts per regime:

* ``no measurable SLO effect``: the real sync ratio is within ``tolerance`` of 1, so merges
  did not measurably slow the real sidecar and no SLO claim about merges is possible;
* ``calibrated``: the simulated sync ratio and high/low ratio are both within
  ``tolerance`` of the real ones;
* ``uncalibrated``: otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

import numpy as np

from diloco_gym import core
from diloco_gym.learners import LearnerParams
from diloco_gym.regimes import REGIMES, get_regime
from diloco_gym.sidecar import SidecarParams, effect_sizes, percentile

__all__ = ["load_calibration", "simulated_effect_sizes", "transfer_verdict", "fit_sidecar",
           "Calibration", "measured_utilization"]

TOLERANCE = 0.05
METRICS = ("p95_high_low", "p95_sync_ratio")


@dataclass(frozen=True)
class Calibration:
    """Real-sidecar measurements per regime.

    Attributes:
        source: where the numbers come from.
        regimes: regime -> {"p95_high_low", "p95_sync_ratio", optional
            "pressure_latency_corr", optional "calibrated_on"}.
        path: the file it was read from.
    """

    source: str
    regimes: dict
    path: str
    fitted_sidecar: SidecarParams | None = None
    user_regimes: tuple[str, ...] = ()
    complete: bool = True

    def measured_on(self, regime: str) -> str:
        """The regime whose measurements apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime, {})
        on = entry.get("calibrated_on", regime)
        return on if on == regime else self.measured_on(on)

    def sidecar_for(self, regime: str) -> SidecarParams | None:
        """Fitted sidecar parameters that apply to ``regime``, if the file has them.

        A live calibration file (``diloco-gym calibrate``) fits the sidecar model to its
        measurements; those parameters drive the simulation of the measured regime and of
        the regimes calibrated on it. ``None`` means: keep the regime's defaults.
        """
        if self.fitted_sidecar is None:
            return None
        return self.fitted_sidecar if self.measured_on(regime) in self.user_regimes else None

    def measured(self, regime: str) -> dict:
        """Measurements that apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime)
        if entry is None:
            raise KeyError(f"calibration file {self.path} has no entry for regime {regime!r}; "
                           f"it has {sorted(self.regimes)}")
        on = entry.get("calibrated_on", regime)
        if on != regime:
            base = dict(self.measured(on))
            base["calibrated_on"] = on
            return base
        return entry


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Read a calibration file (default: the shipped reference measurements).

    A user file (for example from ``diloco-gym calibrate``) overrides the reference entry by
    entry: regimes it does not measure keep the reference's numbers, and regimes
    calibrated on a regime it does measure (bursty on sync-heavy) follow the new numbers.
    A ``fitted_sidecar`` object in the file is validated and exposed as
    :attr:`Calibration.fitted_sidecar`.

    Raises:
        ValueError: naming the file and field when the file is malformed.
    """
    if path is None:
        return _read_calibration(None)
    base = _read_calibration(None)
    user = _read_calibration(path)
    regimes = dict(base.regimes)
    regimes.update(user.regimes)
    return Calibration(user.source, regimes, user.path, user.fitted_sidecar,
                       tuple(user.regimes), user.complete)


def _read_calibration(path: str | Path | None) -> Calibration:
    if path is None:
        text = resources.files("diloco_gym").joinpath("data/calibration_reference.json") \
            .read_text()
        where = "diloco_gym/data/calibration_reference.json"
    else:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"{where}: cannot read calibration file: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or "regimes" not in data or "source" not in data:
        raise ValueError(f"{where}: needs top-level fields 'source' and 'regimes'")
    for name, entry in data["regimes"].items():
        if "calibrated_on" in entry:
            if entry["calibrated_on"] not in data["regimes"]:
                raise ValueError(f"{where}: regimes.{name}.calibrated_on names unknown regime "
                                 f"{entry['calibrated_on']!r}")
            continue
        for metric in METRICS:
            v = entry.get(metric)
            if not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ValueError(f"{where}: regimes.{name}.{metric} must be a positive "
                                 f"number, got {v!r}")
    fitted = None
    if data.get("fitted_sidecar"):
        fs = data["fitted_sidecar"]
        if not isinstance(fs, dict):
            raise ValueError(f"{where}: fitted_sidecar must be an object of SidecarParams "
                             f"fields")
        known = {f.name for f in fields(SidecarParams)}
        unknown = set(fs) - known
        if unknown:
            raise ValueError(f"{where}: fitted_sidecar has unknown field(s) {sorted(unknown)}")
        try:
            fitted = SidecarParams(**fs)
        except ValueError as exc:
            raise ValueError(f"{where}: fitted_sidecar: {exc}") from exc
    return Calibration(str(data["source"]), dict(data["regimes"]), where, fitted,
                       tuple(data["regimes"]), bool(data.get("complete", True)))


def measured_utilization(path: str | Path | None, sidecar: SidecarParams) -> float | None:
    """The utilization a live calibration file was measured at, under ``sidecar``.

    ``diloco-gym calibrate`` records the replayed rate and the mean prompt and output
    tokens it sent (``metadata.trace``); the nominal service time is linear in the tokens,
    so the mean offered work over capacity is
    ``rate * base_latency(mean prompt, mean output) / slots`` exactly. ``None`` for the
    shipped reference (measured on the regimes' own loads) or a file without those fields.
    """
    if path is None:
        return None
    try:
        trace = json.loads(Path(path).read_text()).get("metadata", {}).get("trace", {})
        rate = trace.get("rate_rps")
        if rate is None and trace.get("duration_s"):
            rate = trace["requests"] / trace["duration_s"]
        prompt, output = trace["sent_prompt_tokens_mean"], trace["sent_output_tokens_mean"]
        rate, prompt, output = float(rate), float(prompt), float(output)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(np.isfinite(v) and v >= 0 for v in (rate, prompt, output)) or rate == 0:
        return None
    service = (sidecar.ttft_ms + sidecar.prefill_ms_per_token * prompt
               + sidecar.decode_ms_per_token * output) / 1000.0
    return rate * service / sidecar.slots


def fixed_schedule(n: int, every: int, h_min: int, h_max: int) -> list[int]:
    """Merges every ``every`` decisions (clamped to the corridor)."""
    every = min(max(every, h_min), h_max)
    return list(range(every, n, every))


def simulated_effect_sizes(regime: str, seeds=range(8), sidecar: SidecarParams | None = None,
                           params: core.EnvParams | None = None,
                           calibrated_on: bool = True,
                           utilization: float | None = None) -> dict:
    """Effect sizes of the simulator for ``regime``, pooled over ``seeds``.

    With ``calibrated_on`` the trace comes from the regime the parameters were fitted on
    (for bursty: sync-heavy traces with the bursty sidecar parameters). The trace regime
    runs at its own utilization on ``sidecar`` (:meth:`SyntheticRegime.with_load`): a
    fitted sidecar of lower capacity sees proportionally lower rates, the load its effect
    sizes were measured at relative to its capacity, instead of an overload; with the
    regimes' default sidecars the traces are unchanged. ``utilization`` replays it at that
    utilization instead (the load a live calibration was measured at,
    :func:`measured_utilization`).
    """
    params = params or core.EnvParams()
    reg = get_regime(regime)
    trace_regime = get_regime(reg.calibrated_on) if calibrated_on and reg.calibrated_on \
        else reg
    sidecar = sidecar or reg.sidecar
    trace_regime = trace_regime.with_load(sidecar, target_utilization=utilization)
    lat, act, prs = [], [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        ep = core.build_episode(trace_regime(rng), params, sidecar, LearnerParams(), rng, seed)
        merges = fixed_schedule(ep.n_decisions, 256 // params.decision_interval, params.h_min,
                                params.h_max)
        res = core.replay_schedule(ep, merges, params, sidecar)
        lat.append(res.latency_s)
        act.append(res.sync_active)
        prs.append(res.pressure)
    from diloco_gym.sidecar import ReplayResult

    pooled = ReplayResult(np.concatenate(lat), np.zeros(0, bool), np.concatenate(act),
                          np.concatenate(prs))
    out = effect_sizes(pooled, sidecar.high_pressure)
    out["p95_ms"] = percentile(pooled.latency_s * 1000, 95)
    return out


def transfer_verdict(simulated: dict, measured: dict, tolerance: float = TOLERANCE) -> str:
    """``calibrated``, ``uncalibrated`` or ``no measurable SLO effect`` (see module doc)."""
    if abs(measured["p95_sync_ratio"] - 1.0) <= tolerance:
        return "no measurable SLO effect"
    ok = all(abs(simulated[m] - measured[m]) <= tolerance for m in METRICS
             if np.isfinite(simulated.get(m, np.nan)))
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

    for field, metric in (("sync_slowdown", "p95_sync_ratio"),
                          ("pressure_gain", "p95_high_low"),
                          ("sync_slowdown", "p95_sync_ratio")):
        sidecar = solve(field, metric, measured[metric], sidecar)
    return sidecar


def main() -> None:  # pragma: no cover - a maintenance command
    """Print the fitted sidecar parameters per regime: ``python -m diloco_gym.calibration``."""
    cal = load_calibration()
    for name in REGIMES:
        if REGIMES[name].calibrated_on not in ("", name):
            continue
        fitted = fit_sidecar(name, cal.measured(name))
        sim = simulated_effect_sizes(name, sidecar=fitted)
        print(f"{name:15s} sync_slowdown={fitted.sync_slowdown:.3f} "
              f"pressure_gain={fitted.pressure_gain:.3f} -> "
              + " ".join(f"{k}={v:.3f}" for k, v in sim.items()))


if __name__ == "__main__":  # pragma: no cover
    main()
