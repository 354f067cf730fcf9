"""The command line's user errors: what a command raises to report one line and an exit status.

:func:`diloco_gym.cli.main` prints ``diloco-gym: <message>`` on stderr for these (and for
the library's own error types, see :func:`diloco_gym.cli.exit_status`) and exits with
``exit_code``; no traceback.
"""

from __future__ import annotations

__all__ = ["CLIError", "UsageError", "DataError", "Interrupted"]


class CLIError(Exception):
    """A user error a command reports as one line; ``exit_code`` is the exit status."""

    exit_code = 1


class UsageError(CLIError):
    """The command line is wrong: a bad option value, an unknown name, a refused ``--out``."""

    exit_code = 2


class DataError(CLIError):
    """An input file (trace, calibration, model) is missing, unreadable or unusable."""

    exit_code = 1


class Interrupted(CLIError):
    """Ctrl-C: the command stopped; the message says what was left on disk."""

    exit_code = 130
