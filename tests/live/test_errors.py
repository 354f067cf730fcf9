"""The errors of a live run (:mod:`diloco_gym.live.errors`): one family, the partial file's
path carried along, SIGTERM handled as Ctrl-C."""

from __future__ import annotations

import pytest

from diloco_gym.live.errors import (
    CalibrationError,
    CalibrationTerminated,
    EndpointUnavailableError,
    MergeWorkerError,
)


def test_every_run_error_is_a_calibration_error_with_its_partial_path():
    for cls in (CalibrationError, EndpointUnavailableError, MergeWorkerError):
        err = cls("boom", path="cal.partial.json")
        assert isinstance(err, CalibrationError) and isinstance(err, RuntimeError)
        assert (str(err), err.path) == ("boom", "cal.partial.json")
    assert CalibrationError("nothing written").path is None


def test_sigterm_is_caught_like_ctrl_c():
    """Code that handles Ctrl-C (``except KeyboardInterrupt``) handles SIGTERM too."""
    with pytest.raises(KeyboardInterrupt):
        raise CalibrationTerminated()
    assert not issubclass(CalibrationTerminated, Exception)  # not swallowed by except Exception
