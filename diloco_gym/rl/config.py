"""Training configuration files for ``diloco-gym train --config FILE.toml``.

A config file holds three tables; every key is optional and command-line flags override
the file::

    [train]                      # the run
    algo = "maskable-ppo"        # ppo, maskable-ppo, dqn
    timesteps = 300000
    seed = 0
    n_envs = 5                   # default: one env per (regime, budget); 4 without budgets
    eval_episodes = 10           # validation seeds 900000.. per (regime, budget)
    eval_freq = 20000
    select_by = "vs_random"      # best_model.zip: lowest agent - matched random (or "sync_excess")
    checkpoint_freq = 0
    bc_teacher = "online-forecast-budget"   # optional warm start: imitate this agent first
    bc_episodes = 20             # ... on this many training episodes per env kind
    bc_epochs = 5

    [env]                        # the environments
    regimes = ["bursty"]         # or regime = "bursty", or trace = "my.csv" (below)
    budgets_per_hour = [48, 60, 72, 96, 144]   # merges per hour, or:
    # budgets_per_10min = [8, 10, 12, 16, 24]  # merges per 10 minutes
    excess_weight = 1.0          # any EnvParams field (reward weights, corridor, ...)
    # calibration = "calib.json" # a calibration file: its fitted sidecar drives the env
    # learner_calibration = "lc.json"  # its learner model (diloco_gym.rl.learner_config)
    # trace = "my.csv"; trace_format = "azure"; window_s = 600; rate_scale = 8.0
    # target_utilization = 0.6; sidecar = "sync-heavy"; trace_span_s = [0, 3600]
    # fleet = "fleet.toml"       # or a fleet of sites (DiLoCoFleet-v1), instead of the above

    [algo]                       # hyperparameters, passed to the SB3 algorithm
    learning_rate = 3e-4
    n_steps = 256
    policy_kwargs = { net_arch = [64, 64] }

**Budgets.** A budget is given per hour (``budgets_per_hour``, the unit of
``diloco-gym frontier --budgets``) or per 10 minutes (``budgets_per_10min``); each is
converted to the exact merges per episode the env takes (``merge_budget = M``,
``M = round(per_hour * episode_s / 3600)``, the frontier's conversion) and checked against
the merges the corridor allows in an episode. With budgets, the training envs are one copy
per (regime, budget) (``n_envs`` cycles through them) and the policy sees the budget
features of :mod:`diloco_gym.rl.wrappers` (``observation = "budget"``, the default then).

**Fleets.** ``fleet = "FILE"`` (or ``--fleet FILE``) trains on a fleet of sites
(``DiLoCoFleet-v1``, docs/fleet.md) instead of regimes or a trace: the fleet file sets the
sites' traffic, traces and sidecars, so those keys are refused with it; ``[env]``'s
``EnvParams`` fields override the fleet file's ``[env]`` table, and budgets count
fragment syncs per fleet episode (:mod:`diloco_gym.rl.env_specs`).

Each table is a declarative model (:mod:`diloco_gym.tables`, pydantic): unknown keys are
refused and types are strict. Every error is one line naming the file, the table and the
key.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import PositiveInt, create_model, field_validator, model_validator

from diloco_gym.envs.budget_features import OBS_TRANSFORMS
from diloco_gym.envs.params import EnvParams
from diloco_gym.rl import learner_config
from diloco_gym.rl.algos import ALGOS, RESERVED_ALGO_KEYS, SELECT_BY, VEC_ENVS, algo_kwargs
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.tables import Table, TableError, validate_table

__all__ = [
    "ConfigError",
    "TrainConfig",
    "load_config_file",
    "parse_config",
    "check_config",
    "policy_kwargs_for_sb3",
    "validate_hyperparameters",
    "hyperparameter_problem",
    "TRAIN_KEYS",
    "ENV_KEYS",
]


class ConfigError(ValueError):
    """A training config file (or its combination with flags) is invalid."""


#: The training seed's range: what NumPy and SB3 seed their generators with.
MAX_SEED = 2**32 - 1
#: The largest count (timesteps, episodes, frequencies): an int64 with room to add.
MAX_COUNT = 2**62


def _short(v: Any) -> str:
    """``repr(v)``, a huge value cut short."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


