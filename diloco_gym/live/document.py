"""The calibration file's content from a run: the request records and counts, the
measured effect sizes and the fit (:mod:`diloco_gym.live.fit`), the regime's entry, the
metadata (without machine paths), the reasons a run is uncertain, and the console summary.

The document follows the calibration schema ``diloco_gym/data/calibration.schema.json``
(``source``, ``regimes``, ``complete``, ``error``, ``fitted_sidecar``, ``fit``,
``measured``, ``metadata``, ``schedule``, ``merges``, ``requests`` (counts) and
``records``: one column per field of :class:`~diloco_gym.live.replay.RequestRecord`)."""

from __future__ import annotations

import math
import os
import platform
import socket
from dataclasses import asdict, fields
from functools import partial
from typing import Any

import numpy as np

from diloco_gym.live.config import (
    CalibrationConfig,
)
from diloco_gym.live.fit import (
    RunData,
    bootstrap_intervals,
    fit_sidecar_live,
    measured_effect_sizes,
)
from diloco_gym.live.plan import (
    level_name,
    phase_key,
)
from diloco_gym.live.replay import (
    RequestRecord,
)
from diloco_gym.live.state import RunState
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.text import fmt

__all__ = [
    "build_document",
    "run_data",
    "request_counts",
    "uncertain_reasons",
    "CONTROL_VS_PROBE_LIMIT",
    "summary_lines",
    "finite",
]


