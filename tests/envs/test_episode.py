"""Episodes: the same seed builds the same episode, the seed's draws and an explicit trace
build the same one, a batch gives each episode its batch of one, and too-short traces are
refused."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.episode import (
    Episode,
    build_episode,
    episode_core,
    episode_core_batch,
    episode_from_seed,
    episode_length,
    min_episode_seconds,
)
from diloco_gym.envs.kernel import episode_draws
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import nominal_rate_rps
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import regimes

_ARRAYS = ("exo", "throughputs", "base_s", "req_bin", "pressure_bin")


def _episode(regime: str, seed: int, params: EnvParams | None = None) -> Episode:
    reg = regimes.get_regime(regime)
    return episode_from_seed(reg, seed, params or EnvParams(), reg.sidecar, lrn.LearnerParams())


def _assert_same(a: Episode, b: Episode) -> None:
    assert a.n_decisions == b.n_decisions and a.seed == b.seed
    for name in _ARRAYS:
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    np.testing.assert_array_equal(a.baseline.latency_s, b.baseline.latency_s)
    np.testing.assert_array_equal(a.baseline.violated, b.baseline.violated)
    assert a.reward_per_request == b.reward_per_request


@pytest.mark.parametrize("regime", ["bursty", "non-periodic"])
def test_the_same_seed_builds_the_same_episode(regime):
    a, b = _episode(regime, 7), _episode(regime, 7)
    _assert_same(a, b)
    for d in (0, 40, a.n_decisions - 1):
        assert a.merge_cost_at(d) == b.merge_cost_at(d)
    c = _episode(regime, 8)
    assert not np.array_equal(a.exo, c.exo)
    assert not np.array_equal(a.throughputs, c.throughputs)


def test_an_episode_from_its_draws_is_the_episode_of_its_seed():
    """``episode_from_seed`` is ``build_episode`` on the seed's draws (the trace, then the
    throughputs, from one generator), and ``episode_draws`` is that order."""
    reg, params, lp = regimes.get_regime("bursty"), EnvParams(), lrn.LearnerParams()
    rng = np.random.default_rng(3)
    trace = reg(rng)
    rate = nominal_rate_rps(reg, params)
    built = build_episode(trace, params, reg.sidecar, lp, rng, seed=3, rate_rps=rate)
    _assert_same(built, _episode("bursty", 3))
    drawn_trace, thr = episode_draws(reg, 3, lp)
    np.testing.assert_array_equal(drawn_trace.arrival_s, trace.arrival_s)
    np.testing.assert_array_equal(thr, built.throughputs)


def test_lazy_merge_costs_equal_the_full_table():
    ep = _episode("sync-heavy", 2)
    ds = [0, 5, ep.n_decisions // 2, ep.n_decisions - 1]
    lazy = [ep.merge_cost_at(d) for d in ds]
    full = ep.merge_cost
    assert full.shape == (ep.n_decisions,) and not full.flags.writeable
    assert lazy == [float(full[d]) for d in ds]
    assert ep.pct_per_request == 100.0 / ep.n_requests


def test_batched_episode_core_equals_one_at_a_time():
    reg = regimes.get_regime("non-periodic")
    params = EnvParams()
    traces = [reg(np.random.default_rng(s)) for s in range(4)]
    c = episode_core_batch(
        [t.arrival_s for t in traces],
        [t.prompt_tokens for t in traces],
        [t.output_tokens for t in traces],
        np.stack([t.network for t in traces]),
        np.stack([t.checkpoint for t in traces]),
        reg.duration_s,
        params,
        reg.sidecar,
    )
    off = 0
    for e, t in enumerate(traces):
        one = episode_core(
            t.arrival_s,
            t.prompt_tokens,
            t.output_tokens,
            t.network,
            t.checkpoint,
            t.duration_s,
            params,
            reg.sidecar,
        )
        for name in ("exo", "pressure_dec", "pressure_bin", "m0", "s", "prefmin"):
            np.testing.assert_array_equal(getattr(c, name)[e], getattr(one, name), name)
        k = slice(off, off + t.num_requests)
        for name in ("base_s", "req_bin", "latency", "violated"):
            np.testing.assert_array_equal(getattr(c, name)[k], getattr(one, name), name)
        off += t.num_requests
    assert off == c.req_bin.size


def test_the_shortest_episode_and_a_too_short_trace():
    params, sidecar = EnvParams(), regimes.get_regime("bursty").sidecar
    min_s = min_episode_seconds(params, sidecar)
    assert episode_length(min_s, params, sidecar) == params.h_min + 1
    assert episode_length(600.0, params, sidecar) <= params.n_decisions(600.0)
    with pytest.raises(ValueError, match=r"trace 'tiny' of .* is too short"):
        episode_length(min_s - params.decision_seconds, params, sidecar, "tiny")
