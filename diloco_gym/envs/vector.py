"""A native vector environment: many merge-scheduling episodes stepped together in numpy.

:class:`DiLoCoSyncVectorEnv` is the simulation kernel (:mod:`diloco_gym.envs.kernel`) with
Gymnasium's vector API around it: spaces, seeding, autoreset modes and infos. Its episodes
live in an :class:`~diloco_gym.envs.bank.EpisodeBank`; the dynamics are the kernel's
functions, which :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` runs as a batch of one.
``tests/envs/test_vector.py`` checks that env ``i`` reproduces the single env step for step.

:class:`diloco_gym.rl.sb3.SB3VecEnv` adapts it to Stable-Baselines3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from diloco_gym.envs import kernel
from diloco_gym.envs.bank import BUILD_CHUNK, BuildSpec, EpisodeBank, build_rows, pool_row
from diloco_gym.envs.env import (
    check_actions,
    check_env_sizes,
    check_reset_options,
    check_seed,
    configure,
)
from diloco_gym.envs.fused import NO_THRESHOLDS, FusedStep
from diloco_gym.envs.observation import OBS_DIM, OBS_HIGH, OBS_LOW
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.shaping import merge_debt, shaping_scale
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import SidecarParams

__all__ = [
    "DiLoCoSyncVectorEnv",
    "build_rows",
    "BUILD_CHUNK",
    "check_autoreset_mode",
    "check_num_envs",
]

_SEED_HIGH = 2**31 - 1  # the single env draws episode seeds with integers(0, 2**31 - 1)


def check_num_envs(num_envs: Any) -> int:
    """``num_envs`` as an int, or a ``ValueError`` unless it is an int >= 1."""
    if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    return int(num_envs)


def _check_episode_pool(episode_pool: Any, params: EnvParams, generator: Any) -> int | None:
    """``episode_pool`` as ``None`` or an int, or a ``ValueError`` unless it is ``None`` or an
    int >= 1; a pool too large for the size limits is refused here (:func:`check_env_sizes`)."""
    if episode_pool is None:
        return None
    if (
        not isinstance(episode_pool, (int, np.integer))
        or isinstance(episode_pool, bool)
        or episode_pool < 1
    ):
        raise ValueError(f"episode_pool must be None or an int >= 1, got {episode_pool!r}")
    check_env_sizes(params, generator, int(episode_pool), "episode_pool")
    return int(episode_pool)


def check_autoreset_mode(autoreset_mode: Any) -> AutoresetMode:
    """``autoreset_mode`` as an :class:`AutoresetMode`, ``NEXT_STEP`` or ``SAME_STEP``, or a
    ``ValueError``."""
    try:
        mode = AutoresetMode(autoreset_mode)
    except ValueError:
        mode = None
    if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        raise ValueError(
            f"autoreset_mode must be AutoresetMode.NEXT_STEP or SAME_STEP, got {autoreset_mode!r}"
        )
    return mode


class DiLoCoSyncVectorEnv(gym.vector.VectorEnv[np.ndarray, np.ndarray, np.ndarray]):
    """``num_envs`` DiLoCo merge-scheduling episodes stepped together (numpy, one process).

    ## Description

    The same environment as :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` (see its docstring for
    the problem, observation features and reward), vectorised over a leading batch axis.
    ``gym.make_vec("DiLoCoSync-v2", num_envs=1024, vectorization_mode="vector_entry_point")``
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

    Without a pool, every autoreset builds a fresh episode from its seed (with 1,024 envs
    and 517-decision episodes two envs restart per step on average). The envs restarting in
    a step are built together (:func:`build_rows`, bit-identical per episode), and a merge
    is costed only when launched: a fresh env keeps its no-merge queue and requests in the
    bank (timings and memory in ``benchmarks/README.md``).

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
    ``K >= 1``); ``autoreset_mode`` (``NEXT_STEP`` or ``SAME_STEP``); ``parallel`` (default
    ``False``): the compiled per-row work of a large batch (episode builds, merge costs, the
    observation) runs on numba's threads, one contiguous block of rows each, when called
    from the main thread (``NUMBA_NUM_THREADS`` sets how many; the results are the same
    with and without). It pays only on idle cores: every parallel region waits for its
    slowest thread, so on a machine whose cores are busy (other processes, or the learner's
    own torch threads) a step gets several times slower; ``benchmarks/README.md`` has the
    measurements. No rendering: render one episode with the single env.
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
        parallel: bool = False,
        **overrides: Any,
    ) -> None:
        b = check_num_envs(num_envs)
        cfg = configure("DiLoCoSyncVectorEnv", regime, params, sidecar, learners, overrides)
        check_env_sizes(cfg.params, cfg.generator, b)
        pool = _check_episode_pool(episode_pool, cfg.params, cfg.generator)
        mode = check_autoreset_mode(autoreset_mode)
        if render_mode is not None:
            raise ValueError(
                "DiLoCoSyncVectorEnv does not render; render one episode with DiLoCoSyncEnv"
            )
        if not isinstance(parallel, bool):
            raise ValueError(f"parallel must be True or False, got {parallel!r}")
        self.parallel = parallel
        self.params, self.generator, self.regime_name = cfg.params, cfg.generator, cfg.regime_name
        # The single env's reward scale (reward.nominal_rate_rps), fixed for every episode.
        self.reward_rate_rps = cfg.reward_rate_rps
        self.sidecar, self.learner_params = cfg.sidecar, cfg.learner_params
        self.episode_pool = pool
        self.autoreset_mode = mode
        self.metadata = dict(type(self).metadata, autoreset_mode=mode)
        self.render_mode = None
        self._init_spaces(b)
        self._init_buffers(b)
        #: the merge debt's scale k when the reward is shaped (envs/shaping.py), else None
        self.shaping_cost: float | None = shaping_scale(
            self.generator, self.params, self.sidecar, self.learner_params, self.reward_rate_rps
        )
        self._phi = np.zeros(b)  # each env's potential at its last observation

    def _init_spaces(self, b: int) -> None:
        """``num_envs`` and the single and batched spaces of ``b`` envs."""
        self.num_envs = b
        self.single_observation_space = gym.spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, b)
        self.action_space = batch_space(self.single_action_space, b)

    def _init_buffers(self, b: int) -> None:
        """The kernel's state and episode constants, one row per env, and the episode bank
        (fresh episodes in slot i of env i; a pool holds K episodes and envs point into it),
        with the step's buffers and the per-env generators (set by the first reset)."""
        k = self.learner_params.num_learners
        self._state = kernel.new_state(b)
        self._batch = kernel.new_batch(b, k)
        self._budgets = kernel.Budgets(self.params)
        self.bank = EpisodeBank(
            self.episode_pool or b, self.params, self.sidecar, k, store=self.__dict__
        )
        self._spec = BuildSpec(
            self.generator,
            self.params,
            self.sidecar,
            self.learner_params,
            self.bank.horizon,
            self.reward_rate_rps,
        )
        self._autoreset = np.zeros(b, dtype=bool)
        self._all = np.ones(b, dtype=bool)
        self._obs = np.zeros((b, OBS_DIM), dtype=np.float32)
        self._obs_consts: tuple | None = None  # kernel.observe_consts, on the first observe
        self._env_rngs: list[np.random.Generator | None] = [None] * b
        # The compiled step of the rows (envs/fused.py); the observation is taken after the
        # restarts, by _observe.
        self._fused = FusedStep(
            self._state, self._batch, self.params, self.learner_params, self.sidecar,
            self._budgets, np.zeros((0, OBS_DIM), dtype=np.float32), record=False,
            parallel=self.parallel,
        )  # fmt: skip
        self._rows_all = np.arange(b, dtype=np.int64)
        self._prepared: tuple[int, int | None] = (-1, None)  # (bank version, n) of _fused
        self._source: tuple = ()
        self._masks = np.ones((b, 2), dtype=bool)
        self._pool_base: int | None = None
        self._pool_next = 0
        self._started = False

    # ----------------------------------------------------------------- public views
    @property
    def episode_seeds(self) -> np.ndarray:
        """Seed of each env's current episode (rebuild it with ``DiLoCoSyncEnv.reset``)."""
        return self._batch.seed.copy()

    @property
    def decisions(self) -> np.ndarray:
        """Index of each env's current decision."""
        return self._state.d.copy()

    @property
    def merge_counts(self) -> np.ndarray:
        """Merges launched so far in each env's episode."""
        return self._state.n_merges.copy()

    def action_masks(self) -> np.ndarray:
        """Feasible actions of every env, ``(num_envs, 2)`` bool ``[defer, merge]``.

        An env whose episode has ended (it restarts on the next step) allows both.
        """
        self._require_started()
        out = self._masks
        for _n, sub in self._prepare(self._rows_all):
            self._fused.masks(sub, out)
        return out.copy()

    # ----------------------------------------------------------------- gym API
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode in every env (``options``: none are defined; ``None`` or
        ``{}``, anything else is an error)."""
        b = self.num_envs
        check_reset_options(options, (), "DiLoCoSyncVectorEnv")
        seeds = self._seed_list(seed)
        for s in seeds:
            if s is not None:
                check_seed(s, "seed (+ env index)")
        if seed is not None:
            first = next((s for s in seeds if s is not None), None)
            self._np_random, self._np_random_seed = seeding.np_random(first)
        if self.episode_pool is None:
            self._batch.slot[:] = np.arange(b, dtype=np.int64)
            self._build_fresh(self._batch.slot, [self._next_seed(i, seeds[i]) for i in range(b)])
        else:
            self._reset_pool(seed, seeds)
        self._start(np.arange(b))
        self._autoreset[:] = False
        self._started = True
        self._observe()
        info = {"episode_seed": self.episode_seeds, "_episode_seed": self._all.copy()}
        self._add_mask(info)
        return self._obs.copy(), info

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env once; see the class docstring for autoreset and info."""
        self._require_started()
        b = self.num_envs
        want = check_actions(actions, self.action_space)
        pending = self._autoreset.copy()  # NEXT_STEP: these envs restart instead of stepping
        restart = np.flatnonzero(pending)
        active = ~pending if restart.size else self._all.copy()
        f = self._fused
        rows = np.flatnonzero(active) if restart.size else self._rows_all
        if restart.size:  # the restarting rows: no merge, reward 0
            f.oi[:] = 0
            f.of[:] = 0.0
        for _n, sub in self._prepare(rows):
            bad = f.step(sub, want[sub])
            if bad >= 0:  # cannot happen with validated budgets
                raise RuntimeError(
                    f"no feasible action at decision {self._state.d[bad]} (row {bad})"
                )
        merge, overridden, truncated = f.oi[:, 0] == 1, f.oi[:, 1] == 1, f.oi[:, 2] == 1
        excess, progress, rewards = f.of[:, 0].copy(), f.of[:, 1].copy(), f.of[:, 2].copy()
        terminated = np.zeros(b, dtype=bool)
        shaping = None
        if self.shaping_cost is not None:  # F = gamma * phi(s') - phi(s); restarting rows: 0
            phi = self._potential()
            shaping = np.where(active, self.params.shaping_gamma * phi - self._phi, 0.0)
            self._phi = np.where(active, phi, self._phi)
            rewards += self.params.excess_weight * shaping

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
        if shaping is not None:
            info["shaping"], info["_shaping"] = shaping, active
        ended = np.flatnonzero(truncated)
        if ended.size:
            info["episode_end"] = {
                "merges": self._state.n_merges.copy(),
                "_merges": truncated,
                "sync_excess_pct": self._state.excess_sum.copy(),
                "_sync_excess_pct": truncated,
                "progress": self._state.progress_sum.copy(),
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
        self._add_mask(info)
        return self._obs.copy(), rewards, terminated, truncated, info

    def _add_mask(self, info: dict[str, Any]) -> None:
        """``info["action_mask"]``: every env's feasible actions for its next step, int8
        ``(num_envs, 2)`` as the single env's (Gymnasium's convention, as Taxi)."""
        info["action_mask"] = self.action_masks().astype(np.int8)
        info["_action_mask"] = self._all.copy()

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

    def _build_fresh(self, slots: np.ndarray, seeds: list[int]) -> None:
        """Build the fresh episodes of ``seeds`` into bank ``slots`` (``EpisodeBank.build``)."""
        self.bank.build(self._spec, slots, seeds, self.parallel)
        self._check_budget(slots)

    def _check_budget(self, slots: np.ndarray) -> None:
        if self.params.merge_budget is not None:
            for n in np.unique(self.bank.n[slots]):
                self._budgets.tables(int(n))  # an infeasible budget fails here

    def _prepare(self, rows: np.ndarray):
        """``(n, rows of that length)`` groups of ``rows`` with the compiled step prepared for
        them (the bank's arrays, rebuilt when the bank replaced one, and the budget tables
        of episodes of ``n`` decisions; one group of all rows without a budget)."""
        bank = self.bank
        if bank.version != self._prepared[0]:
            q = bank.queue()
            thresholds = self._thresholds()
            self._source = (q.s, q.d, q.ptr, q.rbin, q.base, q.m0, *thresholds, bank.prefmin,
                            q.m0_bins)  # fmt: skip
            self._prepared = (bank.version, None)
        if self.params.merge_budget is None:
            self._begin(0)
            yield 0, rows
            return
        n = self._batch.n[rows]
        for n0 in np.unique(n).tolist():
            self._begin(n0)
            yield n0, rows[n == n0]

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        """The cost queue's precomputed violation thresholds (none: computed in the count
        from the env's one sidecar)."""
        return NO_THRESHOLDS, NO_THRESHOLDS

    def _begin(self, n: int) -> None:
        """The compiled step prepared for episodes of ``n`` decisions, unless it already is."""
        if self._prepared[1] != n:
            self._fused.begin(n, self._source, self.bank.cost, self.bank.exo)
            self._prepared = (self._prepared[0], n)

    def _advance_rows(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A restart's forced decisions in rows ``idx``, compiled (their owed terms)."""
        for _n, sub in self._prepare(np.asarray(idx, dtype=np.int64)):
            bad = self._fused.advance(sub)
            if bad >= 0:  # cannot happen with validated budgets
                raise RuntimeError(
                    f"no feasible action at decision {self._state.d[bad]} (row {bad})"
                )
        return self._state.pend_excess[idx], self._state.pend_progress[idx]

    def _merge_costs(self, idx: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Isolated cost of a merge at decision ``d[k]`` of env ``idx[k]`` (the bank's)."""
        return self.bank.merge_costs(self._batch.slot[idx], d, self.episode_pool is not None)

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
                self.bank.store_pool(j, pool_row(self._spec, base + j))
            self._check_budget(np.arange(k))
            self._pool_base = base
            self._pool_next = 0
        if seed is not None:
            self._pool_next = 0
        b = self.num_envs
        self._batch.slot[:] = (self._pool_next + np.arange(b, dtype=np.int64)) % k
        self._pool_next = (self._pool_next + b) % k

    def _restart(self, idx: np.ndarray) -> None:
        """Autoreset: the next episode of each env in ``idx`` (in index order)."""
        if self.episode_pool is None:
            self._build_fresh(self._batch.slot[idx], [self._next_seed(int(i), None) for i in idx])
        else:
            k = self.episode_pool
            self._batch.slot[idx] = (self._pool_next + np.arange(idx.size)) % k
            self._pool_next = int((self._pool_next + idx.size) % k)
        self._start(idx)

    def _start(self, idx: np.ndarray) -> None:
        """Start the episodes now in the bank slots of envs ``idx`` (:func:`kernel.reset_rows`)."""
        kernel.load_episodes(self._batch, self.bank, idx)
        self._autoreset[idx] = False
        kernel.reset_rows(
            self._state, self._batch, idx, self.params, self.learner_params, self._advance_rows,
        )  # fmt: skip
        if self.shaping_cost is not None:
            self._phi[idx] = self._potential()[idx]

    def _potential(self) -> np.ndarray:
        """Every env's merge debt now (:func:`~diloco_gym.envs.shaping.merge_debt`)."""
        assert self.shaping_cost is not None
        st = self._state
        return merge_debt(self.shaping_cost, st.d, st.last, st.n_merges, self._batch.n, self.params)

    def _observe(self) -> None:
        """Fill ``self._obs`` (:func:`kernel.observe`)."""
        if self._obs_consts is None:
            self._obs_consts = kernel.observe_consts(self.params, self.learner_params)
        kernel.observe(
            self._state,
            self._batch,
            self.bank.exo,
            self.params,
            self.learner_params,
            self._obs,
            self._obs_consts,
            self.parallel,
        )