def finite(x: Any) -> Any:
    """JSON-safe value: NaN and infinities become ``None``; numpy scalars become Python,
    numpy arrays lists."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [finite(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def run_data(records: list[RequestRecord], run: RunState, level: str = "sync") -> RunData:
    """The successful requests of the sync phases labelled ``level`` (relabelled ``sync``:
    ``sync@U`` for a phase at link share ``U``) and of the control phases, with the merge
    windows of those sync phases; the default is the full-rate run."""
    keys = {
        (p["name"], p["repeat"]): p for p in run.phases.values() if p["name"] in (level, "control")
    }
    ok = [r for r in records if r.ok and (r.phase, r.repeat) in keys]
    origin = {key: p["origin_s"] for key, p in keys.items()}
    windows: dict[int, list[tuple[float, float]]] = {}
    for m in run.merges:
        k = m.get("repeat", 0)
        # A full-rate merge's entry has no phase (as in files before link shares).
        if m.get("phase", "sync") == level and m.get("end_s") is not None and (level, k) in origin:
            o = origin[(level, k)]
            windows.setdefault(k, []).append((m["start_s"] - o, m["end_s"] - o))
    first = keys.get((level, 0), {})
    control: dict = next((p for (name, _), p in keys.items() if name == "control"), {})
    return RunData(
        phase=np.array(["sync" if r.phase == level else r.phase for r in ok], dtype=object),
        offset_s=np.array([r.send_s - origin[(r.phase, r.repeat)] for r in ok], dtype=np.float64),
        latency_s=np.array([r.latency_s for r in ok], dtype=np.float64),
        prompt_tokens=np.array([r.prompt_tokens for r in ok], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in ok], dtype=np.int64),
        sync_active=np.array([r.merge_active for r in ok], dtype=bool),
        inflight=np.array([r.inflight for r in ok], dtype=np.int64),
        cpu_util=np.array([r.cpu_util for r in ok], dtype=np.float64),
        windows_s=windows.get(0, []),
        sync_duration_s=float(first.get("duration_s", 0.0)),
        control_duration_s=float(control.get("duration_s", 0.0)),
        repeat=np.array([r.repeat for r in ok], dtype=np.int64),
        windows_by_repeat=windows,
    )


def request_counts(records: list[RequestRecord]) -> dict:
    done = [r for r in records if r.done]
    by_status: dict[str, int] = {}
    for r in done:
        if r.status == 200 and r.error:
            key = "invalid response"
        else:
            key = str(r.status) if r.status else (r.error or "error")
        by_status[key] = by_status.get(key, 0) + 1
    return {
        "planned": len(records),
        "sent": sum(r.sent for r in records),
        "completed": len(done),
        "ok": sum(r.ok for r in records),
        "errors": sum(1 for r in done if not r.ok),
        "timeouts": sum(1 for r in done if r.error == "timed out"),
        "refused": sum(1 for r in done if r.error == "connection refused"),
        "invalid": sum(1 for r in done if r.error.startswith("invalid response")),
        "unfinished": sum(1 for r in records if r.sent and not r.done),
        "sync_active": sum(1 for r in records if r.ok and r.phase == "sync" and r.merge_active),
        "sync_inactive": sum(
            1 for r in records if r.ok and r.phase == "sync" and not r.merge_active
        ),
        "control": sum(1 for r in records if r.ok and r.phase == "control"),
        "by_status": by_status,
    }


def _records_columns(records: list[RequestRecord]) -> dict:
    names = [f.name for f in fields(RequestRecord)]
    cols: dict[str, list] = {name: [] for name in names}
    for r in records:
        for name in names:
            cols[name].append(getattr(r, name))
    cols["ok"] = [r.ok for r in records]
    return cols


def build_document(
    run: RunState, complete: bool, cfg: CalibrationConfig, intervals: bool = True
) -> dict:
    """The calibration file's content from the run so far (``intervals=False`` skips the
    bootstrap, for the partial file saved after each phase)."""
    records = run.replayer.snapshot() if run.replayer is not None else []
    counts = request_counts(records)
    measured: dict = {}
    fit: dict = {}
    fitted: dict = {}
    regimes: dict = {}
    if counts["ok"]:
        measured, fit, fitted, entry = _measure_and_fit(records, run, complete, cfg, intervals)
        regimes[run.label] = entry
    metadata = _metadata(run, cfg)
    if fitted and regimes:
        _mark_out_of_range(fitted, fit, regimes[run.label], metadata)
    ep = run.endpoint.get("url", "?")
    source = (
        f"live calibration (diloco-gym calibrate) of {ep} "
        f"[{run.endpoint.get('kind', 'endpoint')}] with real "
        f"{run.cluster.get('backend', '?')} merges on {socket.gethostname()}, "
        f"started {run.started_utc}. p95 ratios use linear-interpolation percentiles; "
        f"high pressure = in-flight proxy >= {cfg.high_pressure}; sync active = sent "
        f"inside a recorded merge window."
    )
    document = {
        "source": source,
        "regimes": regimes,
        "complete": bool(complete),
        "error": run.error,
        "stage": run.stage,
        "measured": measured,
        "fitted_sidecar": fitted,
        "fit": fit,
        "requests": counts,
        "capacity": run.capacity,
        "metadata": metadata,
        "schedule": [{"start_s": s, "length_s": n} for s, n in run.plan],
        "merges": run.merges,
        "records": _records_columns(records),
    }
    if cfg.shares_below_one and counts["ok"]:
        document = _with_interference(document, records, run, cfg, intervals)
    document["uncertain"] = uncertain_reasons(document)
    return document


def _with_interference(
    document: dict, records: list[RequestRecord], run: RunState, cfg: CalibrationConfig,
    intervals: bool,
) -> dict:  # fmt: skip
    """``document`` with the ``interference`` block (after ``fit``): the slowdown at every
    link share and the fitted interference function (:mod:`diloco_gym.live.intensity`)."""
    from diloco_gym.live.intensity import interference_block

    try:
        params = SidecarParams(**document["fitted_sidecar"])
    except (TypeError, ValueError) as exc:  # no fit (a degenerate partial run)
        block: dict = {"error": f"no fitted sidecar to refit per link share ({exc})"}
    else:
        shares = (1.0, *cfg.shares_below_one)
        levels = {u: run_data(records, run, level_name(u)) for u in shares}
        achieved = {u: _achieved_share(run.merges, level_name(u)) for u in shares}
        resamples = cfg.interference_resamples if intervals else 0
        block = interference_block(
            levels, params, achieved, resamples, cfg.seed, cfg.pressure_norm_inflight,
            cfg.high_pressure, cfg.bootstrap_resamples if intervals else 0,
        )  # fmt: skip
    out: dict = {}
    for key, value in document.items():
        out[key] = value
        if key == "fit":
            out["interference"] = block
    return out


def _achieved_share(merges: list[dict], level: str) -> float | None:
    """The mean share of its windows that the all-reduces of ``level``'s merges occupied
    (``None`` at the full rate, whose merges do not report it)."""
    values = [
        m["achieved_share"]
        for m in merges
        if m.get("phase") == level and m.get("achieved_share") is not None
    ]
    return float(np.mean(values)) if values else None


#: A control phase whose p95 is more than this many times the probe's p95 at a load at
#: least as high says that the host was busier during the replay than during the probe.
CONTROL_VS_PROBE_LIMIT = 3.0


def uncertain_reasons(document: dict) -> list[str]:
    """Why a live calibration's numbers may not hold, one sentence each (empty: none seen):

    * the capacity probe was unstable: a step at or below the accepted capacity failed (the
      capacity was accepted on a retry, so it, and the replay rate drawn from it, may be
      overstated);
    * the control phase's p95 is more than :data:`CONTROL_VS_PROBE_LIMIT` times the probe's
      p95 at the lowest sustainable probed rate at or above the replay's rate (the host was
      busier during the replay than during the probe);
    * the fit contradicts the measurement: the measured p95 sync ratio is below 1 (requests
      were faster while merges ran) but the fitted ``sync_slowdown`` slows service during
      merges.
    """
    out: list[str] = []
    cap = document.get("capacity") or {}
    steps = (cap.get("probe") or {}).get("steps") or []
    best = cap.get("capacity_rps")
    if isinstance(best, float | int) and math.isfinite(best):
        failed = sorted(
            {s["offered_rps"] for s in steps if not s["sustainable"] and s["offered_rps"] <= best}
        )
        if failed:
            out.append(
                f"unstable capacity probe: the step at {', '.join(_fmt(r) for r in failed)} "
                f"req/s failed, yet {_fmt(best)} req/s was accepted on a retry, so the "
                f"capacity and the replay rate drawn from it may be overstated"
            )
    m = document.get("measured") or {}
    control_ms, rate = m.get("p95_control_ms"), cap.get("rate_rps")
    if isinstance(control_ms, float | int) and math.isfinite(control_ms) and rate:
        above = [
            s for s in steps if s["sustainable"] and s.get("p95_s") and s["offered_rps"] >= rate
        ]
        if above:
            ref = min(above, key=lambda s: s["offered_rps"])
            factor = control_ms / 1000 / ref["p95_s"]
            if factor > CONTROL_VS_PROBE_LIMIT:
                out.append(
                    f"control p95 {_fmt(control_ms / 1000)} s is {factor:.1f}x the probe's "
                    f"{_fmt(ref['p95_s'])} s at {_fmt(ref['offered_rps'])} req/s (a load at "
                    f"least the replay's {_fmt(rate)} req/s): the host was busier during the "
                    f"replay than during the probe"
                )
    ratio = m.get("p95_sync_ratio")
    slowdown = (document.get("fitted_sidecar") or {}).get("sync_slowdown")
    if (
        isinstance(ratio, float | int)
        and math.isfinite(ratio)
        and ratio < 1
        and isinstance(slowdown, float | int)
        and slowdown > 0
    ):
        out.append(
            f"the fit contradicts the measurement: the measured p95 sync ratio is "
            f"{_fmt(ratio)} (< 1: requests were faster while merges ran) but the fitted "
            f"sync_slowdown {_fmt(slowdown)} slows service during merges"
        )
    return out


def _mark_out_of_range(fitted: dict, fit: dict, entry: dict, metadata: dict) -> None:
    """Mark a calibration whose fitted sidecar is slower than the SLO (every request
    violates it: outside the model's range) in ``fit["out_of_range"]`` and the regime's
    note; the command warns about it."""
    from diloco_gym.eval.calibration import slower_than_slo

    try:
        why = slower_than_slo(SidecarParams(**fitted), {"metadata": metadata})
    except (TypeError, ValueError):  # a degenerate partial fit: nothing to judge
        return
    if why:
        fit["out_of_range"] = why
        entry["note"] = entry.get("note", "") + "; outside the model's range: slower than the SLO"


def _measure_and_fit(
    records: list[RequestRecord],
    run: RunState,
    complete: bool,
    cfg: CalibrationConfig,
    intervals: bool,
) -> tuple[dict, dict, dict, dict]:
    """The effect sizes (with bootstrap intervals), the fit, the fitted parameters and the
    regime's entry, from the successful requests so far: ``(measured, fit, fitted, entry)``.
    """
    data = run_data(records, run)
    measured = measured_effect_sizes(data, cfg.pressure_norm_inflight, cfg.high_pressure)
    boot = bootstrap_intervals(
        data,
        cfg.pressure_norm_inflight,
        cfg.high_pressure,
        cfg.bootstrap_resamples if intervals else 0,
        seed=cfg.seed,
    )
    measured["intervals"] = boot
    fitted: dict = {}
    try:
        live_fit = fit_sidecar_live(
            data, measured, run.base, sync_ratio_interval=boot["p95_sync_ratio"]
        )
        fit = live_fit.to_dict()
        fitted = fit.pop("fitted_sidecar")
    except (ValueError, FloatingPointError) as exc:  # a degenerate partial run
        fit = {"error": f"fit failed: {exc}"}
    return measured, fit, fitted, _regime_entry(measured, boot, complete)


def _regime_entry(measured: dict, boot: dict, complete: bool) -> dict:
    """The regime's entry under ``regimes``: the effect sizes (an undefined one written as
    1.0 and listed), their intervals, and a note."""
    undefined = [k for k in ("p95_high_low", "p95_sync_ratio") if not math.isfinite(measured[k])]
    entry = {
        k: (measured[k] if k not in undefined else 1.0) for k in ("p95_high_low", "p95_sync_ratio")
    }
    entry["pressure_latency_corr"] = measured["pressure_latency_corr"]
    for k in ("p95_sync_ratio", "p95_high_low"):
        if boot.get(k) is not None and k not in undefined:
            entry[f"{k}_ci"] = boot[k]
    entry["note"] = (
        "live calibration"
        + ("" if complete else " (incomplete run)")
        + (
            f"; undefined (empty class), written as 1.0: {', '.join(undefined)}"
            if undefined
            else ""
        )
    )
    if undefined:
        entry["undefined"] = undefined
    return entry


def _metadata(run: RunState, cfg: CalibrationConfig) -> dict:
    """The file's ``metadata``: how the run was set up, where and when it ran."""
    return {
        "warmup": run.warmup,
        "phase_order": [phase_key(n, k) for n, k in run.order],
        "overload_inflight_limit": run.overload_limit,
        "endpoint": _portable(run.endpoint),
        "trace": run.trace_info,
        "label": run.label,
        "merges": _portable(run.cluster),
        "started_utc": run.started_utc,
        "elapsed_s": run.clock(),
        "phases": run.phases,
        "config": _portable(finite(_config_dict(cfg))),
        "pressure_proxy": (
            f"min(1, client in-flight requests at send / {cfg.pressure_norm_inflight})"
        ),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch": _torch_version(),
        },
        "clock": "seconds since the run started (time.monotonic)",
    }


