"""``diloco-gym validate``: check the fitted simulator against a real engine on held-out
settings, replay verdicts live, and run a scheduler in the loop
(:mod:`diloco_gym.live.validate_cli`; the ``live`` extra)."""

from __future__ import annotations

import argparse

from diloco_gym.commands.extras import missing_extra

__all__ = ["HELP", "SLOW_OPTIONS", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "check the simulator against a real engine: fidelity, live verdicts, closed loop"

#: Its options come from a module that imports torch (seconds): the parser adds them only
#: when ``validate`` is the command being run (or every command's are).
SLOW_OPTIONS = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``validate`` command's options (:mod:`diloco_gym.live.validate_cli`); none
    without the ``live`` extra (:func:`run` then says it is missing)."""
    try:
        from diloco_gym.live.validate_cli import add_validate_arguments
    except ImportError:
        return
    add_validate_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run the validation the options describe."""
    try:
        import torch  # noqa: F401 - the engine and the merges need it (the live extra's)

        from diloco_gym.live.validate_cli import run_validate_command
    except ImportError as exc:
        raise missing_extra("validate", ["live"], exc) from None
    return int(run_validate_command(args) or 0)
