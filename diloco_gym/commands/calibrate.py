"""``diloco-gym calibrate``: measure real merge interference on a serving endpoint
(:mod:`diloco_gym.live.cli`; the ``live`` extra)."""

from __future__ import annotations

import argparse

from diloco_gym.commands.extras import missing_extra

__all__ = ["HELP", "SLOW_OPTIONS", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "measure real merge interference on a serving endpoint"

#: Its options come from a module that imports torch (seconds): the parser adds them only
#: when ``calibrate`` is the command being run (or every command's are).
SLOW_OPTIONS = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``calibrate`` command's options (:mod:`diloco_gym.live.cli`); none without the
    ``live`` extra (:func:`run` then says it is missing)."""
    try:
        from diloco_gym.live.cli import add_calibrate_arguments
    except ImportError:
        return
    add_calibrate_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run the live calibration the options describe."""
    try:
        import torch  # noqa: F401 - the engine and the merges need it (the live extra's)

        from diloco_gym.live.cli import run_calibrate_command
    except ImportError as exc:
        raise missing_extra("calibrate", ["live"], exc) from None
    return int(run_calibrate_command(args) or 0)
