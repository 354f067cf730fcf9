"""``gym.make_vec("DiLoCoFleet-v1", num_envs=K, vectorization_mode="vector_entry_point")``:
``K`` fleet envs stepped as one Gymnasium vector env (:func:`make_fleet_vector`).

Where the fleet allows it (the default fleet does), that is the compiled fleet vector env
(:class:`~diloco_gym.envs.fleet_native.DiLoCoFleetNativeVectorEnv`: one compiled call per
step, the native vector env's infos). Otherwise, or with ``native=False``, it is
:class:`DiLoCoFleetVectorEnv`: Gymnasium's :class:`~gymnasium.vector.SyncVectorEnv` over
``K`` :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv` made directly (no wrappers), with
the checks and views of the single vector env (:mod:`diloco_gym.envs.vector`): its
arguments are checked before any env is built, a bad action is a one-line ``ValueError``,
``reset(seed=s)`` gives env ``i`` the fleet env's ``reset(seed=s + i)`` (later autoresets
continue each env's own generator, as its ``reset()`` does), and ``action_masks()``
stacks the envs' masks. It is not a compiled batch: a step costs ``K`` fleet env steps,
and its infos are the fleet env's (per-site summaries included). Fleets with per-site
timing (``timing = "rounds"``) are refused by both.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from diloco_gym.envs.env import check_seed
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.vector import check_autoreset_mode, check_num_envs
from diloco_gym.sim.limits import check_limit

__all__ = ["DiLoCoFleetVectorEnv", "make_fleet_vector"]


def _num_envs(num_envs: Any) -> int:
    check_num_envs(num_envs)
    check_limit("ENVS", int(num_envs), "num_envs")
    return int(num_envs)


def _given(env: DiLoCoFleetEnv) -> DiLoCoFleetEnv:
    return env


class DiLoCoFleetVectorEnv(SyncVectorEnv):
    """``num_envs`` :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv` (``DiLoCoFleet-v1``)
    stepped together.

    ## Spaces

    ``single_observation_space`` / ``single_action_space``: the fleet env's;
    ``observation_space`` / ``action_space``: their batches of ``num_envs``
    (``MultiDiscrete([2] * num_envs)`` for the default ``Discrete(2)``).
    ``action_masks()``: ``(num_envs, width)`` bool, each row the fleet env's
    ``action_masks()``.

    ## Seeding and autoreset

    ``reset(seed=s)`` starts env ``i`` on the fleet env's episode of ``reset(seed=s + i)``;
    ``seed`` may also be a sequence of ``num_envs`` ints or ``None`` entries. Autoreset is
    Gymnasium's ``NEXT_STEP`` by default (the step after an episode's last returns the next
    episode's first observation, reward 0, flags False; that env's action is ignored) or
    ``SAME_STEP``; an autoreset is the fleet env's ``reset()``, which draws the next episode
    seed from the env's generator: env ``i`` of a vector env seeded ``s`` runs exactly the
    episodes, observations and rewards of a fleet env reset with seed ``s + i`` and then
    reset without a seed after each episode (tested).

    ## Info

    Gymnasium's vector infos: each key of the fleet env's info as an array over envs with
    its ``_key`` mask (``reward_terms`` and ``episode_summary`` as nested dicts).

    ## Arguments

    ``num_envs``, ``autoreset_mode``; every other keyword goes to
    :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv` (``fleet``, ``params``, ``learners``,
    ``FleetParams`` and ``EnvParams`` fields). ``gym.make_vec("DiLoCoFleet-v1", ...)``
    passes the id's ``model_version=1``, as ``gym.make`` does; made directly, the class
    takes ``DiLoCoFleetEnv``'s defaults (model v0 unless the fleet selects v1). A fleet
    with ``timing = "rounds"`` is refused (``ValueError``): step ``DiLoCoFleet-v1`` envs of
    such a fleet with ``gym.make_vec(..., vectorization_mode="sync")``.
    """

    def __init__(
        self,
        num_envs: int = 1,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        **kwargs: Any,
    ) -> None:
        n = _num_envs(num_envs)
        mode = check_autoreset_mode(autoreset_mode)
        from diloco_gym.envs.fleet_rounds import fleet_timing

        if fleet_timing(kwargs.get("fleet"), kwargs.get("timing")) == "rounds":
            raise ValueError(
                "DiLoCoFleetVectorEnv does not support fleets with timing = 'rounds' (per-site "
                "timing); use gym.make_vec('DiLoCoFleet-v1', ..., vectorization_mode='sync')"
            )
        envs = [DiLoCoFleetEnv(**kwargs) for _ in range(n)]
        super().__init__([partial(_given, e) for e in envs], copy=True, autoreset_mode=mode)
        self.fleet_envs: list[DiLoCoFleetEnv] = envs  #: the fleet envs, in order

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Start an episode in every env (``options["reset_mask"]``: only in those envs, as
        Gymnasium's ``SyncVectorEnv``; other options go to each fleet env's ``reset``)."""
        seeds: list[int | None]
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [check_seed(int(seed) + i, "seed (+ env index)") for i in range(self.num_envs)]
        elif isinstance(seed, Sequence) and not isinstance(seed, str):
            if len(seed) != self.num_envs:
                raise ValueError(
                    f"seed: a sequence of {len(seed)} seeds for {self.num_envs} envs; give one "
                    f"per env (an int or None each)"
                )
            seeds = [None if s is None else check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
        else:
            raise ValueError(
                f"seed must be None, an int or a sequence of num_envs ints or None, got "
                f"{type(seed).__name__} {seed!r:.60}"
            )
        return super().reset(seed=seeds, options=options)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (an env whose episode ended restarts instead: see the class)."""
        a = np.asarray(actions) if not isinstance(actions, np.ndarray) else actions
        if a.dtype.kind not in "iu" or not self.action_space.contains(a):
            shape = getattr(a, "shape", None)
            raise ValueError(
                f"actions {actions!r:.80} (shape {shape}) are not in the action space "
                f"{self.action_space}: one action of {self.single_action_space} per env"
            )
        return super().step(a)

    def _add_info(
        self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
    ) -> dict[str, Any]:
        """Gymnasium's ``VectorEnv._add_info`` (the same arrays, dtypes and ``_key`` masks),
        without its per-key allocations: a key's array and mask are made once per step (its
        first env), then written in place. ``final_obs`` goes to Gymnasium's."""
        n = self.num_envs
        for key, value in env_info.items():
            if key == "final_obs":
                super()._add_info(vector_infos, {key: value}, env_num)
                continue
            if isinstance(value, dict):  # its own infos, under its key, and its mask
                sub = vector_infos.get(key)
                if sub is None:
                    sub = vector_infos[key] = {}
                    vector_infos["_" + key] = np.zeros(n, dtype=np.bool_)
                self._add_info(sub, value, env_num)
                vector_infos["_" + key][env_num] = True
                continue
            array = vector_infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(n, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((n, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(n, fill_value=None, dtype=object)
                vector_infos[key] = array
                vector_infos["_" + key] = np.zeros(n, dtype=np.bool_)
            array[env_num] = value
            vector_infos["_" + key][env_num] = True
        return vector_infos

    def action_masks(self) -> np.ndarray:
        """Each env's ``action_masks()``, ``(num_envs, width)`` bool."""
        return np.stack([env.action_masks() for env in self.fleet_envs])


def make_fleet_vector(
    num_envs: int = 1,
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    native: bool | None = None,
    **kwargs: Any,
) -> Any:
    """The vector env of ``DiLoCoFleet-v1``'s ``vector_entry_point``: the compiled
    :class:`~diloco_gym.envs.fleet_native.DiLoCoFleetNativeVectorEnv` where the fleet
    allows it (:func:`~diloco_gym.envs.fleet_native.native_refusal`), else
    :class:`DiLoCoFleetVectorEnv`. ``native=True``: the compiled env or a ``ValueError``
    saying why not; ``native=False``: :class:`DiLoCoFleetVectorEnv` (the fleet env's
    infos). Other keywords: as the fleet env's."""
    from diloco_gym.envs.fleet_native import (
        DiLoCoFleetNativeVectorEnv,
        native_refusal,
        refuse_vector_extras,
    )
    from diloco_gym.envs.fleet_rounds import fleet_timing

    if native not in (None, True, False):
        raise ValueError(f"native must be None, True or False, got {native!r}")
    _num_envs(num_envs)
    check_autoreset_mode(autoreset_mode)
    refuse_vector_extras(kwargs)
    if native is False or fleet_timing(kwargs.get("fleet"), kwargs.get("timing")) == "rounds":
        if native:
            raise ValueError(
                "native=True: the compiled fleet vector env does not run fleets with timing = "
                "'rounds' (per-site timing); use gym.make_vec('DiLoCoFleet-v1', ..., "
                "vectorization_mode='sync')"
            )
        return DiLoCoFleetVectorEnv(num_envs, autoreset_mode, **kwargs)
    template = DiLoCoFleetEnv(**kwargs)
    why = native_refusal(template)
    if kwargs.get("render_mode") is not None:
        why = "it does not render (render_mode is set)"
    if why is None:
        return DiLoCoFleetNativeVectorEnv(num_envs, autoreset_mode, _template=template)
    if native:
        raise ValueError(
            f"native=True: the compiled fleet vector env does not run this fleet: {why}"
        )
    return DiLoCoFleetVectorEnv(num_envs, autoreset_mode, **kwargs)