#: Machine-specific fields a calibration file leaves out: the server's command line (a
#: virtual environment's executable, temporary model directories) and the merge workers'
#: temporary checkpoint directory. The versions and the model configuration stay.
_MACHINE_FIELDS = ("command", "checkpoint_dir")


def _portable(value: Any) -> Any:
    """``value`` without machine paths: the :data:`_MACHINE_FIELDS` dropped and every
    absolute filesystem path replaced by its last component (a model directory's name)."""
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items() if k not in _MACHINE_FIELDS}
    if isinstance(value, list | tuple):
        return [_portable(v) for v in value]
    if isinstance(value, str) and "://" not in value and os.path.isabs(value):
        return os.path.basename(value.rstrip("/\\")) or value
    return value


def _config_dict(cfg: CalibrationConfig) -> dict:
    out = asdict(cfg)
    out["gap_seconds"] = list(cfg.gap_seconds)
    return out


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:  # pragma: no cover - torch is required to get here
        return "unavailable"


def summary_lines(document: dict) -> list[str]:
    """The console summary of a calibration file: the effect sizes, the fitted slowdown and
    every note of the fit (what the run could not determine, and why)."""
    m = document["measured"]
    iv = m.get("intervals") or {}

    def ci(name: str) -> str:
        bounds = iv.get(name)
        return f" [{_fmt(bounds[0])}, {_fmt(bounds[1])}]" if bounds else ""

    lines = [
        f"measured p95 sync ratio {_fmt(m.get('p95_sync_ratio'))}"
        f"{ci('p95_sync_ratio')}, p95 high/low {_fmt(m.get('p95_high_low'))}"
        f"{ci('p95_high_low')}, pressure-latency corr "
        f"{_fmt(m.get('pressure_latency_corr'))}; fitted sync_slowdown "
        f"{_fmt(document['fitted_sidecar'].get('sync_slowdown'))}"
    ]
    if iv.get("repeats", 0) >= 2:
        lines.append(
            f"intervals: {100 * iv['level']:.0f} % bootstrap over {iv['repeats']} "
            f"repeats (coarse with few repeats); per-repeat p95 sync ratios: "
            + ", ".join(_fmt(v) for v in iv["per_repeat"]["p95_sync_ratio"])
        )
    cap = document.get("capacity") or {}
    if cap.get("capacity_rps"):
        lines.append(
            f"probed capacity {_fmt(cap['capacity_rps'])} req/s; replayed at "
            f"{_fmt(cap.get('rate_rps'))} req/s (utilization "
            f"{_fmt(cap.get('utilization'))})"
        )
    counts = document.get("requests", {})
    if counts.get("errors"):
        limit = document.get("metadata", {}).get("config", {}).get("max_error_fraction")
        kinds = ", ".join(
            f"{k}: {v}" for k, v in sorted(counts.get("by_status", {}).items()) if k != "200"
        )
        lines.append(
            f"{counts['errors']} of {counts['sent']} requests failed "
            f"({100 * counts['errors'] / max(1, counts['sent']):.0f} %"
            + (f", within the {100 * limit:.0f} % limit" if limit is not None else "")
            + f"; {kinds}); they are left out of the measurements"
        )
    lines += _interference_lines(document.get("interference"))
    lines += [f"fit note: {note}" for note in document["fit"].get("notes", [])]
    lines += [f"UNCERTAIN: {why}" for why in document.get("uncertain") or []]
    if "error" in document["fit"]:
        lines.append(f"fit note: {document['fit']['error']}")
    return lines


