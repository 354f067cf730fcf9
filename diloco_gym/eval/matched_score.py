"""Every episode scored against its matched-random control, as a Gymnasium wrapper.

:class:`MatchedRandomScore` passes the agent's own actions through and scores every finished
episode against its matched-random control, exactly as ``diloco-gym report`` does (the same
functions of :mod:`diloco_gym.eval.protocol`): the figures land in the last step's
``info``, so a training loop or a notebook sees per episode whether the agent's placement
beats random placement of the same number of merges. Its public home is
:mod:`diloco_gym.wrappers`, beside the control itself
(:class:`~diloco_gym.eval.protocol.MatchedRandomDeferral`).

Importing this module loads neither pandas nor Stable-Baselines3.
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
import numpy as np

from diloco_gym.envs.env import Action, DiLoCoSyncEnv, Observation

__all__ = ["MatchedRandomScore", "SCORE_KEY", "SCORE_FIELDS"]

#: The key of the last step's ``info`` that holds an episode's score.
SCORE_KEY = "matched_random_score"

#: The fields of ``info[SCORE_KEY]`` (percentage points unless said otherwise).
SCORE_FIELDS = (
    "sync_excess_pct",  # the agent's exact sync-excess (results.csv sync_excess_pct)
    "matched_random_mean",  # its matched random's mean at the same number of merges
    "matched_random_p05",  # ... 5 % percentile
    "matched_random_p95",  # ... 95 % percentile
    "matched_random_additive_mean",  # the control's additive (isolated-cost) mean
    "gap_pp",  # sync_excess_pct - matched_random_mean: below 0 is a placement gain
    "merges",  # the episode's merges (int)
    "draws",  # matched-random schedules drawn (int)
    "episode_seed",  # the episode's seed (int)
)


class MatchedRandomScore(gym.Wrapper[Observation, Action, Observation, Action]):
    """Score each episode of a ``DiLoCoSync`` env against matched random, exactly.

    The actions are passed through unchanged. When an episode ends (terminated or
    truncated with the env's ``episode_summary``), the last step's ``info`` gets
    ``info["matched_random_score"]``, a dict of :data:`SCORE_FIELDS`: the episode's exact
    sync-excess (the exact replay the report scores), the mean and 5-95 % range of
    ``draws`` schedules drawn uniformly among the feasible schedules with exactly the
    episode's number of merges (:func:`~diloco_gym.eval.protocol.episode_control`: the
    draws seeded by the episode seed and the merges, the report's own), and ``gap_pp``,
    the agent minus the control's mean. For an episode seed and schedule these are the
    numbers results.csv gives (``sync_excess_pct``, ``matched_random_mean``,
    ``matched_random_p05``, ``matched_random_p95``) at the same ``--draws``.

    Scoring costs one exact replay of ``draws + 1`` schedules per episode (about a
    millisecond per 100 draws of a 600 s episode); lower ``draws`` for training.

    Args:
        env: a :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` (any wrappers around it).
        draws: matched-random schedules per episode (the report's ``--draws``).

    Raises:
        TypeError: ``env`` is not a single ``DiLoCoSync`` env.
        ValueError: ``draws`` is below 1.
    """

    def __init__(self, env: gym.Env, draws: int = 1000) -> None:
        super().__init__(env)
        if not isinstance(env.unwrapped, DiLoCoSyncEnv):
            raise TypeError(
                f"MatchedRandomScore wraps a DiLoCoSync env (DiLoCoSyncEnv), got "
                f"{type(env.unwrapped).__name__}"
            )
        if int(draws) < 1:
            raise ValueError(f"MatchedRandomScore: draws must be >= 1, got {draws}")
        self.draws = int(draws)
        self._seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._seed = int(info["episode_seed"])
        return obs, info

    def step(self, action: Any):
        if self._seed is None:
            raise RuntimeError("MatchedRandomScore: call reset() first")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if (terminated or truncated) and "episode_summary" in info:
            info = dict(info)
            info[SCORE_KEY] = self.score(info["episode_summary"]["merge_decisions"])
        return obs, reward, terminated, truncated, info

    def score(self, merge_decisions: Any) -> dict[str, Any]:
        """The current episode's figures (:data:`SCORE_FIELDS`) for a schedule of merge
        decisions (decision indices), by the protocol's exact replay and control."""
        from diloco_gym.eval import protocol

        base = cast(DiLoCoSyncEnv, self.env.unwrapped)
        ep = base.episode
        if ep is None or self._seed is None:
            raise RuntimeError("MatchedRandomScore: no episode to score (call reset() first)")
        schedule = np.asarray(merge_decisions, dtype=np.int64).reshape(1, -1)
        m = schedule.shape[1]
        scorer = protocol.EpisodeScorer(ep, base.params, base.sidecar)
        counts = protocol.counts_for(ep.n_decisions, base.params, max(m, 40))
        control = protocol.episode_control(scorer, m, self.draws, self._seed, counts)
        agent = float(scorer.score(schedule).exact_pct[0])
        figures = protocol.control_figures(control.scores)
        return {
            "sync_excess_pct": agent,
            **figures,
            "gap_pp": agent - figures["matched_random_mean"],
            "merges": m,
            "draws": self.draws,
            "episode_seed": self._seed,
        }
