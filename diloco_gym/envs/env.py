"""The Gymnasium environment: when to run a DiLoCo outer merge on a shared host.

:class:`DiLoCoSyncEnv` is the simulation kernel (:mod:`diloco_gym.envs.kernel`) on a batch of
one episode, with the single-env Gymnasium API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, NamedTuple, TypeAlias

import gymnasium as gym
import numpy as np

from diloco_gym.envs import kernel
from diloco_gym.envs.episode import Episode, episode_from_seed
from diloco_gym.envs.fused import NO_COST_QUEUE, FusedStep
from diloco_gym.envs.observation import OBS_DIM, OBS_HIGH, OBS_INDEX, OBS_LOW, unsquash_rate
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import ExactCredit, nominal_rate_rps, require_additive
from diloco_gym.envs.schedule import schedule_summary
from diloco_gym.envs.shaping import merge_debt_one, shaping_scale
from diloco_gym.sim import compiled
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.learner_calibration import learner_params, load_learner_calibration
from diloco_gym.sim.limits import check_limit
from diloco_gym.sim.regimes import REGIMES, SyntheticRegime, get_regime
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.step_layout import NEED_COST
from diloco_gym.sim.traces import Trace

__all__ = [
    "DiLoCoSyncEnv",
    "EnvConfig",
    "check_action",
    "check_actions",
    "check_env_sizes",
    "check_reset_options",
    "check_seed",
    "configure",
    "make_generator",
    "MAX_SEED",
]

#: The ``gym.Env`` type parameters: an observation is a float32 vector of ``OBS_DIM`` features;
#: an action is ``0`` (defer) or ``1`` (merge), a Python or NumPy integer (``Discrete(2)``
#: samples ``np.int64``).
Observation: TypeAlias = np.ndarray
Action: TypeAlias = int | np.integer

_G = OBS_INDEX
_ENV_FIELDS = {f.name for f in fields(EnvParams)}


def make_generator(regime) -> tuple[Callable[[np.random.Generator], Trace], SidecarParams, str]:
    """Resolve ``regime`` (a name, a generator object, or a :class:`Trace`) to a generator.

    Returns:
        ``(generator, default sidecar parameters, name)``.
    """
    if isinstance(regime, str) and regime not in REGIMES and _looks_like_path(regime):
        from diloco_gym.sim.loaders import load_trace

        regime = load_trace(regime)  # a trace file by path: a JSON-serialisable env spec
    if isinstance(regime, str):
        gen = get_regime(regime)
        return gen, gen.sidecar, gen.name
    if isinstance(regime, dict):  # a SyntheticRegime as EnvSpec.to_json/from_json gives it
        regime = _from_dict(SyntheticRegime, regime, "regime")
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
        f"regime must be a regime name ({', '.join(REGIMES)}), a trace file path, a "
        f"generator (callable rng -> Trace) or a Trace; got {type(regime).__name__}"
    )


def _looks_like_path(text: str) -> bool:
    return any(sep in text for sep in ("/", "\\")) or "." in text


def _from_dict(cls: type, value: dict[str, Any], what: str) -> Any:
    """Rebuild a parameter dataclass from the dict that ``EnvSpec.to_json`` (through
    ``dataclasses.asdict``) and ``EnvSpec.from_json`` turn it into."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise TypeError(
            f"{what}: a dict given for {cls.__name__} has unknown field(s) {unknown}; "
            f"valid fields: {sorted(names)}"
        )
    kwargs = dict(value)
    if cls is SyntheticRegime and isinstance(kwargs.get("sidecar"), dict):
        kwargs["sidecar"] = _from_dict(SidecarParams, kwargs["sidecar"], f"{what}.sidecar")
    return cls(**kwargs)