#: Three decimals, ``n/a`` for a missing or non-finite value (the console lines' numbers).
_fmt = partial(fmt, nd=3)


def _interference_lines(block: dict | None) -> list[str]:
    """The console lines of the ``interference`` block (none without one)."""
    if not block:
        return []
    if "error" in block:
        return [f"interference: {block['error']}"]

    def ci(bounds: list | None) -> str:
        return f" [{_fmt(bounds[0])}, {_fmt(bounds[1])}]" if bounds else ""

    gamma = (
        f"{_fmt(block['share_exponent'])}{ci(block['share_exponent_interval'])}"
        if block["share_exponent_fitted"]
        else f"{_fmt(block['share_exponent'])} (kept: one share below 1)"
    )
    lines = [
        f"interference: host_share {_fmt(block['host_share'])}{ci(block['host_share_interval'])}"
        f", share_exponent {gamma}"
    ]
    for row in block["levels"]:
        lines.append(
            f"  link share {row['link_share']:g}"
            + (
                f" (achieved {_fmt(row['achieved_share'])})"
                if row["achieved_share"] is not None
                else ""
            )
            + f": p95 sync ratio {_fmt(row['p95_sync_ratio'])}{ci(row['p95_sync_ratio_ci'])}, "
            f"sync_slowdown {_fmt(row['sync_slowdown'])}{ci(row['sync_slowdown_interval'])}"
        )
    lines += [f"interference note: {note}" for note in block.get("notes", [])]
    return lines