#: The largest budget a config may give, in merges per hour (one merge a second is 3,600;
#: the corridor refuses far less): a bound that keeps the conversion to merges finite.
MAX_BUDGET_PER_HOUR = 1e6


def _finite_number(v: Any) -> bool:
    """A real number (not a bool) that is finite as a float (a 400-digit integer is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _positive_budgets(value: list) -> list:
    if not value:
        raise ValueError("give at least one budget")
    for v in value:
        if not _finite_number(v) or not 0 < v <= MAX_BUDGET_PER_HOUR:
            shown = repr(v) if len(repr(v)) < 40 else f"{repr(v)[:24]}..."
            raise ValueError(
                f"budgets must be positive numbers (finite, at most "
                f"{MAX_BUDGET_PER_HOUR:g}), got {shown}"
            )
    if len({float(v) for v in value}) != len(value):
        raise ValueError(f"each budget once, got {value}")
    return value


class _TrainTable(Table):
    """The ``[train]`` table (``None``: not given, the default applies)."""

    algo: str | None = None
    timesteps: int | None = None
    seed: int | None = None
    n_envs: int | None = None
    vec_env: str | None = None
    eval_episodes: int | None = None
    eval_freq: int | None = None
    select_by: str | None = None
    checkpoint_freq: int | None = None
    bc_teacher: str | None = None
    bc_episodes: int | None = None
    bc_epochs: int | None = None


#: ``[env]`` keys a fleet run does not take: its fleet file sets them per site.
_NOT_WITH_FLEET = {
    "regime",
    "regimes",
    "trace",
    "trace_format",
    "trace_span_s",
    "window_s",
    "rate_scale",
    "target_utilization",
    "sidecar",
    "calibration",
    "learner_calibration",
}


class _EnvKeys(Table):
    """The ``[env]`` keys other than :class:`EnvParams` fields."""

    regime: str | None = None
    regimes: list | None = None
    trace: str | None = None
    fleet: str | None = None
    trace_format: str | None = None
    trace_span_s: list | None = None
    window_s: float | None = None
    rate_scale: float | None = None
    target_utilization: float | None = None
    sidecar: str | None = None
    calibration: str | None = None
    learner_calibration: str | None = None
    budgets_per_hour: list | None = None
    budgets_per_10min: list | None = None
    observation: str | None = None
    # Not a key: the budget is given per hour or per 10 minutes (refused with a hint).
    merge_budget: Any = None

    @field_validator("merge_budget")
    @classmethod
    def _no_merge_budget(cls, value: Any) -> Any:
        raise ValueError(
            "give budgets_per_hour or budgets_per_10min (converted to merges per episode)"
        )

    @field_validator("regimes")
    @classmethod
    def _regime_names(cls, value: list) -> list:
        if not value or not all(isinstance(r, str) for r in value):
            raise ValueError("must be a non-empty list of names")
        return value

    @field_validator("budgets_per_hour", "budgets_per_10min")
    @classmethod
    def _budgets(cls, value: list) -> list:
        return _positive_budgets(value)

    @field_validator("trace_span_s")
    @classmethod
    def _span(cls, span: list) -> list:
        if len(span) != 2 or not all(_finite_number(x) for x in span) or not 0 <= span[0] < span[1]:
            raise ValueError(
                f"must be [start, end] finite seconds with 0 <= start < end, got {_short(span)}"
            )
        return span

    @model_validator(mode="after")
    def _exclusive(self) -> _EnvKeys:
        given = self.model_fields_set
        if {"regime", "regimes"} <= given:
            raise ValueError("give regime or regimes, not both")
        if {"budgets_per_hour", "budgets_per_10min"} <= given:
            raise ValueError("give budgets_per_hour or budgets_per_10min, not both")
        clash = sorted(given & _NOT_WITH_FLEET) if "fleet" in given else []
        if clash:
            raise ValueError(
                f"fleet replaces {', '.join(clash)} (a fleet file sets its sites' traffic, "
                f"traces and sidecars)"
            )
        return self


def _param_type(default: Any) -> Any:
    if isinstance(default, bool):
        return bool
    if isinstance(default, str):  # reward_mode (EnvParams checks the value)
        return str
    return int if isinstance(default, int) else float


#: The ``[env]`` table's :class:`EnvParams` fields (all but the budget) and their types.
_PARAM_TYPES: dict[str, Any] = {
    f.name: (_param_type(f.default) | None, None)
    for f in fields(EnvParams)
    if f.name != "merge_budget"
}
#: The ``[env]`` table: its own keys and every :class:`EnvParams` field but the budget.
_EnvTable = create_model("_EnvTable", __base__=_EnvKeys, **_PARAM_TYPES)


class _PolicyKwargs(Table):
    """``[algo] policy_kwargs``: the entries a config may give (activations by name)."""

    net_arch: list[PositiveInt] | None = None
    activation_fn: Literal["tanh", "relu", "elu", "leaky_relu"] | None = None
    ortho_init: bool | None = None
    share_features_extractor: bool | None = None

    @field_validator("net_arch")
    @classmethod
    def _non_empty(cls, value: list) -> list:
        if not value:
            raise ValueError("must be a list of positive integers")
        return value


class _ConfigFile(Table):
    """A config file: three optional tables."""

    train: dict = {}
    env: dict = {}
    algo: dict = {}


#: ``[train]`` keys and their types.
TRAIN_KEYS: dict[str, Any] = {k: f.annotation for k, f in _TrainTable.model_fields.items()}
#: ``[env]`` keys other than :class:`EnvParams` fields, and their types.
ENV_KEYS: dict[str, Any] = {
    k: f.annotation for k, f in _EnvKeys.model_fields.items() if k != "merge_budget"
}
#: EnvParams fields a config may set (the budget comes from the budget lists).
_PARAM_FIELDS = {f.name: f for f in fields(EnvParams) if f.name != "merge_budget"}
_ACTIVATIONS = ("tanh", "relu", "elu", "leaky_relu")


@dataclass
class TrainConfig:
    """A resolved training configuration (file values, then flags, then defaults).

    Attributes mirror the ``[train]`` and ``[env]`` keys; ``env_params`` holds the
    :class:`EnvParams` overrides, ``hyperparameters`` the ``[algo]`` table and ``source``
    the file's path, SHA-256 and text (``None`` without a file).
    """

    algo: str = "ppo"
    timesteps: int = 200_000
    seed: int = 0
    n_envs: int | None = None
    vec_env: str | None = None
    eval_episodes: int = 10
    eval_freq: int = 10_000
    select_by: str = "vs_random"
    checkpoint_freq: int = 50_000
    bc_teacher: str | None = None
    bc_episodes: int = 20
    bc_epochs: int = 5
    regimes: list[str] = field(default_factory=lambda: ["bursty"])
    trace: str | None = None
    fleet: str | None = None
    trace_format: str = "auto"
    trace_span_s: list[float] | None = None
    window_s: float = 600.0
    rate_scale: float | None = None
    target_utilization: float | None = None
    sidecar: str | None = None
    calibration: str | None = None
    learner_calibration: str | None = None
    budgets_per_hour: list[float] | None = None
    observation: str | None = None
    env_params: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] | None = None

    @property
    def label(self) -> str:
        """The run's regime label: the regime, ``a+b`` for a mix, ``replay:STEM`` for a
        trace, ``fleet:STEM`` for a fleet (recorded as ``regime`` in meta.json, checked by
        ``--resume``)."""
        if self.fleet is not None:
            return f"fleet:{Path(self.fleet).stem}"
        if self.trace is not None:
            return f"replay:{Path(self.trace).stem}"
        return "+".join(self.regimes)

    def env_kwargs(self) -> dict[str, Any]:  # every env's (diloco_gym.rl.learner_config)
        return learner_config.train_env_kwargs(self.env_params, self.learner_calibration)

    def record(self) -> dict[str, Any]:
        """The resolved configuration as JSON-ready data (for meta.json)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        return out | {"label": self.label} | learner_config.record(self.learner_calibration)


