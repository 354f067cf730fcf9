"""Moved: the executor backends are the leaf module :mod:`diloco_gym.backends` (they import
nothing of the project). This name re-exports it for one release."""

from diloco_gym.backends import *  # noqa: F403
