"""diloco-gym: when is it safe to run a DiLoCo outer merge on a shared serving host?

Importing the package registers the Gymnasium ids ``DiLoCoSync-v0`` (bursty by default,
any regime through ``regime=``) and one id per regime, e.g. ``DiLoCoSync-Bursty-v0``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.observation import OBS_FEATURES
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim.learners import LearnerParams
from diloco_gym.sim.regimes import REGIMES, ReplayRegime, SyntheticRegime, get_regime
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace, TraceFormatError


@lru_cache(maxsize=1)
def _package_version() -> str:
    """The installed distribution's version (pyproject.toml is the one place it is set)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("diloco-gym")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """``__version__``, looked up on first access: importlib.metadata takes 10-20 ms to
    import, which every process importing the package (each spawned worker) would pay.
    ``evaluate`` and ``Evaluation`` (:mod:`diloco_gym.api`) likewise: the protocol loads
    pandas and scipy, which the env never needs."""
    if name == "__version__":
        return _package_version()
    if name in ("evaluate", "Evaluation"):
        from diloco_gym import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DiLoCoSyncEnv",
    "EnvParams",
    "SidecarParams",
    "LearnerParams",
    "Trace",
    "TraceFormatError",
    "REGIMES",
    "get_regime",
    "SyntheticRegime",
    "ReplayRegime",
    "OBS_FEATURES",
    "ENV_IDS",
    "register_envs",
    "evaluate",
    "Evaluation",
]


def _id_for(regime: str) -> str:
    return "DiLoCoSync-" + "".join(part.capitalize() for part in regime.split("-")) + "-v0"


#: Registered id for each regime (plus the generic ``DiLoCoSync-v0``).
ENV_IDS: dict[str, str] = {name: _id_for(name) for name in REGIMES}


def register_envs() -> None:
    """Register the environment ids with Gymnasium (idempotent; runs on import)."""
    import gymnasium as gym

    entries: dict[str, dict[str, str]] = {"DiLoCoSync-v0": {}} | {
        env_id: {"regime": name} for name, env_id in ENV_IDS.items()
    }
    for env_id, kwargs in entries.items():
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point="diloco_gym.envs.env:DiLoCoSyncEnv",
            vector_entry_point="diloco_gym.envs.vector:DiLoCoSyncVectorEnv",
            kwargs=kwargs,
            # gym.make returns the env itself, so that env.action_masks() (MaskablePPO's
            # protocol) needs no get_wrapper_attr: the env enforces reset-before-step
            # itself, and the test suite runs Gymnasium's and SB3's env checkers on it.
            # gym.make(id, disable_env_checker=False) adds the passive checker back.
            order_enforce=False,
            disable_env_checker=True,
        )
    if "DiLoCoFleet-v0" not in gym.registry:
        gym.register(
            id="DiLoCoFleet-v0",
            entry_point="diloco_gym.envs.fleet:DiLoCoFleetEnv",
            disable_env_checker=False,
        )


register_envs()