def _where(path: str, table: str, key: str) -> str:
    return f"{path}: [{table}] {key}"


def _table(path: str, table: str, model: Any, data: dict[str, Any], valid: str) -> Any:
    """``data`` validated by ``model``; the first error as one line naming the file, the
    table and the key."""
    try:
        return validate_table(model, data)
    except TableError as err:
        if err.key is None:
            raise ConfigError(f"{path}: [{table}] {err.message}") from None
        key = err.key.split(".")[0]
        if err.kind == "unknown":
            raise ConfigError(f"{_where(path, table, key)}: unknown key; valid: {valid}") from None
        sep = " " if err.message.startswith("must be") else ": "
        raise ConfigError(f"{_where(path, table, key)}{sep}{err.message}") from None


def load_config_file(path: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Read a TOML config file: ``(data, source)`` with ``source = {"path", "sha256",
    "text"}``.

    Raises:
        ConfigError: the file is missing, unreadable or not valid TOML.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10: the same parser as the package tomli
        import tomli as tomllib

    from diloco_gym.sim import parsing
    from diloco_gym.sim.limits import LimitError

    p = Path(path)
    try:
        text = parsing.read_text(p)  # at most DILOCO_GYM_MAX_SETTINGS_BYTES
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except LimitError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: the config file is not UTF-8 text") from None
    try:
        data = parsing.parse_toml(text, str(p))  # at most DILOCO_GYM_MAX_NESTING deep
    except LimitError as exc:
        raise ConfigError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    raw = text.encode("utf-8")
    return data, {"path": str(p), "sha256": hashlib.sha256(raw).hexdigest(), "text": text}


#: The value rules of the SB3 hyperparameters a config file may set: ``("int", low,
#: high)`` an integer in ``[low, high]``, ``("float", low, high, low_inclusive)`` a finite
#: number in that range (``high`` included), ``("bool",)`` a boolean. A value SB3 would
#: only assert on (``batch_size = 0``), or take and train with (``gamma = 2.0``), is a
#: one-line error naming the file and the key instead. Keys not listed (the buffer and
#: rollout classes) cannot be given in a file.
HYPERPARAMETER_RULES: dict[str, tuple] = {
    "learning_rate": ("float", 0.0, 10.0, False),
    "gamma": ("float", 0.0, 1.0, False),
    "gae_lambda": ("float", 0.0, 1.0, True),
    "clip_range": ("float", 0.0, 100.0, False),
    "clip_range_vf": ("float", 0.0, 1e6, False),
    "ent_coef": ("float", 0.0, 1e3, True),
    "vf_coef": ("float", 0.0, 1e3, True),
    "max_grad_norm": ("float", 0.0, 1e6, False),
    "target_kl": ("float", 0.0, 1e3, False),
    "tau": ("float", 0.0, 1.0, False),
    "exploration_fraction": ("float", 0.0, 1.0, True),
    "exploration_initial_eps": ("float", 0.0, 1.0, True),
    "exploration_final_eps": ("float", 0.0, 1.0, True),
    "batch_size": ("int", 1, 2**31 - 1),
    "n_steps": ("int", 1, 2**31 - 1),
    "n_epochs": ("int", 1, 2**31 - 1),
    "buffer_size": ("int", 1, 2**31 - 1),
    "learning_starts": ("int", 0, 2**62),
    "train_freq": ("int", 1, 2**31 - 1),
    "gradient_steps": ("int", -1, 2**31 - 1),
    "target_update_interval": ("int", 1, 2**62),
    "sde_sample_freq": ("int", -1, 2**31 - 1),
    "stats_window_size": ("int", 1, 2**31 - 1),
    "normalize_advantage": ("bool",),
    "use_sde": ("bool",),
    "optimize_memory_usage": ("bool",),
}


def hyperparameter_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for hyperparameter ``key`` (``None``: nothing), by
    :data:`HYPERPARAMETER_RULES`."""
    rule = HYPERPARAMETER_RULES.get(key)
    if rule is None:
        return "cannot be set in a config file (train chooses it)"
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:24]}..."
    if rule[0] == "bool":
        return None if isinstance(value, bool) else f"must be true or false, got {shown}"
    if rule[0] == "int":
        lo, hi = rule[1], rule[2]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return f"must be an integer in [{lo}, {hi}], got {shown}"
        if key == "gradient_steps" and value == 0:
            return "must be an integer >= 1 or -1 (as many as environment steps), got 0"
        return None
    lo, hi, inclusive = rule[1], rule[2], rule[3]
    if not _finite_number(value) or not (
        (value >= lo if inclusive else value > lo) and value <= hi
    ):
        return f"must be a finite number in {'[' if inclusive else '('}{lo:g}, {hi:g}], got {shown}"
    return None


def validate_hyperparameters(algo: str, hp: dict[str, Any], where: str = "[algo]") -> None:
    """Check an ``[algo]`` table against the SB3 class's keyword arguments and the value
    rules (:data:`HYPERPARAMETER_RULES`).

    Raises:
        ConfigError: an unknown or reserved key, a value of the wrong kind or out of its
            range, or a bad ``policy_kwargs`` entry (the message names ``where`` and the
            key).
    """
    valid = algo_kwargs(algo)
    for key, value in hp.items():
        if key in RESERVED_ALGO_KEYS:
            raise ConfigError(f"{where} {key}: set by train itself, not a hyperparameter")
        if key not in valid:
            raise ConfigError(
                f"{where} {key}: unknown hyperparameter of {algo}; "
                f"valid: {', '.join(sorted(valid))}"
            )
        if key == "policy_kwargs":
            _check_policy_kwargs(where, value)
            continue
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where} {key}: expected a number, string or boolean, got {value!r}")
        why = hyperparameter_problem(key, value)
        if why is not None:
            raise ConfigError(f"{where} {key} {why}")


def _check_policy_kwargs(where: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} policy_kwargs must be a table, got {value!r}")
    try:
        validate_table(_PolicyKwargs, value)
    except TableError as err:
        key = (err.key or "").split(".")[0]
        if err.kind == "unknown":
            raise ConfigError(
                f"{where} policy_kwargs.{key}: not supported; valid: "
                f"{', '.join(sorted(_PolicyKwargs.model_fields))}"
            ) from None
        if key == "activation_fn":
            raise ConfigError(
                f"{where} policy_kwargs.activation_fn: {value[key]!r}; "
                f"valid: {', '.join(_ACTIVATIONS)}"
            ) from None
        if key == "net_arch":
            raise ConfigError(
                f"{where} policy_kwargs.net_arch must be a list of positive "
                f"integers, got {value[key]!r}"
            ) from None
        raise ConfigError(f"{where} policy_kwargs.{key} {err.message}") from None


def policy_kwargs_for_sb3(hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` with ``policy_kwargs.activation_fn`` names turned into torch classes."""
    pk = hp.get("policy_kwargs")
    if not isinstance(pk, dict) or "activation_fn" not in pk:
        return dict(hp)
    import torch

    names = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU}
    names["leaky_relu"] = torch.nn.LeakyReLU
    return {**hp, "policy_kwargs": {**pk, "activation_fn": names[pk["activation_fn"]]}}


