"""The Gymnasium environment: when to run a DiLoCo outer merge on a shared host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np

from diloco_gym.envs import core
from diloco_gym.envs.core import OBS_DIM, OBS_HIGH, OBS_INDEX, OBS_LOW, EnvParams, Episode
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.regimes import REGIMES, get_regime
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace

__all__ = ["DiLoCoSyncEnv", "make_generator"]

#: The ``gym.Env`` type parameters: an observation is a float32 vector of ``OBS_DIM`` features;
#: an action is ``0`` (defer) or ``1`` (merge), a Python or NumPy integer (``Discrete(2)``
#: samples ``np.int64``).
Observation: TypeAlias = np.ndarray
Action: TypeAlias = int | np.integer

_G = OBS_INDEX
_G_GAP, _G_OPEN, _G_MERGES, _G_BUDGET = (
    _G["gap"],
    _G["corridor_open"],
    _G["merges"],
    _G["budget_left"],
)
_ENV_FIELDS = {f.name for f in fields(EnvParams)}


def make_generator(regime) -> tuple[Callable[[np.random.Generator], Trace], SidecarParams, str]:
    """Resolve ``regime`` (a name, a generator object, or a :class:`Trace`) to a generator.

    Returns:
        ``(generator, default sidecar parameters, name)``.
    """
    if isinstance(regime, str):
        gen = get_regime(regime)
        return gen, gen.sidecar, gen.name
    if isinstance(regime, Trace):
        from diloco_gym.sim.regimes import ReplayRegime

        gen = ReplayRegime(regime, duration_s=regime.duration_s, start_s=0.0, name=regime.name)
        return gen, gen.sidecar, regime.name
    if callable(regime):
        return (
            regime,
            getattr(regime, "sidecar", SidecarParams()),
            getattr(regime, "name", type(regime).__name__),
        )
    raise TypeError(
        f"regime must be a regime name ({', '.join(REGIMES)}), a generator "
        f"(callable rng -> Trace) or a Trace; got {type(regime).__name__}"
    )


class DiLoCoSyncEnv(gym.Env[Observation, Action]):
    """## Description

    A DiLoCo training job shares its hosts with a latency-sensitive LLM serving sidecar.
    Every ``decision_interval`` training steps the agent decides whether to launch the
    outer merge now (``1``) or defer (``0``). A merge occupies the host for
    ``merge_seconds`` and slows the sidecar; requests that then exceed their SLO are the
    merge's *sync-excess* cost. The corridor (docs/model.md#corridor-and-decisions) bounds
    the schedule: no merge before ``H_min`` steps since the last one, a forced merge at
    ``H_max``.

    ## Action Space

    ``Discrete(2)``: ``0`` defer, ``1`` merge now. An action the corridor (or budget)
    forbids is replaced by the feasible one and ``info["action_overridden"]`` is set;
    ``action_masks()`` gives the feasible actions (for sb3-contrib's MaskablePPO).
    By default (``skip_forced=True``) the agent is only asked when both are feasible.

    ## Observation Space

    ``Box(17,)`` float32; see ``diloco_gym.envs.core.OBS_FEATURES`` (name, unit, range, meaning)
    and the README's table. Every feature is computed from the past only.

    ## Rewards

    ``reward = excess_weight * sync_excess + progress_weight * progress`` (both terms in
    ``info["reward_terms"]``, ``sync_excess <= 0``):

    * ``sync_excess`` = ``-c * scale`` where ``c`` is the extra SLO-violating requests of
      the merges launched in this step, each evaluated in isolation against the no-merge
      replay and credited when it is launched, and ``scale`` =
      ``core.reward_per_request(nominal_rate_rps, duration_s)`` =
      ``1000 / (nominal_rate_rps * duration_s)``: violating requests per 1,000 *nominal*
      requests of the window. ``nominal_rate_rps`` is fixed before the episode starts
      (``EnvParams.reward_rate_rps``, or the regime's:
      :func:`diloco_gym.envs.core.nominal_rate_rps`;
      bursty 8 req/s, so 4,800 nominal requests per 600 s window), never the episode's own
      request count, which depends on the future.
    * ``progress``: the global loss decrease of those merges (learner surrogate).

    The only look-ahead in a reward is a merge's own cost window: ``c`` counts the requests
    arriving during the merge (``merge_seconds``) or within ``sidecar.tail_s`` after it that
    the merge (its slowdown and the backlog it leaves) pushes over the SLO. Two traces equal
    up to time ``t`` give equal rewards for every step whose merges' cost windows end by
    ``t`` (tested).

    Exact relation to the episode's sync-excess: over an episode the ``sync_excess`` terms
    sum to ``-scale * A`` where ``A`` = ``episode_summary["additive_excess_requests"]``, the
    sum of the merges' isolated costs, and ``additive_excess_pct`` = ``A * 100 / requests``;
    so ``sum(sync_excess terms) = -10 * additive_excess_pct * requests / (nominal_rate_rps *
    duration_s)`` (bursty: about ``-10 * additive_excess_pct``, as ``requests`` is close to
    the 4,800 nominal). ``A`` equals the exact replay's ``sync_excess_requests`` whenever each
    merge's backlog drains before the next merge starts (true on the shipped regimes up to
    rounding; the test suite bounds the gap). ``info["excess_requests_so_far"]`` is ``A`` so
    far. The exact replay is in the final ``info["episode_summary"]`` (not ``"episode"``,
    which Gymnasium's ``RecordEpisodeStatistics`` and SB3's ``Monitor`` write).

    ## Starting State

    ``reset(seed=s)`` draws the trace from the regime's generator with
    ``np.random.default_rng(s)``, so every agent sees the same trace for the same seed;
    without a seed a fresh episode seed is drawn from the env's generator
    (``info["episode_seed"]``). The episode starts just after a merge (gap 0).

    ## Episode End

    Truncated after the last decision of the trace window; never terminated.

    ## Arguments

    ``regime``: a regime name (``ordinary``, ``pressure-heavy``, ``sync-heavy``, ``bursty``,
    ``non-periodic``), a generator (callable ``rng -> Trace``, e.g. ``ReplayRegime``) or a
    fixed ``Trace``. ``params``/``sidecar``/``learners``: parameter dataclasses; any
    ``EnvParams`` field may also be passed as a keyword (``merge_budget=8``).
    ``render_mode``: ``"ansi"`` or ``"rgb_array"``.

    ## Version History

    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        regime: Any = "bursty",
        params: EnvParams | None = None,
        sidecar: SidecarParams | None = None,
        learners: lrn.LearnerParams | None = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        unknown = set(overrides) - _ENV_FIELDS
        if unknown:
            raise TypeError(
                f"unknown DiLoCoSyncEnv argument(s) {sorted(unknown)}; valid "
                f"EnvParams fields: {sorted(_ENV_FIELDS)}"
            )
        self.params = replace(params or EnvParams(), **overrides)
        self.generator, default_sidecar, self.regime_name = make_generator(regime)
        #: nominal request rate of the reward scale, fixed for every episode of this env.
        self.reward_rate_rps = core.nominal_rate_rps(self.generator, self.params)
        self.sidecar = sidecar or default_sidecar
        self.learner_params = learners or lrn.LearnerParams()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        self.episode: Episode | None = None
        self._budget_cache: dict[int, core.BudgetTables] = {}

    # ----------------------------------------------------------------- public views
    @property
    def decision(self) -> int:
        """Index of the current decision in the episode."""
        return self._d

    @property
    def merges(self) -> list[int]:
        """Decision indices of the merges launched so far."""
        return list(self._merges)

    def oracle_costs(self) -> np.ndarray:
        """The cost (requests) of a merge at every decision of the episode.

        This looks into the future and exists only for non-deployable baselines (the
        offline oracle). A deployable agent must never call it.
        """
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        return self.episode.merge_cost.copy()

    def learner_reports(self) -> dict[str, np.ndarray]:
        """Per-learner reports now: loss reduction, tokens since the last merge, staleness."""
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        gap_s = (self._d - self._last) * self.params.decision_seconds
        delta, tau = lrn.reports(gap_s, self._tokens, self.episode.throughputs, self.learner_params)
        return {"loss_delta": delta, "tokens": tau, "staleness_s": np.full(delta.shape, gap_s)}

    def action_masks(self) -> np.ndarray:
        """Feasible actions now, ``[defer, merge]`` (sb3-contrib MaskablePPO protocol)."""
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        if self._d >= self.episode.n_decisions:
            return np.array([True, True])
        can_merge, can_defer = self._options(self._d)
        return np.array([bool(can_defer), bool(can_merge)])

    # ----------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            episode_seed = int(seed)
        else:
            episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.episode = core.episode_from_seed(
            self.generator,
            episode_seed,
            self.params,
            self.sidecar,
            self.learner_params,
            rate_rps=self.reward_rate_rps,
        )
        n = self.episode.n_decisions
        p = self.params
        self._budget = None
        if p.merge_budget is not None:
            key = n
            if key not in self._budget_cache:
                self._budget_cache[key] = core.BudgetTables(n, p.h_min, p.h_max, p.merge_budget)
            self._budget = self._budget_cache[key]
        self._d = 0
        self._last = 0
        self._merges: list[int] = []
        self._costs: list[float] = []
        self._tokens = float(self.learner_params.initial_tokens)
        self._m_left = p.merge_budget if p.merge_budget is not None else 0
        self._max_merges = max(1.0, n / p.h_min)
        self._obs_base = self._obs_table()
        self._obs_base[:, _G_BUDGET] = 1.0  # overwritten per step when there is a budget
        self._refresh_learners(new_episode=True)
        self._excess_requests = 0.0
        self._progress_sum = 0.0
        info: dict[str, Any] = {"episode_seed": episode_seed}
        # Merges forced before the agent's first real choice (possible only with a tight
        # merge_budget) are applied here; reset() cannot return a reward, so their terms are
        # carried into the first step's reward instead of being lost.
        self._pending = (0.0, 0.0)
        if p.skip_forced:
            self._pending = self._advance_forced_raw()
            if self._d >= n:
                raise ValueError(
                    f"merge_budget={p.merge_budget} leaves the agent no decision "
                    f"in this episode (every merge is forced)"
                )
        info["reward_terms"] = {"sync_excess": 0.0, "progress": 0.0}  # paid on the first step
        info.update(self._step_info(False, False))
        return self._obs(), info

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        n = self.episode.n_decisions
        if self._d >= n:
            raise RuntimeError("step() called after the episode ended; call reset()")
        if type(action) is int or isinstance(action, np.integer):  # the common fast path
            a = int(action)
            if a != 0 and a != 1:
                raise ValueError(f"action must be 0 (defer) or 1 (merge), got {action!r}")
        else:
            a = self._parse_action(action)
        can_merge, can_defer = self._options(self._d)
        want = a == 1
        merge = (want and can_merge) or not can_defer
        overridden = merge != want
        excess, progress = self._apply(merge)
        excess += self._pending[0]
        progress += self._pending[1]
        self._pending = (0.0, 0.0)
        self._d += 1
        if self.params.skip_forced:
            ex2, pr2 = self._advance_forced_raw()
            excess += ex2
            progress += pr2
        p = self.params
        reward = -p.excess_weight * excess + p.progress_weight * progress
        truncated = self._d >= n
        info = self._step_info(merge, overridden)
        info["reward_terms"] = {"sync_excess": -excess, "progress": progress}
        if truncated:
            info["episode_summary"] = self.episode_summary()
        return self._obs(), float(reward), False, truncated, info

    # ----------------------------------------------------------------- internals
    @staticmethod
    def _parse_action(action: Any) -> int:
        """Validate a non-integer action (a bool, float, 0-d or one-element array)."""
        try:
            a = int(action)
        except (TypeError, ValueError):
            raise ValueError(f"action must be 0 (defer) or 1 (merge), got {action!r}") from None
        if (
            a not in (0, 1)
            or np.ndim(action) > 1
            or (np.ndim(action) == 1 and np.size(action) != 1)
            or np.asarray(action).item() != a
        ):
            # the last test rejects a fractional action (0.7) that int() would truncate
            raise ValueError(f"action must be 0 (defer) or 1 (merge), got {action!r}")
        return a

    def _require_episode(self) -> None:
        if self.episode is None:
            raise RuntimeError("call reset() before using the environment")

    def _options(self, d: int):
        assert self.episode is not None  # called only after reset()
        return core.options(
            d, self._last, self._m_left, self.params, self.episode.n_decisions, self._budget
        )

    def _refresh_learners(self, new_episode: bool = False, loss_now: float | None = None) -> None:
        """The learner features for every gap until the next merge. Only the loss-progress
        columns depend on the global tokens; the rest (tokens, staleness) is built once per
        episode, with the per-learner token counts of every gap. ``loss_now``: the loss at
        the current global tokens, when known."""
        p, lp = self.params, self.learner_params
        if new_episode:
            assert self.episode is not None  # called only after reset()
            self._ltable = core.learner_table(self._tokens, self.episode.throughputs, p, lp)
            gaps_s = np.arange(p.h_max + 1) * p.decision_seconds
            self._tau_k = self.episode.throughputs[:, None] * gaps_s  # as learner_table
            # merge_gain's sum over learners, once per episode (the same np.sum).
            self._thr_sum = float(np.sum(self.episode.throughputs, axis=-1))
            return
        self._ltable[:, 0], self._ltable[:, 1] = core.learner_progress(
            self._tau_k, self._tokens, p, lp, loss_now
        )

    def _apply(self, merge: bool) -> tuple[float, float]:
        if not merge:
            return 0.0, 0.0
        assert self.episode is not None  # called only after reset()
        d = self._d
        gap_s = (d - self._last) * self.params.decision_seconds
        added, gain, loss_after = lrn.merge_gain_scalar(
            gap_s, self._tokens, self._thr_sum, self.learner_params
        )
        self._tokens += added
        cost = self.episode.merge_cost_at(d)
        self._merges.append(d)
        self._costs.append(cost)
        self._last = d
        self._m_left -= 1
        self._refresh_learners(loss_now=loss_after)
        excess = cost * self.episode.reward_per_request
        self._excess_requests += cost
        self._progress_sum += gain
        return excess, gain

    def _advance_forced_raw(self) -> tuple[float, float]:
        """Apply single-option decisions until the agent has a real choice or the end."""
        assert self.episode is not None  # called only after reset()
        n = self.episode.n_decisions
        excess = progress = 0.0
        while self._d < n:
            can_merge, can_defer = self._options(self._d)
            if can_merge and can_defer:
                break
            if not can_merge and not can_defer:  # cannot happen with validated budgets
                raise RuntimeError(f"no feasible action at decision {self._d}")
            if can_merge:
                e, g = self._apply(True)
                excess += e
                progress += g
            # Jump over a run of forced deferrals in one go (no budget: until H_min).
            if not can_merge and self._budget is None:
                self._d = min(n, self._last + self.params.h_min)
            else:
                self._d += 1
        return excess, progress

    def _obs_table(self) -> np.ndarray:
        """Per-decision rows of the agent-independent features (exogenous block and time
        left; row ``n`` is the terminal observation's), built once per episode."""
        ep = self.episode
        assert ep is not None  # called only after reset()
        n = ep.n_decisions
        base = np.zeros((n + 1, OBS_DIM), dtype=np.float32)
        base[:n, core.EXO_SLICE] = ep.exo
        base[n, core.EXO_SLICE] = ep.exo[n - 1]
        base[:, _G["time_left"]] = (n - np.arange(n + 1)) / n
        return base

    def _obs(self) -> np.ndarray:
        p = self.params
        d = self._d  # never past n: the episode ends there
        gap = d - self._last
        obs = self._obs_base[d].copy()
        obs[_G_GAP] = gap / p.h_max if gap < p.h_max else 1.0
        obs[_G_OPEN] = 1.0 if gap >= p.h_min else 0.0
        obs[core.LEARNER_SLICE] = self._ltable[gap if gap < p.h_max else p.h_max]
        m = len(self._merges) / self._max_merges
        obs[_G_MERGES] = m if m < 1.0 else 1.0
        if p.merge_budget is not None:
            obs[_G_BUDGET] = self._m_left / p.merge_budget if p.merge_budget else 0.0
        return obs

    def _step_info(self, merged: bool, overridden: bool) -> dict[str, Any]:
        assert self.episode is not None  # called only after reset()
        return {
            "decision": self._d,
            "time_s": self._d * self.params.decision_seconds,
            "gap_steps": (min(self._d, self.episode.n_decisions) - self._last)
            * self.params.decision_interval,
            "merged": merged,
            "action_overridden": overridden,
            "merges": len(self._merges),
            "excess_requests_so_far": self._excess_requests,
        }

    def episode_summary(self) -> dict[str, Any]:
        """Exact replay of the schedule so far (the sidecar model, all merges together)."""
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        out = core.schedule_summary(self.episode, self._merges, self.params, self.sidecar)
        out["merge_decisions"] = list(self._merges)
        out["merge_times_s"] = [d * self.params.decision_seconds for d in self._merges]
        out["merge_costs_requests"] = list(self._costs)
        out["progress"] = self._progress_sum
        out["regime"] = self.regime_name
        out["episode_seed"] = self.episode.seed
        return out

    # ----------------------------------------------------------------- rendering
    def render(self) -> str | np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode")
            return None
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        if self.render_mode == "ansi":
            ep = self.episode
            gap = (min(self._d, ep.n_decisions) - self._last) * self.params.decision_interval
            obs = self._obs()
            rate = core.unsquash_rate(obs[_G["rate_now"]], self.params.rate_norm_rps)
            return (
                f"t={self._d * self.params.decision_seconds:7.1f}s gap={gap:4d} steps "
                f"merges={len(self._merges):3d} rate={rate:5.1f} rps "
                f"pressure(n/s/c)={obs[_G['network']]:.2f}/{obs[_G['serving']]:.2f}/"
                f"{obs[_G['checkpoint']]:.2f} excess={self._excess_requests:6.0f} req\n"
            )
        from diloco_gym.envs.render import timeline_rgb

        return timeline_rgb(self.episode, self._merges, self.params, self.sidecar, upto=self._d)
