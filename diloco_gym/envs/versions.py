"""The env ids' versions: what ``DiLoCoSync-v1`` sets over :class:`EnvParams`' defaults
(which are ``DiLoCoSync-v0``'s), and the deprecated ``-v0`` ids' entry point."""

from __future__ import annotations

import warnings
from typing import Any

from diloco_gym.envs.env import DiLoCoSyncEnv

__all__ = ["V1_KWARGS", "make_v0"]

#: What ``DiLoCoSync-v1`` sets over the ``EnvParams`` defaults, which are
#: ``DiLoCoSync-v0``'s (and ``diloco-gym train``'s): the merge-debt reward shaping
#: (:mod:`diloco_gym.envs.shaping`) and a reward on the scale of the sync-excess in
#: percentage points of the episode's nominal requests (``excess_weight = 0.1``).
V1_KWARGS: dict[str, object] = {"reward_shaping": "merge-debt", "excess_weight": 0.1}


def make_v0(**kwargs: Any) -> DiLoCoSyncEnv:
    """The entry point of the deprecated ``DiLoCoSync-v0`` ids: ``DiLoCoSyncEnv`` with
    ``EnvParams``' own defaults (no reward shaping, ``excess_weight = 1``), after a
    ``FutureWarning``. Kept for one release."""
    warnings.warn(
        "DiLoCoSync-v0 ids are deprecated and will be removed in the next release: use "
        "DiLoCoSync-v1 (the same task and observation, with the merge-debt reward shaping "
        "and a reward 10x smaller, on the scale of the sync-excess in percentage points), "
        "on which Stable-Baselines3's PPO learns from scratch; see docs/training.md. "
        "DiLoCoSyncEnv(...) itself is unchanged.",
        FutureWarning,
        stacklevel=3,
    )
    return DiLoCoSyncEnv(**kwargs)


#: Gymnasium reads an entry point's ``metadata`` (its render modes) to wrap the env for
#: modes such as ``"rgb_array_list"``: the v0 ids keep the env's.
make_v0.metadata = DiLoCoSyncEnv.metadata  # type: ignore[attr-defined]
