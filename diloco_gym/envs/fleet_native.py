"""The compiled fleet vector env: ``K`` fleets stepped by the simulation kernel in one call.

:class:`DiLoCoFleetNativeVectorEnv` is the native vector env
(:class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv`: the same compiled step, seeding,
autoreset and infos) over fleet episodes. Its episode bank holds ``N`` slots per env, env
``i``'s site ``j`` in slot ``i * N + j``: each site's episode is built from its own seed
(:func:`~diloco_gym.envs.fleet_sites.site_seed`) straight into the bank, as the single
vector env builds its episodes, and the compiled step costs a sync as the sum of the
env's sites' isolated costs (:func:`~diloco_gym.sim.jit_step.sites_cost`), the rule the
fleet env's own compiled step runs. The observation is the kernel's, with site 0's
pressure block, then the further sites' blocks, as the fleet env's.

It runs the fleets whose syncs the compiled step costs (:func:`native_refusal` says why
another is not run): one-instant timing, one precision, fixed links, no site cap, no
worst-site weight, no traffic correlation, and one cost horizon (the sites' ``tail_s``);
any number of fragments (model v1's fragment credit is the kernel's, and each fragment's
staleness feature is read from the recorded schedule). Sites whose sidecars differ (their
regimes, or in model v1 their link shares) get each request's violation thresholds from
their own sidecar, computed when the episode is built (16 bytes a request more). Env ``i`` of
``reset(seed=s)`` gives the fleet env's episodes, observations and rewards of
``reset(seed=s + i)`` and later ``reset()`` calls, bit for bit (tested)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from diloco_gym.envs import kernel
from diloco_gym.envs.bank import BuildSpec, EpisodeBank
from diloco_gym.envs.env import check_env_sizes
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.fleet_sites import compiled_refusal, site_seed
from diloco_gym.envs.fused import FusedStep
from diloco_gym.envs.kernel import is_synthetic
from diloco_gym.envs.observation import EXO_SLICE, OBS_DIM
from diloco_gym.envs.reward import reward_per_request
from diloco_gym.envs.vector import (
    DiLoCoSyncVectorEnv,
    check_autoreset_mode,
    check_num_envs,
)
from diloco_gym.sim.sidecar import queue_thresholds

__all__ = ["DiLoCoFleetNativeVectorEnv", "native_refusal", "refuse_vector_extras"]

_N_EXO = EXO_SLICE.stop - EXO_SLICE.start


def native_refusal(env: DiLoCoFleetEnv) -> str | None:
    """Why the compiled fleet vector env does not run ``env``'s fleet (``None``: it does).

    It runs a one-instant fleet whose syncs the compiled step costs
    (:func:`~diloco_gym.envs.fleet_sites.compiled_refusal`, one site included) and whose
    sites' episodes the bank builds from their own seeds (no traffic correlation)."""
    if type(env) is not DiLoCoFleetEnv:
        return "its timing is 'rounds' (per-site timing)"
    if env.fleet.traffic_correlation > 0:
        return "traffic_correlation > 0 (sites share traffic)"
    return compiled_refusal(env.setup)


def refuse_vector_extras(kwargs: dict[str, Any]) -> None:
    """The single vector env's arguments the fleet's does not take, refused by name (not
    as unknown fleet env arguments)."""
    for key in ("episode_pool", "parallel"):
        if key in kwargs:
            raise ValueError(
                f"DiLoCoFleetNativeVectorEnv takes no {key} argument (fresh fleet episodes, "
                f"built serially)"
            )


