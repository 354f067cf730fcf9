"""The env ids' versions: what ``DiLoCoSync-v1`` and ``DiLoCoSync-v2`` set over
:class:`EnvParams`' and :class:`LearnerParams`' defaults (which are ``DiLoCoSync-v0``'s),
and the deprecated ``-v0`` and ``-v1`` ids' entry points (and the deprecated
``DiLoCoFleet-v0``'s: the fleet model v0, ``model_version=0``; ``DiLoCoFleet-v1`` is the
fleet model v1, docs/fleet.md).

* ``-v0``: ``DiLoCoSyncEnv``'s own defaults.
* ``-v1``: v0 with the merge-debt reward shaping and a reward on the scale of the
  sync-excess in percentage points (:data:`V1_KWARGS`).
* ``-v2``: v1 with the learner model of the learner calibration shipped with the package
  (:data:`V2_KWARGS`): fitted to a real DiLoCo trainer's paired runs, it prices a 4-fold
  longer sync interval at +0.6 % loss where the published DiLoCo ablations give +0.1 to
  +1.2 %, and the v0/v1 learner model +3.8 % (docs/learners.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.sim.learner_calibration import SHIPPED

__all__ = ["V1_KWARGS", "V2_KWARGS", "make_v0", "make_v1", "make_fleet_v0"]

#: What ``DiLoCoSync-v1`` sets over the ``EnvParams`` defaults, which are
#: ``DiLoCoSync-v0``'s (and ``diloco-gym train``'s): the merge-debt reward shaping
#: (:mod:`diloco_gym.envs.shaping`) and a reward on the scale of the sync-excess in
#: percentage points of the episode's nominal requests (``excess_weight = 0.1``).
V1_KWARGS: dict[str, object] = {"reward_shaping": "merge-debt", "excess_weight": 0.1}

#: What ``DiLoCoSync-v2`` sets: v1's reward, and the learners of the shipped learner
#: calibration (``learner_calibration="shipped"``). The traffic, the scoring and the
#: observation's layout are v1's; the learner features (``loss_progress_*``) and the
#: ``progress`` reward term follow the calibrated loss curve, drift and merge overhead.
V2_KWARGS: dict[str, object] = {**V1_KWARGS, "learner_calibration": SHIPPED}


def make_v0(**kwargs: Any) -> DiLoCoSyncEnv:
    """The entry point of the deprecated ``DiLoCoSync-v0`` ids: ``DiLoCoSyncEnv`` with
    ``EnvParams``' own defaults (no reward shaping, ``excess_weight = 1``), after a
    ``FutureWarning``. Kept for one release."""
    warnings.warn(
        "DiLoCoSync-v0 ids are deprecated and will be removed in the next release: use "
        "DiLoCoSync-v2 (the same task, with the merge-debt reward shaping, a reward 10x "
        "smaller, on the scale of the sync-excess in percentage points, and the calibrated "
        "learner model), on which Stable-Baselines3's PPO learns from scratch; see "
        "docs/training.md. DiLoCoSyncEnv(...) itself is unchanged.",
        FutureWarning,
        stacklevel=3,
    )
    return DiLoCoSyncEnv(**kwargs)


def make_v1(**kwargs: Any) -> DiLoCoSyncEnv:
    """The entry point of the deprecated ``DiLoCoSync-v1`` ids: v1's reward over the default
    learner model, after a ``FutureWarning``. Kept for one release."""
    warnings.warn(
        "DiLoCoSync-v1 ids are deprecated and will be removed in a later release: use "
        "DiLoCoSync-v2 (the same traffic, reward and scoring; its learner model is the "
        "shipped learner calibration's, whose price of long sync intervals agrees with the "
        "published DiLoCo ablations, where v1's is about 4x too high); see docs/learners.md.",
        FutureWarning,
        stacklevel=3,
    )
    return DiLoCoSyncEnv(**kwargs)


def make_fleet_v0(**kwargs: Any) -> Any:
    """The entry point of the deprecated ``DiLoCoFleet-v0`` id: the fleet env with the
    fleet model v0 (``model_version=0``, which the id passes), after a ``FutureWarning``.
    Kept for one release."""
    from diloco_gym.envs.fleet import DiLoCoFleetEnv

    warnings.warn(
        "DiLoCoFleet-v0 is deprecated and will be removed in the next release: use "
        "DiLoCoFleet-v1 (the fleet model v1: each site's slowdown at its own link share, a "
        "streamed sync's host part charged by its work, full-mode syncs stall the learners, "
        "fragment credit by its own staleness, ring latency by its hops); see docs/fleet.md, "
        "'What v1 changes'. DiLoCoFleetEnv(...) itself keeps model v0 unless "
        "model_version=1 is given.",
        FutureWarning,
        stacklevel=3,
    )
    return DiLoCoFleetEnv(**kwargs)


#: Gymnasium reads an entry point's ``metadata`` (its render modes) to wrap the env for
#: modes such as ``"rgb_array_list"``: the deprecated ids keep the env's.
make_v0.metadata = DiLoCoSyncEnv.metadata  # type: ignore[attr-defined]
make_v1.metadata = DiLoCoSyncEnv.metadata  # type: ignore[attr-defined]
make_fleet_v0.metadata = DiLoCoSyncEnv.metadata  # type: ignore[attr-defined]
