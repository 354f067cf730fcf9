"""What a run replays and when: the trace window (a regime's trace or a trace file, cut
and rescaled), the request sizes sent for it, the seeded merge schedule of a sync phase and
the seeded order of the phases."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.live.config import (
    CalibrationConfig,
)
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace, random_window, scale_rate, window

__all__ = [
    "check_source",
    "prepare_trace",
    "plan_merges",
    "token_arrays",
    "phase_order",
    "phase_key",
    "level_name",
    "level_share",
]


def check_source(source: str | os.PathLike[str]) -> Path:
    """The trace file ``source`` names, when it is not a regime.

    Raises:
        ValueError: ``source`` is neither a regime nor an existing file (a usage error,
            checked before anything starts).
    """
    from diloco_gym.sim.regimes import REGIMES

    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"{source!s} is neither a regime ({', '.join(REGIMES)}) nor an existing trace file"
        )
    return path


def prepare_trace(
    source: str | os.PathLike[str] | Trace,
    duration_s: float,
    cfg: CalibrationConfig,
    trace_format: str = "auto",
) -> tuple[Trace, str, SidecarParams, dict]:
    """Resolve the source and cut the replayed window.

    Args:
        source: a regime name, a trace file, or a :class:`Trace`.
        duration_s: window length, seconds.
        cfg: the (resolved) config: seed, start, rate.
        trace_format: format of a trace file (see :func:`diloco_gym.sim.loaders.load_trace`).

    Returns:
        ``(window, label, base sidecar parameters, provenance)``.

    Raises:
        ValueError: unknown regime and no such file, a label that is not a regime, or a
            window outside the trace.
    """
    from diloco_gym.sim.regimes import REGIMES

    rng = np.random.default_rng(cfg.seed)
    full, label, base, info = _resolve_source(source, cfg, trace_format, rng)
    label = cfg.label or label
    if label not in REGIMES:
        raise ValueError(
            f"the calibration file's entry needs a regime name, and {label!r} is not one: "
            f"pass --label (label=) one of {', '.join(REGIMES)}, the regime whose "
            f"measurements this trace stands for"
        )
    info["native_rate_rps"] = full.mean_rate_rps
    if full.num_requests and None not in (
        cfg.output_scale,
        cfg.max_prompt_tokens,
        cfg.max_output_tokens,
    ):
        # The longest request any window of this trace can send (after the caps): the
        # engine's KV cache is sized for it before the window is cut.
        p_all, o_all = token_arrays(full, cfg)
        info["longest_prompt_tokens"] = int(p_all.max())
        info["longest_output_tokens"] = int(o_all.max())
    if cfg.rate_rps is not None:
        full = scale_rate(full, cfg.rate_rps)
    if cfg.start_s is not None:
        win = window(full, cfg.start_s, duration_s)
    else:
        win = random_window(full, duration_s, rng)
    info.update(
        window_start_s=float(win.meta.get("window_start_s", 0.0)),
        duration_s=float(duration_s),
        rate_rps=cfg.rate_rps,
        requests=win.num_requests,
    )
    return win, label, cfg.base_sidecar or base, info


def _resolve_source(
    source: str | os.PathLike[str] | Trace,
    cfg: CalibrationConfig,
    trace_format: str,
    rng: np.random.Generator,
) -> tuple[Trace, str, SidecarParams, dict]:
    """The whole trace of a :class:`Trace`, a regime (drawn from ``rng``) or a file, with
    its label, base sidecar parameters and provenance."""
    from diloco_gym.sim.regimes import REGIMES, get_regime

    info: dict[str, Any]
    if isinstance(source, Trace):
        full, label, base, info = (
            source,
            source.name,
            SidecarParams(),
            {"kind": "trace", "name": source.name},
        )
    elif isinstance(source, str) and source in REGIMES:
        regime = get_regime(source)
        full = regime(rng)
        label, base = source, regime.sidecar
        info = {"kind": "regime", "name": source, "seed": cfg.seed}
    else:
        path = check_source(source)
        from diloco_gym.sim.loaders import load_trace

        full = load_trace(path, trace_format, seed=cfg.seed)
        label, base = full.name, SidecarParams()
        info = {
            "kind": "file",
            "path": str(path),
            "format": full.meta.get("format"),
            "rows_read": full.meta.get("rows_read"),
        }
    return full, label, base, info


def plan_merges(duration_s: float, cfg: CalibrationConfig) -> list[tuple[float, float]]:
    """Planned merge windows ``(start, length)`` of the sync phase (seeded).

    Windows start at ``lead_seconds`` and are separated by gaps drawn uniformly from
    ``gap_seconds``; a window that would not end inside the phase is dropped, except that
    a phase always has at least one merge when it is longer than the lead.
    """
    rng = np.random.default_rng([cfg.seed, 7])
    lo, hi = cfg.gap_seconds
    plan: list[tuple[float, float]] = []
    t = cfg.lead_seconds
    while t + cfg.merge_seconds <= duration_s:
        plan.append((round(t, 3), cfg.merge_seconds))
        t += cfg.merge_seconds + float(rng.uniform(lo, hi))
    if not plan and duration_s > cfg.lead_seconds:
        plan.append((cfg.lead_seconds, max(0.1, (duration_s - cfg.lead_seconds) / 2)))
    return plan


def token_arrays(win: Trace, cfg: CalibrationConfig) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.clip(win.prompt_tokens, 1, cfg.max_prompt_tokens)
    output = np.clip(np.rint(win.output_tokens * cfg.output_scale), 1, cfg.max_output_tokens)
    return prompt.astype(np.int64), output.astype(np.int64)


def phase_order(cfg: CalibrationConfig) -> list[tuple[str, int]]:
    """The run's phases ``(name, repeat)``: ``repeats`` pairs of a sync and a control phase,
    each pair in an order drawn from the seed (sync phases only without a control).

    With link shares below 1 (``cfg.link_shares``), each repeat also has a sync phase
    ``sync@U`` per share ``U``, and the repeat's phases are in an order drawn from the seed
    (a permutation), so that drift of the host does not line up with the intensity.
    """
    rng = np.random.default_rng([cfg.seed, 13])
    extra = [level_name(u) for u in cfg.shares_below_one]
    order: list[tuple[str, int]] = []
    for k in range(cfg.repeats):
        names = ["sync", "control"] if cfg.control else ["sync"]
        if extra:
            names = [(names + extra)[i] for i in rng.permutation(len(names) + len(extra))]
        elif cfg.control and rng.random() < 0.5:
            names.reverse()
        order += [(name, k) for name in names]
    return order


def phase_key(name: str, repeat: int) -> str:
    """Key of a phase in the file's ``metadata.phases`` (``sync`` and ``control`` for the
    first repeat, as in files without repeats; ``sync-2`` ... after it)."""
    return name if repeat == 0 else f"{name}-{repeat + 1}"


def level_name(share: float) -> str:
    """The label of a sync phase at link share ``share``: ``sync`` at 1, else ``sync@U``."""
    return "sync" if share == 1.0 else f"sync@{share:g}"


def level_share(name: str) -> float:
    """The link share of a sync phase label (:func:`level_name` read back)."""
    return float(name.partition("@")[2] or 1.0)
