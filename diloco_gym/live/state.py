"""The state of one live calibration run: its fixed inputs (:class:`Job`), the replayed
window (:class:`TraceWindow`) and what the run has measured so far (:class:`RunState`,
what a partial file is written from)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diloco_gym.live.config import (
    CalibrationConfig,
)
from diloco_gym.live.replay import (
    OpenLoopReplayer,
)
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace

__all__ = [
    "RunState",
    "Job",
    "TraceWindow",
]


@dataclass
class RunState:
    """Mutable state of one run (what a partial file needs)."""

    t0: float
    started_utc: str
    label: str = ""
    base: SidecarParams = field(default_factory=SidecarParams)
    trace_info: dict = field(default_factory=dict)
    plan: list[tuple[float, float]] = field(default_factory=list)
    merges: list[dict] = field(default_factory=list)
    phases: dict = field(default_factory=dict)
    endpoint: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)
    replayer: OpenLoopReplayer | None = None
    error: str | None = None
    stage: str = "setup"
    order: list[tuple[str, int]] = field(default_factory=list)
    current: tuple[str, int] | None = None
    capacity: dict = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)
    rate_rps: float | None = None
    overload_limit: int = 64
    over_since: float | None = None

    def clock(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class Job:
    """The fixed inputs of one run, shared by its steps."""

    endpoint: str | None
    source: str | os.PathLike[str] | Trace
    duration_s: float
    trace_format: str
    cfg: CalibrationConfig
    say: Callable[[str], None]
    out: Path
    partial: Path

    @property
    def builtin(self) -> bool:
        return self.endpoint is None


@dataclass
class TraceWindow:
    """The replayed trace window and the request sizes sent for it (after the caps)."""

    trace: Trace
    prompt: np.ndarray
    output: np.ndarray
