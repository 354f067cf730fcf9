"""Fidelity of the fitted sidecar model on held-out settings: measured against predicted.

A *setting* (a target utilisation, a regime, a trace window) is replayed open loop against
the real engine in two phases, each repeated ``R`` times: *control* (no merges) and *sync*
(real merges at a fixed schedule). One replayed phase of one repeat is a
:class:`PhaseSample`. This module compares what was measured with what the fitted sidecar
model predicts for the very same sends; it runs no engine (numpy only, matplotlib for the
figure).

Definitions:

* **Measured** (:func:`measured_metrics`): p50/p95/p99 latency (ms, linear-interpolation
  percentiles, :func:`diloco_gym.sim.percentiles`) over the *successful* requests, and the
  SLO-violation percentage over *all sent* requests, a failed request (timeout, error)
  counting as a violation: it did not get its answer within the SLO. Nothing sent gives
  NaN everywhere; nothing succeeded gives NaN percentiles (and 100 % violations).
* **Predicted** (:func:`predicted_metrics`): every sent request, failed ones included, is
  replayed at its send time with its requested token counts through
  :func:`diloco_gym.live.fit.replay_requests` (the binning of the fit; zero pressure; the
  phase's planned merge windows as the merge mask). Violations are the model's own
  (``latency > params.slo_s``); percentiles are over every simulated request.
* **Pooled over repeats**: the repeats' requests are concatenated, then the metric is
  computed (measured and predicted alike).
* **Errors**: ``abs_error = predicted - measured`` (ms, percentage points, or the ratio's
  units); ``rel_error = abs_error / measured``, NaN unless ``measured > 0``.
* **Intervals**: 95 % percentile bootstrap over *repeats*, the independent unit (requests
  of one phase share the engine's state and the merge windows). Each resample draws ``R``
  repeats with replacement, pools them, and recomputes measured, predicted and the errors.
  When both phases have the same number of repeats the draw is paired (repeat ``k``'s
  control and sync phases go together, as they ran back to back), which the sync-control
  rows need. With fewer than two repeats there is no interval (``None``).
* **Merge cost** (phase ``"sync-control"``): ``p95_ratio`` = sync p95 / control p95 and
  ``violation_diff_pp`` = sync violations - control violations (pp), measured against
  predicted, as what the merges cost.
* **Verdict** (``fails``): a latency metric or the p95 ratio misses when
  ``|rel_error| > rel_tolerance``; a violation metric when
  ``|abs_error| > max(2 pp, rel_tolerance * |measured|)``; a row whose measured or
  predicted value is undefined misses too (the model cannot be checked there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.live.fit import replay_requests
from diloco_gym.sim import percentiles
from diloco_gym.sim.sidecar import SidecarParams, pct_of
from diloco_gym.text import md_text

__all__ = [
    "METRICS",
    "EFFECT_METRICS",
    "EFFECT_PHASE",
    "VIOLATION_FLOOR_PP",
    "PhaseSample",
    "measured_metrics",
    "predicted_metrics",
    "fidelity_rows",
    "failures",
    "markdown_section",
    "plot_fidelity",
]

#: The per-phase metrics: latency percentiles (ms) and the SLO-violation percentage.
METRICS = ("p50_ms", "p95_ms", "p99_ms", "violation_pct")
#: The merge-cost metrics of the ``"sync-control"`` rows: sync p95 over control p95, and
#: sync violations minus control violations (percentage points).
EFFECT_METRICS = ("p95_ratio", "violation_diff_pp")
#: The phase name of the merge-cost rows.
EFFECT_PHASE = "sync-control"
#: A violation metric misses only when its error exceeds this many percentage points (and
#: ``rel_tolerance`` of the measured rate).
VIOLATION_FLOOR_PP = 2.0

_Q = (50, 95, 99)
_VIOLATION_METRICS = ("violation_pct", "violation_diff_pp")
_UNITS = {
    "p50_ms": "ms",
    "p95_ms": "ms",
    "p99_ms": "ms",
    "violation_pct": "%",
    "p95_ratio": "x",
    "violation_diff_pp": "pp",
}
_LABELS = {
    "p50_ms": "p50",
    "p95_ms": "p95",
    "p99_ms": "p99",
    "violation_pct": "violations",
    "p95_ratio": "p95 ratio",
    "violation_diff_pp": "violation increase",
}
_LEVEL = 0.95


def _vector(name: str, x: Any, n: int | None = None) -> np.ndarray:
    """``x`` as a 1-D array of ``n`` values (when given); a one-line error naming the field."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"PhaseSample.{name}: expected a 1-D array, got shape {a.shape}")
    if n is not None and a.size != n:
        raise ValueError(
            f"PhaseSample.{name}: {a.size} values, but offset_s has {n} (one per sent request)"
        )
    return a