def _parse_env(path: str, env: dict[str, Any], cfg: TrainConfig) -> None:
    valid = ", ".join(sorted(set(ENV_KEYS) | set(_PARAM_FIELDS)))
    _table(path, "env", _EnvTable, env, valid)
    # The file's own values (validated above): an integer weight stays an integer.
    cfg.env_params.update({k: v for k, v in env.items() if k in _PARAM_FIELDS})
    if "regime" in env:
        cfg.regimes = [env["regime"]]
    if "regimes" in env:
        cfg.regimes = list(env["regimes"])
    if "budgets_per_hour" in env:
        cfg.budgets_per_hour = [float(b) for b in env["budgets_per_hour"]]
    if "budgets_per_10min" in env:
        cfg.budgets_per_hour = [6.0 * float(b) for b in env["budgets_per_10min"]]
    for key in ("trace", "fleet", "trace_format", "sidecar", "calibration", "observation"):
        if key in env:
            setattr(cfg, key, env[key])
    for key in ("window_s", "rate_scale", "target_utilization"):
        if key in env:
            setattr(cfg, key, float(env[key]))
    if "trace_span_s" in env:
        cfg.trace_span_s = [float(x) for x in env["trace_span_s"]]
    cfg.learner_calibration = env.get("learner_calibration", cfg.learner_calibration)


