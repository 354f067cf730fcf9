"""Errors of a live calibration run."""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "EndpointUnavailableError",
    "MergeWorkerError",
    "CalibrationTerminated",
]


class CalibrationError(RuntimeError):
    """A live calibration could not complete.

    Attributes:
        path: the file holding the partial measurements (``"complete": false``), or
            ``None`` when nothing was written.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class EndpointUnavailableError(CalibrationError):
    """The serving endpoint cannot be reached (refused, timed out, bad URL)."""


class MergeWorkerError(CalibrationError):
    """A merge worker failed or died."""


class CalibrationTerminated(KeyboardInterrupt):
    """SIGTERM arrived during a run (``diloco-gym calibrate`` turns it into this).

    It is a :class:`KeyboardInterrupt` so that a run handles it exactly like Ctrl-C: the
    partial measurements are saved and every child process is stopped.
    """
