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
    # trace = "my.csv"; trace_format = "azure"; window_s = 600; rate_scale = 8.0
    # target_utilization = 0.6; sidecar = "sync-heavy"; trace_span_s = [0, 3600]

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

Every error is one line naming the file, the table and the key.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from diloco_gym.envs.core import EnvParams
from diloco_gym.sim.regimes import REGIMES

__all__ = [
    "ConfigError",
    "TrainConfig",
    "EnvSpec",
    "load_config_file",
    "parse_config",
    "check_config",
    "policy_kwargs_for_sb3",
    "validate_hyperparameters",
    "build_env_specs",
    "TRAIN_KEYS",
    "ENV_KEYS",
]


class ConfigError(ValueError):
    """A training config file (or its combination with flags) is invalid."""


#: ``[train]`` keys and their types.
TRAIN_KEYS: dict[str, type | tuple[type, ...]] = {
    "algo": str,
    "timesteps": int,
    "seed": int,
    "n_envs": int,
    "vec_env": str,
    "eval_episodes": int,
    "eval_freq": int,
    "checkpoint_freq": int,
    "bc_teacher": str,
    "bc_episodes": int,
    "bc_epochs": int,
}
#: ``[env]`` keys other than :class:`EnvParams` fields, and their types.
ENV_KEYS: dict[str, type | tuple[type, ...]] = {
    "regime": str,
    "regimes": list,
    "trace": str,
    "trace_format": str,
    "trace_span_s": list,
    "window_s": (int, float),
    "rate_scale": (int, float),
    "target_utilization": (int, float),
    "sidecar": str,
    "calibration": str,
    "budgets_per_hour": list,
    "budgets_per_10min": list,
    "observation": str,
}
#: EnvParams fields a config may set (the budget comes from the budget lists).
_PARAM_FIELDS = {f.name: f for f in fields(EnvParams) if f.name != "merge_budget"}
#: Keyword arguments of an SB3 algorithm that ``train`` sets itself.
_RESERVED_ALGO_KEYS = {"policy", "env", "seed", "device", "verbose", "tensorboard_log"}
#: ``policy_kwargs`` entries a config may give (activation functions by name).
_POLICY_KWARGS = {"net_arch", "activation_fn", "ortho_init", "share_features_extractor"}
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
    checkpoint_freq: int = 50_000
    bc_teacher: str | None = None
    bc_episodes: int = 20
    bc_epochs: int = 5
    regimes: list[str] = field(default_factory=lambda: ["bursty"])
    trace: str | None = None
    trace_format: str = "auto"
    trace_span_s: list[float] | None = None
    window_s: float = 600.0
    rate_scale: float | None = None
    target_utilization: float | None = None
    sidecar: str | None = None
    calibration: str | None = None
    budgets_per_hour: list[float] | None = None
    observation: str | None = None
    env_params: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] | None = None

    @property
    def label(self) -> str:
        """The run's regime label: the regime, ``a+b`` for a mix, ``replay:STEM`` for a
        trace (recorded as ``regime`` in meta.json, checked by ``--resume``)."""
        if self.trace is not None:
            return f"replay:{Path(self.trace).stem}"
        return "+".join(self.regimes)

    def record(self) -> dict[str, Any]:
        """The resolved configuration as JSON-ready data (for meta.json)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        out["label"] = self.label
        return out


def _where(path: str, table: str, key: str) -> str:
    return f"{path}: [{table}] {key}"


def _check_type(path: str, table: str, key: str, value: Any, want) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    ok = isinstance(value, wants) and not (isinstance(value, bool) and bool not in wants)
    if not ok:
        label = {"int": "an integer", "float": "a number", "str": "a string", "list": "a list"}
        names = (
            "a number"
            if set(wants) == {int, float}
            else " or ".join(label.get(w.__name__, w.__name__) for w in wants)
        )
        raise ConfigError(f"{_where(path, table, key)} must be {names}, got {value!r}")


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

    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: the config file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return data, {"path": str(p), "sha256": hashlib.sha256(raw).hexdigest(), "text": text}


def _algo_kwargs(algo: str) -> set[str]:
    from diloco_gym.rl.train import _algo_class

    params = inspect.signature(_algo_class(algo).__init__).parameters
    return {n for n in params if n not in ("self", "_init_setup_model")} - _RESERVED_ALGO_KEYS


def validate_hyperparameters(algo: str, hp: dict[str, Any], where: str = "[algo]") -> None:
    """Check an ``[algo]`` table against the SB3 class's keyword arguments.

    Raises:
        ConfigError: an unknown or reserved key, a value of the wrong kind, or a bad
            ``policy_kwargs`` entry (the message names ``where`` and the key).
    """
    valid = _algo_kwargs(algo)
    for key, value in hp.items():
        if key in _RESERVED_ALGO_KEYS:
            raise ConfigError(f"{where} {key}: set by train itself, not a hyperparameter")
        if key not in valid:
            raise ConfigError(
                f"{where} {key}: unknown hyperparameter of {algo}; "
                f"valid: {', '.join(sorted(valid))}"
            )
        if key == "policy_kwargs":
            if not isinstance(value, dict):
                raise ConfigError(f"{where} policy_kwargs must be a table, got {value!r}")
            for k, v in value.items():
                if k not in _POLICY_KWARGS:
                    raise ConfigError(
                        f"{where} policy_kwargs.{k}: not supported; valid: "
                        f"{', '.join(sorted(_POLICY_KWARGS))}"
                    )
                if k == "activation_fn" and v not in _ACTIVATIONS:
                    raise ConfigError(
                        f"{where} policy_kwargs.activation_fn: {v!r}; "
                        f"valid: {', '.join(_ACTIVATIONS)}"
                    )
                if k == "net_arch" and not (
                    isinstance(v, list)
                    and v
                    and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
                ):
                    raise ConfigError(
                        f"{where} policy_kwargs.net_arch must be a list of positive "
                        f"integers, got {v!r}"
                    )
        elif isinstance(value, (dict, list)):
            raise ConfigError(f"{where} {key}: expected a number, string or boolean, got {value!r}")


def policy_kwargs_for_sb3(hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` with ``policy_kwargs.activation_fn`` names turned into torch classes."""
    pk = hp.get("policy_kwargs")
    if not isinstance(pk, dict) or "activation_fn" not in pk:
        return dict(hp)
    import torch

    names = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU}
    names["leaky_relu"] = torch.nn.LeakyReLU
    return {**hp, "policy_kwargs": {**pk, "activation_fn": names[pk["activation_fn"]]}}


