"""Former home of the environment's parameters, observation table, episodes and rules.

The names moved to one module per concept; they are re-exported here, unchanged, for one
release (0.6.0), so that ``from diloco_gym.envs.core import X`` keeps working. Import them
from their new homes:

* :mod:`diloco_gym.envs.params`: :class:`EnvParams`.
* :mod:`diloco_gym.envs.observation`: ``OBS_FEATURES``, ``OBS_DIM``, ``OBS_INDEX``,
  ``OBS_LOW``, ``OBS_HIGH``, ``EXO_SLICE``, ``LEARNER_SLICE``, :func:`squash_rate`,
  :func:`unsquash_rate`, :func:`learner_features`, :func:`learner_features_k`,
  :func:`learner_table`.
* :mod:`diloco_gym.envs.episode`: :class:`Episode`, :class:`EpisodeCore`,
  :func:`decision_costs`, :func:`min_episode_seconds`, :func:`episode_length`,
  :func:`episode_core`, :func:`episode_core_batch`, :func:`build_episode`,
  :func:`episode_from_seed`.
* :mod:`diloco_gym.envs.kernel`: :func:`episode_draws`, :func:`episode_draws_batch`,
  :func:`synthetic_draws`, :func:`is_synthetic`, :class:`BudgetTables`, and ``options``
  as :func:`~diloco_gym.envs.kernel.options_at` (the compiled rule on scalars or arrays).
* :mod:`diloco_gym.envs.schedule`: :func:`sync_mask`, :func:`replay_schedule`,
  :func:`schedule_summary`.
* :mod:`diloco_gym.envs.env`: ``MAX_SEED``, :func:`check_seed`,
  :func:`check_reset_options`, :func:`check_env_sizes`.
* :mod:`diloco_gym.envs.reward` (already there): ``REWARD_NOMINAL_REQUESTS``,
  :func:`nominal_rate_rps`, :func:`reward_per_request`.
"""

from __future__ import annotations

from diloco_gym.envs.env import MAX_SEED, check_env_sizes, check_reset_options, check_seed
from diloco_gym.envs.episode import (
    Episode,
    EpisodeCore,
    build_episode,
    decision_costs,
    episode_core,
    episode_core_batch,
    episode_from_seed,
    episode_length,
    min_episode_seconds,
)
from diloco_gym.envs.kernel import (
    BudgetTables,
    episode_draws,
    episode_draws_batch,
    is_synthetic,
    synthetic_draws,
)
from diloco_gym.envs.kernel import options_at as options
from diloco_gym.envs.observation import (
    EXO_SLICE,
    LEARNER_SLICE,
    OBS_DIM,
    OBS_FEATURES,
    OBS_HIGH,
    OBS_INDEX,
    OBS_LOW,
    learner_features,
    learner_features_k,
    learner_table,
    squash_rate,
    unsquash_rate,
)
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import REWARD_NOMINAL_REQUESTS, nominal_rate_rps, reward_per_request
from diloco_gym.envs.schedule import replay_schedule, schedule_summary, sync_mask

__all__ = [
    "EnvParams",
    "Episode",
    "EpisodeCore",
    "build_episode",
    "decision_costs",
    "episode_core",
    "episode_core_batch",
    "episode_from_seed",
    "episode_length",
    "min_episode_seconds",
    "episode_draws",
    "episode_draws_batch",
    "synthetic_draws",
    "is_synthetic",
    "OBS_FEATURES",
    "OBS_DIM",
    "OBS_INDEX",
    "OBS_LOW",
    "OBS_HIGH",
    "EXO_SLICE",
    "LEARNER_SLICE",
    "squash_rate",
    "unsquash_rate",
    "REWARD_NOMINAL_REQUESTS",
    "nominal_rate_rps",
    "reward_per_request",
    "learner_table",
    "learner_features",
    "learner_features_k",
    "options",
    "BudgetTables",
    "sync_mask",
    "replay_schedule",
    "schedule_summary",
    "MAX_SEED",
    "check_seed",
    "check_reset_options",
    "check_env_sizes",
]