def parse_config(data: dict[str, Any], path: str = "<config>") -> TrainConfig:
    """A :class:`TrainConfig` from a parsed config file (before flags).

    Raises:
        ConfigError: an unknown table or key, or a value of the wrong kind (one line
            naming ``path``, the table and the key).
    """
    cfg = TrainConfig()
    try:
        validate_table(_ConfigFile, data)
    except TableError as err:
        table = (err.key or "").split(".")[0]
        if err.kind == "unknown":
            raise ConfigError(
                f"{path}: unknown table [{table}]; valid: [train], [env], [algo]"
            ) from None
        raise ConfigError(f"{path}: {table} must be a table ([{table}])") from None
    train = data.get("train", {})
    _table(path, "train", _TrainTable, train, ", ".join(TRAIN_KEYS))
    for key, value in train.items():
        setattr(cfg, key, value)
    _parse_env(path, data.get("env", {}), cfg)
    cfg.hyperparameters = dict(data.get("algo", {}))
    return cfg


def check_config(cfg: TrainConfig, path: str = "<config>") -> None:
    """Check a resolved configuration (after flags) as a whole; with budgets and no
    ``observation``, sets ``observation = "budget"``.

    Raises:
        ConfigError: an invalid value or combination, naming ``path`` and the key.
    """
    _check_run_keys(cfg, path)
    _check_env_keys(cfg, path)
    _check_observation(cfg, path)
    try:
        params = EnvParams(**cfg.env_params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [env] {exc}") from None
    _check_episode_fits(cfg, params, path)
    if (problem := learner_config.problem(cfg.learner_calibration)) is not None:
        raise ConfigError(f"{path}: [env] learner_calibration{problem}")
    validate_hyperparameters(cfg.algo, cfg.hyperparameters, where=f"{path}: [algo]")
    _check_teacher(cfg, path)


def _check_run_keys(cfg: TrainConfig, path: str) -> None:
    """The run's algorithm, counts and vector env."""
    if cfg.algo not in ALGOS:
        raise ConfigError(f"{path}: algo {cfg.algo!r} is unknown; valid: {', '.join(ALGOS)}")
    if cfg.timesteps < 1:
        raise ConfigError(f"{path}: timesteps must be >= 1, got {cfg.timesteps}")
    if not 0 <= cfg.seed <= MAX_SEED:
        raise ConfigError(f"{path}: seed must be in [0, {MAX_SEED}], got {_short(cfg.seed)}")
    for key in ("timesteps", "n_envs", "eval_episodes", "eval_freq", "checkpoint_freq"):
        v = getattr(cfg, key)
        if v is not None and v > MAX_COUNT:
            raise ConfigError(f"{path}: {key} must be at most 2**62, got {_short(v)}")
    for key in ("bc_episodes", "bc_epochs"):
        if getattr(cfg, key) > MAX_COUNT:
            raise ConfigError(
                f"{path}: [train] {key} must be at most 2**62, got {_short(getattr(cfg, key))}"
            )
    if cfg.n_envs is not None and cfg.n_envs < 1:
        raise ConfigError(f"{path}: n_envs must be >= 1, got {cfg.n_envs}")
    if cfg.n_envs is not None:
        from diloco_gym.sim.limits import LimitError, check_limit

        try:  # each env holds its episode: the vector env's limit, before any is built
            check_limit("ENVS", cfg.n_envs, "n_envs")
        except LimitError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for key in ("eval_episodes", "eval_freq", "checkpoint_freq"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: {key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.select_by not in SELECT_BY:
        raise ConfigError(
            f"{path}: select_by {cfg.select_by!r} is unknown; valid: {', '.join(SELECT_BY)}"
        )
    if cfg.vec_env is not None and cfg.vec_env not in VEC_ENVS:
        raise ConfigError(
            f"{path}: vec_env {cfg.vec_env!r} is unknown; valid: {', '.join(VEC_ENVS)}"
        )


def _check_env_keys(cfg: TrainConfig, path: str) -> None:
    """The regimes, or the trace and its replay options, or the fleet."""
    if cfg.fleet is not None:
        _check_fleet_keys(cfg, path)
    elif cfg.trace is None:
        bad = [r for r in cfg.regimes if r not in REGIMES]
        if bad:
            raise ConfigError(
                f"{path}: unknown regime(s) {bad}; valid regimes: {', '.join(REGIMES)}"
            )
        if len(set(cfg.regimes)) != len(cfg.regimes):
            raise ConfigError(f"{path}: regimes: each regime once, got {cfg.regimes}")
        for key in ("sidecar", "rate_scale", "target_utilization", "trace_span_s"):
            if getattr(cfg, key) is not None:
                raise ConfigError(f"{path}: {key} applies to a trace (trace = ...)")
        if cfg.trace_format != "auto":
            raise ConfigError(f"{path}: trace_format applies to a trace (trace = ...)")
    else:
        if cfg.sidecar is not None and cfg.sidecar not in REGIMES:
            raise ConfigError(
                f"{path}: sidecar {cfg.sidecar!r} is not a regime; valid: {', '.join(REGIMES)}"
            )
        if cfg.rate_scale is not None and cfg.target_utilization is not None:
            raise ConfigError(f"{path}: give rate_scale or target_utilization, not both")
    for key in ("window_s", "rate_scale", "target_utilization"):
        v = getattr(cfg, key)
        if v is not None and not (_finite_number(v) and v > 0):
            raise ConfigError(f"{path}: {key} must be a finite positive number, got {v}")


def _check_fleet_keys(cfg: TrainConfig, path: str) -> None:
    """A fleet run: the fleet file exists; no regime, trace or calibration key (the fleet
    file sets its sites), and no learner calibration (the fleet's learners are its own)."""
    if cfg.trace is not None:
        raise ConfigError(f"{path}: [env] give fleet or trace, not both")
    given = [
        k
        for k in ("sidecar", "rate_scale", "target_utilization", "trace_span_s", "calibration")
        if getattr(cfg, k) is not None
    ]
    if cfg.learner_calibration is not None:
        given.append("learner_calibration")
    if given:
        raise ConfigError(
            f"{path}: [env] fleet replaces {', '.join(given)} (a fleet file sets its sites)"
        )
    if not Path(cfg.fleet or "").is_file():
        raise ConfigError(f"{path}: [env] fleet: no such file: {cfg.fleet}")


def _check_episode_fits(cfg: TrainConfig, params: EnvParams, path: str) -> None:
    """The ``[env]`` corridor and step fit the episode window (a regime's, or
    ``window_s`` of a trace): otherwise no episode could be built and training would fail
    at its first reset, naming no file."""
    from diloco_gym.envs.episode import min_episode_seconds

    if cfg.fleet is not None:  # the fleet env checks its own sites (env_specs probes it)
        return
    if cfg.trace is None:
        windows = [(r, REGIMES[r].duration_s, REGIMES[r].sidecar) for r in cfg.regimes]
    else:
        windows = [("window_s", cfg.window_s, REGIMES[cfg.sidecar or "sync-heavy"].sidecar)]
    for name, duration, sidecar in windows:
        need = min_episode_seconds(params, sidecar)
        if duration < need:
            raise ConfigError(
                f"{path}: [env] an episode with these EnvParams (step_seconds, h_min_steps, "
                f"decision_interval, merge_seconds) needs at least {need:.1f} s, but "
                f"{name}'s window is {duration:g} s"
            )


def _check_observation(cfg: TrainConfig, path: str) -> None:
    """The observation transform and the budgets it needs (the default with budgets is
    ``"budget"``)."""
    for b in cfg.budgets_per_hour or ():  # --budgets: the file's values are checked already
        if not (_finite_number(b) and abs(b) <= MAX_BUDGET_PER_HOUR):
            raise ConfigError(
                f"{path}: budgets must be finite numbers of at most {MAX_BUDGET_PER_HOUR:g} "
                f"merges per hour, got {_short(b)}"
            )
    if cfg.observation is None and cfg.budgets_per_hour is not None:
        cfg.observation = "budget"
    if cfg.observation not in OBS_TRANSFORMS:
        raise ConfigError(
            f'{path}: observation {cfg.observation!r} is unknown; valid: "budget" (or leave it out)'
        )
    if cfg.observation is not None and cfg.budgets_per_hour is None:
        raise ConfigError(
            f"{path}: observation = {cfg.observation!r} needs budgets (budgets_per_hour or "
            f"budgets_per_10min)"
        )
    if cfg.budgets_per_hour is not None and cfg.vec_env == "native":
        raise ConfigError(
            f'{path}: vec_env "native" runs one budget; with budgets use "dummy" or "subproc"'
        )


def _check_teacher(cfg: TrainConfig, path: str) -> None:
    """The behaviour-cloning teacher: a deployable registry agent, for a budget run."""
    if cfg.bc_teacher is not None:
        from diloco_gym.agents.fleet_rounds import split_rule
        from diloco_gym.agents.registry import AGENTS

        base, rule = split_rule(cfg.bc_teacher)
        if rule != "together" and cfg.fleet is None:
            raise ConfigError(
                f"{path}: [train] bc_teacher {cfg.bc_teacher!r}: the '+own' site rule needs a "
                f"fleet with timing = 'rounds'"
            )
        if base not in AGENTS:
            raise ConfigError(
                f"{path}: [train] bc_teacher {cfg.bc_teacher!r} is not an agent; valid: "
                f"{', '.join(AGENTS)}"
            )
        if cfg.budgets_per_hour is None and cfg.fleet is None:
            raise ConfigError(
                f"{path}: [train] bc_teacher needs budgets (a budget-conditioned run) or a fleet"
            )
        if base == "offline-oracle":
            raise ConfigError(f"{path}: [train] bc_teacher must be deployable, not the oracle")
    if cfg.bc_episodes < 1 or cfg.bc_epochs < 1:
        raise ConfigError(f"{path}: [train] bc_episodes and bc_epochs must be >= 1")