def _number_list(path: str, key: str, value: list) -> list[float]:
    if not value:
        raise ConfigError(f"{_where(path, 'env', key)}: give at least one budget")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(
                f"{_where(path, 'env', key)}: budgets must be positive numbers, got {v!r}"
            )
        out.append(float(v))
    if len(set(out)) != len(out):
        raise ConfigError(f"{_where(path, 'env', key)}: each budget once, got {value}")
    return out


def _parse_env(path: str, env: dict[str, Any], cfg: TrainConfig) -> None:
    for key, value in env.items():
        if key in ENV_KEYS:
            _check_type(path, "env", key, value, ENV_KEYS[key])
        elif key in _PARAM_FIELDS:
            default = _PARAM_FIELDS[key].default
            want: Any = (
                bool
                if isinstance(default, bool)
                else int
                if isinstance(default, int)
                else (int, float)
            )
            _check_type(path, "env", key, value, want)
            cfg.env_params[key] = value
        elif key == "merge_budget":
            raise ConfigError(
                f"{_where(path, 'env', key)}: give budgets_per_hour or budgets_per_10min "
                f"(converted to merges per episode)"
            )
        else:
            raise ConfigError(
                f"{_where(path, 'env', key)}: unknown key; valid: "
                f"{', '.join(sorted(set(ENV_KEYS) | set(_PARAM_FIELDS)))}"
            )
    if "regime" in env and "regimes" in env:
        raise ConfigError(f"{path}: [env] give regime or regimes, not both")
    if "regime" in env:
        cfg.regimes = [env["regime"]]
    if "regimes" in env:
        regs = env["regimes"]
        if not regs or not all(isinstance(r, str) for r in regs):
            raise ConfigError(f"{_where(path, 'env', 'regimes')} must be a non-empty list of names")
        cfg.regimes = list(regs)
    if "budgets_per_hour" in env and "budgets_per_10min" in env:
        raise ConfigError(f"{path}: [env] give budgets_per_hour or budgets_per_10min, not both")
    if "budgets_per_hour" in env:
        cfg.budgets_per_hour = _number_list(path, "budgets_per_hour", env["budgets_per_hour"])
    if "budgets_per_10min" in env:
        per_10 = _number_list(path, "budgets_per_10min", env["budgets_per_10min"])
        cfg.budgets_per_hour = [6.0 * b for b in per_10]
    for key in ("trace", "trace_format", "sidecar", "calibration", "observation"):
        if key in env:
            setattr(cfg, key, env[key])
    for key in ("window_s", "rate_scale", "target_utilization"):
        if key in env:
            setattr(cfg, key, float(env[key]))
    if "trace_span_s" in env:
        span = env["trace_span_s"]
        if (
            len(span) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in span)
            or not 0 <= span[0] < span[1]
        ):
            raise ConfigError(
                f"{_where(path, 'env', 'trace_span_s')} must be [start, end] seconds with "
                f"0 <= start < end, got {span!r}"
            )
        cfg.trace_span_s = [float(span[0]), float(span[1])]