def _params(cls: type, value: Any, what: str) -> Any:
    """``None``, an instance of ``cls``, or its dict form (a spec read back from JSON)."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return _from_dict(cls, value, what)
    raise TypeError(f"{what} must be a {cls.__name__} or None, got {type(value).__name__}")


class EnvConfig(NamedTuple):
    """What both envs resolve from their arguments (:func:`configure`)."""

    params: EnvParams
    generator: Callable[[np.random.Generator], Trace]
    regime_name: str
    reward_rate_rps: float
    sidecar: SidecarParams
    learner_params: lrn.LearnerParams


def configure(
    owner: str,
    regime: Any,
    params: EnvParams | None,
    sidecar: SidecarParams | None,
    learners: lrn.LearnerParams | None,
    overrides: dict[str, Any],
) -> EnvConfig:
    """Resolve the arguments an env shares (``owner`` names it in errors): ``EnvParams``
    field keywords over ``params``, the regime's generator and default sidecar, and the
    nominal request rate of the reward scale (fixed for every episode of the env)."""
    # learner_calibration=FILE|dict|LearnerCalibration: the loss curve and drift of the
    # learner model fitted to real DiLoCo runs (diloco_gym/sim/learner_calibration.py).
    calibration = overrides.pop("learner_calibration", None)
    unknown = [name for name in overrides if name not in _ENV_FIELDS]
    if unknown:
        # Python's own wording for an unknown keyword, which wrappers such as TorchRL's
        # GymEnv recognise (they retry without an optional argument like ``frameskip``).
        more = f" (and {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else ""
        raise TypeError(
            f"{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}{more}; "
            f"valid keyword arguments are {owner}'s named parameters and the EnvParams "
            f"fields: {sorted(_ENV_FIELDS)}"
        )
    params = _params(EnvParams, params, "params")
    sidecar = _params(SidecarParams, sidecar, "sidecar")
    learners = _params(lrn.LearnerParams, learners, "learners")
    if calibration is not None:
        learners = learner_params(load_learner_calibration(calibration), learners)
    p = replace(params or EnvParams(), **overrides)
    if owner != "DiLoCoSyncEnv":  # the exact credit is the single env's (envs/reward.py)
        require_additive(p, owner)
    generator, default_sidecar, name = make_generator(regime)
    check_env_sizes(p, generator)  # before any episode is allocated
    return EnvConfig(
        p,
        generator,
        name,
        nominal_rate_rps(generator, p),
        sidecar or default_sidecar,
        learners or lrn.LearnerParams(),
    )


class _RenderModes(list):
    """The env's render modes (``metadata["render_modes"]``). For ``gym.make``: a
    ``render_mode`` that is not a string counts as listed, so that Gymnasium hands it to the
    env, whose check refuses it with a ``ValueError`` naming ``render_mode`` (Gymnasium
    itself would call ``.endswith`` on it, an ``AttributeError``). Strings are looked up
    as in a list."""

    def __contains__(self, value: object) -> bool:
        return not isinstance(value, str) or super().__contains__(value)


def _space_error(what: str, value: Any, space: gym.Space) -> str:
    shown = np.array2string(value, threshold=8) if isinstance(value, np.ndarray) else repr(value)
    kind = type(value).__name__
    if isinstance(value, np.ndarray):
        kind += f" of dtype {value.dtype}, shape {value.shape}"
        if value.shape != space.shape:
            kind += f", expected shape {space.shape}"
    return (
        f"{what} {shown} ({kind}) is not in the action space {space}; "
        f"use 0 (defer) or 1 (merge) as Python or NumPy integers"
    )


#: the info's ``action_mask`` for ``(can_defer, can_merge)``, at ``2 * can_defer + can_merge``
#: (copied for each step: a caller may write to its own)
_MASKS = tuple(np.array((a, b), dtype=np.int8) for a in (0, 1) for b in (0, 1))


def check_action(action: Any, space: gym.Space) -> bool:
    """Whether ``action`` asks for a merge; exactly what ``space.contains`` accepts (an int,
    a bool, an integer NumPy scalar or 0-d array of value 0 or 1), else ``ValueError``
    naming the value and the space."""
    if (type(action) is int or type(action) is np.int64) and (action == 0 or action == 1):
        return bool(action == 1)  # the common fast path (a Python bool, as below)
    if not space.contains(action):
        raise ValueError(_space_error("action", action, space))
    return bool(action == 1)


def check_actions(actions: Any, space: gym.Space) -> np.ndarray:
    """Which envs ask for a merge (bool array); exactly what ``space.contains`` accepts (an
    array or sequence of the batch's shape whose integer or bool dtype casts safely to
    ``int64``, values 0 or 1), else ``ValueError`` naming the value and the space."""
    a = actions
    if not (
        type(a) is np.ndarray
        and a.dtype == np.int64
        and a.shape == space.shape
        and (a.size == 0 or (a.min() >= 0 and a.max() <= 1))
    ) and not space.contains(a):
        raise ValueError(_space_error("actions", a, space))
    return np.asarray(a) == 1


#: Largest episode seed: seeds are stored as int64 (Gymnasium wants them non-negative).
MAX_SEED = 2**63 - 1


def check_env_sizes(
    params: EnvParams, generator, num_envs: int = 1, what: str = "num_envs"
) -> None:
    """Refuse, before anything is allocated, an env whose episodes would be too large:
    decisions per episode (``DILOCO_GYM_MAX_DECISIONS``), envs (``DILOCO_GYM_MAX_ENVS``),
    envs x decisions (``DILOCO_GYM_MAX_BATCH_DECISIONS``) and a synthetic regime's requests
    per episode at its busiest rate (``DILOCO_GYM_MAX_REQUESTS``); see
    :mod:`diloco_gym.sim.limits`. ``generator`` is asked for its ``duration_s`` (the
    episode window); one without it is not checked here. ``what`` names ``num_envs`` in
    the message (a vector env's ``episode_pool`` is checked the same way).

    Raises:
        diloco_gym.sim.limits.LimitError: a size above its limit.
    """
    check_limit("ENVS", num_envs, what)
    duration = getattr(generator, "duration_s", None)
    if not isinstance(duration, (int, float, np.integer, np.floating)):
        return
    duration = float(duration)
    if not np.isfinite(duration):
        raise ValueError(f"the regime's episode window duration_s must be finite, got {duration}")
    n = duration / params.decision_seconds
    check_limit("DECISIONS", n, f"an episode window of {duration:g} s, in decisions")
    rates = [getattr(generator, k, None) for k in ("quiet_rate_rps", "busy_rate_rps")]
    if all(isinstance(r, (int, float)) for r in rates):  # a synthetic regime's load
        peak = float(max(r for r in rates if r is not None))
        check_limit(
            "REQUESTS",
            peak * duration,
            f"requests per episode ({peak:.3g}/s at the busiest x {duration:g} s; "
            f"--rate-scale or --target-utilization set the load)",
        )
    check_limit(
        "BATCH_DECISIONS",
        n * num_envs,
        f"{what} {num_envs:,} x {int(n):,} decisions per episode",
    )


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` as an int in ``[0, MAX_SEED]``, or a ``ValueError`` naming ``what``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{what} must be an int, got {type(seed).__name__} {seed!r:.60}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{what} must be an int in [0, 2**63 - 1], got {int(seed)}")
    return int(seed)


def check_reset_options(options, allowed: tuple[str, ...], owner: str) -> dict:
    """``options`` of ``reset`` as a dict (``{}`` for ``None``); anything but a dict, or a
    key not in ``allowed``, is a ``ValueError`` (an option is never silently ignored)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(
            f"{owner}.reset options must be a dict or None, got {type(options).__name__}"
        )
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:
        valid = ", ".join(repr(k) for k in allowed) or "none"
        raise ValueError(
            f"{owner}.reset: unknown option(s) {', '.join(map(repr, unknown))}; valid options: "
            f"{valid} (environment parameters such as merge_budget are set when the env is made)"
        )
    return options


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

    ``Box(17,)`` float32; see ``diloco_gym.envs.observation.OBS_FEATURES`` (name, unit,
    range, meaning) and the README's table. Every feature is computed from the past only.

    ## Rewards

    ``reward = excess_weight * (sync_excess + shaping) + progress_weight * progress`` (the
    terms in ``info["reward_terms"]``, ``sync_excess <= 0``; ``shaping`` only with
    ``reward_shaping="merge-debt"``, ``DiLoCoSync-v2``'s default, else 0 and absent: the
    merge debt of :mod:`diloco_gym.envs.shaping`, ``gamma * phi(s') - phi(s)``):

    * ``sync_excess`` = ``-c * scale`` where ``c`` is the extra SLO-violating requests of
      the merges launched in this step, each evaluated in isolation against the no-merge
      replay and credited when it is launched, and ``scale`` =
      ``reward.reward_per_request(nominal_rate_rps, duration_s)`` =
      ``1000 / (nominal_rate_rps * duration_s)``: violating requests per 1,000 *nominal*
      requests of the window. ``nominal_rate_rps`` is fixed before the episode starts
      (``EnvParams.reward_rate_rps``, or the regime's:
      :func:`diloco_gym.envs.reward.nominal_rate_rps`;
      bursty 8 req/s, so 4,800 nominal requests per 600 s window), never the episode's own
      request count, which depends on the future. For a replayed trace without a
      ``target_rate_rps`` the regime's rate is the mean rate of the whole loaded trace: one
      constant for every window, but computed from the whole file (later windows
      included), not from a window's past; ``reward_rate_rps`` declares a causal one.
    * ``progress``: the global loss decrease of those merges (learner surrogate).

    That is ``reward_mode="additive"`` (the default). With ``reward_mode="exact"``,
    ``sync_excess`` = ``-scale * c`` where ``c`` is instead the sum of the *marginal exact*
    costs due at this step (:class:`diloco_gym.envs.reward.ExactCredit`): merge ``j``'s is
    the exact replay's extra violations of the schedule up to ``j`` minus those of the
    schedule up to ``j - 1`` (so a merge that lands in an earlier merge's backlog pays for
    the interaction); it is due once both schedules' backlogs have drained (bin ``r``), and
    paid with the first observation at a decision ``d'`` with ``r < d' *
    decision_interval``. So the reward returned with the observation at ``d'`` counts only
    requests that arrived before ``t_(d')`` minus one training step: no look-ahead, except
    on the episode's last step, which also pays every credit not yet due (requests up to
    the trace's end). An episode's ``sync_excess`` terms sum to ``-scale *
    E``, ``E`` the exact replay's sync-excess in requests, as the protocol's scorer
    (:class:`diloco_gym.eval.scorer.EpisodeScorer`) counts it (tested to 1e-9 at 1.41x
    bursty load, where merges interact); ``episode_summary["merge_marginal_requests"]``
    lists the credits. Only this env has the exact credit: the vector and the fleet env
    refuse ``reward_mode="exact"``.

    The only look-ahead in an additive reward is a merge's own cost window: ``c`` counts
    the requests arriving during the merge (``merge_seconds``) or within ``sidecar.tail_s``
    after it that the merge (its slowdown and the backlog it leaves) pushes over the SLO.
    Two traces equal up to time ``t`` give equal rewards for every step whose merges' cost
    windows end by ``t`` (tested).

    Exact relation to the episode's sync-excess (additive mode): the ``sync_excess`` terms
    sum to ``-scale * A`` where ``A`` = ``episode_summary["additive_excess_requests"]``, the
    sum of the merges' isolated costs, and ``additive_excess_pct`` = ``A * 100 / requests``;
    so ``sum(sync_excess terms) = -10 * additive_excess_pct * requests / (nominal_rate_rps *
    duration_s)`` (bursty: about ``-10 * additive_excess_pct``, as ``requests`` is close to
    the 4,800 nominal). ``A`` equals the exact replay's ``sync_excess_requests`` whenever each
    merge's backlog drains before the next merge starts (true on the shipped regimes up to
    rounding; the test suite bounds the gap). ``info["excess_requests_so_far"]`` is ``A`` so
    far (in exact mode: the exact credits paid so far, as causal as the exact reward;
    :data:`~diloco_gym.envs.info.INFO_KEYS` lists every info key and whether it is
    causal). The exact replay is in the final ``info["episode_summary"]`` (not
    ``"episode"``, which Gymnasium's ``RecordEpisodeStatistics`` and SB3's ``Monitor``
    write).

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
    ``learner_calibration``: a learner calibration file (``diloco-gym calibrate-learners``),
    its parsed document or a ``LearnerCalibration``; the learner model (and the
    ``progress`` reward) then uses the loss curve and drift fitted to real DiLoCo runs.
    ``render_mode``: ``"ansi"`` or ``"rgb_array"``.

    ## Version History

    * v1: the merge-debt reward shaping and ``excess_weight = 0.1`` (the task, the
      observation and the scoring are v0's); Stable-Baselines3's PPO learns it from
      scratch (docs/training.md).
    * v0: initial version (deprecated: its ids warn and stay for one release).
    """

    metadata = {"render_modes": _RenderModes(["ansi", "rgb_array"]), "render_fps": 4}

    def __init__(
        self,
        regime: Any = "bursty",
        params: EnvParams | None = None,
        sidecar: SidecarParams | None = None,
        learners: lrn.LearnerParams | None = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        cfg = configure("DiLoCoSyncEnv", regime, params, sidecar, learners, overrides)
        self.params, self.generator, self.regime_name = cfg.params, cfg.generator, cfg.regime_name
        #: nominal request rate of the reward scale, fixed for every episode of this env.
        self.reward_rate_rps = cfg.reward_rate_rps
        self.sidecar, self.learner_params = cfg.sidecar, cfg.learner_params
        if render_mode is not None and (
            not isinstance(render_mode, str) or render_mode not in self.metadata["render_modes"]
        ):
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        self.episode: Episode | None = None
        # The kernel's state and episode constants, a batch of one (envs/kernel.py).
        self._state = kernel.new_state(1)
        self._state_ints = kernel.state_arrays(self._state)[0]  # (4, 1): its int fields
        self._batch = kernel.new_batch(1, self.learner_params.num_learners)
        self._budgets = kernel.Budgets(self.params)
        self._exact_seen = 0  # merges of the schedule handed to the exact credit so far
        self._exact: ExactCredit | None = None  # reward_mode="exact"'s credit
        #: the merge debt's scale k (reward units of excess_weight = 1) when the reward is
        #: shaped (EnvParams.reward_shaping; envs/shaping.py), else None
        self.shaping_cost: float | None = shaping_scale(
            self.generator, self.params, self.sidecar, self.learner_params, self.reward_rate_rps
        )
        self._phi = 0.0  # the potential at the last observation
        self._exo: np.ndarray = np.zeros((1, 1, 7), dtype=np.float32)  # the episode's, 1 slot
        self._obs_out = np.zeros((1, OBS_DIM), dtype=np.float32)
        self._obs_consts = kernel.observe_consts(self.params, self.learner_params)
        self._obs_args: tuple = ()  # kernel.observe_args, set by reset()
        # One compiled call per decision (envs/fused.py). A merge's cost comes from the
        # episode's cost queue inside it, unless a subclass costs merges its own way (the
        # fleet env: per precision); the step then stops at the merge and asks it.
        self._fused = FusedStep(
            self._state, self._batch, self.params, self.learner_params, self.sidecar,
            self._budgets, self._obs_out, record=True,
        )  # fmt: skip
        self._own_cost = type(self)._merge_cost_at is not DiLoCoSyncEnv._merge_cost_at
        self._memo = np.zeros((1, 0))  # the cost memo of the compiled step, set by reset()
        self._mask_out = np.ones((1, 2), dtype=bool)
        self._base_obs = type(self)._obs is DiLoCoSyncEnv._obs
        self._base_masks = type(self).action_masks is DiLoCoSyncEnv.action_masks
        self._base_want = type(self)._want is DiLoCoSyncEnv._want
        self._state_floats = kernel.state_arrays(self._state)[1]  # (6, 1): its float fields
        self._row0 = np.zeros(1, dtype=np.int64)
        self._want0 = np.zeros(1, dtype=np.bool_)
        self._step_now: Callable[[], int] = lambda: -1  # FusedStep.bound_step, set by reset()

    # ----------------------------------------------------------------- public views
    @property
    def decision(self) -> int:
        """Index of the current decision in the episode."""
        return self._state.d.item(0)

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
        st = self._state
        gap_s = int(st.d[0] - st.last[0]) * self.params.decision_seconds
        delta, tau = lrn.reports(
            gap_s, st.tokens.item(0), self.episode.throughputs, self.learner_params
        )
        return {"loss_delta": delta, "tokens": tau, "staleness_s": np.full(delta.shape, gap_s)}

    def action_masks(self) -> np.ndarray:
        """Feasible actions now, ``[defer, merge]`` (sb3-contrib MaskablePPO protocol)."""
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        self._fused.masks(self._row0, self._mask_out)
        return self._mask_out[0].copy()

    # ----------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode: the one of ``seed`` (drawn from the env's generator when
        ``None``), or ``options["episode"]``, an :class:`~diloco_gym.envs.episode.Episode`
        built with this env's parameters (:func:`~diloco_gym.envs.episode.episode_from_seed`),
        to run an agent on an episode built once for several uses."""
        if seed is not None:
            check_seed(seed)
        given = check_reset_options(options, ("episode",), "DiLoCoSyncEnv").get("episode")
        super().reset(seed=seed)
        if given is not None:
            self.episode = self._check_episode(given, seed)
            episode_seed = given.seed
        else:
            if seed is not None:
                episode_seed = int(seed)
            else:
                episode_seed = int(self.np_random.integers(0, 2**31 - 1))
            self.episode = self._episode_of_seed(episode_seed)
        ep = self.episode
        n = ep.n_decisions
        p = self.params
        batch = self._batch
        batch.n[0] = n
        batch.pct[0] = ep.pct_per_request
        batch.scale[0] = ep.reward_per_request
        batch.max_merges[0] = kernel.max_merges(n, p)
        batch.thr[0] = ep.throughputs
        batch.thr_k[:, 0] = ep.throughputs
        batch.thr_sum[0] = np.sum(ep.throughputs, axis=-1)
        batch.seed[0] = -1 if ep.seed is None else ep.seed
        if p.merge_budget is not None:
            self._budgets.tables(n)  # an infeasible budget fails here
        self._exact_seen = 0
        self._exact = ExactCredit(ep, p, self.sidecar) if p.reward_mode == "exact" else None
        self._exo = ep.exo[None]
        self._obs_args = kernel.observe_args(
            self._state, self._batch, self._exo, self._obs_consts, self._obs_out
        )
        source, self._memo = self._cost_source(ep)
        self._fused.begin(n, source, self._memo, self._exo)
        self._step_now = self._fused.bound_step(self._row0, self._want0)
        kernel.reset_rows(
            self._state, batch, 0, p, self.learner_params, self._advance_fused,
        )  # fmt: skip
        self._record_schedule()
        info: dict[str, Any] = {"episode_seed": episode_seed}
        info["reward_terms"] = {"sync_excess": 0.0, "progress": 0.0}  # paid on the first step
        if self.shaping_cost is not None:
            self._phi = self._potential()
            info["reward_terms"]["shaping"] = 0.0
        info.update(self._step_info(False, False))
        return self._obs(), info

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        ep = self.episode
        if ep is None:
            raise RuntimeError("call reset() before using the environment")
        if self._state_ints.item(0) >= ep.n_decisions:  # the decision, row 0 of the ints
            raise RuntimeError("step() called after the episode ended; call reset()")
        # One compiled call (FusedStep: the rules in sim/jit_step.py), then the schedule, the
        # exact credit and the info in Python.
        if self._base_want:
            self._want0[0] = check_action(action, self.action_space)
        else:
            self._want0[0] = self._want(action)
        f = self._fused
        while True:
            if self._step_now() >= 0:  # cannot happen with validated budgets
                raise RuntimeError(
                    f"no feasible action at decision {self._state.d.item(0)} (row 0)"
                )
            merged, overridden, truncated, can_defer, can_merge, status, _, d = f.oi[0].tolist()
            if status != NEED_COST:
                break
            self._memo[0, d] = self._merge_cost_at(d)  # a subclass's own cost, then resume
        excess, progress, reward = f.of[0, :3].tolist()
        if self._exact is not None and self._state.n_merges.item(0) != self._exact_seen:
            self._record_schedule()
        truncated = bool(truncated)
        if self._exact is not None:  # the marginal exact costs due now, not the isolated ones
            excess = self._exact.due(self._state.d.item(0), truncated) * ep.reward_per_request
            reward = f.reward(excess, progress)
        info = self._step_info(bool(merged), bool(overridden), (can_defer, can_merge))
        info["reward_terms"] = {"sync_excess": -excess, "progress": progress}
        if self.shaping_cost is not None:  # F = gamma * phi(s') - phi(s), envs/shaping.py
            phi = self._potential()
            shaping = self.params.shaping_gamma * phi - self._phi
            self._phi = phi
            reward += self.params.excess_weight * shaping
            info["reward_terms"]["shaping"] = shaping
        if truncated:
            info["episode_summary"] = self.episode_summary()
        obs = self._obs_out[0].copy() if self._base_obs else self._step_obs()
        return obs, reward, False, truncated, info

    def _step_obs(self) -> np.ndarray:
        """A subclass's observation after a step (the compiled step has just written the
        kernel's into ``_obs_out``, which a subclass may reuse): :meth:`_obs`."""
        return self._obs()

    def _cost_source(self, ep: Any) -> tuple[tuple, np.ndarray]:
        """The compiled step's cost queue and cost memo for the episode ``ep``: the
        episode's own; none and a memo of NaN for a subclass that costs merges itself (the
        step asks it at each merge, :meth:`_merge_cost_at`)."""
        if self._own_cost:
            return NO_COST_QUEUE, np.full((1, ep.n_decisions), np.nan)
        return ep.cost_source, ep.cost_memo

    def _advance_fused(self, _row: Any) -> tuple[float, float]:
        """A reset's forced decisions, compiled (the terms owed to the first step)."""
        while (code := self._fused.advance(self._row0)) != -1:
            if code >= 0:  # cannot happen with validated budgets
                raise RuntimeError(
                    f"no feasible action at decision {self._state.d.item(0)} (row 0)"
                )
            d = self._state.d.item(0)
            self._memo[0, d] = self._merge_cost_at(d)  # a subclass's own cost, then resume
        return self._state.pend_excess.item(0), self._state.pend_progress.item(0)

    def _record_schedule(self) -> None:
        """The merges the compiled step recorded since the last call, into the exact credit's
        schedule, in order."""
        if self._exact is None:
            return
        k, m = self._exact_seen, self._state.n_merges.item(0)
        for x in self._fused.sched_d[0, k:m].tolist():
            self._exact.add(x)
        self._exact_seen = m

    @property
    def _merges(self) -> list[int]:
        """The schedule so far: the decisions of its merges, as the compiled step recorded
        them (the state holds their count)."""
        return self._fused.sched_d[0, : self._state.n_merges.item(0)].tolist()

    @property
    def _costs(self) -> list[float]:
        """The isolated costs of the schedule's merges, as the compiled step recorded them."""
        return self._fused.sched_c[0, : self._state.n_merges.item(0)].tolist()

    def _check_episode(self, episode: Any, seed: int | None) -> Episode:
        """A given episode must be an :class:`Episode` built with this env's parameters."""
        if not isinstance(episode, Episode):
            raise ValueError(
                f"options['episode'] must be a diloco_gym.envs.episode.Episode, "
                f"got {type(episode).__name__}"
            )
        if episode.params != self.params or episode.sidecar != self.sidecar:
            raise ValueError(
                "options['episode'] was built with other EnvParams or SidecarParams than this env's"
            )
        if seed is not None and episode.seed != int(seed):
            raise ValueError(
                f"options['episode'] is the episode of seed {episode.seed}, not of seed {seed}"
            )
        return episode

    def _episode_of_seed(self, episode_seed: int) -> Any:
        """The episode of ``episode_seed`` with this env's parameters (the fleet env
        builds its sites' episodes here)."""
        return episode_from_seed(
            self.generator,
            episode_seed,
            self.params,
            self.sidecar,
            self.learner_params,
            rate_rps=self.reward_rate_rps,
        )

    def _require_episode(self) -> None:
        if self.episode is None:
            raise RuntimeError("call reset() before using the environment")

    def _want(self, action: Any) -> bool:
        """Whether ``action`` asks to merge (checked against the action space; the fleet
        env's precision action reads its second component here)."""
        return check_action(action, self.action_space)

    def _merge_cost_at(self, d: int) -> float:
        """The isolated cost of a merge at decision ``d`` (the fleet env's: at the chosen
        precision)."""
        assert self.episode is not None  # called only after reset()
        return self.episode.merge_cost_at(d)

    def _obs(self) -> np.ndarray:
        """The observation now: the kernel's compiled observation of this batch of one
        (:func:`kernel.observe`, its arguments kept from the reset)."""
        compiled().observe_rows(*self._obs_args)
        return self._obs_out[0].copy()

    def _step_info(
        self, merged: bool, overridden: bool, mask: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The step's info; ``mask``: ``(can_defer, can_merge)`` now, when known."""
        ep = self.episode
        assert ep is not None  # called only after reset()
        d, last, _, merges = self._state_ints.ravel().tolist()  # step_layout.STATE_INT
        if mask is None or not self._base_masks:  # a subclass's masks may have more entries
            action_mask = self.action_masks().astype(np.int8)
        else:
            action_mask = _MASKS[2 * mask[0] + mask[1]].copy()
        p = self.params
        n = ep.n_decisions
        return {
            "decision": d,
            "time_s": d * p.decision_seconds,
            "gap_steps": ((d if d < n else n) - last) * p.decision_interval,
            "merged": merged,
            "action_overridden": overridden,
            "merges": merges,
            "excess_requests_so_far": self._excess_so_far(),
            # Gymnasium's convention (as Taxi): int8, so action_space.sample(mask) takes it.
            "action_mask": action_mask,
        }

    def _potential(self) -> float:
        """The merge debt now (:func:`~diloco_gym.envs.shaping.merge_debt`)."""
        assert self.episode is not None and self.shaping_cost is not None
        d, last, _, merges = self._state_ints.ravel().tolist()  # step_layout.STATE_INT
        n = self.episode.n_decisions
        return merge_debt_one(self.shaping_cost, d, last, merges, n, self.params)

    def _excess_so_far(self) -> float:
        """``info["excess_requests_so_far"]`` (:data:`~diloco_gym.envs.info.INFO_KEYS`): the
        requests the reward's ``sync_excess`` terms have counted so far. Additive mode: the
        launched merges' isolated costs (the kernel's running sum, row 2 of
        ``step_layout.STATE_FLOAT``), each with its own cost window, the additive reward's
        documented look-ahead. Exact mode: the marginal exact costs paid so far, causal
        like the exact reward (the isolated costs would leak what the exact reward
        withholds until the backlog drains)."""
        if self._exact is not None:
            return self._exact.credited
        return self._state_floats.item(2)

    def episode_summary(self) -> dict[str, Any]:
        """Exact replay of the schedule so far (the sidecar model, all merges together)."""
        self._require_episode()
        assert self.episode is not None  # for mypy: _require_episode() raised otherwise
        merges, costs = self._merges, self._costs
        out = schedule_summary(self.episode, merges, self.params, self.sidecar, costs=costs)
        out["merge_decisions"] = list(merges)
        out["merge_times_s"] = [d * self.params.decision_seconds for d in merges]
        out["merge_costs_requests"] = costs
        if self._exact is not None:
            out["merge_marginal_requests"] = list(self._exact.marginals)
        out["progress"] = self._state.progress_sum.item(0)
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
            st = self._state
            d = st.d.item(0)
            gap = (min(d, ep.n_decisions) - st.last.item(0)) * self.params.decision_interval
            obs = self._obs()
            rate = unsquash_rate(obs[_G["rate_now"]], self.params.rate_norm_rps)
            return (
                f"t={d * self.params.decision_seconds:7.1f}s gap={gap:4d} steps "
                f"merges={len(self._merges):3d} rate={rate:5.1f} rps "
                f"pressure(n/s/c)={obs[_G['network']]:.2f}/{obs[_G['serving']]:.2f}/"
                f"{obs[_G['checkpoint']]:.2f} excess={st.excess_requests.item(0):6.0f} req\n"
            )
        from diloco_gym.envs.render import timeline_rgb

        return timeline_rgb(
            self.episode, self._merges, self.params, self.sidecar, upto=self._state.d.item(0)
        )
