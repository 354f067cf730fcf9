"""The kinds of env a training run learns on, from its configuration: one per (regime or
trace, budget), or per fleet budget.

:class:`EnvSpec` is a regime (or a trace replay) with a budget, :class:`FleetEnvSpec` a
fleet file (``DiLoCoFleet-v1``, docs/fleet.md) with a budget; both build a fresh,
unwrapped env with ``make(env_params)`` (a
:class:`~diloco_gym.rl.train_envs.TrainEnvKind`). :func:`build_env_specs` converts a
config's budgets to merges (fragment syncs on a fleet) per episode with the frontier's
rule and checks them against the corridor of a probe episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diloco_gym.rl.config import ConfigError, TrainConfig
from diloco_gym.sim.regimes import REGIMES

__all__ = ["EnvSpec", "FleetEnvSpec", "build_env_specs"]


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


@dataclass(frozen=True)
class FleetEnvSpec:
    """One kind of fleet training env: a fleet file (``DiLoCoFleet-v1``) and a budget.

    Attributes:
        fleet: the fleet configuration file (TOML).
        merge_budget: fragment syncs per episode (``None``: free budget).
        budget_per_hour: the budget as given, syncs per hour (``None``: given per episode).
    """

    fleet: str
    merge_budget: int | None
    budget_per_hour: float | None = None

    @property
    def label(self) -> str:
        """``fleet:STEM``, the run's label."""
        return f"fleet:{Path(self.fleet).stem}"

    def make(self, env_params: dict[str, Any] | None = None) -> Any:
        """A fresh fleet env of this fleet with this budget and the ``env_params`` overrides
        of the fleet file's ``[env]`` table: a
        :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv`, or with per-site timing a
        :class:`~diloco_gym.envs.fleet_rounds.DiLoCoFleetRoundsEnv`."""
        from diloco_gym.envs.fleet_rounds import make_fleet_env

        kw = dict(env_params or {})
        if self.merge_budget is not None:
            kw["merge_budget"] = self.merge_budget
        return make_fleet_env(fleet=self.fleet, **kw)

    def record(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "fleet": self.fleet,
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


def build_env_specs(cfg: TrainConfig, path: str = "<config>") -> list[Any]:
    """The training env kinds of ``cfg``: one per (regime, budget), or per fleet budget;
    budgets converted to merges per episode with the frontier's rule and checked against
    the corridor.

    Raises:
        ConfigError: a budget outside the feasible range, two budgets that round to the
            same merges per episode, an unreadable trace, calibration or fleet file, or a
            fleet with per-site timing.
    """
    from diloco_gym.eval import calibration as cal

    if cfg.fleet is not None:
        return _fleet_specs(cfg, path)
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
    specs: list[Any] = []
    for label, regime, sidecar in bases:
        if cfg.budgets_per_hour is None:
            specs.append(EnvSpec(label, regime, sidecar, None, None))
            continue
        probe = _probe(EnvSpec(label, regime, sidecar, None, None), cfg, path, "")
        specs += [
            EnvSpec(label, regime, sidecar, m, b)
            for m, b in _episode_budgets(probe, cfg.budgets_per_hour, path, "merges")
        ]
    return specs


def _fleet_specs(cfg: TrainConfig, path: str) -> list[Any]:
    """A fleet run's env kinds: the fleet at each budget (fragment syncs per episode)."""
    from diloco_gym.envs.fleet_rounds import fleet_timing

    assert cfg.fleet is not None
    where = f"fleet {cfg.fleet}: "
    from diloco_gym.agents.fleet_rounds import split_rule
    from diloco_gym.envs.fleet import require_fixed_precision

    rounds = fleet_timing(cfg.fleet) == "rounds"  # an unreadable file answers "instant"
    if rounds and cfg.algo == "dqn":
        raise ConfigError(
            f"{path}: [env] {where}timing = 'rounds' gives one action per site (MultiBinary), "
            f"which dqn does not take; use ppo or maskable-ppo"
        )
    if not rounds and cfg.bc_teacher is not None and split_rule(cfg.bc_teacher)[1] != "together":
        raise ConfigError(
            f"{path}: [train] bc_teacher {cfg.bc_teacher!r}: the '+own' site rule needs a "
            f"fleet with timing = 'rounds'"
        )

    spec = FleetEnvSpec(cfg.fleet, None)
    probe = _probe(spec, cfg, path, where)  # the fleet's sites and corridor fit its episode
    try:  # validation scores one precision per sync, as the report does
        require_fixed_precision(probe.fleet, "fleet training")
    except ValueError as exc:
        raise ConfigError(f"{path}: [env] {where}{exc}") from None
    if cfg.budgets_per_hour is None:
        return [spec]
    return [
        FleetEnvSpec(cfg.fleet, m, b)
        for m, b in _episode_budgets(probe, cfg.budgets_per_hour, path, "fragment syncs")
    ]


def _probe(spec: Any, cfg: TrainConfig, path: str, where: str) -> Any:
    """``spec``'s env reset at the first training seed: an ``[env]`` value that fails only
    with an episode (a step too long for it) is a config error here, not at training."""
    from diloco_gym.eval.seed_ranges import TRAIN_SEED_LOW

    try:
        probe = spec.make(cfg.env_params)
        probe.reset(seed=TRAIN_SEED_LOW)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: [env] {where}{' '.join(str(exc).split())}") from None
    return probe


def _episode_budgets(
    probe: Any, budgets_per_hour: list[float], path: str, unit: str
) -> list[tuple[int, float]]:
    """``(per episode, per hour)`` of each budget on ``probe``'s episode, checked."""
    from diloco_gym.eval.units import episode_budget

    ep = probe.episode
    assert ep is not None
    seen: dict[int, float] = {}
    for b in budgets_per_hour:
        try:
            m = episode_budget(b, ep.trace.duration_s, ep.n_decisions, probe.params)
        except ValueError as exc:
            raise ConfigError(f"{path}: [env] budgets: {exc}") from None
        if m in seen:
            raise ConfigError(
                f"{path}: [env] budgets {seen[m]:g} and {b:g} {unit}/h are both {m} "
                f"{unit} per {ep.trace.duration_s:g} s episode; give distinct budgets"
            )
        seen[m] = b
    return [(m, b) for m, b in seen.items()]
