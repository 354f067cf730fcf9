"""A native vector environment: many merge-scheduling episodes stepped together in numpy.

:class:`DiLoCoSyncVectorEnv` runs ``num_envs`` copies of
:class:`~diloco_gym.envs.env.DiLoCoSyncEnv` over a batch axis. The dynamics are not
re-implemented: episodes come from :func:`diloco_gym.envs.core.episode_from_seed`,
feasibility from :func:`diloco_gym.envs.core.options`,
learner features from :func:`diloco_gym.envs.core.learner_features_k` and merges from
:func:`diloco_gym.sim.learners.merge_gain`, the functions the single env calls, applied to arrays.
``tests/envs/test_vector.py`` checks that env ``i`` reproduces the single env step for step.

:class:`diloco_gym.rl.sb3.SB3VecEnv` adapts it to Stable-Baselines3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from diloco_gym.envs import core
from diloco_gym.envs.core import (
    EXO_SLICE,
    LEARNER_SLICE,
    OBS_DIM,
    OBS_HIGH,
    OBS_INDEX,
    OBS_LOW,
    EnvParams,
)
from diloco_gym.envs.env import make_generator
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.regimes import SyntheticRegime
from diloco_gym.sim.sidecar import (
    CostQueue,
    SidecarParams,
    cost_horizon,
    cost_queue,
    isolated_merge_costs,
    merge_costs,
)

__all__ = ["DiLoCoSyncVectorEnv"]

_G = OBS_INDEX
_ENV_FIELDS = {f.name for f in fields(EnvParams)}
_SEED_HIGH = 2**31 - 1  # the single env draws episode seeds with integers(0, 2**31 - 1)


class DiLoCoSyncVectorEnv(gym.vector.VectorEnv[np.ndarray, np.ndarray, np.ndarray]):
    """``num_envs`` DiLoCo merge-scheduling episodes stepped together (numpy, one process).

    ## Description

    The same environment as :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` (see its docstring for
    the problem, observation features and reward), vectorised over a leading batch axis.
    ``gym.make_vec("DiLoCoSync-v0", num_envs=1024, vectorization_mode="vector_entry_point")``
    builds one; every registered regime id works the same way.

    ## Spaces

    ``single_observation_space``: ``Box(17,)`` float32, ``observation_space``: its batch
    ``Box((num_envs, 17))``. ``single_action_space``: ``Discrete(2)`` (0 defer, 1 merge),
    ``action_space``: ``MultiDiscrete([2] * num_envs)``. ``action_masks()`` gives the
    feasible actions of every env, ``(num_envs, 2)`` bool ``[defer, merge]``.

    ## Seeding

    ``reset(seed=s)`` gives env ``i`` exactly the episode of the single env's
    ``reset(seed=s + i)``, and each later autoreset of env ``i`` the episode of the single
    env's next ``reset()`` without a seed: env ``i`` owns a generator seeded like the single
    env's ``np_random`` (``gymnasium.utils.seeding.np_random(s + i)``) and draws its next
    episode seed from it. So a run is deterministic given ``s``, and any vector episode can be
    rebuilt with the single env from ``episode_seeds``. ``seed`` may also be a sequence of
    ``num_envs`` ints (or ``None`` entries). ``reset()`` without a seed continues each env's
    generator (a fresh entropy seed on the very first reset).

    ## Autoreset

    ``autoreset_mode`` is :attr:`AutoresetMode.NEXT_STEP` by default (Gymnasium's default and
    the mode of its ``CartPoleVectorEnv``): the step that ends an episode returns its last
    observation with ``truncated=True``; the next ``step`` ignores that env's action, starts
    its next episode and returns the first observation with reward 0 and both flags False.
    :attr:`AutoresetMode.SAME_STEP` resets in the ending step instead: the returned
    observation is the new episode's first, and the last one is in ``info["final_obs"]``
    (an object array, with mask ``info["_final_obs"]``);
    :class:`~diloco_gym.rl.sb3.SB3VecEnv` uses this mode.
    Episodes are never terminated, only truncated (as in the single env).

    ## Episode pool (opt-in)

    Building an episode (trace generation, features, no-merge queue) costs about as much
    as a few hundred vector steps, and with many envs several episodes end every step. With
    ``episode_pool=K`` the env builds ``K`` episodes once per seed - the single env's
    episodes of seeds ``s, s + 1, ..., s + K - 1`` - and reuses them round-robin: env ``i``
    starts on pool episode ``i % K`` (so with ``K >= num_envs`` the first episodes equal the
    fresh ones) and each autoreset takes the next pool episode. Episodes therefore repeat
    (every ``K`` resets); the agent-dependent state always restarts fresh. Throughput with
    and without a pool is reported separately in ``benchmarks/README.md``. A pool needs
    ``seed`` to be ``None``, an int, or the consecutive sequence ``s, s + 1, ...``.

    ## Fresh episodes

    Without a pool, every autoreset builds a fresh episode from its seed (about 1 ms; with
    1,024 envs and 517-decision episodes two envs restart per step on average). The envs
    restarting in a step are built together (:func:`build_rows`, bit-identical per episode),
    and a merge is costed only when launched: a fresh env keeps its no-merge queue and
    requests (~180 KB per env at 600 s episodes).

    ## Info

    Each ``step``'s info holds ``merged``, ``action_overridden`` and the reward terms
    ``sync_excess`` and ``progress`` (arrays over envs, with Gymnasium's ``_key`` masks); when
    episodes end, ``info["episode_end"]`` holds their ``merges``, additive ``sync_excess_pct``,
    ``progress`` and ``seed`` (not ``"episode"``, which Gymnasium's ``RecordEpisodeStatistics``
    writes); ``episode_seed`` marks the envs that started an episode. The
    exact replay summary of the single env's final info is not computed here (it costs a
    replay per episode): rebuild the episode with the single env from its seed when needed.

    ## Arguments

    ``num_envs``; ``regime``, ``params``, ``sidecar``, ``learners`` and ``EnvParams`` field
    keywords exactly as :class:`~diloco_gym.envs.env.DiLoCoSyncEnv`; ``episode_pool`` (``None`` or
    ``K >= 1``); ``autoreset_mode`` (``NEXT_STEP`` or ``SAME_STEP``). No rendering: render
    one episode with the single env.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        regime: Any = "bursty",
        params: EnvParams | None = None,
        sidecar: SidecarParams | None = None,
        learners: lrn.LearnerParams | None = None,
        episode_pool: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        if (
            not isinstance(num_envs, (int, np.integer))
            or isinstance(num_envs, bool)
            or num_envs < 1
        ):
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        unknown = set(overrides) - _ENV_FIELDS
        if unknown:
            raise TypeError(
                f"unknown DiLoCoSyncVectorEnv argument(s) {sorted(unknown)}; valid "
                f"EnvParams fields: {sorted(_ENV_FIELDS)}"
            )
        if episode_pool is not None and (
            not isinstance(episode_pool, (int, np.integer))
            or isinstance(episode_pool, bool)
            or episode_pool < 1
        ):
            raise ValueError(f"episode_pool must be None or an int >= 1, got {episode_pool!r}")
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            mode = None
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(
                f"autoreset_mode must be AutoresetMode.NEXT_STEP or SAME_STEP, got "
                f"{autoreset_mode!r}"
            )
        if render_mode is not None:
            raise ValueError(
                "DiLoCoSyncVectorEnv does not render; render one episode with DiLoCoSyncEnv"
            )
        self.params = replace(params or EnvParams(), **overrides)
        self.generator, default_sidecar, self.regime_name = make_generator(regime)
        # The single env's reward scale (core.nominal_rate_rps), fixed for every episode.
        self.reward_rate_rps = core.nominal_rate_rps(self.generator, self.params)
        self.sidecar = sidecar or default_sidecar
        self.learner_params = learners or lrn.LearnerParams()
        self.episode_pool = None if episode_pool is None else int(episode_pool)
        self.autoreset_mode = mode
        self.metadata = dict(type(self).metadata, autoreset_mode=mode)
        self.render_mode = None

        self.num_envs = b = int(num_envs)
        self.single_observation_space = gym.spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, b)
        self.action_space = batch_space(self.single_action_space, b)

        # Agent-dependent state, one entry per env (the single env's attributes).
        self._d = np.zeros(b, dtype=np.int64)
        self._last = np.zeros(b, dtype=np.int64)
        self._m_left = np.zeros(b, dtype=np.int64)
        self._n_merges = np.zeros(b, dtype=np.int64)
        self._tokens = np.zeros(b)
        self._excess_sum = np.zeros(b)
        self._progress_sum = np.zeros(b)
        # Reward terms of merges forced before the first real choice, paid on the next step.
        self._pend_excess = np.zeros(b)
        self._pend_progress = np.zeros(b)
        self._autoreset = np.zeros(b, dtype=bool)
        self._all = np.ones(b, dtype=bool)
        self._obs = np.zeros((b, OBS_DIM), dtype=np.float32)
        # Episode bank: the agent-independent arrays of the episodes in use. Fresh episodes
        # live in slot i of env i; a pool holds K episodes and envs point into it.
        self._slot = np.arange(b, dtype=np.int64)
        # Per-env copies of each episode's scalars (set at every (re)start: no gathers).
        self._n = np.ones(b, dtype=np.int64)
        self._pct = np.zeros(b)
        self._scale = np.zeros(b)  # reward units per violating request (Episode's)
        self._max_merges = np.ones(b)
        self._thr = np.zeros((b, self.learner_params.num_learners))
        self._thr_k = np.zeros((self.learner_params.num_learners, b))  # learners first
        self._seed = np.zeros(b, dtype=np.int64)
        n_bank = self.episode_pool or b
        self._bank_n = np.zeros(n_bank, dtype=np.int64)
        self._bank_exo = np.zeros((n_bank, 0, EXO_SLICE.stop - EXO_SLICE.start), dtype=np.float32)
        # What costing a merge lazily needs, per bank slot: a row of a sidecar.CostQueue
        # (S, D, ptr, the requests' bins and service times, m0 per decision) and the
        # prefix minimum of S at decision starts.
        self._merge_bins = self.params.merge_steps
        self._horizon = cost_horizon(self.sidecar, self.params.step_seconds, self._merge_bins)
        self._spec = _BuildSpec(
            self.generator,
            self.params,
            self.sidecar,
            self.learner_params,
            self._horizon,
            self.reward_rate_rps,
        )
        self._bank_s = np.zeros((n_bank, 0))
        self._bank_d = np.zeros((n_bank, 0))
        self._bank_ptr = np.zeros((n_bank, 0), dtype=np.int32)
        self._bank_prefmin = np.zeros((n_bank, 0))
        self._bank_m0 = np.zeros((n_bank, 0))
        self._bank_base = np.zeros((n_bank, 0))
        self._bank_rbin = np.zeros((n_bank, 0), dtype=np.int32)
        self._bank_cost = np.zeros((n_bank, 0))  # episode pool: every decision's cost
        self._bank_pct = np.zeros(n_bank)
        self._bank_scale = np.zeros(n_bank)
        self._bank_max_merges = np.ones(n_bank)
        self._bank_thr = np.zeros((n_bank, self.learner_params.num_learners))
        self._bank_seed = np.zeros(n_bank, dtype=np.int64)
        self._env_rngs: list[np.random.Generator | None] = [None] * b
        self._pool_base: int | None = None
        self._pool_next = 0
        self._gaps_s = np.arange(self.params.h_max + 1) * self.params.decision_seconds
        self._budget_cache: dict[int, core.BudgetTables] = {}
        self._next_cache: dict[int, np.ndarray] = {}
        self._started = False

    # ----------------------------------------------------------------- public views
    @property
    def episode_seeds(self) -> np.ndarray:
        """Seed of each env's current episode (rebuild it with ``DiLoCoSyncEnv.reset``)."""
        return self._seed.copy()

    @property
    def decisions(self) -> np.ndarray:
        """Index of each env's current decision."""
        return self._d.copy()

    @property
    def merge_counts(self) -> np.ndarray:
        """Merges launched so far in each env's episode."""
        return self._n_merges.copy()

    def action_masks(self) -> np.ndarray:
        """Feasible actions of every env, ``(num_envs, 2)`` bool ``[defer, merge]``.

        An env whose episode has ended (it restarts on the next step) allows both.
        """
        self._require_started()
        out = np.ones((self.num_envs, 2), dtype=bool)
        live = np.flatnonzero(self._d < self._n)
        if live.size:
            can_merge, can_defer = self._options(live)
            out[live, 0] = can_defer
            out[live, 1] = can_merge
        return out

    # ----------------------------------------------------------------- gym API
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode in every env (``options`` is accepted and ignored)."""
        b = self.num_envs
        seeds = self._seed_list(seed)
        if seed is not None:
            first = next((s for s in seeds if s is not None), None)
            self._np_random, self._np_random_seed = seeding.np_random(first)
        if self.episode_pool is None:
            self._slot = np.arange(b, dtype=np.int64)
            self._build_fresh(self._slot, [self._next_seed(i, seeds[i]) for i in range(b)])
        else:
            self._reset_pool(seed, seeds)
        self._start(np.arange(b))
        self._autoreset[:] = False
        self._started = True
        self._observe()
        info = {"episode_seed": self.episode_seeds, "_episode_seed": self._all.copy()}
        return self._obs.copy(), info

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env once; see the class docstring for autoreset and info."""
        self._require_started()
        b = self.num_envs
        a = np.asarray(actions)
        if a.shape != (b,):
            raise ValueError(f"actions must have shape ({b},), got {a.shape}")
        if a.dtype.kind in "iu":
            valid = a.min() >= 0 and a.max() <= 1
        else:
            valid = a.dtype.kind == "b" or bool(np.all((a == 0) | (a == 1)))
        if not valid:
            bad = a[(a != 0) & (a != 1)][0]
            raise ValueError(f"actions must be 0 (defer) or 1 (merge), got {bad!r}")
        want = a == 1
        p = self.params
        pending = self._autoreset.copy()  # NEXT_STEP: these envs restart instead of stepping
        restart = np.flatnonzero(pending)
        active = ~pending if restart.size else self._all.copy()

        can_merge, can_defer = self._options(None)
        merge = (want & can_merge) | ~can_defer
        if restart.size:
            merge &= active
        overridden = (merge != want) & active
        excess = np.zeros(b)
        progress = np.zeros(b)
        idx = np.flatnonzero(merge)
        if idx.size:
            excess[idx], progress[idx] = self._apply(idx)
        excess += self._pend_excess * active
        progress += self._pend_progress * active
        self._pend_excess[active] = 0.0
        self._pend_progress[active] = 0.0
        self._d += active
        if p.skip_forced:
            live = np.flatnonzero(active) if restart.size else None
            ex2, pr2 = self._advance_forced(live)
            excess += ex2
            progress += pr2
        rewards = -p.excess_weight * excess + p.progress_weight * progress
        truncated = self._d >= self._n
        if restart.size:
            truncated &= active
            rewards[restart] = 0.0
        terminated = np.zeros(b, dtype=bool)

        info: dict[str, Any] = {
            "merged": merge,
            "_merged": active,
            "action_overridden": overridden,
            "_action_overridden": active,
            "sync_excess": -excess,
            "_sync_excess": active,
            "progress": progress,
            "_progress": active,
        }
        ended = np.flatnonzero(truncated)
        if ended.size:
            info["episode_end"] = {
                "merges": self._n_merges.copy(),
                "_merges": truncated,
                "sync_excess_pct": self._excess_sum.copy(),
                "_sync_excess_pct": truncated,
                "progress": self._progress_sum.copy(),
                "_progress": truncated,
                "seed": self.episode_seeds,
                "_seed": truncated,
            }
            info["_episode_end"] = truncated

        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            if restart.size:
                self._restart(restart)
                info["episode_seed"] = self.episode_seeds
                info["_episode_seed"] = pending.copy()
            self._autoreset = truncated.copy()
            self._observe()
        else:  # SAME_STEP
            self._observe()
            if ended.size:
                final = np.full(b, None, dtype=object)
                for i in ended:
                    final[i] = self._obs[i].copy()
                info["final_obs"] = final
                info["_final_obs"] = truncated
                self._restart(ended)
                self._observe()
                info["episode_seed"] = self.episode_seeds
                info["_episode_seed"] = truncated
        return self._obs.copy(), rewards, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release (no subprocesses)."""

    # ----------------------------------------------------------------- episodes
    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("call reset() before using the environment")

    def _seed_list(self, seed) -> list[int | None]:
        b = self.num_envs
        if seed is None:
            return [None] * b
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(b)]
        if (
            isinstance(seed, Sequence)
            and len(seed) == b
            and all(
                s is None or (isinstance(s, (int, np.integer)) and not isinstance(s, bool))
                for s in seed
            )
        ):
            return [None if s is None else int(s) for s in seed]
        raise ValueError(f"seed must be None, an int, or a sequence of {b} ints/None, got {seed!r}")

    def _next_seed(self, i: int, seed: int | None) -> int:
        """Env ``i``'s next episode seed, exactly as the single env's ``reset`` picks it."""
        if seed is not None:
            self._env_rngs[i] = seeding.np_random(seed)[0]
            return int(seed)
        rng = self._env_rngs[i]
        if rng is None:
            rng = self._env_rngs[i] = seeding.np_random()[0]
        return int(rng.integers(0, _SEED_HIGH))

    def _pool_episode(self, seed: int) -> dict[str, Any]:
        """The bank row of a pool episode: the single env's episode of ``seed`` (same draws,
        same arithmetic) with the cost of every decision computed up front, as
        ``Episode.merge_cost`` (a pool episode is reused many times)."""
        arrivals, prompt, output, net, ckpt, duration, name, thr = _draws(self._spec, seed)
        p, sc = self.params, self.sidecar
        c = core.episode_core(arrivals, prompt, output, net, ckpt, duration, p, sc, name)
        starts = np.arange(c.n, dtype=np.int64) * p.decision_interval
        cost = merge_costs(
            c.base_s,
            c.req_bin,
            c.pressure_bin,
            sc,
            p.step_seconds,
            starts,
            p.merge_steps,
            c.violated.astype(np.float64),
        )
        return {
            "n": c.n,
            "exo": c.exo,
            "seed": seed,
            "thr": thr,
            "pct": 100.0 / max(1, c.req_bin.size),
            "cost": cost,
            "scale": core.reward_per_request(self.reward_rate_rps, duration),
        }

    def _build_fresh(self, slots: np.ndarray, seeds: list[int]) -> None:
        """Build the fresh episodes of ``seeds`` into bank ``slots`` (:func:`build_rows`)."""
        done = 0
        for rows in build_rows(self._spec, seeds):
            k = rows["counts"].size
            self._write_rows(slots[done : done + k], rows)
            done += k

    def _write_rows(self, slots: np.ndarray, rows: dict[str, Any]) -> None:
        """Copy the episodes of ``rows`` into bank ``slots``."""
        q: CostQueue = rows["queue"]
        n, size, n_slots = rows["n"], q.s.shape[1], q.m0.shape[1]
        self._grow("_bank_exo", n)[slots, :n] = rows["exo"]
        for key in ("s", "d", "ptr"):
            self._grow("_bank_" + key, size)[slots, :size] = getattr(q, key)
        self._grow("_bank_prefmin", n)[slots, :n] = rows["prefmin"]
        self._grow("_bank_m0", n_slots)[slots, :n_slots] = q.m0
        width = q.base.shape[1]
        self._grow("_bank_base", width, 0.25)[slots, :width] = q.base
        self._grow("_bank_rbin", width, 0.25)[slots, :width] = q.rbin
        self._set_scalars(slots, n, rows["pct"], rows["thr"], rows["seeds"], rows["scale"])

    def _grow(self, name: str, width: int, headroom: float = 0.0) -> np.ndarray:
        """Bank array ``name`` with at least ``width`` columns (kept contents), allocated
        ``headroom`` wider than needed: request counts vary between episodes, and a bank
        that grew by a few columns at every new longest episode would reallocate (and its
        resident memory creep up) for as long as the env runs."""
        arr = getattr(self, name)
        if width > arr.shape[1]:
            width = max(width, int(width * (1.0 + headroom)), int(arr.shape[1] * 1.25))
            new = np.zeros((arr.shape[0], width) + arr.shape[2:], dtype=arr.dtype)
            new[:, : arr.shape[1]] = arr
            setattr(self, name, new)
            arr = new
        return arr

    def _store(self, slot: int, ep: dict[str, Any]) -> None:
        """Copy a pool episode's arrays into bank ``slot`` (growing the bank if needed)."""
        n = ep["n"]
        self._grow("_bank_exo", n)[slot, :n] = ep["exo"]
        self._grow("_bank_cost", n)[slot, :n] = ep["cost"]
        self._set_scalars(slot, n, ep["pct"], ep["thr"], ep["seed"], ep["scale"])

    def _set_scalars(self, slots, n: int, pct, thr, seeds, scale) -> None:
        """The per-episode scalars of bank ``slots`` (episodes of ``n`` decisions)."""
        self._bank_n[slots] = n
        self._bank_pct[slots] = pct
        self._bank_scale[slots] = scale
        self._bank_max_merges[slots] = max(1.0, n / self.params.h_min)
        self._bank_thr[slots] = thr
        self._bank_seed[slots] = seeds
        if self.params.merge_budget is not None:
            self._budget_for(n)  # an infeasible budget fails here, as in the single env

    def _merge_costs(self, idx: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Isolated cost of a merge at decision ``d[k]`` of env ``idx[k]``
        (:func:`sidecar.isolated_merge_costs` on the bank's rows)."""
        p = self.params
        slot = self._slot[idx]
        q = CostQueue(
            self._bank_s,
            self._bank_d,
            self._bank_ptr,
            self._bank_rbin,
            self._bank_base,
            self._bank_m0,
            p.decision_interval,
        )
        return isolated_merge_costs(
            q,
            slot,
            d * p.decision_interval,
            self._bank_prefmin[slot, d],
            p.merge_steps,
            self.sidecar,
            p.step_seconds,
        )

    def _reset_pool(self, seed, seeds: list[int | None]) -> None:
        k = self.episode_pool
        assert k is not None  # called only with an episode pool
        if seed is None:
            base = self._pool_base
            if base is None:
                base = int(seeding.np_random()[0].integers(0, _SEED_HIGH))
        else:
            base = seeds[0]
            if base is None or seeds != [base + i for i in range(self.num_envs)]:
                raise ValueError(
                    "with episode_pool, seed must be None, an int, or the "
                    "consecutive sequence s, s + 1, ..."
                )
        if base != self._pool_base:
            for j in range(k):
                self._store(j, self._pool_episode(base + j))
            self._pool_base = base
            self._pool_next = 0
        if seed is not None:
            self._pool_next = 0
        b = self.num_envs
        self._slot = (self._pool_next + np.arange(b, dtype=np.int64)) % k
        self._pool_next = (self._pool_next + b) % k

    def _restart(self, idx: np.ndarray) -> None:
        """Autoreset: the next episode of each env in ``idx`` (in index order)."""
        if self.episode_pool is None:
            self._build_fresh(self._slot[idx], [self._next_seed(int(i), None) for i in idx])
        else:
            k = self.episode_pool
            self._slot[idx] = (self._pool_next + np.arange(idx.size)) % k
            self._pool_next = int((self._pool_next + idx.size) % k)
        self._start(idx)

    def _start(self, idx: np.ndarray) -> None:
        """The single env's reset of the agent-dependent state, for envs ``idx``."""
        p = self.params
        slot = self._slot[idx]
        self._n[idx] = self._bank_n[slot]
        self._pct[idx] = self._bank_pct[slot]
        self._scale[idx] = self._bank_scale[slot]
        self._max_merges[idx] = self._bank_max_merges[slot]
        self._thr[idx] = self._bank_thr[slot]
        self._thr_k[:, idx] = self._bank_thr[slot].T
        self._seed[idx] = self._bank_seed[slot]
        self._d[idx] = 0
        self._last[idx] = 0
        self._n_merges[idx] = 0
        self._tokens[idx] = float(self.learner_params.initial_tokens)
        self._m_left[idx] = p.merge_budget if p.merge_budget is not None else 0
        self._excess_sum[idx] = 0.0
        self._progress_sum[idx] = 0.0
        self._autoreset[idx] = False
        self._pend_excess[idx] = 0.0
        self._pend_progress[idx] = 0.0
        if p.skip_forced:
            # As the single env, merges forced before the first real choice are applied now
            # and rewarded on the next step (with no budget there are none).
            ex, pr = self._advance_forced(np.asarray(idx))
            self._pend_excess[idx] = ex[idx]
            self._pend_progress[idx] = pr[idx]
            if np.any(self._d[idx] >= self._n[idx]):
                raise ValueError(
                    f"merge_budget={p.merge_budget} leaves the agent no decision "
                    f"in this episode (every merge is forced)"
                )

    # ----------------------------------------------------------------- dynamics
    def _budget_for(self, n: int) -> core.BudgetTables:
        if n not in self._budget_cache:
            p = self.params
            assert p.merge_budget is not None  # called only with a merge budget
            self._budget_cache[n] = core.BudgetTables(n, p.h_min, p.h_max, p.merge_budget)
        return self._budget_cache[n]

    def _options(self, idx: np.ndarray | None):
        """:func:`core.options` for envs ``idx`` (``None``: all), grouped by episode length."""
        sl = slice(None) if idx is None else idx
        d, last, m_left = self._d[sl], self._last[sl], self._m_left[sl]
        p = self.params
        if p.merge_budget is None:
            return core.options(d, last, m_left, p, 0, None)
        n = self._n[sl]
        lengths = np.unique(n)
        if lengths.size == 1:
            n0 = int(lengths[0])
            return core.options(d, last, m_left, p, n0, self._budget_for(n0))
        can_merge = np.empty(d.shape, dtype=bool)
        can_defer = np.empty(d.shape, dtype=bool)
        for n0 in lengths:
            sel = n == n0
            can_merge[sel], can_defer[sel] = core.options(
                d[sel], last[sel], m_left[sel], p, int(n0), self._budget_for(int(n0))
            )
        return can_merge, can_defer

    def _apply(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Merge now in envs ``idx``: the single env's ``_apply(True)``, batched."""
        d = self._d[idx]
        gap_s = (d - self._last[idx]) * self.params.decision_seconds
        added, gain = lrn.merge_gain(gap_s, self._tokens[idx], self._thr[idx], self.learner_params)
        self._tokens[idx] += added
        if self.episode_pool is None:
            cost = self._merge_costs(idx, d)
        else:
            cost = self._bank_cost[self._slot[idx], d]
        self._last[idx] = d
        self._m_left[idx] -= 1
        self._n_merges[idx] += 1
        excess = cost * self._scale[idx]  # the reward term, as the single env's
        self._excess_sum[idx] += cost * self._pct[idx]  # additive sync-excess %, for the summary
        self._progress_sum[idx] += gain
        return excess, gain

    def _advance_forced(self, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Apply single-option decisions in envs ``idx`` (``None``: all) until each has a
        real choice or its episode ends; returns the merges' excess and progress per env."""
        b = self.num_envs
        ex = np.zeros(b)
        pr = np.zeros(b)
        n_all = self._n
        todo = np.flatnonzero(self._d < n_all) if idx is None else idx[self._d[idx] < n_all[idx]]
        while todo.size:
            can_merge, can_defer = self._options(todo)
            forced = ~(can_merge & can_defer)
            todo, can_merge, can_defer = todo[forced], can_merge[forced], can_defer[forced]
            if not todo.size:
                break
            stuck = ~(can_merge | can_defer)
            if stuck.any():  # cannot happen with validated budgets
                i = int(todo[stuck][0])
                raise RuntimeError(f"no feasible action at decision {self._d[i]} (env {i})")
            d = self._d[todo]
            n = n_all[todo]
            # A forced deferral starts a run of them, and the run's end is known: below H_min
            # the options cannot change until H_min (the single env jumps there too); with a
            # budget, deferrals stay forced until the next decision from which the remaining
            # merges can still be placed (or to the end, with none left). Jumping over the run
            # gives the same state as stepping through it (nothing happens on the way).
            d_next = d + 1
            defer = np.flatnonzero(~can_merge)
            if defer.size:
                d_next[defer] = self._forced_deferral_end(todo[defer])
            merged = todo[can_merge]
            if merged.size:
                e, g = self._apply(merged)
                ex[merged] += e
                pr[merged] += g
            self._d[todo] = d_next
            todo = todo[d_next < n]
        return ex, pr

    def _forced_deferral_end(self, idx: np.ndarray) -> np.ndarray:
        """First decision after a forced deferral in envs ``idx`` at which the options can
        differ (or the episode's end)."""
        p = self.params
        d, last, n = self._d[idx], self._last[idx], self._n[idx]
        below = d - last < p.h_min
        end = np.where(below, np.minimum(n, last + p.h_min), d + 1)
        if p.merge_budget is None or below.all():
            return end
        m_left = self._m_left[idx]
        for n0 in np.unique(n[~below]):
            sel = np.flatnonzero(~below & (n == n0))
            nxt = self._next_reach(int(n0))
            m1 = np.maximum(m_left[sel] - 1, 0)
            # No merge left: the tail is already safe (deferral is allowed), so every
            # remaining decision is a forced deferral. Otherwise: the next decision from
            # which the remaining merges can be completed.
            end[sel] = np.where(m_left[sel] > 0, nxt[m1, np.minimum(d[sel] + 1, n0)], n0)
        return end

    def _next_reach(self, n: int) -> np.ndarray:
        """``nxt[m, x]``: the first decision ``>= x`` after which ``m`` more merges can be
        placed feasibly (``reach[m]`` of :class:`core.BudgetTables`), or ``n`` if none."""
        if n not in self._next_cache:
            reach = self._budget_for(n).reach
            pos = np.where(reach, np.arange(n), n)
            nxt = np.full((reach.shape[0], n + 1), n, dtype=np.int64)
            nxt[:, :n] = np.minimum.accumulate(pos[:, ::-1], axis=1)[:, ::-1]
            self._next_cache[n] = nxt
        return self._next_cache[n]

    def _observe(self) -> None:
        """Fill ``self._obs`` (the single env's ``_obs`` for every env)."""
        p = self.params
        n = self._n
        d = self._d
        d_clip = np.minimum(d, n)
        gap = d_clip - self._last
        obs = self._obs
        obs[:, _G["gap"]] = np.minimum(1.0, gap / p.h_max)
        obs[:, _G["corridor_open"]] = gap >= p.h_min
        gaps_s = self._gaps_s[np.minimum(gap, p.h_max)]
        obs[:, LEARNER_SLICE] = core.learner_features_k(
            gaps_s, self._tokens, self._thr_k, p, self.learner_params
        )
        exo = self._bank_exo
        rows = self._slot * exo.shape[1] + np.minimum(d, n - 1)
        obs[:, EXO_SLICE] = np.take(exo.reshape(-1, exo.shape[2]), rows, axis=0)
        obs[:, _G["merges"]] = np.minimum(1.0, self._n_merges / self._max_merges)
        obs[:, _G["time_left"]] = (n - d_clip) / n
        if p.merge_budget:
            obs[:, _G["budget_left"]] = self._m_left / p.merge_budget
        else:
            obs[:, _G["budget_left"]] = 0.0 if p.merge_budget == 0 else 1.0


class _BuildSpec(NamedTuple):
    """What building an episode needs (a picklable value: building is a pure function of it)."""

    generator: Any
    params: EnvParams
    sidecar: SidecarParams
    learner_params: lrn.LearnerParams
    horizon: int
    rate_rps: float  # nominal rate of the reward scale (core.nominal_rate_rps)


#: Episodes built together at most: bounds the temporaries of a reset wave and keeps them in
#: cache (the choice is measured in benchmarks/README.md).
BUILD_CHUNK = 32


def _draws(spec: _BuildSpec, seed: int):
    """The single env's draws for the episode of ``seed``: the trace's arrays and the
    learner throughputs (drawn after the trace from the same generator)."""
    rng = np.random.default_rng(seed)
    gen = spec.generator
    if isinstance(gen, SyntheticRegime) and type(gen).__call__ is SyntheticRegime.__call__:
        arrivals, token_index, net, ckpt = gen.draw(rng)
        prompt, output = gen.tokens(token_index, np.float64)
        duration, name = gen.duration_s, gen.name
    else:
        tr = gen(rng)
        arrivals, prompt, output = tr.arrival_s, tr.prompt_tokens, tr.output_tokens
        net, ckpt, duration, name = tr.network, tr.checkpoint, tr.duration_s, tr.name
    return (
        arrivals,
        prompt,
        output,
        net,
        ckpt,
        duration,
        name,
        spec.learner_params.draw_throughputs(rng),
    )


def build_rows(spec: _BuildSpec, seeds: list[int]) -> list[dict[str, Any]]:
    """The vector env's bank rows of the episodes of ``seeds``, in order, as a list of
    batches (dicts of arrays with a leading episode axis; the requests concatenated).

    The draws are made one episode at a time (each from its own seeded generator, as the
    single env), then :func:`core.episode_core_batch` and the lazy-costing queue run over
    up to :data:`BUILD_CHUNK` episodes in array passes (bit-identical per episode; tested).
    Traces of different durations, or with and without pressure series, go one by one.
    A pure function of its arguments.
    """
    out = []
    for lo in range(0, len(seeds), BUILD_CHUNK):
        chunk = list(range(lo, min(len(seeds), lo + BUILD_CHUNK)))
        draws = [_draws(spec, seeds[k]) for k in chunk]
        if (
            len({d[5] for d in draws}) == 1
            and len({d[3] is None or d[4] is None for d in draws}) == 1
        ):
            out.append(_rows(spec, [seeds[k] for k in chunk], draws))
        else:
            out.extend(_rows(spec, [seeds[k]], [d]) for k, d in zip(chunk, draws, strict=True))
    return out


def _rows(spec: _BuildSpec, seeds: list[int], draws: list) -> dict[str, Any]:
    """Bank rows of same-duration ``draws``: the episode arrays and, for lazy costing, the
    padded no-merge queue, bin pointers and requests (see DiLoCoSyncVectorEnv.__init__)."""
    p, sc = spec.params, spec.sidecar
    has_p = draws[0][3] is not None and draws[0][4] is not None
    c = core.episode_core_batch(
        [d[0] for d in draws],
        [d[1] for d in draws],
        [d[2] for d in draws],
        np.stack([d[3] for d in draws]) if has_p else None,
        np.stack([d[4] for d in draws]) if has_p else None,
        draws[0][5],
        p,
        sc,
        draws[0][6],
    )
    assert c.counts is not None  # episode_core_batch fills it
    n, di = c.n, p.decision_interval
    n_bins = c.pressure_bin.shape[1]
    q = cost_queue(
        c.base_s,
        c.req_bin,
        c.violated,
        c.m0,
        c.s,
        sc,
        p.step_seconds,
        n_bins + 1 + spec.horizon,
        counts=c.counts,
        m0_bins=di,  # the pressure, hence m0, is constant over a decision
    )
    return {
        "seeds": np.asarray(seeds, dtype=np.int64),
        "n": n,
        "exo": c.exo,
        "queue": q,
        "prefmin": c.prefmin[:, : n * di : di],
        "counts": c.counts,
        "pct": 100.0 / np.maximum(1, c.counts),
        "scale": core.reward_per_request(spec.rate_rps, draws[0][5]),
        "thr": np.stack([d[7] for d in draws]),
    }
