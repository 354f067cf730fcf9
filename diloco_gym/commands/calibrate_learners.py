"""``diloco-gym calibrate-learners``: real DiLoCo runs of a tiny LM under many schedules, and
the learner model fitted to them (:mod:`diloco_gym.lm`; torch only when it runs)."""

from __future__ import annotations

import argparse

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "train a tiny LM with DiLoCo under many schedules and fit the learner model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``calibrate-learners`` command's options (:mod:`diloco_gym.lm.cli`)."""
    from diloco_gym.lm.cli import add_calibrate_learners_arguments

    add_calibrate_learners_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run the learner calibration the options describe."""
    from diloco_gym.lm.cli import run_calibrate_learners_command

    return int(run_calibrate_learners_command(args) or 0)
