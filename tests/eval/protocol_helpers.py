"""What the protocol, scorer and oracle tests share (tests/eval/test_protocol.py,
test_scorer.py, test_oracle.py): short enumerable episodes and a high-load regime."""

from __future__ import annotations

import dataclasses

import numpy as np

import diloco_gym
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim.traces import Trace


def steady_env(rate: float, duration: float = 80.0):
    """A short steady trace at ``rate`` req/s on the sync-heavy sidecar, corridor 8..16
    decisions with 8 s merges: few enough schedules to enumerate them all."""
    return hot_instance(rate, 0, duration)


def high_load_regime(busy: float = 24.0):
    """Bursty load with bursts well above the sidecar's capacity (merge backlogs outlive
    H_min, so merges interact)."""

    from diloco_gym.sim.regimes import REGIMES

    return dataclasses.replace(REGIMES["bursty"], busy_rate_rps=busy)


def hot_instance(rate: float, seed: int, duration: float = 80.0):
    """:func:`steady_env`'s short enumerable episode with the arrivals of ``seed``."""

    from diloco_gym.sim.regimes import REGIMES

    reg = dataclasses.replace(REGIMES["sync-heavy"], quiet_rate_rps=rate, busy_rate_rps=rate)
    full = reg(np.random.default_rng(seed))
    keep = full.arrival_s < duration
    tr = Trace(
        full.arrival_s[keep],
        full.prompt_tokens[keep],
        full.output_tokens[keep],
        duration,
        network=full.network[: int(duration)],
        checkpoint=full.checkpoint[: int(duration)],
    )
    params = EnvParams(h_min_steps=64, h_max_steps=128, merge_seconds=8.0)
    env = diloco_gym.DiLoCoSyncEnv(regime=tr, params=params, sidecar=REGIMES["sync-heavy"].sidecar)
    env.reset(seed=seed)
    return env
