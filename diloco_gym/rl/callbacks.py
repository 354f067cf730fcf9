"""A Stable-Baselines3 callback that logs each finished episode's score against matched
random (:class:`diloco_gym.wrappers.MatchedRandomScore`), so that a training curve shows the
placement gain beside the reward.

    env = make_vec_env(lambda: MatchedRandomScore(DiLoCoSyncEnv("bursty"), draws=100), 4)
    model = PPO("MlpPolicy", env, tensorboard_log="runs")
    model.learn(100_000, callback=MatchedRandomCallback())

TensorBoard then has ``matched_random/gap_pp`` (the agent's exact sync-excess minus its
matched random's mean at the same merges; below 0 is a placement gain),
``matched_random/sync_excess_pct``, ``matched_random/matched_random_mean``, ``_p05``,
``_p95``, ``matched_random/merges`` and ``matched_random/episodes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from diloco_gym.eval.matched_score import SCORE_KEY

__all__ = ["MatchedRandomCallback", "LOGGED_FIELDS"]

#: The fields of ``info["matched_random_score"]`` whose mean is logged.
LOGGED_FIELDS = (
    "gap_pp",
    "sync_excess_pct",
    "matched_random_mean",
    "matched_random_p05",
    "matched_random_p95",
    "merges",
)


class MatchedRandomCallback(BaseCallback):
    """Record (``self.logger.record``) the mean of :data:`LOGGED_FIELDS` over the episodes
    that finished since the logger last wrote (``dump``), and their number
    (``<prefix>/episodes``): what the next TensorBoard, CSV or stdout line shows.

    The envs must be wrapped in :class:`~diloco_gym.wrappers.MatchedRandomScore` (inside
    the vector env): the callback reads the last step's ``info`` of each episode from the
    algorithm's ``infos``. Steps without a score are ignored; with no scored episode since
    the last write nothing is recorded.

    Args:
        prefix: the logger keys' prefix.
        verbose: Stable-Baselines3's verbosity.
    """

    def __init__(self, prefix: str = "matched_random", verbose: int = 0) -> None:
        super().__init__(verbose)
        self.prefix = prefix
        self._scores: list[dict[str, Any]] = []
        #: every scored episode seen so far (for inspection after ``learn``).
        self.episodes = 0

    @property
    def _count_key(self) -> str:
        return f"{self.prefix}/episodes"

    def _on_step(self) -> bool:
        new = [
            info[SCORE_KEY]
            for info in self.locals.get("infos", ())
            if isinstance(info, dict) and SCORE_KEY in info
        ]
        if not new:
            return True
        if self._scores and self._count_key not in self.logger.name_to_value:
            self._scores = []  # the logger wrote (and cleared) what was recorded
        self._scores.extend(new)
        self.episodes += len(new)
        for field in LOGGED_FIELDS:
            value = float(np.mean([s[field] for s in self._scores]))
            self.logger.record(f"{self.prefix}/{field}", value)
        self.logger.record(self._count_key, len(self._scores))
        return True
