"""Tests for diloco_gym/eval/scorer.py: the exact scorer (EpisodeScorer) against the whole
replay, its reuse and its bounded-memory paths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from protocol_helpers import high_load_regime

import diloco_gym
from diloco_gym.envs.schedule import schedule_summary
from diloco_gym.eval import protocol
from diloco_gym.eval.scorer import EpisodeScorer, MixedScorer
from diloco_gym.sim import schedules


@pytest.mark.parametrize("busy", [17.0, 24.0])
def test_episode_scorer_equals_the_full_replay(busy):
    """The windowed exact replay equals replaying the whole episode, at the default load
    (where it is proven additive) and with 24 req/s bursts (where merges interact)."""
    env = diloco_gym.DiLoCoSyncEnv(regime=high_load_regime(busy))
    gaps, replayed = [], 0
    for seed in (0, 1):
        env.reset(seed=seed)
        ep, p, sc = env.episode, env.params, env.sidecar
        scorer = EpisodeScorer(ep, p, sc)
        for m in (8, 16, 30):
            sch = schedules.sample_uniform(
                ep.n_decisions, p.h_min, p.h_max, m, 150, np.random.default_rng([seed, m])
            )
            got = scorer.score(sch)
            np.testing.assert_allclose(
                got.exact_pct, protocol.replay_full(ep, sch, p, sc), rtol=0, atol=1e-9
            )
            ref = schedule_summary(ep, sch[0].tolist(), p, sc)["sync_excess_pct"]
            assert got.exact_pct[0] == pytest.approx(ref, abs=1e-9)
            np.testing.assert_allclose(
                got.additive_pct, ep.merge_cost[sch].sum(axis=1) * ep.pct_per_request
            )
            gaps.append(np.abs(got.exact_pct - got.additive_pct).max())
            replayed += int(got.replayed.sum())
            if scorer.episode_proven:
                assert not got.replayed.any()
                np.testing.assert_array_equal(got.exact_pct, got.additive_pct)
    if busy == 17.0:
        assert max(gaps) == 0.0 and replayed == 0
    else:  # the interacting path was exercised and additive scoring would be wrong
        assert replayed > 100 and max(gaps) > 1.0


def test_scorer_is_reused_only_for_the_same_episode():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=3)
    scorer = EpisodeScorer(env.episode, env.params, env.sidecar)
    env.reset(seed=3)
    assert scorer.matches(env.episode)
    env.reset(seed=4)
    assert not scorer.matches(env.episode)
    with pytest.raises(ValueError, match="decisions must be in"):
        scorer.score(np.array([[env.episode.n_decisions]]))


def test_episode_scorer_bounded_memory_paths_agree(monkeypatch):
    """An hour-long high-load episode, scored with the default grid and with a grid so
    small that every replay is split into blocks: both equal the whole-episode replay."""

    env = diloco_gym.DiLoCoSyncEnv(
        regime=dataclasses.replace(high_load_regime(24.0), duration_s=3600.0)
    )
    env.reset(seed=1)
    ep, p, sc = env.episode, env.params, env.sidecar
    m = ep.n_decisions // 40
    sch = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, m, 40, np.random.default_rng(0)
    )
    full = protocol.replay_full(ep, sch, p, sc)
    big = EpisodeScorer(ep, p, sc)
    got = big.score(sch)
    np.testing.assert_allclose(got.exact_pct, full, rtol=0, atol=1e-9)
    assert got.replayed.any() and not big.episode_proven
    from diloco_gym.eval import scorer as scorer_module

    monkeypatch.setattr(scorer_module, "_GRID_MAX", 3000)
    small = EpisodeScorer(ep, p, sc)
    np.testing.assert_array_equal(small.drain_bins, big.drain_bins)
    np.testing.assert_array_equal(small.iso_excess, big.iso_excess)
    np.testing.assert_array_equal(small.score(sch).exact_pct, got.exact_pct)


def test_a_mixed_scorer_of_one_part_is_that_scorer():
    env = diloco_gym.DiLoCoSyncEnv(regime=high_load_regime(24.0))
    env.reset(seed=0)
    ep, p, sc = env.episode, env.params, env.sidecar
    one = EpisodeScorer(ep, p, sc)
    mixed = MixedScorer([one], np.zeros(ep.n_decisions, dtype=np.int64))
    sch = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, 16, 150, np.random.default_rng(2)
    )
    a, b = one.score(sch), mixed.score(sch)
    assert not mixed.episode_proven and b.replayed.any()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("busy", [17.0, 24.0])
def test_a_mixed_scorer_equals_the_full_replay_with_each_merges_own_window(busy):
    """Merges of two kinds (another slowdown and a longer window), by decision: the mixed
    scorer equals the whole-episode replay of the schedule with each merge's own episode
    parameters, where merges are isolated and where they interact."""
    env = diloco_gym.DiLoCoSyncEnv(regime=high_load_regime(busy))
    env.reset(seed=1)
    ep, p, sc = env.episode, env.params, env.sidecar
    p2 = dataclasses.replace(p, merge_seconds=p.merge_seconds * 1.5)
    sc2 = dataclasses.replace(sc, sync_slowdown=sc.sync_slowdown * 1.4)
    ep2 = dataclasses.replace(ep, params=p2, sidecar=sc2)
    kind = np.random.default_rng(5).integers(0, 2, ep.n_decisions)
    mixed = MixedScorer([EpisodeScorer(ep, p, sc), EpisodeScorer(ep2, p2, sc2)], kind)
    sch = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, 20, 40, np.random.default_rng(3)
    )
    got = mixed.score(sch)
    for row, exact in zip(sch, got.exact_pct, strict=True):
        per_sync = [ep2 if kind[d] else ep for d in row]
        ref = schedule_summary(ep, row.tolist(), p, sc, per_sync)["sync_excess_pct"]
        assert exact == pytest.approx(ref, abs=1e-9)
    np.testing.assert_array_equal(
        got.additive_pct,
        np.where(kind == 1, ep2.merge_cost, ep.merge_cost)[sch].sum(axis=1) * ep.pct_per_request,
    )
    if busy == 24.0:  # the interacting path was exercised
        assert got.replayed.sum() > 10 and not mixed.episode_proven


def test_a_mixed_scorers_parts_must_score_one_episode():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=3)
    a = EpisodeScorer(env.episode, env.params, env.sidecar)
    env.reset(seed=4)
    b = EpisodeScorer(env.episode, env.params, env.sidecar)
    with pytest.raises(ValueError, match="one episode's requests"):
        MixedScorer([a, b], np.zeros(env.episode.n_decisions, dtype=np.int64))
