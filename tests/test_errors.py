"""diloco_gym/errors.py: the command line's user errors, their exit statuses and their
hierarchy; the CLI reports each as one line with that status."""

from __future__ import annotations

import pytest

from diloco_gym import errors
from diloco_gym.errors import CLIError, DataError, Interrupted, UsageError


def test_exit_codes():
    assert CLIError.exit_code == 1
    assert UsageError.exit_code == 2
    assert DataError.exit_code == 1
    assert Interrupted.exit_code == 130  # 128 + SIGINT, what a shell reports for Ctrl-C


@pytest.mark.parametrize("cls", [UsageError, DataError, Interrupted])
def test_every_error_is_a_cli_error_and_an_exception(cls):
    assert issubclass(cls, CLIError) and issubclass(CLIError, Exception)
    # Not a ValueError or an OSError: the CLI maps those itself, with other statuses.
    assert not issubclass(cls, (ValueError, OSError, KeyboardInterrupt))
    err = cls("a message")
    assert str(err) == "a message" and err.exit_code == cls.exit_code


def test_the_errors_are_distinct_classes():
    with pytest.raises(UsageError):
        raise UsageError("bad option")
    with pytest.raises(CLIError):
        raise DataError("bad file")
    assert not issubclass(DataError, UsageError) and not issubclass(UsageError, DataError)


def test_public_names():
    assert errors.__all__ == ["CLIError", "UsageError", "DataError", "Interrupted"]
    assert all(isinstance(getattr(errors, name), type) for name in errors.__all__)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (CLIError("boom"), 1),
        (UsageError("--out refused"), 2),
        (DataError("trace.csv: unreadable"), 1),
        (Interrupted("stopped; 3 cells on disk"), 130),
    ],
)
def test_the_cli_reports_its_status_and_message(exc, status):
    from diloco_gym.cli import exit_status

    assert exit_status(exc) == (status, str(exc))


def test_a_subclass_may_set_its_own_exit_code():
    from diloco_gym.cli import exit_status

    class Refused(UsageError):
        exit_code = 3

    assert exit_status(Refused("no")) == (3, "no")