def _floats(name: str, x: Any, n: int | None = None) -> np.ndarray:
    a = _vector(name, x, n)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"PhaseSample.{name}: expected numbers, got dtype {a.dtype}")
    return a.astype(np.float64)


def _counts(name: str, x: Any, n: int) -> np.ndarray:
    a = _vector(name, x, n)
    if a.dtype.kind not in "iu":
        raise ValueError(f"PhaseSample.{name}: expected integer token counts, got dtype {a.dtype}")
    if a.size and int(a.min()) < 0:
        raise ValueError(f"PhaseSample.{name}: token counts must be >= 0, got {int(a.min())}")
    return a.astype(np.int64)


def _windows(x: Any) -> list[tuple[float, float]]:
    out = []
    for i, w in enumerate(x):
        try:
            lo, hi = (float(v) for v in w)
        except (TypeError, ValueError):
            raise ValueError(
                f"PhaseSample.merges_s[{i}]: expected a (start_s, end_s) pair, got {w!r}"
            ) from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(
                f"PhaseSample.merges_s[{i}]: expected finite start_s <= end_s, got ({lo}, {hi})"
            )
        out.append((lo, hi))
    return out


@dataclass(frozen=True, eq=False)
class PhaseSample:
    """One replayed phase (control or sync) of one repeat: every request that was sent.

    Attributes:
        offset_s: send time of each request relative to the phase's origin, seconds.
        latency_s: its latency, seconds (NaN, or anything, where it failed: only the
            successful requests' latencies are read, and they must be finite and >= 0).
        ok: whether it succeeded (bool).
        prompt_tokens / output_tokens: its requested token counts (integers >= 0).
        merges_s: the planned merge windows ``(start_s, end_s)`` relative to the phase's
            origin (empty for a control phase).
        duration_s: length of the phase's trace window, seconds.

    Raises:
        ValueError: one line naming the field, for arrays of other lengths (than
            ``offset_s``) or types, non-finite send times, a successful request without a
            finite latency, a malformed merge window or a bad duration.
    """

    offset_s: np.ndarray
    latency_s: np.ndarray
    ok: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    merges_s: list[tuple[float, float]]
    duration_s: float

    def __post_init__(self) -> None:
        offsets = _floats("offset_s", self.offset_s)
        n = offsets.size
        if not np.isfinite(offsets).all():
            raise ValueError("PhaseSample.offset_s: send times must be finite")
        latency = _floats("latency_s", self.latency_s, n)
        ok = _vector("ok", self.ok, n)
        if ok.dtype != bool:
            raise ValueError(f"PhaseSample.ok: expected booleans, got dtype {ok.dtype}")
        bad = ok & ~(np.isfinite(latency) & (latency >= 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"PhaseSample.latency_s: request {i} succeeded (ok) but its latency is "
                f"{latency[i]!r} (a successful request needs a finite latency >= 0)"
            )
        try:
            duration = float(self.duration_s)
        except (TypeError, ValueError):
            raise ValueError(
                f"PhaseSample.duration_s: expected a number, got {self.duration_s!r}"
            ) from None
        if not (math.isfinite(duration) and duration >= 0):
            raise ValueError(f"PhaseSample.duration_s: expected finite >= 0, got {duration}")
        values = {
            "offset_s": offsets,
            "latency_s": latency,
            "ok": ok,
            "prompt_tokens": _counts("prompt_tokens", self.prompt_tokens, n),
            "output_tokens": _counts("output_tokens", self.output_tokens, n),
            "merges_s": _windows(self.merges_s),
            "duration_s": duration,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class _Outcome:
    """One repeat's requests as a metric reads them: the latencies its percentiles are
    over (ms), how many violated, and how many were sent."""

    lat_ms: np.ndarray
    violated: int
    sent: int


def _measured(sample: PhaseSample, slo_s: float) -> _Outcome:
    ok = sample.ok
    lat = sample.latency_s[ok]
    violated = int(np.count_nonzero(~ok)) + int(np.count_nonzero(lat > slo_s))
    return _Outcome(lat * 1000.0, violated, int(ok.size))


def _predicted(sample: PhaseSample, params: SidecarParams, bin_s: float) -> _Outcome:
    n = int(sample.offset_s.size)
    if n == 0:
        return _Outcome(np.zeros(0), 0, 0)
    res = replay_requests(
        sample.offset_s, sample.prompt_tokens, sample.output_tokens, sample.duration_s,
        sample.merges_s or None, params, bin_s,
    )  # fmt: skip
    return _Outcome(res.latency_s * 1000.0, int(np.count_nonzero(res.violated)), n)


def _metrics(outcomes: Sequence[_Outcome], counts: Sequence[int]) -> dict[str, float]:
    """:data:`METRICS` of the repeats pooled, repeat ``k`` taken ``counts[k]`` times."""
    parts = [o.lat_ms for o, c in zip(outcomes, counts, strict=True) for _ in range(int(c))]
    lat = np.concatenate(parts) if parts else np.zeros(0)
    sent = sum(o.sent * int(c) for o, c in zip(outcomes, counts, strict=True))
    violated = sum(o.violated * int(c) for o, c in zip(outcomes, counts, strict=True))
    p50, p95, p99 = percentiles(lat, _Q)
    return {
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "violation_pct": pct_of(violated, sent) if sent else float("nan"),
    }


def measured_metrics(sample: PhaseSample, slo_s: float) -> dict[str, float]:
    """The measured :data:`METRICS` of one phase (module docstring, "Measured").

    Percentiles are over the successful requests' latencies (ms); ``violation_pct`` is over
    every sent request, a failed one (timeout, error) counting as a violation since it
    missed its SLO; a successful one violates when its latency exceeds ``slo_s`` (the
    simulator's rule). NaN percentiles when nothing succeeded; all NaN when nothing was
    sent.
    """
    return _metrics([_measured(sample, slo_s)], [1])


def predicted_metrics(
    sample: PhaseSample, params: SidecarParams, bin_s: float = 0.05
) -> dict[str, float]:
    """The sidecar model's :data:`METRICS` for the same sends (module docstring,
    "Predicted"): every sent request, failed ones included, replayed at its send time with
    its requested sizes and the phase's merge windows; violations judged with
    ``params.slo_s`` by :func:`diloco_gym.sim.sidecar.replay`."""
    return _metrics([_predicted(sample, params, bin_s)], [1])


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else float("nan")


def _values(
    outs: Mapping[str, tuple[list[_Outcome], list[_Outcome]]],
    counts: Mapping[str, Sequence[int]],
) -> dict[tuple[str, str], tuple[float, float]]:
    """``(phase, metric) -> (measured, predicted)`` of every row, for one draw of repeats."""
    vals: dict[tuple[str, str], tuple[float, float]] = {}
    for phase, (meas, pred) in outs.items():
        m, p = _metrics(meas, counts[phase]), _metrics(pred, counts[phase])
        for k in METRICS:
            vals[(phase, k)] = (m[k], p[k])
    if "control" in outs and "sync" in outs:
        s95, c95 = vals[("sync", "p95_ms")], vals[("control", "p95_ms")]
        sv, cv = vals[("sync", "violation_pct")], vals[("control", "violation_pct")]
        vals[(EFFECT_PHASE, "p95_ratio")] = (_ratio(s95[0], c95[0]), _ratio(s95[1], c95[1]))
        vals[(EFFECT_PHASE, "violation_diff_pp")] = (sv[0] - cv[0], sv[1] - cv[1])
    return vals


def _errors(measured: float, predicted: float) -> tuple[float, float]:
    """``(abs_error, rel_error)``; the relative error is NaN unless ``measured > 0``."""
    err = predicted - measured
    rel = err / measured if math.isfinite(measured) and measured > 0 else float("nan")
    return err, rel


def _misses(metric: str, measured: float, predicted: float, rel_tolerance: float) -> bool:
    """The verdict of the module docstring ("Verdict")."""
    if not (math.isfinite(measured) and math.isfinite(predicted)):
        return True
    err, rel = _errors(measured, predicted)
    if metric in _VIOLATION_METRICS:
        return abs(err) > max(VIOLATION_FLOOR_PP, rel_tolerance * abs(measured))
    return abs(rel) > rel_tolerance if math.isfinite(rel) else err != 0


def _bootstrap(
    outs: Mapping[str, tuple[list[_Outcome], list[_Outcome]]], n_boot: int, seed: int
) -> list[dict[tuple[str, str], tuple[float, float]]]:
    """``n_boot`` resamples of repeats (paired across phases when their counts agree);
    the rows' values of each. A resample depends only on how often each repeat is drawn,
    so equal draws are computed once."""
    n = {phase: len(meas) for phase, (meas, _) in outs.items()}
    paired = len(set(n.values())) == 1
    rng = np.random.default_rng([seed, 23])
    cache: dict[tuple, dict[tuple[str, str], tuple[float, float]]] = {}
    draws = []
    for _ in range(n_boot):
        shared = rng.integers(0, max(n.values()), size=max(n.values())) if paired else None
        counts = {}
        for phase, k in n.items():
            pick = shared if shared is not None else rng.integers(0, k, size=k)
            counts[phase] = tuple(np.bincount(pick, minlength=k).tolist())
        key = tuple(counts[phase] for phase in n)
        if key not in cache:
            cache[key] = _values(outs, counts)
        draws.append(cache[key])
    return draws


def _interval(values: Sequence[float]) -> list[float] | None:
    """The central :data:`_LEVEL` percentile interval of the finite ``values``; ``None``
    when fewer than half of them are finite (the metric is often undefined)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0 or arr.size < len(values) / 2:
        return None
    alpha = (1.0 - _LEVEL) / 2.0
    return [float(np.quantile(arr, alpha)), float(np.quantile(arr, 1.0 - alpha))]


def _json(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _row(
    key: tuple[str, str],
    value: tuple[float, float],
    draws: list[tuple[float, float]] | None,
    n_repeats: int,
    requests: tuple[int, int],
    rel_tolerance: float,
) -> dict[str, Any]:
    phase, metric = key
    measured, predicted = value
    err, rel = _errors(measured, predicted)
    ci: dict[str, list[float] | None] = {"measured": None, "abs": None, "rel": None}
    if draws is not None:
        errs = [_errors(m, p) for m, p in draws]
        ci = {
            "measured": _interval([m for m, _ in draws]),
            "abs": _interval([e for e, _ in errs]),
            "rel": _interval([r for _, r in errs]),
        }
    lo_hi = ci["measured"]
    within = None
    if lo_hi is not None:
        within = bool(math.isfinite(predicted) and lo_hi[0] <= predicted <= lo_hi[1])
    return {
        "phase": phase,
        "metric": metric,
        "unit": _UNITS[metric],
        "measured": _json(measured),
        "predicted": _json(predicted),
        "abs_error": _json(err),
        "rel_error": _json(rel),
        "measured_ci": lo_hi,
        "abs_error_ci": ci["abs"],
        "rel_error_ci": ci["rel"],
        "within_interval": within,
        "fails": _misses(metric, measured, predicted, rel_tolerance),
        "rel_tolerance": float(rel_tolerance),
        "n_repeats": int(n_repeats),
        "requests": int(requests[0]),
        "failed_requests": int(requests[1]),
    }


def _check_rows_args(
    samples: Mapping[str, Sequence[PhaseSample]],
    params: SidecarParams,
    slo_s: float,
    n_boot: int,
    rel_tolerance: float,
) -> None:
    if not samples:
        raise ValueError("fidelity_rows: samples has no phase")
    for phase, reps in samples.items():
        if phase == EFFECT_PHASE:
            raise ValueError(f"fidelity_rows: phase name {EFFECT_PHASE!r} is reserved")
        if len(reps) == 0:
            raise ValueError(f"fidelity_rows: phase {phase!r} has no repeats")
        for i, s in enumerate(reps):
            if not isinstance(s, PhaseSample):
                raise ValueError(
                    f"fidelity_rows: samples[{phase!r}][{i}] is a {type(s).__name__}, "
                    "not a PhaseSample"
                )
    if not (math.isfinite(slo_s) and slo_s > 0 and math.isclose(slo_s, params.slo_s)):
        raise ValueError(
            f"fidelity_rows: slo_s {slo_s!r} must be > 0 and equal params.slo_s "
            f"({params.slo_s!r}): measured and predicted violations use one SLO"
        )
    if isinstance(n_boot, bool) or not (isinstance(n_boot, int | np.integer) and n_boot >= 0):
        raise ValueError(f"fidelity_rows: n_boot must be an integer >= 0, got {n_boot!r}")
    if not (math.isfinite(rel_tolerance) and rel_tolerance > 0):
        raise ValueError(f"fidelity_rows: rel_tolerance must be > 0, got {rel_tolerance!r}")


def fidelity_rows(
    samples: Mapping[str, Sequence[PhaseSample]],
    params: SidecarParams,
    slo_s: float,
    rng_seed: int = 0,
    n_boot: int = 2000,
    rel_tolerance: float = 0.25,
    bin_s: float = 0.05,
) -> list[dict[str, Any]]:
    """Measured against predicted for one setting: one row per phase and metric.

    Args:
        samples: phase name (``"control"``, ``"sync"``) -> its samples, one per repeat.
        params: the fitted sidecar parameters.
        slo_s: the SLO of the measured violations; it must equal ``params.slo_s`` (the
            predicted ones use the model's own).
        rng_seed: seed of the bootstrap.
        n_boot: bootstrap resamples (0: no intervals).
        rel_tolerance: the verdict's tolerance (module docstring, "Verdict").
        bin_s: replay bin width, seconds.

    Returns:
        Rows for every phase in the order given, :data:`METRICS` in order, then, when both
        ``"control"`` and ``"sync"`` are present, the :data:`EFFECT_PHASE` rows of
        :data:`EFFECT_METRICS`. Each row is a JSON-able dict: ``phase``, ``metric``,
        ``unit`` (``ms``, ``%``, ``x`` or ``pp``), ``measured``, ``predicted``,
        ``abs_error``, ``rel_error``, ``measured_ci``, ``abs_error_ci``, ``rel_error_ci``
        (``[lo, hi]``, 95 % percentile bootstrap over repeats; ``None`` with fewer than two
        repeats, no resamples, or a metric undefined in most resamples), ``within_interval``
        (the prediction lies in ``measured_ci``; ``None`` without one), ``fails``,
        ``rel_tolerance``, ``n_repeats``, ``requests`` (sent, pooled) and
        ``failed_requests``. A non-finite number (an undefined metric) is ``None``.
    """
    _check_rows_args(samples, params, slo_s, n_boot, rel_tolerance)
    outs = {
        phase: ([_measured(s, slo_s) for s in reps], [_predicted(s, params, bin_s) for s in reps])
        for phase, reps in samples.items()
    }
    point = _values(outs, {phase: [1] * len(reps) for phase, reps in samples.items()})
    draws = _bootstrap(outs, int(n_boot), rng_seed)
    sent = {ph: sum(o.sent for o in meas) for ph, (meas, _) in outs.items()}
    failed = {ph: sum(int(np.count_nonzero(~s.ok)) for s in reps) for ph, reps in samples.items()}
    rows = []
    for key, value in point.items():
        phases = ("control", "sync") if key[0] == EFFECT_PHASE else (key[0],)
        n_rep = min(len(samples[ph]) for ph in phases)
        key_draws = [d[key] for d in draws] if n_rep >= 2 and draws else None
        requests = (sum(sent[ph] for ph in phases), sum(failed[ph] for ph in phases))
        rows.append(_row(key, value, key_draws, n_rep, requests, rel_tolerance))
    return rows


def _bare(metric: str, x: float | None, signed: bool = False) -> str:
    """A row's value as a number without its unit (``n/a`` when undefined)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    sign = "+" if signed else ""
    unit = _UNITS[metric]
    if unit == "ms":
        return f"{x:{sign},.1f}" if abs(x) < 10 else f"{x:{sign},.0f}"
    return f"{x:{sign}.2f}" if unit == "x" else f"{x:{sign}.1f}"


def _num(metric: str, x: float | None, signed: bool = False) -> str:
    """A row's value with its unit, as a sentence or a table cell shows it (an error of a
    violation rate is in percentage points)."""
    text = _bare(metric, x, signed)
    if text == "n/a":
        return text
    unit = _UNITS[metric]
    if unit == "x":
        return f"{text}x"
    if unit == "%" and signed:
        unit = "pp"
    return f"{text} {unit}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.0f} %"


def failures(setting_name: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per failing row (``fails``), e.g. ``"bursty U=0.6, sync p99: predicted
    812 ms, measured 1,430 ms (-43 %)"``: the setting, phase and metric, the predicted and
    measured values and the relative error (for a violation metric the error in
    percentage points first, then the relative error where the measured rate is > 0)."""
    out = []
    for r in rows:
        if not r.get("fails"):
            continue
        metric = r["metric"]
        phase = "sync vs control" if r["phase"] == EFFECT_PHASE else r["phase"]
        err = _pct(r.get("rel_error"))
        if metric in _VIOLATION_METRICS:
            pp = _num(metric, r.get("abs_error"), signed=True)
            err = pp if r.get("rel_error") is None else f"{pp}, {err}"
        out.append(
            f"{setting_name}, {phase} {_LABELS[metric]}: predicted "
            f"{_num(metric, r.get('predicted'))}, measured {_num(metric, r.get('measured'))} "
            f"({err})"
        )
    return out


def _setting_title(setting: Mapping[str, Any]) -> str:
    """``name (regime, U=0.60, 4.00 req/s, 120 s, 3 repeats)`` with what is known."""
    parts = []
    if setting.get("regime") is not None:
        parts.append(md_text(setting["regime"]))
    for key, text in (
        ("utilization", "U={:.2f}"),
        ("rate_rps", "{:.2f} req/s"),
        ("duration_s", "{:,.0f} s"),
    ):
        value = setting.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            parts.append(text.format(value))
    reps = setting.get("repeats")
    if isinstance(reps, int):
        parts.append(f"{reps} repeat" + ("" if reps == 1 else "s"))
    name = md_text(setting.get("name", "setting"))
    return f"{name} ({', '.join(parts)})" if parts else name


def _table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "| metric | phase | measured [95 % CI] | predicted | error | relative error | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        metric = r["metric"]
        measured = _num(metric, r.get("measured"))
        ci = r.get("measured_ci")
        if ci is not None:
            measured += f" [{_bare(metric, ci[0])}, {_bare(metric, ci[1])}]"
        cells = [
            f"{_LABELS[metric]} ({_UNITS[metric]})",
            md_text(r["phase"]),
            measured,
            _num(metric, r.get("predicted")),
            _num(metric, r.get("abs_error"), signed=True),
            _pct(r.get("rel_error")),
            "misses" if r.get("fails") else "ok",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _tolerance(block: Mapping[str, Any]) -> float | None:
    """The block's ``rel_tolerance``, else the one its rows were judged with."""
    if block.get("rel_tolerance") is not None:
        return float(block["rel_tolerance"])
    for setting in [block.get("calibration") or {}, *block.get("settings", [])]:
        for r in setting.get("rows") or []:
            if r.get("rel_tolerance") is not None:
                return float(r["rel_tolerance"])
    return None


def markdown_section(document_block: Mapping[str, Any]) -> list[str]:
    """The fidelity section of a Markdown report, as lines.

    Args:
        document_block: ``{"calibration": {setting}, "settings": [{setting}, ...],
            "failures": [sentences]}``, each setting ``{"name", "regime", "utilization",
            "rate_rps", "duration_s", "repeats", "rows"}`` (rows of :func:`fidelity_rows`;
            the calibration setting's rows, when present, are shown as in-sample). Without
            ``"failures"`` the sentences are made from the held-out settings' rows
            (:func:`failures`); an optional ``"rel_tolerance"`` names the tolerance (else
            the rows' own).

    Returns:
        A heading, a sentence on the method, one table per setting and the list of the
        model's misses ("Where the model fails").
    """
    tol = _tolerance(document_block)
    tol_text = "the tolerance" if tol is None else f"{100 * tol:g} %"
    cal = document_block.get("calibration") or {}
    settings = list(document_block.get("settings") or [])
    out = ["## Fidelity on held-out settings", ""]
    intro = (
        "Each setting was replayed against the real engine without merges (control) and with "
        "real merges at a fixed schedule (sync); measured values pool the repeats, with 95 % "
        "percentile-bootstrap intervals over repeats, and predicted values replay the same "
        "sends through the fitted sidecar model. A latency metric or the p95 ratio misses "
        f"when its relative error exceeds {tol_text}; a violation rate when its error exceeds "
        f"{VIOLATION_FLOOR_PP:g} pp and {tol_text} of the measured rate."
    )
    if cal:
        intro = f"The model was calibrated on {_setting_title(cal)}. " + intro
    out += [intro, ""]
    if cal.get("rows"):
        out += [f"### Calibration setting (in-sample): {_setting_title(cal)}", ""]
        out += _table(cal["rows"]) + [""]
    for setting in settings:
        out += [f"### {_setting_title(setting)}", ""]
        rows = setting.get("rows") or []
        out += (_table(rows) if rows else ["No rows were measured."]) + [""]
    sentences = document_block.get("failures")
    if sentences is None:
        sentences = [
            s for st in settings for s in failures(str(st.get("name", "setting")), st["rows"])
        ]
    out += ["### Where the model fails", ""]
    out += [f"- {md_text(s)}" for s in sentences] if sentences else [f"None at {tol_text}."]
    return out


_PANELS = METRICS + EFFECT_METRICS
_MARKERS = {"control": "o", "sync": "s", EFFECT_PHASE: "^"}


def _points(document_block: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(label prefix, row)`` of every setting's rows, the calibration setting first."""
    cal = document_block.get("calibration") or {}
    settings = [(f"{cal.get('name', 'calibration')} (cal)", cal)] if cal.get("rows") else []
    settings += [(str(s.get("name", "setting")), s) for s in document_block.get("settings", [])]
    return [(name, r) for name, s in settings for r in s.get("rows") or []]


def _panel(ax: Any, metric: str, points: list[tuple[str, Mapping[str, Any]]], tol: float) -> None:
    """One metric's panel: predicted against measured, ``y = x`` and the tolerance band."""
    pts = [
        (name, r)
        for name, r in points
        if r["metric"] == metric
        and r.get("measured") is not None
        and r.get("predicted") is not None
    ]
    ax.set_title(f"{_LABELS[metric]} ({_UNITS[metric]})")
    ax.set_xlabel("measured")
    ax.set_ylabel("predicted")
    if not pts:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    xs = np.array([r["measured"] for _, r in pts], dtype=np.float64)
    ys = np.array([r["predicted"] for _, r in pts], dtype=np.float64)
    log = _UNITS[metric] == "ms" and bool((xs > 0).all() and (ys > 0).all())
    ends = [v for _, r in pts for v in (r.get("measured_ci") or []) if not log or v > 0]
    lo = min(float(xs.min()), float(ys.min()), *ends)
    hi = max(float(xs.max()), float(ys.max()), *ends)
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    grid = (
        np.geomspace(lo / 1.3, hi * 1.3, 50) if log else np.linspace(lo - span / 5, hi + span / 5)
    )
    if metric in _VIOLATION_METRICS:
        half = np.maximum(VIOLATION_FLOOR_PP, tol * np.abs(grid))
        band, label = (grid - half, grid + half), f"±max(2 pp, {100 * tol:g} %)"
    else:
        band, label = (grid * (1 - tol), grid * (1 + tol)), f"±{100 * tol:g} %"
    ax.fill_between(grid, *band, color="0.9", label=label)
    ax.plot(grid, grid, color="0.4", lw=1, label="y = x")
    colours: dict[str, Any] = {}
    for (name, r), x, y in zip(pts, xs, ys, strict=True):
        colour = colours.setdefault(name, f"C{len(colours) % 10}")
        ci = r.get("measured_ci")
        xerr = None if ci is None else [[max(0.0, x - ci[0])], [max(0.0, ci[1] - x)]]
        ax.errorbar(
            x, y, xerr=xerr, fmt=_MARKERS.get(r["phase"], "D"), color=colour, ms=5, capsize=2
        )
        ax.annotate(f"{name} {r['phase']}", (x, y), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlim(grid[0], grid[-1])
    ax.set_ylim(grid[0], grid[-1])
    if log:
        _log_axes(ax)
    ax.legend(fontsize=6, loc="upper left")


def _log_axes(ax: Any) -> None:
    """Log scales on both axes, ticks at 1, 2 and 5 per decade labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        axis.set_minor_formatter(NullFormatter())


def plot_fidelity(document_block: Mapping[str, Any], path: str | Path) -> None:
    """Save the fidelity figure (PNG) to ``path``: one panel per metric of
    :data:`METRICS` and :data:`EFFECT_METRICS`, predicted against measured for every
    setting and phase (log scales for latencies), with ``y = x``, the verdict's tolerance
    band and the measured 95 % intervals as horizontal error bars. Drawn on a Figure of its
    own Agg canvas (no pyplot) and written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from diloco_gym.io import save_atomic

    tol = _tolerance(document_block)
    tol = 0.25 if tol is None else tol
    fig = Figure(figsize=(13, 8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    points = _points(document_block)
    for ax, metric in zip(axes.flat, _PANELS, strict=True):
        _panel(ax, metric, points, tol)
    fig.suptitle("Fitted sidecar model: predicted against measured")
    fig.tight_layout()
    save_atomic(lambda tmp: fig.savefig(tmp, format="png", dpi=110), path)