class DiLoCoFleetNativeVectorEnv(DiLoCoSyncVectorEnv):
    """``num_envs`` fleets (``DiLoCoFleet-v1``) stepped together by the compiled kernel.

    ## Description

    The fleet env (:class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv`) vectorised over a leading
    batch axis, for the fleets the compiled step costs (:func:`native_refusal`; the
    default fleet is one). ``gym.make_vec("DiLoCoFleet-v1", num_envs=K,
    vectorization_mode="vector_entry_point")`` builds one where the fleet allows it.

    ## Spaces

    ``single_observation_space``: the fleet env's ``Box`` (its :attr:`obs_features`);
    ``single_action_space``: ``Discrete(2)``; ``action_space``:
    ``MultiDiscrete([2] * num_envs)``; ``action_masks()``: ``(num_envs, 2)`` bool.

    ## Seeding, autoreset, info

    As :class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv`'s: env ``i`` of
    ``reset(seed=s)`` runs the fleet env's episodes of ``reset(seed=s + i)`` and then of
    ``reset()`` without a seed; ``NEXT_STEP`` or ``SAME_STEP`` autoreset; the infos
    ``merged``, ``action_overridden``, ``sync_excess``, ``progress``, ``episode_end``
    (``merges``, ``sync_excess_pct``: the additive sync-excess in percentage points of
    all the fleet's requests, ``progress``, ``seed``), ``episode_seed`` and
    ``action_mask``. The fleet env's exact per-site summary is not computed here (a
    replay of every site per episode): rebuild the episode with the fleet env from its
    seed when needed, or step ``gym.make_vec(..., vectorization_mode="sync")`` for the
    fleet env's infos.

    ## Arguments

    ``num_envs``, ``autoreset_mode``; every other keyword goes to the fleet env
    (``fleet``, ``params``, ``learners``, ``FleetParams`` and ``EnvParams`` fields), which
    checks them. No episode pool, no parallel variant, no rendering.
    """

    def __init__(
        self,
        num_envs: int = 1,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        b = check_num_envs(num_envs)
        mode = check_autoreset_mode(autoreset_mode)
        if render_mode is not None:
            raise ValueError(
                "DiLoCoFleetNativeVectorEnv does not render; render one episode with the fleet env"
            )
        refuse_vector_extras(kwargs)
        # the factory (fleet_vector.make_fleet_vector) hands over the fleet env it checked
        template = kwargs.pop("_template", None) or DiLoCoFleetEnv(**kwargs)
        why = native_refusal(template)
        if why is not None:
            raise ValueError(
                f"DiLoCoFleetNativeVectorEnv does not run this fleet: {why}; step it with "
                f"gym.make_vec('DiLoCoFleet-v1', ..., vectorization_mode='sync')"
            )
        self._init_fleet(template, b)
        self.parallel = False
        self.episode_pool = None
        self.autoreset_mode = mode
        self.metadata = dict(type(self).metadata, autoreset_mode=mode)
        self.render_mode = None
        self._init_spaces(b)
        self._init_buffers(b)
        self.shaping_cost = None  # the fleet env refuses a shaped reward
        self._phi = np.zeros(b)

    def _init_fleet(self, template: DiLoCoFleetEnv, b: int) -> None:
        """The fleet's setup, parameters and observation table from the fleet env made of
        the arguments (its checks are the fleet env's), and the size checks of its sites'
        episodes."""
        s = template.setup
        self.fleet, self.setup = template.fleet, s
        self.n_sites = len(s.site_names)
        for gen in {id(g): g for g in s.generators}.values():
            sites = sum(g is gen for g in s.generators)
            check_env_sizes(s.params, gen, b * sites, f"num_envs x {sites} site(s)")
        self.params, self.generator, self.regime_name = s.params, s.generators[0], s.regime_name
        self.reward_rate_rps = s.rate_total
        self.sidecar, self.learner_params = s.sidecars[0], template.learner_params
        #: the observation table (name, unit, low, high, meaning), the fleet env's
        self.obs_features = template.obs_features
        self.obs_index = template.obs_index
        self._single_obs_space = template.observation_space
        v1 = self.fleet.model_version >= 1
        self._stall_s = float(s.plan.stall_s) if v1 else 0.0
        f = self.fleet.fragments
        #: the kernel's fragment credit (model v1, F >= 2; kernel.EpisodeBatch.fragments)
        self._fragment_credit = f if v1 and f > 1 else 0
        self._h_full = self.params.h_max * f  # a fragment's own H_max (decisions)
        self._frag0 = OBS_DIM + _N_EXO * (self.n_sites - 1)
        self._scale = reward_per_request(s.rate_total, float(s.generators[0].duration_s))
        #: sites of different sidecars: each request's violation thresholds are computed at
        #: its build from its site's sidecar (the compiled count reads them; one sidecar's
        #: are computed in the count)
        self._own_thresholds = len(s.cost_groups) > 1
        #: the sites built together: a build group of the fleet env (one synthetic regime)
        #: split by sidecar (a merge's lost capacity is built into the site's cost queue)
        self._build_groups = [
            [j for j in g if s.sidecars[j] == sc]
            for g in s.groups
            for sc in dict.fromkeys(s.sidecars[j] for j in g)
        ]

    def _init_spaces(self, b: int) -> None:
        self.num_envs = b
        self.single_observation_space = self._single_obs_space
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, b)
        self.action_space = batch_space(self.single_action_space, b)

    def _init_buffers(self, b: int) -> None:
        """The single vector env's buffers with a bank of ``N`` slots per env, a cost memo
        of ``N + 1`` rows per env (the sync's sum, then each site's: the compiled step's
        fleet layout; one row per env for one site), site 0's exogenous features (the
        kernel's observation) and the further sites' (the fleet's features)."""
        super()._init_buffers(b)
        n_sites = self.n_sites
        k = self.learner_params.num_learners
        self.bank = EpisodeBank(b * n_sites, self.params, self.sidecar, k, store=self.__dict__)
        self._specs = [
            BuildSpec(g, self.params, sc, self.learner_params, self.bank.horizon, r)
            for g, sc, r in zip(self.setup.generators, self.setup.sidecars, self.setup.rates,
                                strict=True)
        ]  # fmt: skip
        self._memo_rows = n_sites + 1 if n_sites > 1 else 1
        self._memo = np.zeros((b * self._memo_rows, 0))
        self._exo0 = np.zeros((b, 0, _N_EXO), dtype=np.float32)
        self._extra = np.zeros((b, 1, _N_EXO * (n_sites - 1)), dtype=np.float32)
        self._requests = np.zeros(b, dtype=np.int64)
        self._thr_in = self._thr_tail = np.zeros((0, 0))
        self._obs_base = np.zeros((b, OBS_DIM), dtype=np.float32)
        self._obs = np.zeros((b, len(self.obs_features)), dtype=np.float32)
        self._batch.sites[:] = n_sites
        self._batch.stall_s[:] = self._stall_s
        self._batch.credit[:] = self.setup.progress_factor
        self._batch.fragments[:] = self._fragment_credit
        if self.fleet.fragments > 1:  # the staleness features read the recorded schedule
            self._fused = FusedStep(
                self._state, self._batch, self.params, self.learner_params, self.sidecar,
                self._budgets, np.zeros((0, OBS_DIM), dtype=np.float32), record=True,
            )  # fmt: skip

    # ----------------------------------------------------------------- episodes
    def _build_fresh(self, slots: np.ndarray, seeds: list[int]) -> None:
        """Build the fleet episodes of ``seeds`` for envs ``slots``: each site's episode
        into bank slot ``env * N + site`` (a group of sites of one synthetic regime in
        one build, a trace site's window per episode), then the envs' own tables."""
        s, n_sites = self.setup, self.n_sites
        envs = np.asarray(slots, dtype=np.int64)
        for group in self._build_groups:
            spec = self._specs[group[0]]
            if is_synthetic(spec.generator):
                at = [int(i) * n_sites + j for i in envs for j in group]
                sd = [site_seed(e, j) for e in seeds for j in group]
                self.bank.build(spec, np.asarray(at, dtype=np.int64), sd)
                continue
            (j,) = group  # a trace site: its window depends on the episode seed
            for i, e in zip(envs.tolist(), seeds, strict=True):
                sp = spec._replace(generator=s.generator_for(j, e))
                self.bank.build(sp, np.array([i * n_sites + j]), [site_seed(e, j)])
        first = envs * n_sites
        n = int(self.bank.n[first[0]])
        if np.any(self.bank.n[first] != n):  # equal by the fleet's checks
            raise RuntimeError("the fleet's episodes have different decision counts")
        if self.params.merge_budget is not None:
            self._budgets.tables(n)  # an infeasible budget fails here
        if self._own_thresholds:
            self._fill_thresholds(envs)
        self._batch.seed[envs] = seeds
        self._episode_tables(envs, n)

    def _fill_thresholds(self, envs: np.ndarray) -> None:
        """The violation thresholds of envs ``envs``' site episodes, each site's from its
        own sidecar (:func:`~diloco_gym.sim.sidecar.violation_threshold` inside a sync's
        window and after it: the operations the count does with one sidecar); ``+inf`` for
        a request already violated without a sync and for padding."""
        bank = self.bank
        if self._thr_in.shape != bank.base.shape:  # the bank grew: keep the rows built
            old_in, old_tail = self._thr_in, self._thr_tail
            self._thr_in = np.full(bank.base.shape, np.inf)
            self._thr_tail = np.full(bank.base.shape, np.inf)
            if old_in.size:
                self._thr_in[:, : old_in.shape[1]] = old_in
                self._thr_tail[:, : old_tail.shape[1]] = old_tail
            self._prepared = (-1, None)  # the compiled step's arguments hold the old ones
        di = self.params.decision_interval  # the bank keeps one slowdown per decision
        for j, sc in enumerate(self.setup.sidecars):
            rows = envs * self.n_sites + j
            self._thr_in[rows], self._thr_tail[rows] = queue_thresholds(
                bank.m0[rows], bank.rbin[rows], bank.base[rows], di, sc
            )

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        if self._own_thresholds:
            return self._thr_in, self._thr_tail
        return super()._thresholds()

    def _episode_tables(self, envs: np.ndarray, n: int) -> None:
        """Envs ``envs``' request counts, site 0's features, the further sites' features
        (row ``n`` repeats the last decision's, as the fleet env's terminal observation)
        and their cost memo rows (NaN: not costed)."""
        n_sites, b = self.n_sites, self.num_envs
        if self._exo0.shape[1] < n:
            self._exo0 = np.zeros((b, n, _N_EXO), dtype=np.float32)
            self._extra = np.zeros((b, n + 1, _N_EXO * (n_sites - 1)), dtype=np.float32)
            self._memo = np.zeros((b * self._memo_rows, n))
            self._prepared = (-1, None)  # the compiled step's arguments hold the old ones
        exo = self.bank.exo
        slots = envs[:, None] * n_sites + np.arange(n_sites)
        self._requests[envs] = self.bank.requests[slots].sum(axis=1)
        self._exo0[envs, :n] = exo[slots[:, 0], :n]
        for j in range(1, n_sites):
            cols = slice((j - 1) * _N_EXO, j * _N_EXO)
            self._extra[envs, :n, cols] = exo[slots[:, j], :n]
            self._extra[envs, n, cols] = exo[slots[:, j], n - 1]
        rows = envs[:, None] * self._memo_rows + np.arange(self._memo_rows)
        self._memo[rows.ravel()] = np.nan

    def _start(self, idx: np.ndarray) -> None:
        """Start the episodes of envs ``idx``: the fleet's constants (site 0's decisions
        and learner throughputs, the fleet's reward scale and request count), then
        :func:`kernel.reset_rows`."""
        batch, bank = self._batch, self.bank
        first = idx * self.n_sites
        batch.n[idx] = bank.n[first]
        batch.pct[idx] = 100.0 / np.maximum(1, self._requests[idx])
        batch.scale[idx] = self._scale
        batch.max_merges[idx] = bank.max_merges[first]
        batch.thr[idx] = bank.thr[first]
        batch.thr_k[:, idx] = bank.thr[first].T
        batch.thr_sum[idx] = np.sum(bank.thr[first], axis=-1)
        self._autoreset[idx] = False
        kernel.reset_rows(
            self._state, batch, idx, self.params, self.learner_params, self._advance_rows,
        )  # fmt: skip

    def _begin(self, n: int) -> None:
        """The compiled step prepared for episodes of ``n`` decisions, with the fleets'
        cost memo and site 0's features."""
        if self._prepared[1] != n:
            # the recorded schedule (fragments) holds an episode's syncs: its decisions,
            # where the single vector env passes 0 (no budget tables to prepare)
            self._fused.begin(n or self._memo.shape[1], self._source, self._memo, self._exo0)
            self._prepared = (self._prepared[0], n)

    def _observe(self) -> None:
        """Fill ``self._obs``: the kernel's observation with site 0's features, then the
        further sites' features at each env's decision."""
        if self._obs_consts is None:
            self._obs_consts = kernel.observe_consts(self.params, self.learner_params)
        kernel.observe(
            self._state, self._batch, self._exo0, self.params, self.learner_params,
            self._obs_base, self._obs_consts,
        )  # fmt: skip
        self._obs[:, :OBS_DIM] = self._obs_base
        d = self._state.d
        if self.n_sites > 1:
            self._obs[:, OBS_DIM : self._frag0] = self._extra[self._rows_all, d]
        f = self.fleet.fragments
        if f > 1:
            self._obs[:, self._frag0 : self._frag0 + f] = np.minimum(
                1.0, (d[:, None] - self._last_syncs(f)) / self._h_full
            )

    def _last_syncs(self, f: int) -> np.ndarray:
        """``(num_envs, f)``: the decisions of each env's last ``f`` syncs, in sync order
        (the fleet env's ``fragment_staleness``: before the episode, the fragments' syncs
        at ``-(f - 1 - k) * h_max``)."""
        m = np.minimum(self._state.n_merges, f)[:, None]
        pos = m + np.arange(f)  # in the history of f initial syncs then the schedule
        before = -(f - 1 - pos) * self.params.h_max
        at = np.clip(self._state.n_merges[:, None] - f + np.arange(f), 0, None)
        sched = self._fused.sched_d
        recorded = sched[self._rows_all[:, None], at] if sched.shape[1] else before
        return np.where(pos < f, before, recorded)

    def _check_budget(self, slots: np.ndarray) -> None:
        """Checked by :meth:`_build_fresh` (the bank's slots are sites, not envs)."""
