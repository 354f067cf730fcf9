"""Stable-Baselines3 ``VecEnv`` over the native vector env (no subprocesses)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env import VecEnv

from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

__all__ = ["SB3VecEnv"]


class SB3VecEnv(VecEnv):
    """Stable-Baselines3 ``VecEnv`` over a :class:`DiLoCoSyncVectorEnv` (no subprocesses).

    Args:
        venv: a native vector env with ``autoreset_mode=SAME_STEP`` (SB3's convention:
            the observation returned at a done is the next episode's first, and the last
            one is ``infos[i]["terminal_observation"]``). If omitted, one is built from
            ``num_envs`` and ``kwargs`` (the native env's arguments).

    ``env_method("action_masks")`` returns each env's ``[defer, merge]`` mask, so
    sb3-contrib's ``MaskablePPO`` works on it. Episodes end by truncation, flagged with
    ``infos[i]["TimeLimit.truncated"] = True``. Wrap it in ``VecMonitor`` for episode
    statistics. ``seed(s)`` gives env ``i`` the seed ``s + i`` at the next ``reset()``,
    the same contract as the native env.
    """

    def __init__(
        self, venv: DiLoCoSyncVectorEnv | None = None, num_envs: int = 1, **kwargs: Any
    ) -> None:
        if venv is None:
            venv = DiLoCoSyncVectorEnv(num_envs, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
        elif kwargs:
            raise TypeError("pass either a native vector env or its arguments, not both")
        if venv.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3VecEnv needs a DiLoCoSyncVectorEnv with autoreset_mode=AutoresetMode.SAME_STEP"
            )
        self.venv = venv
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self):
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        obs, info = self.venv.reset(seed=seeds)
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [{"episode_seed": int(s)} for s in info["episode_seed"]]
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions).reshape(self.num_envs)

    def step_wait(self):
        obs, rewards, terminated, truncated, info = self.venv.step(self._actions)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        done = terminated | truncated
        if done.any():
            final = info["final_obs"]
            for i in np.flatnonzero(done):
                infos[i]["terminal_observation"] = final[i]
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                infos[i]["episode_seed"] = int(info["episode_seed"][i])
        return obs, rewards.astype(np.float32), done, infos

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        value = getattr(self.venv, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        raise AttributeError("SB3VecEnv shares one native env: set attributes on .venv")

    def env_method(
        self, method_name: str, *method_args, indices=None, **method_kwargs
    ) -> list[Any]:
        if method_name == "action_masks":
            masks = self.venv.action_masks()
            return [masks[i] for i in self._get_indices(indices)]
        raise AttributeError(
            f"SB3VecEnv supports env_method('action_masks') only, not "
            f"{method_name!r}; call methods on .venv (the native env)"
        )

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self):
        raise NotImplementedError("SB3VecEnv does not render")
