"""Moved: the report's cells are :mod:`diloco_gym.eval.cells` (they belong to the evaluation
layer). This name re-exports it for one release."""

from diloco_gym.eval.cells import *  # noqa: F403
