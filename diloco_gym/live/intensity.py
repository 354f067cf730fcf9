"""Merge interference at several sync intensities, and the fit of the fleet model's
interference function to it.

The fleet model (:func:`diloco_gym.sim.fleet.sync_slowdown`, docs/fleet.md) slows a site's
serving during a sync by

    sync_slowdown(u) = sync_slowdown x (host_share + (1 - host_share) x u ** share_exponent)

where ``u`` in (0, 1] is the share of the link the sync uses: 1 for a fragment sent at the
full rate, less for one streamed at a fraction of the rate over a longer window. A live
run with ``link_shares`` (:class:`~diloco_gym.live.config.CalibrationConfig`) measures it:
in every repeat, besides the full-rate sync phase and the control phase, one sync phase per
share ``u < 1`` whose merges all-reduce the same tensor over the same windows at ``u`` of
the unthrottled rate (:meth:`~diloco_gym.live.merges.MergeCluster.merge`). Its records are
labelled ``sync@U``.

Per share: the p95 sync ratio of that phase (merge-active requests over the others, as for
the full-rate phase), and the ``sync_slowdown`` that reproduces it in the sidecar model with
every other parameter as fitted on the full-rate run (:func:`~diloco_gym.live.fit.
fit_sync_slowdown`). Then, with ``r(u) = sync_slowdown(u) / sync_slowdown(1)``:

* one share below 1: ``share_exponent`` is kept at 1 (two points cannot fix two
  parameters) and ``host_share = (r - u) / (1 - u)``, clipped to [0, 1];
* two or more: least squares of ``r(u)`` over ``host_share`` in [0, 1] and
  ``share_exponent`` in [0.05, 20].

Intervals: a percentile bootstrap over repeats (a repeat holds one phase of every share, so
it is the independent unit, as in :func:`~diloco_gym.live.fit.bootstrap_intervals`): each
resample redoes every share's ratio, its ``sync_slowdown`` and the function fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from diloco_gym.live.fit import (
    RunData,
    bootstrap_intervals,
    fit_sync_slowdown,
    measured_effect_sizes,
)
from diloco_gym.sim.sidecar import SidecarParams

__all__ = [
    "MODEL",
    "fit_interference",
    "InterferenceFit",
    "interference_block",
]

#: The fitted function, as the calibration file states it.
MODEL = "sync_slowdown(u) = sync_slowdown x (host_share + (1 - host_share) x u ** share_exponent)"
#: Bounds of the fitted exponent (an exponent outside them is not a shape one can tell
#: apart with a few shares).
EXPONENT_BOUNDS = (0.05, 20.0)
#: Bisection iterations of each resample's ``sync_slowdown`` (the point estimate uses 30).
BOOTSTRAP_ITERS = 16


@dataclass(frozen=True)
class InterferenceFit:
    """The interference function fitted to the slowdowns at several link shares.

    Attributes:
        host_share: the share of the full-rate slowdown that does not depend on the link
            share, in [0, 1].
        share_exponent: ``gamma`` of the link-share term.
        exponent_fitted: whether ``share_exponent`` was fitted (False: kept at 1, one share
            below 1 only).
        residual: root-mean-square error of ``r(u)`` at the measured shares.
        notes: what could not be determined and why.
    """

    host_share: float
    share_exponent: float
    exponent_fitted: bool
    residual: float
    notes: tuple[str, ...] = ()


def fit_interference(shares: list[float], slowdowns: list[float]) -> InterferenceFit:
    """Fit ``host_share`` and ``share_exponent`` to ``sync_slowdown`` values measured at
    link ``shares`` (one of them 1; the module docstring gives the rule).

    Raises:
        ValueError: no share of 1, no share below 1, or a share outside (0, 1].
    """
    pairs = sorted(zip(shares, slowdowns, strict=True), reverse=True)
    if any(not 0.0 < u <= 1.0 for u, _ in pairs):
        raise ValueError(f"link shares must be in (0, 1], got {sorted(shares)}")
    full = [s for u, s in pairs if u == 1.0]
    if not full or len(full) == len(pairs):
        raise ValueError(f"the fit needs the share 1 and one below it, got {sorted(shares)}")
    base = full[0]
    low = [(u, s) for u, s in pairs if u < 1.0 and math.isfinite(s)]
    if not low:
        return InterferenceFit(
            float("nan"),
            float("nan"),
            False,
            float("nan"),
            ("no share below 1 has a defined p95 sync ratio: the function is undetermined",),
        )
    if not (math.isfinite(base) and base > 0):
        return InterferenceFit(
            float("nan"),
            float("nan"),
            False,
            float("nan"),
            (
                f"no slowdown at the full link share (sync_slowdown {base:g}): the shares "
                f"cannot be told apart, host_share and share_exponent are undetermined",
            ),
        )
    u = np.array([p[0] for p in low])
    r = np.array([p[1] for p in low]) / base
    if u.size == 1:
        raw = float((r[0] - u[0]) / (1.0 - u[0]))
        h = float(np.clip(raw, 0.0, 1.0))
        notes: tuple[str, ...] = ()
        if raw != h:
            notes = (
                f"the slowdown at link share {u[0]:g} is {r[0]:.3f} of the full-rate one: "
                f"{'below' if raw < 0 else 'above'} what the function reaches with "
                f"share_exponent 1, host_share clipped to {h:g}",
            )
        return InterferenceFit(h, 1.0, False, _rms(h, 1.0, u, r), notes)
    return _least_squares(u, r)


def _rms(h: float, gamma: float, u: np.ndarray, r: np.ndarray) -> float:
    return float(np.sqrt(np.mean((h + (1.0 - h) * u**gamma - r) ** 2)))


def _least_squares(u: np.ndarray, r: np.ndarray) -> InterferenceFit:
    """Bounded least squares of ``r(u) = h + (1 - h) u ** gamma`` (two or more shares)."""
    from scipy.optimize import least_squares

    lo, hi = EXPONENT_BOUNDS
    best = None
    for h0, g0 in ((0.25, 1.0), (0.5, 0.5), (0.1, 2.0)):  # starts: the fit is not convex
        res = least_squares(
            lambda p: p[0] + (1.0 - p[0]) * u ** p[1] - r,
            x0=[h0, g0],
            bounds=([0.0, lo], [1.0, hi]),
        )
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    h, gamma = (float(v) for v in best.x)
    notes: tuple[str, ...] = ()
    if h >= 1.0 - 1e-6:
        notes = ("the slowdown does not fall with the link share: host_share = 1",)
    return InterferenceFit(h, gamma, True, _rms(h, gamma, u, r), notes)


def _slowdowns(
    levels: dict[float, RunData],
    params: SidecarParams,
    ratio: Callable[[RunData], float],
    iters: int,
) -> dict[float, float]:
    """``sync_slowdown`` of every share, fitted to ``ratio`` of its data."""
    out = {}
    for u, d in levels.items():
        target = ratio(d)
        fit = fit_sync_slowdown(d, target, params, iters=iters)
        out[u] = fit.sync_slowdown if math.isfinite(target) else float("nan")
    return out


def interference_block(
    level_data: dict[float, RunData],
    params: SidecarParams,
    achieved: dict[float, float | None],
    resamples: int,
    seed: int,
    pressure_norm_inflight: float = 4.0,
    high_pressure: float = 0.6,
    ratio_resamples: int | None = None,
) -> dict:
    """The calibration file's ``interference`` block from every share's run data.

    Args:
        level_data: per link share, its sync phases' requests (labelled ``sync``, with
            their merge windows) and the control phases.
        params: the sidecar fitted on the full-rate run (its ``sync_slowdown`` is refitted
            per share; the rest is kept).
        achieved: per share, the share of the merge windows the all-reduces occupied
            (measured; ``None`` at the full rate).
        resamples: bootstrap resamples of the function's parameters (0: no intervals).
        seed: seeds the bootstraps.
        ratio_resamples: bootstrap resamples of each share's p95 sync ratio (default
            ``resamples``); the run passes its ``bootstrap_resamples``, so that the full
            share's interval is the regime entry's.
    """

    def ratio(d: RunData) -> float:
        return measured_effect_sizes(d, pressure_norm_inflight, high_pressure)["p95_sync_ratio"]

    rows, slow = [], {}
    for u in sorted(level_data, reverse=True):
        d = level_data[u]
        m = measured_effect_sizes(d, pressure_norm_inflight, high_pressure)
        n_boot = resamples if ratio_resamples is None else ratio_resamples
        boot = bootstrap_intervals(d, pressure_norm_inflight, high_pressure, n_boot, seed=seed)
        ratio_ci = boot["p95_sync_ratio"]
        fit = fit_sync_slowdown(d, m["p95_sync_ratio"], params, ratio_interval=ratio_ci)
        # An undefined ratio (no merge-active request) has no slowdown, not the base one.
        slow[u] = fit.sync_slowdown if math.isfinite(m["p95_sync_ratio"]) else float("nan")
        rows.append(
            {
                "link_share": u,
                "achieved_share": achieved.get(u),
                "p95_sync_ratio": m["p95_sync_ratio"],
                "p95_sync_ratio_ci": ratio_ci,
                "sync_slowdown": fit.sync_slowdown,
                "sync_slowdown_interval": fit.interval,
                "requests_sync_active": m["requests_sync_active"],
                "requests_sync_inactive": m["requests_sync_inactive"],
            }
        )
    point = fit_interference(list(slow), list(slow.values()))
    intervals = _bootstrap_fit(level_data, params, ratio, resamples, seed)
    notes = list(point.notes) + _shape_notes(slow, point) + intervals.get("notes", [])
    return {
        "model": MODEL,
        "host_share": point.host_share,
        "share_exponent": point.share_exponent,
        "share_exponent_fitted": point.exponent_fitted,
        "host_share_interval": intervals.get("host_share"),
        "share_exponent_interval": intervals.get("share_exponent")
        if point.exponent_fitted
        else None,
        "residual": point.residual,
        "levels": rows,
        "bootstrap": {
            "unit": "repeat (one phase of every link share and a control phase)",
            "resamples": int(resamples),
            "level": 0.95,
            "defined": intervals.get("defined", 0),
        },
        "notes": notes,
    }


def _shape_notes(slow: dict[float, float], fit: InterferenceFit) -> list[str]:
    """What the measured shares say about the function's shape beyond the fit: a slowdown
    that does not fall with the share, an exponent at a bound of its range."""
    notes = []
    shares = sorted(u for u, v in slow.items() if math.isfinite(v))
    values = [slow[u] for u in shares]
    if any(a > b for a, b in zip(values, values[1:], strict=False)):
        shown = ", ".join(f"{u:g}: {slow[u]:.3f}" for u in shares)
        notes.append(
            f"the fitted slowdown does not rise with the link share ({shown}): at this noise "
            f"the shares are not told apart; read the intervals"
        )
    if fit.exponent_fitted and any(abs(fit.share_exponent - b) < 1e-6 for b in EXPONENT_BOUNDS):
        notes.append(
            f"share_exponent is at the bound {fit.share_exponent:g} of its range "
            f"{list(EXPONENT_BOUNDS)}: the shares do not fix the function's shape"
        )
    return notes


def _bootstrap_fit(
    level_data: dict[float, RunData],
    params: SidecarParams,
    ratio: Callable[[RunData], float],
    resamples: int,
    seed: int,
) -> dict:
    """95 % percentile intervals of ``host_share`` and ``share_exponent`` over repeats:
    every resample draws the repeats with replacement (the same draw for every share) and
    redoes the shares' slowdowns and the function fit."""
    reps = sorted({k for d in level_data.values() for k in d.repeats()})
    if len(reps) < 2 or resamples < 1:
        return {"notes": ["fewer than two repeats: no interval of the function's parameters"]}
    rng = np.random.default_rng([seed, 29])
    draws: dict[str, list[float]] = {"host_share": [], "share_exponent": []}
    for _ in range(resamples):
        pick = [reps[j] for j in rng.integers(0, len(reps), size=len(reps))]
        levels = {u: _resample(d, pick) for u, d in level_data.items()}
        slow = _slowdowns(levels, params, ratio, BOOTSTRAP_ITERS)
        fit = fit_interference(list(slow), list(slow.values()))
        draws["host_share"].append(fit.host_share)
        draws["share_exponent"].append(fit.share_exponent)
    out: dict = {"notes": []}
    for name, values in draws.items():
        arr = np.asarray(values, dtype=np.float64)
        arr = arr[np.isfinite(arr)]
        out["defined"] = int(arr.size)
        if arr.size < resamples / 2:
            out[name] = None
            out["notes"].append(
                f"{name}: fewer than half of the resamples define it (no slowdown at the "
                f"full rate in {resamples - arr.size} of {resamples}): no interval"
            )
        else:
            out[name] = [float(np.quantile(arr, 0.025)), float(np.quantile(arr, 0.975))]
    return out


def _resample(data: RunData, pick: list[int]) -> RunData:
    """The requests of the repeats ``pick`` (with repetition), relabelled 0, 1, ... so that
    a repeat drawn twice counts twice, each with its own merge windows."""
    parts, repeat_ids, windows = [], [], {}
    for j, k in enumerate(pick):
        index = np.flatnonzero(data.repeat_mask(k))
        parts.append(index)
        repeat_ids.append(np.full(index.size, j, dtype=np.int64))
        windows[j] = data.windows_for(k)
    index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    sub = data.take(index)
    return replace(
        sub,
        repeat=np.concatenate(repeat_ids) if repeat_ids else np.zeros(0, dtype=np.int64),
        windows_by_repeat=windows,
    )