def parse_config(data: dict[str, Any], path: str = "<config>") -> TrainConfig:
    """A :class:`TrainConfig` from a parsed config file (before flags).

    Raises:
        ConfigError: an unknown table or key, or a value of the wrong kind (one line
            naming ``path``, the table and the key).
    """
    cfg = TrainConfig()
    for table in data:
        if table not in ("train", "env", "algo"):
            raise ConfigError(f"{path}: unknown table [{table}]; valid: [train], [env], [algo]")
        if not isinstance(data[table], dict):
            raise ConfigError(f"{path}: {table} must be a table ([{table}])")
    for key, value in data.get("train", {}).items():
        if key not in TRAIN_KEYS:
            raise ConfigError(
                f"{_where(path, 'train', key)}: unknown key; valid: {', '.join(TRAIN_KEYS)}"
            )
        _check_type(path, "train", key, value, TRAIN_KEYS[key])
        setattr(cfg, key, value)
    _parse_env(path, data.get("env", {}), cfg)
    cfg.hyperparameters = dict(data.get("algo", {}))
    return cfg


def check_config(cfg: TrainConfig, path: str = "<config>") -> None:
    """Check a resolved configuration (after flags) as a whole.

    Raises:
        ConfigError: an invalid value or combination, naming ``path`` and the key.
    """
    from diloco_gym.rl.train import ALGOS, VEC_ENVS
    from diloco_gym.rl.wrappers import OBS_TRANSFORMS

    if cfg.algo not in ALGOS:
        raise ConfigError(f"{path}: algo {cfg.algo!r} is unknown; valid: {', '.join(ALGOS)}")
    for key in ("timesteps",):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{path}: {key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.n_envs is not None and cfg.n_envs < 1:
        raise ConfigError(f"{path}: n_envs must be >= 1, got {cfg.n_envs}")
    for key in ("eval_episodes", "eval_freq", "checkpoint_freq"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: {key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.vec_env is not None and cfg.vec_env not in VEC_ENVS:
        raise ConfigError(
            f"{path}: vec_env {cfg.vec_env!r} is unknown; valid: {', '.join(VEC_ENVS)}"
        )
    if cfg.trace is None:
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
    else:
        if cfg.sidecar is not None and cfg.sidecar not in REGIMES:
            raise ConfigError(
                f"{path}: sidecar {cfg.sidecar!r} is not a regime; valid: {', '.join(REGIMES)}"
            )
        if cfg.rate_scale is not None and cfg.target_utilization is not None:
            raise ConfigError(f"{path}: give rate_scale or target_utilization, not both")
    for key in ("window_s", "rate_scale", "target_utilization"):
        v = getattr(cfg, key)
        if v is not None and not v > 0:
            raise ConfigError(f"{path}: {key} must be a positive number, got {v}")
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
    try:
        EnvParams(**cfg.env_params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [env] {exc}") from None
    validate_hyperparameters(cfg.algo, cfg.hyperparameters, where=f"{path}: [algo]")
    if cfg.bc_teacher is not None:
        from agents.registry import AGENTS

        if cfg.bc_teacher not in AGENTS:
            raise ConfigError(
                f"{path}: [train] bc_teacher {cfg.bc_teacher!r} is not an agent; valid: "
                f"{', '.join(AGENTS)}"
            )
        if cfg.budgets_per_hour is None:
            raise ConfigError(
                f"{path}: [train] bc_teacher needs budgets (a budget-conditioned run)"
            )
        if cfg.bc_teacher == "offline-oracle":
            raise ConfigError(f"{path}: [train] bc_teacher must be deployable, not the oracle")
    if cfg.bc_episodes < 1 or cfg.bc_epochs < 1:
        raise ConfigError(f"{path}: [train] bc_episodes and bc_epochs must be >= 1")


@dataclass(frozen=True)
class EnvSpec:
    """One kind of training environment: a regime (or a trace replay) and a budget.

    Attributes:
        label: the regime's name (or ``replay:STEM``).
        regime: what :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` takes as ``regime``.
        sidecar: the sidecar (``None``: the regime's own).
        merge_budget: merges per episode (``None``: free budget).
        budget_per_hour: the budget as given, merges per hour.
    """

    label: str
    regime: Any
    sidecar: Any
    merge_budget: int | None
    budget_per_hour: float | None

    def make(self, env_params: dict[str, Any] | None = None):
        """A fresh :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` of this spec."""
        from diloco_gym.envs.env import DiLoCoSyncEnv

        kw = dict(env_params or {})
        if self.merge_budget is not None:
            kw["merge_budget"] = self.merge_budget
        if self.sidecar is not None:
            kw["sidecar"] = self.sidecar
        return DiLoCoSyncEnv(regime=self.regime, **kw)

    def record(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "merge_budget": self.merge_budget,
            "budget_per_hour": self.budget_per_hour,
        }


def _trace_regime(cfg: TrainConfig, path: str):
    from diloco_gym.eval import calibration as cal
    from diloco_gym.sim.loaders import load_trace
    from diloco_gym.sim.regimes import ReplayRegime, replay_rate_scale
    from diloco_gym.sim.traces import scale_rate, window

    assert cfg.trace is not None
    key = cfg.sidecar or "sync-heavy"
    fitted = cal.load_calibration(cfg.calibration).sidecar_for(key)
    sidecar = fitted or REGIMES[key].sidecar
    try:
        tr = load_trace(cfg.trace, cfg.trace_format)
        if cfg.trace_span_s is not None:
            start, end = cfg.trace_span_s
            tr = window(tr, start, min(end, tr.duration_s) - start)
        scale = replay_rate_scale(tr, sidecar, cfg.rate_scale, cfg.target_utilization)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: trace {cfg.trace}: {exc}") from None
    replayed = tr if scale == 1.0 else scale_rate(tr, tr.mean_rate_rps * scale)
    if replayed.duration_s < cfg.window_s:
        raise ConfigError(
            f"{path}: trace {cfg.trace} lasts {replayed.duration_s:.0f} s at rate scale "
            f"{scale:.3g}, shorter than window_s = {cfg.window_s:g}"
        )
    return ReplayRegime(replayed, duration_s=cfg.window_s, sidecar=sidecar, name=tr.name), sidecar


def build_env_specs(cfg: TrainConfig, path: str = "<config>") -> list[EnvSpec]:
    """The training env kinds of ``cfg``: one per (regime, budget), budgets converted to
    merges per episode with the frontier's rule and checked against the corridor.

    Raises:
        ConfigError: a budget outside the feasible range, two budgets that round to the
            same merges per episode, or an unreadable trace or calibration.
    """
    from diloco_gym.eval import calibration as cal
    from diloco_gym.eval.frontier import _episode_budget
    from diloco_gym.eval.seed_ranges import TRAIN_SEED_LOW

    bases: list[tuple[str, Any, Any]] = []
    if cfg.trace is not None:
        regime, sidecar = _trace_regime(cfg, path)
        bases.append((cfg.label, regime, sidecar))
    else:
        try:
            calib = cal.load_calibration(cfg.calibration)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: calibration: {exc}") from None
        for name in cfg.regimes:
            fitted = calib.sidecar_for(name)
            regime = REGIMES[name].with_load(fitted) if fitted is not None else name
            bases.append((name, regime, fitted))
    specs: list[EnvSpec] = []
    for label, regime, sidecar in bases:
        if cfg.budgets_per_hour is None:
            specs.append(EnvSpec(label, regime, sidecar, None, None))
            continue
        probe = EnvSpec(label, regime, sidecar, None, None).make(cfg.env_params)
        probe.reset(seed=TRAIN_SEED_LOW)
        ep = probe.episode
        assert ep is not None
        seen: dict[int, float] = {}
        for b in cfg.budgets_per_hour:
            try:
                m = _episode_budget(b, ep.trace.duration_s, ep.n_decisions, probe.params)
            except ValueError as exc:
                raise ConfigError(f"{path}: [env] budgets: {exc}") from None
            if m in seen:
                raise ConfigError(
                    f"{path}: [env] budgets {seen[m]:g} and {b:g} merges/h are both {m} "
                    f"merges per {ep.trace.duration_s:g} s episode; give distinct budgets"
                )
            seen[m] = b
            specs.append(EnvSpec(label, regime, sidecar, m, b))
    return specs
