"""Gymnasium wrappers that put the calibration protocol's control on any episode.

* :class:`MatchedRandomScore` (:mod:`diloco_gym.eval.matched_score`) passes the agent's own
  actions through and adds to each episode's last ``info`` its exact sync-excess, its
  matched random's mean and 5-95 % range at the same number of merges, and the gap: the
  numbers ``diloco-gym report`` gives for that episode (docs/your-scheduler.md).
* :class:`MatchedRandomDeferral` (:mod:`diloco_gym.eval.protocol`) is the control itself:
  it ignores the actions and places the episode's merges by a uniformly drawn feasible
  schedule with a given number of merges.
"""

from __future__ import annotations

from diloco_gym.eval.matched_score import SCORE_FIELDS, SCORE_KEY, MatchedRandomScore
from diloco_gym.eval.protocol import MatchedRandomDeferral

__all__ = ["MatchedRandomScore", "MatchedRandomDeferral", "SCORE_KEY", "SCORE_FIELDS"]
