"""The environments a training run learns on, built in one place.

Seed discipline: a training episode always resets with an explicit episode seed drawn
from ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH) = [10**6, 2**30)``
(:mod:`diloco_gym.eval.seed_ranges`) by a generator seeded from the training seed
(``seed + env index``), so a training run never sees a held-out episode (seeds below
``10**6``: the report's, the frontier's and the validation seeds).

:func:`make_vec_env` is the one builder: env ``i`` is kind ``specs[i % len(specs)]``
(anything with ``make(env_params) -> gym.Env``: a
:class:`~diloco_gym.rl.config.EnvSpec` of a regime or trace and budget, or a fleet's
spec), wrapped by :func:`wrap_for_training` as
``Monitor(TrainSeedWrapper([BudgetFeatures](env)))``, and batched by SB3's ``DummyVecEnv``
or ``SubprocVecEnv``, or by the project's native batched vector env for a single regime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW
from diloco_gym.rl.algos import VEC_ENVS
from diloco_gym.rl.env_specs import EnvSpec

__all__ = [
    "TrainEnvKind",
    "TrainSeedWrapper",
    "regime_spec",
    "wrap_for_training",
    "make_vec_env",
    "make_train_vec_env",
    "make_train_env",
    "train_episode_seeds",
]


class TrainEnvKind(Protocol):
    """One kind of training env: builds a fresh, unwrapped env."""

    def make(self, env_params: dict[str, Any] | None = None) -> Any:
        """A fresh env of this kind with the ``EnvParams`` overrides ``env_params``."""
        ...


class TrainSeedWrapper(gym.Wrapper):
    """Reset the wrapped env only with episode seeds from the training range.

    ``reset(seed=s)`` re-seeds the wrapper's own generator with ``s``; every reset (seeded
    or not, e.g. a vector env's auto-reset) then draws the episode seed from
    ``[low, high)`` with that generator and resets the env with it. The seed passed to
    ``reset`` never reaches the env directly, so a training episode can never use a
    held-out seed.

    Args:
        env: the environment (a :class:`DiLoCoSyncEnv`, possibly wrapped).
        low: smallest training episode seed (default ``TRAIN_SEED_LOW``).
        high: one past the largest training episode seed (default ``TRAIN_SEED_HIGH``).
        seed: initial seed of the wrapper's generator (``None``: from OS entropy).
    """

    def __init__(
        self,
        env: gym.Env,
        low: int = TRAIN_SEED_LOW,
        high: int = TRAIN_SEED_HIGH,
        seed: int | None = None,
    ) -> None:
        super().__init__(env)
        if not 0 <= low < high:
            raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
        self.low = int(low)
        self.high = int(high)
        self._seed_rng = np.random.default_rng(seed)
        #: the episode seeds used so far (for audits and tests).
        self.episode_seeds: list[int] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        episode_seed = int(self._seed_rng.integers(self.low, self.high))
        self.episode_seeds.append(episode_seed)
        return self.env.reset(seed=episode_seed, options=options)


def regime_spec(regime: Any) -> EnvSpec:
    """The env kind of a plain run: ``regime`` as it is, no budget, its own sidecar."""
    label = regime if isinstance(regime, str) else str(getattr(regime, "name", regime))
    return EnvSpec(label, regime, None, None, None)


def wrap_for_training(env: gym.Env, seed: int, obs_transform: str | None = None) -> gym.Env:
    """``Monitor(TrainSeedWrapper(env))``, with the budget features between them when
    ``obs_transform`` is ``"budget"``.

    ``Monitor`` is outermost: it replaces the env's final ``info["episode_summary"]``
    replay summary with SB3's ``{"r", "l", "t"}`` episode statistics.
    """
    from stable_baselines3.common.monitor import Monitor

    from diloco_gym.rl.wrappers import BudgetFeatures

    if obs_transform == "budget":
        env = BudgetFeatures(env)
    return Monitor(TrainSeedWrapper(env, seed=seed))


def _train_seed_vector_env() -> type:
    """The native vector env with :class:`TrainSeedWrapper`'s seed rule (built lazily: the
    class derives from :class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv`)."""
    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    class TrainSeedVectorEnv(DiLoCoSyncVectorEnv):
        """Every episode seed of env ``i`` drawn from ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)``
        by a generator seeded with the seed ``reset`` gives env ``i``, exactly as a
        :class:`TrainSeedWrapper` does: a training episode can never use a held-out seed,
        and env ``i`` plays the episodes of the ``dummy`` / ``subproc`` kinds' env ``i``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._train_rngs: list[np.random.Generator] = [
                np.random.default_rng() for _ in range(self.num_envs)
            ]
            #: the episode seeds used so far (for audits and tests).
            self.train_episode_seeds: list[int] = []

        def _next_seed(self, i: int, seed: int | None) -> int:
            if seed is not None:
                self._train_rngs[i] = np.random.default_rng(seed)
            episode_seed = int(self._train_rngs[i].integers(TRAIN_SEED_LOW, TRAIN_SEED_HIGH))
            self.train_episode_seeds.append(episode_seed)
            return episode_seed

    return TrainSeedVectorEnv


def _native_vec_env(spec: Any, seed: int, n_envs: int, env_params: dict[str, Any]) -> Any:
    """SB3's view of the batched native vector env over one plain regime (one array
    operation steps the ``n_envs`` envs)."""
    from gymnasium.vector import AutoresetMode
    from stable_baselines3.common.vec_env import VecMonitor

    from diloco_gym.rl.sb3 import SB3VecEnv

    venv = _train_seed_vector_env()(
        n_envs, regime=spec.regime, autoreset_mode=AutoresetMode.SAME_STEP, **env_params
    )
    vec = VecMonitor(SB3VecEnv(venv))
    vec.seed(seed)
    return vec


def make_vec_env(
    kind: str,
    specs: Sequence[TrainEnvKind],
    seed: int,
    n_envs: int,
    env_params: dict[str, Any] | None = None,
    obs_transform: str | None = None,
) -> Any:
    """The SB3 vector env a run learns on.

    Args:
        kind: ``"dummy"`` (SB3's ``DummyVecEnv``: the envs one after another),
            ``"subproc"`` (SB3's ``SubprocVecEnv``: one spawned process per env) or
            ``"native"`` (:class:`~diloco_gym.rl.sb3.SB3VecEnv` over the batched native
            vector env in this process; one plain regime only: no budget, no transform).
        specs: the env kinds; env ``i`` is ``specs[i % len(specs)]``.
        seed: env ``i``'s episode-seed generator starts from ``seed + i`` (every kind), so
            every kind plays the same episodes.
        n_envs: environments.
        env_params: ``EnvParams`` overrides for every env (and ``learner_calibration``, a
            learner calibration file: :mod:`diloco_gym.rl.learner_config`).
        obs_transform: ``"budget"``: append the budget features (every kind needs a merge
            budget).

    Returns:
        The vector env, with episode statistics (``Monitor`` / ``VecMonitor``).

    Raises:
        ValueError: an unknown kind, no spec, or ``native`` asked for more than one plain
            regime.
    """
    params = dict(env_params or {})
    if kind not in VEC_ENVS:
        raise ValueError(f"unknown vec env {kind!r}; valid: {', '.join(VEC_ENVS)}")
    if not specs:
        raise ValueError("give at least one env kind")
    if kind == "native":
        plain = len(specs) == 1 and getattr(specs[0], "merge_budget", None) is None
        if not plain or obs_transform is not None or not hasattr(specs[0], "regime"):
            raise ValueError(f"vec env {kind!r} cannot run several env kinds; use dummy or subproc")
        return _native_vec_env(specs[0], seed, n_envs, params)

    def env_fn(i: int) -> Callable[[], gym.Env]:
        spec = specs[i % len(specs)]
        return lambda: wrap_for_training(spec.make(params), seed + i, obs_transform)

    fns = [env_fn(i) for i in range(n_envs)]
    if kind == "dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(fns)
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return SubprocVecEnv(fns, start_method="spawn")


def make_train_vec_env(
    kind: str, regime: Any, seed: int, n_envs: int, env_kwargs: dict[str, Any] | None = None
) -> Any:
    """:func:`make_vec_env` over one plain regime (``n_envs`` copies)."""
    return make_vec_env(kind, [regime_spec(regime)], seed, n_envs, env_kwargs)


def make_train_env(regime: Any, seed: int, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One training env of a plain regime: ``Monitor(TrainSeedWrapper(DiLoCoSyncEnv))``."""
    return wrap_for_training(regime_spec(regime).make(env_kwargs), seed)


def train_episode_seeds(vec_env: Any) -> list[int]:
    """The training episode seeds a vector env from :func:`make_vec_env` used."""
    inner = getattr(vec_env, "venv", None)
    native = getattr(inner, "venv", None)
    if native is not None and hasattr(native, "train_episode_seeds"):
        return list(native.train_episode_seeds)
    return [s for seeds in vec_env.get_attr("episode_seeds") for s in seeds]
