"""The protocol's statistical units: seeds of a synthetic regime, or windows of a trace.

One home for what the report, the frontier and the report's cells share: :class:`Unit` (an
env and a seed; its episode is built once for every agent and the scoring),
:func:`synthetic_units` and :func:`trace_units` (the units of one report setting, with the
load's description), :func:`trace_effect_sizes` (the calibration check on replayed windows)
and :func:`episode_budget` (merges per episode for a budget in merges per hour).

With a learner calibration (``config.learner_calibration``, ``--learner-calibration``) the
units' envs use its learner model (:func:`unit_learners`): the learner observations and the
optional progress reward an agent sees are those of the calibrated surrogate, as in a
training run whose config names the same file. The serving side of an episode (its trace,
the sidecar, the scoring) does not depend on the learners: the episode's requests are drawn
before its learner throughputs, from the same seed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import Episode, episode_from_seed, min_episode_seconds
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.schedule import replay_schedule
from diloco_gym.eval import calibration as cal
from diloco_gym.sim.learners import LearnerParams
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.schedules import budget_range
from diloco_gym.sim.sidecar import SidecarParams


class UnitOptions(Protocol):
    """The settings the units are built from (:class:`~diloco_gym.eval.report.ReportConfig`
    has them all; read-only: the configs are frozen)."""

    @property
    def seeds(self) -> int: ...
    @property
    def seed0(self) -> int: ...
    @property
    def rate_scale(self) -> float | None: ...
    @property
    def target_utilization(self) -> float | None: ...
    @property
    def trace(self) -> str | None: ...
    @property
    def trace_format(self) -> str: ...
    @property
    def window_s(self) -> float: ...
    @property
    def stride_s(self) -> float | None: ...
    @property
    def overlapping(self) -> bool: ...


@functools.lru_cache(maxsize=4)
def _calibrated_learners(path: str) -> LearnerParams:
    from diloco_gym.sim.learner_calibration import learner_params, load_learner_calibration

    return learner_params(load_learner_calibration(path))


def unit_learners(config: object) -> LearnerParams | None:
    """The learner model of the units' envs: the calibrated one of
    ``config.learner_calibration`` (a file, read once per process), or ``None`` (the env's
    default learners) without one. A config that has no such option (``diloco-gym run``'s)
    counts as without one."""
    path = getattr(config, "learner_calibration", None)
    if not path:
        return None
    return _calibrated_learners(str(path))


@dataclass
class Unit:
    """One statistical unit (episode): a seed of a synthetic regime or a trace window.

    ``env`` is where agents act; the episode itself is built by :meth:`episode`, directly
    from the env's generator and parameters (no env reset), once for every agent and the
    scoring.
    """

    env: DiLoCoSyncEnv
    seed: int
    fields: dict

    def episode(self) -> Episode:
        """The unit's episode (:func:`~diloco_gym.envs.episode.episode_from_seed` with the
        env's parameters)."""
        env = self.env
        return episode_from_seed(
            env.generator,
            self.seed,
            env.params,
            env.sidecar,
            env.learner_params,
            rate_rps=env.reward_rate_rps,
        )


def synthetic_units(
    config: UnitOptions, regime: str, fitted: SidecarParams | None
) -> tuple[list[Unit], dict]:
    """Seeds of a synthetic regime at the configured load, and the load's description."""
    base = REGIMES[regime]
    gen = base.with_load(fitted, config.rate_scale, config.target_utilization)
    env = DiLoCoSyncEnv(regime=gen, sidecar=fitted, learners=unit_learners(config))
    fields = {
        "unit": "seed",
        "window_start_s": np.nan,
        "window_end_s": np.nan,
        "independent": True,
        "independent_units": config.seeds,
        "verdict_unit": True,
    }
    units = [Unit(env, seed, fields) for seed in range(config.seed0, config.seed0 + config.seeds)]
    load = {
        "rate_scale": gen.mean_rate_rps / base.mean_rate_rps,
        "mean_rate_rps": gen.mean_rate_rps,
        "capacity_rps": gen.capacity_rps(env.sidecar),
        "utilization": gen.utilization(env.sidecar),
        "idle_violation_pct": gen.idle_violation_pct(env.sidecar),
    }
    return units, load


def trace_units(config: UnitOptions, sidecar: SidecarParams) -> tuple[list[Unit], dict]:
    """The trace's tiled windows at the configured load (one env and seed per window)."""
    from diloco_gym.sim.limits import LimitError
    from diloco_gym.sim.loaders import load_trace
    from diloco_gym.sim.regimes import (
        ReplayRegime,
        replay_rate_scale,
        trace_idle_violation_pct,
        trace_utilization,
    )
    from diloco_gym.sim.traces import TraceFormatError, scale_rate

    assert config.trace is not None  # called only for a trace report
    try:
        tr = load_trace(config.trace, config.trace_format)
    except MemoryError:
        raise TraceFormatError(config.trace, "out of memory while loading the trace") from None
    scale = replay_rate_scale(tr, sidecar, config.rate_scale, config.target_utilization)
    replayed = tr if scale == 1.0 else scale_rate(tr, tr.mean_rate_rps * scale)
    try:
        tiles = ReplayRegime(
            replayed, duration_s=config.window_s, sidecar=sidecar, name=tr.name
        ).tiles(config.stride_s)
    except LimitError as exc:
        raise LimitError(f"{config.trace}: {exc}") from None
    except ValueError as exc:
        min_s = min_episode_seconds(EnvParams(), sidecar)
        raise ValueError(
            f"{config.trace}: {exc} (the trace lasts {tr.duration_s:.0f} s, "
            f"{replayed.duration_s:.0f} s at rate scale {scale:.3g}: too short "
            f"for the window; an episode needs at least {min_s:.1f} s)"
        ) from None
    independent = not config.overlapping
    # Overlapping windows share requests: only a disjoint subset of them are independent
    # units. The test and the verdict use the windows picked greedily from the start (each
    # starts at or after the previous one's end); the others are descriptive only.
    picked, last_end = [], -np.inf
    for tile in tiles:
        assert tile.start_s is not None  # tiles() fixes every window's start
        picked.append(tile.start_s >= last_end - 1e-9)
        if picked[-1]:
            last_end = tile.start_s + config.window_s
    disjoint = int(sum(picked))
    units = []
    learners = unit_learners(config)
    from diloco_gym.eval.seed_ranges import check_test_seeds

    check_test_seeds(config.seed0, len(tiles), "window seeds (--seed0 + window index)")
    for i, tile in enumerate(tiles):
        # Window times in the file's own clock: a trace replayed ``scale`` times faster
        # compresses time by ``scale``.
        assert tile.start_s is not None  # tiles() fixes every window's start
        fields = {
            "unit": "window",
            "window_start_s": tile.start_s * scale,
            "window_end_s": (tile.start_s + config.window_s) * scale,
            "independent": independent,
            "independent_units": disjoint,
            "verdict_unit": bool(picked[i]),
        }
        env = DiLoCoSyncEnv(regime=tile, sidecar=sidecar, learners=learners)
        units.append(Unit(env, config.seed0 + i, fields))
    util = trace_utilization(replayed, sidecar)
    load = {
        "rate_scale": scale,
        "mean_rate_rps": replayed.mean_rate_rps,
        "capacity_rps": replayed.mean_rate_rps / util if util > 0 else np.inf,
        "utilization": util,
        "idle_violation_pct": trace_idle_violation_pct(replayed, sidecar),
        "trace_duration_s": tr.duration_s,
        "replayed_duration_s": replayed.duration_s,
        "windows": len(units),
        "window_s": config.window_s,
        "stride_s": config.stride_s or config.window_s,
        "independent": independent,
    }
    return units, load


def trace_effect_sizes(units: list[Unit]) -> dict:
    """Effect sizes of a fixed-256 schedule on the replayed windows, pooled (information:
    the calibration verdict is the sidecar's, not the trace's)."""
    from diloco_gym.sim.sidecar import ReplayResult, effect_sizes

    lat, act, prs = [], [], []
    for unit in units:
        env = unit.env
        ep = unit.episode()
        merges = cal.fixed_schedule(
            ep.n_decisions, 256 // env.params.decision_interval, env.params.h_min, env.params.h_max
        )
        res = replay_schedule(ep, merges, env.params, env.sidecar)
        lat.append(res.latency_s)
        act.append(res.sync_active)
        prs.append(res.pressure)
    pooled = ReplayResult(
        np.concatenate(lat), np.zeros(0, bool), np.concatenate(act), np.concatenate(prs)
    )
    return effect_sizes(pooled, units[0].env.sidecar.high_pressure)


def episode_budget(per_hour: float, duration_s: float, n: int, params) -> int:
    """Merges per episode for ``per_hour`` (rounded), checked against the feasible range
    (a non-finite budget, or one whose merges overflow, is refused the same way)."""
    exact = per_hour * duration_s / 3600.0
    if not -(2.0**62) < exact < 2.0**62:  # NaN, infinities, 1e308: no integer count
        raise ValueError(
            f"budget {per_hour:g} merges/h is not a finite number of merges in a "
            f"{duration_s:g} s episode"
        )
    m = int(round(exact))
    lo, hi = budget_range(n, params.h_min, params.h_max)
    if not lo <= m <= hi:
        to_h = 3600.0 / duration_s
        raise ValueError(
            f"budget {per_hour:g} merges/h is {m} merges in a {duration_s:g} s "
            f"episode, outside the feasible {lo}..{hi} "
            f"({lo * to_h:g}..{hi * to_h:g} merges/h)"
        )
    return m
