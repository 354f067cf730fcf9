"""diloco-gym: when is it safe to run a DiLoCo outer merge on a shared serving host?

Importing the package registers the Gymnasium ids ``DiLoCoSync-v2`` (bursty by default,
any regime through ``regime=``) and one id per regime, e.g. ``DiLoCoSync-Bursty-v2``; the
``-v0`` and ``-v1`` ids stay for one release and warn (``diloco_gym.envs.versions`` says
what each version changed), and the fleet ids ``DiLoCoFleet-v1`` (and the deprecated
``DiLoCoFleet-v0``, docs/fleet.md).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.observation import OBS_FEATURES
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.versions import V1_KWARGS, V2_KWARGS
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
    "ENV_IDS_V0",
    "ENV_IDS_V1",
    "V1_KWARGS",
    "V2_KWARGS",
    "register_envs",
    "evaluate",
    "Evaluation",
]


def _id_for(regime: str, version: int = 2) -> str:
    return "DiLoCoSync-" + "".join(part.capitalize() for part in regime.split("-")) + f"-v{version}"


#: Registered id for each regime, current version (plus the generic ``DiLoCoSync-v2``).
ENV_IDS: dict[str, str] = {name: _id_for(name) for name in REGIMES}
#: The deprecated ``-v1`` ids (kept for one release; making one warns).
ENV_IDS_V1: dict[str, str] = {name: _id_for(name, 1) for name in REGIMES}
#: The deprecated ``-v0`` ids (kept for one release; making one warns).
ENV_IDS_V0: dict[str, str] = {name: _id_for(name, 0) for name in REGIMES}


def register_envs() -> None:
    """Register the environment ids with Gymnasium (idempotent; runs on import)."""
    import gymnasium as gym

    entries: dict[str, tuple[str, dict[str, Any]]] = {
        "DiLoCoSync-v2": ("env:DiLoCoSyncEnv", dict(V2_KWARGS)),
        "DiLoCoSync-v1": ("versions:make_v1", dict(V1_KWARGS)),
        "DiLoCoSync-v0": ("versions:make_v0", {}),
    }
    for name in REGIMES:
        entries[ENV_IDS[name]] = ("env:DiLoCoSyncEnv", {"regime": name, **V2_KWARGS})
        entries[ENV_IDS_V1[name]] = ("versions:make_v1", {"regime": name, **V1_KWARGS})
        entries[ENV_IDS_V0[name]] = ("versions:make_v0", {"regime": name})
    for env_id, (entry, kwargs) in entries.items():
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=f"diloco_gym.envs.{entry}",
            vector_entry_point="diloco_gym.envs.vector:DiLoCoSyncVectorEnv",
            kwargs=kwargs,
            # gym.make returns the env itself, so that env.action_masks() (MaskablePPO's
            # protocol) needs no get_wrapper_attr: the env enforces reset-before-step
            # itself, and the test suite runs Gymnasium's and SB3's env checkers on it.
            # gym.make(id, disable_env_checker=False) adds the passive checker back.
            order_enforce=False,
            disable_env_checker=True,
        )
    # The fleet: -v1 is the fleet model v1; the deprecated -v0 (kept for one release, it
    # warns) the model v0. The id fixes the model: it overrides a fleet file's model_version.
    if "DiLoCoFleet-v1" not in gym.registry:
        gym.register(
            id="DiLoCoFleet-v1",
            entry_point="diloco_gym.envs.fleet_rounds:make_fleet_env",
            # gym.make_vec(..., vectorization_mode="vector_entry_point"): K fleets in one
            # vector env, compiled where the fleet allows (envs/fleet_vector.py; fleets with
            # timing = "rounds" refused)
            vector_entry_point="diloco_gym.envs.fleet_vector:make_fleet_vector",
            kwargs={"model_version": 1},
            disable_env_checker=False,
        )
    if "DiLoCoFleet-v0" not in gym.registry:
        gym.register(
            id="DiLoCoFleet-v0",
            entry_point="diloco_gym.envs.versions:make_fleet_v0",
            kwargs={"model_version": 0},
            disable_env_checker=False,
        )


register_envs()
