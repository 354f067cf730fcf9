"""The compiled episode build: a batch gives each episode exactly its batch of one."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.episode import episode_core, episode_core_batch
from diloco_gym.envs.kernel import synthetic_draws
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import regimes
from diloco_gym.sim.sidecar import cost_queue, cost_queue_into


@pytest.mark.parametrize("name", ["bursty", "sync-heavy", "non-periodic"])
def test_from_raw_batch_equals_each_draw(name: str) -> None:
    reg = regimes.get_regime(name)
    raws = [reg.draw_raw(np.random.default_rng(s)) for s in range(5)]
    arrivals, prompt, output, counts, pressure = reg.from_raw(raws, np.float64)
    assert counts.sum() == arrivals.size == prompt.size == output.size
    ends = np.cumsum(counts)
    for e, s in enumerate(range(5)):
        one = reg.draw(np.random.default_rng(s), np.float64)
        lo, hi = ends[e] - counts[e], ends[e]
        for got, want in zip(
            (arrivals[lo:hi], prompt[lo:hi], output[lo:hi], pressure[e, 0], pressure[e, 1]),
            one,
            strict=True,
        ):
            np.testing.assert_array_equal(got, want)
    trace = reg(np.random.default_rng(3))  # the generator's Trace: the same draws as ints
    np.testing.assert_array_equal(trace.prompt_tokens, prompt[ends[2] : ends[3]].astype(np.int64))
    assert np.all(np.diff(arrivals[: counts[0]]) >= 0) and arrivals[: counts[0]].max() < 600.0


def test_episode_core_batch_flat_and_cost_queue_into_match_batches_of_one() -> None:
    reg = regimes.get_regime("bursty")
    params, sc = EnvParams(), reg.sidecar
    a, p, o, counts, pr, _ = synthetic_draws(reg, [0, 1, 2], lrn.LearnerParams())
    c = episode_core_batch(a, p, o, pr[:, 0], pr[:, 1], reg.duration_s, params, sc, counts=counts)
    size = c.pressure_bin.shape[1] + 40
    rows = np.array([2, 0, 1])  # episode e into row rows[e]
    q = cost_queue(
        c.base_s, c.req_bin, c.violated, c.m0, c.s, sc, params.step_seconds, size,
        counts=counts, m0_bins=params.decision_interval,
    )  # fmt: skip
    keys = ("s", "d", "ptr", "rbin", "base", "m0")
    shuffled = q._replace(**{k: np.zeros_like(getattr(q, k)) for k in keys})  # no stale rows
    cost_queue_into(
        shuffled, rows, c.base_s, c.req_bin, c.violated, c.m0, c.s, sc, params.step_seconds,
        size, counts,
    )  # fmt: skip
    ends = np.cumsum(counts)
    for e in range(3):
        lo, hi = ends[e] - counts[e], ends[e]
        one = episode_core(
            a[lo:hi], p[lo:hi], o[lo:hi], pr[e, 0], pr[e, 1], reg.duration_s, params, sc
        )
        np.testing.assert_array_equal(c.exo[e], one.exo)
        np.testing.assert_array_equal(c.s[e], one.s)
        np.testing.assert_array_equal(c.latency[lo:hi], one.latency)
        for key in keys:
            np.testing.assert_array_equal(getattr(shuffled, key)[rows[e]], getattr(q, key)[e])
    assert not np.array_equal(q.s[0], q.s[1])  # the rows differ, so the placement is tested
