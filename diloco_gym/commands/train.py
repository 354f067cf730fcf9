"""``diloco-gym train``: train an RL scheduler with stable-baselines3 (:mod:`diloco_gym.rl.train`;
the ``rl`` extra)."""

from __future__ import annotations

import argparse

from diloco_gym.commands.extras import missing_extra

__all__ = ["HELP", "SLOW_OPTIONS", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "train an RL scheduler with stable-baselines3"

#: Its options come from a module that imports stable-baselines3 and torch (seconds): the
#: parser adds them only when ``train`` is the command being run (or every command's are).
SLOW_OPTIONS = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train`` command's options (:func:`diloco_gym.rl.train.add_train_arguments`);
    without the ``rl`` extra the rest of the command line, which :func:`run` refuses."""
    try:
        from diloco_gym.rl.train import add_train_arguments
    except ImportError:  # no rl extra: main() says so before parsing
        p.add_argument("rest", nargs=argparse.REMAINDER)
        return
    add_train_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Train the scheduler the options describe."""
    try:
        from diloco_gym.rl.train import run_train_command
    except ImportError as exc:
        raise missing_extra("train", ["rl"], exc) from None
    return int(run_train_command(args) or 0)
