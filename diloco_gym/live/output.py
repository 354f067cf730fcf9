"""Where a run's measurements go, and how: only a complete run writes the target file;
partial measurements always go beside it (:func:`partial_path`, ``NAME.partial.json`` for
``NAME.json``), so a failed run never replaces a good calibration. Every file is written
atomically (temporary file, fsync, rename)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diloco_gym.io import write_text_atomic
from diloco_gym.live.config import (
    CalibrationConfig,
)
from diloco_gym.live.document import (
    build_document,
    finite,
    summary_lines,
)
from diloco_gym.live.state import Job, RunState

__all__ = [
    "CalibrationResult",
    "partial_path",
    "write_atomic",
    "save_document",
    "save_partial",
    "write_complete",
]


@dataclass
class CalibrationResult:
    """What :func:`run_calibration` measured and wrote.

    Attributes:
        path: the calibration file.
        document: its content.
        complete: the run finished as planned.
    """

    path: str
    document: dict

    @property
    def complete(self) -> bool:
        return bool(self.document.get("complete"))

    @property
    def measured(self) -> dict:
        return self.document.get("measured", {})

    @property
    def fitted_sidecar(self) -> dict:
        return self.document.get("fitted_sidecar", {})

    @property
    def out_of_range(self) -> str | None:
        """Why the fitted sidecar is outside the model's range (slower than the SLO)."""
        return (self.document.get("fit") or {}).get("out_of_range")


def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where the partial measurements of a run writing ``out`` go: ``NAME.partial.json``
    beside ``NAME.json`` (``out`` itself is written only by a complete run)."""
    out = Path(out)
    stem = out.name[:-5] if out.name.lower().endswith(".json") else out.name
    return out.with_name(f"{stem}.partial.json")


def write_atomic(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(finite(document), indent=1, allow_nan=False) + "\n")


def save_partial(
    out: Path, run: RunState, cfg: CalibrationConfig, say: Callable[[str], None]
) -> bool:
    """Save an incomplete run to ``out`` (a partial path); never mask the error being
    handled. Says "partial measurements saved" once: callers do not repeat it."""
    try:
        save_document(out, run, False, cfg)
    except Exception as exc:  # noqa: BLE001 - report and carry on with the original error
        say(f"could not save the partial measurements to {out}: {exc}")
        return False
    say(f"partial measurements saved to {out} (complete: false)")
    return True


def save_document(
    out: Path, run: RunState, complete: bool, cfg: CalibrationConfig, intervals: bool = True
) -> dict:
    document = build_document(run, complete, cfg, intervals)
    write_atomic(out, document)
    return finite(document)


def write_complete(job: Job, document: dict) -> CalibrationResult:
    """Write the complete file, remove the partial one it supersedes, print the summary."""
    write_atomic(job.out, document)
    document = finite(document)
    job.partial.unlink(missing_ok=True)  # superseded by the complete file
    for line in summary_lines(document):
        job.say(line)
    job.say(f"wrote {job.out} (complete: {str(bool(document['complete'])).lower()})")
    return CalibrationResult(str(job.out), document)
