"""A realised schedule: its merge windows (``sync_mask``), its exact replay with per-sync
windows and slowdowns, and its summary."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv, EnvParams
from diloco_gym.envs.schedule import replay_schedule, schedule_summary, sync_mask


def _sync_mask_add_at(merges, n_bins, params):
    """The former ``sync_mask`` (a +1/-1 difference array and a cumulative sum)."""
    mask = np.zeros(n_bins + params.merge_steps)
    starts = np.asarray(merges, dtype=np.int64) * params.decision_interval
    if starts.size:
        delta = np.zeros(mask.size + 1)
        np.add.at(delta, starts, 1.0)
        np.add.at(delta, starts + params.merge_steps, -1.0)
        mask = np.cumsum(delta)[:-1]
    return np.minimum(mask[:n_bins], 1.0)


@pytest.mark.parametrize("merges", [[], [0], [3, 20, 40], [5, 6], [0, 535], [535], [-1, 10]])
def test_sync_mask_equals_the_difference_array(merges):
    """Overlapping windows, windows running past the end and negative indices alike."""
    p = EnvParams()
    n_bins = 536 * p.decision_interval
    np.testing.assert_array_equal(
        sync_mask(merges, n_bins, p), _sync_mask_add_at(merges, n_bins, p)
    )


def test_sync_mask_rejects_a_start_past_the_end_as_before():
    p = EnvParams()
    with pytest.raises(IndexError):
        sync_mask([10_000], 100, p)


@pytest.mark.parametrize("merges", [[], [0], [3, 20, 40], [0, 535]])
def test_sync_mask_with_uniform_widths_and_levels_is_the_plain_mask(merges):
    p = EnvParams()
    n_bins = 536 * p.decision_interval
    w = [p.merge_steps] * len(merges)
    np.testing.assert_array_equal(
        sync_mask(merges, n_bins, p, widths=w, levels=[1.0] * len(merges)),
        sync_mask(merges, n_bins, p),
    )


def test_sync_mask_per_merge_widths_and_levels():
    p = EnvParams()
    di = p.decision_interval
    mask = sync_mask([1, 4], 8 * di, p, widths=[2, 5], levels=[0.5, 2.0])
    want = np.zeros(8 * di)
    want[di : di + 2] = 0.5
    want[4 * di : 4 * di + 5] = 2.0
    np.testing.assert_array_equal(mask, want)
    # overlapping windows: the larger level holds; a window past the end is cut
    mask = sync_mask([0, 0], 3, p, widths=[2, 5], levels=[3.0, 1.0])
    np.testing.assert_array_equal(mask, [3.0, 3.0, 1.0])
    with pytest.raises(ValueError, match="one value per merge"):
        sync_mask([1, 2], 100, p, widths=[2])
    with pytest.raises(ValueError, match="widths >= 1"):
        sync_mask([1], 100, p, widths=[0])


def test_replay_with_per_sync_episodes_equal_to_the_env_is_the_plain_replay():
    """A per-sync episode list that repeats the episode's own window and slowdown replays
    bit for bit as the plain replay (the mask carries the slowdown, the sidecar 1)."""
    env = DiLoCoSyncEnv()
    env.reset(seed=3)
    ep = env.episode
    merges = [20, 90, 200]
    a = schedule_summary(ep, merges, env.params, env.sidecar)
    b = schedule_summary(ep, merges, env.params, env.sidecar, per_sync=[ep] * 3)
    assert a == b
    # a shorter, milder sync costs less
    mild = replace(
        ep,
        params=replace(env.params, merge_seconds=2.0),
        sidecar=replace(env.sidecar, sync_slowdown=env.sidecar.sync_slowdown / 4),
    )
    c = schedule_summary(ep, merges, env.params, env.sidecar, per_sync=[mild] * 3)
    assert c["sync_excess_requests"] <= a["sync_excess_requests"]
    assert c["sync_active_frac"] < a["sync_active_frac"]
    assert c["additive_excess_requests"] == sum(mild.merge_cost_at(d) for d in merges)
    with pytest.raises(ValueError, match="per_sync has 1 episodes for 3 merges"):
        schedule_summary(ep, merges, env.params, env.sidecar, per_sync=[ep])


def test_summary_of_no_merges_is_the_load_match():
    """With no merge the replay is the episode's no-merge baseline: zero sync-excess, exact
    and additive."""
    env = DiLoCoSyncEnv("sync-heavy")
    env.reset(seed=1)
    ep = env.episode
    res = replay_schedule(ep, [], env.params, env.sidecar)
    np.testing.assert_array_equal(res.violated, ep.baseline.violated)
    s = schedule_summary(ep, [], env.params, env.sidecar)
    assert s["merges"] == 0 and s["sync_excess_requests"] == 0
    assert s["additive_excess_requests"] == 0.0 and s["sync_excess_pct"] == 0.0


def test_summary_of_merges_counts_them_and_adds_their_isolated_costs():
    env = DiLoCoSyncEnv("sync-heavy")
    env.reset(seed=1)
    ep, merges = env.episode, [20, 100, 300]
    s = schedule_summary(ep, merges, env.params, env.sidecar)
    assert s["merges"] == 3
    assert s["additive_excess_requests"] == sum(ep.merge_cost_at(d) for d in merges)
    assert s["additive_excess_pct"] == s["additive_excess_requests"] * ep.pct_per_request
    base = ep.baseline.summary()
    assert s["sync_excess_requests"] == s["violated"] - base["violated"]


def test_summary_takes_the_no_merge_terms_from_the_baseline_summary():
    """The no-sync terms (read from the baseline's violations, without its latency
    percentiles) are exactly the baseline summary's, with the same types."""
    env = DiLoCoSyncEnv("bursty")
    for seed in (0, 3):
        env.reset(seed=seed)
        ep = env.episode
        base = ep.baseline.summary()
        s = schedule_summary(ep, [10, 200], env.params, env.sidecar)
        assert type(s["no_sync_violation_pct"]) is float
        assert s["no_sync_violation_pct"] == base["violation_pct"]
        assert s["sync_excess_pct"] == s["violation_pct"] - base["violation_pct"]
        assert type(s["sync_excess_requests"]) is int
        assert s["sync_excess_requests"] == s["violated"] - base["violated"]


@pytest.mark.parametrize("regime", ["bursty", "pressure-heavy", "sync-heavy"])
@pytest.mark.parametrize(
    "merges", [[], [0], [3, 20, 40], [5, 6], [7, 7], [0, 100, 535], [535], [3, 21, 39, 57]]
)
def test_the_one_call_summary_is_the_replay_summary_bit_for_bit(regime, merges):
    """The compiled one-call summary (``jit_stats.replay_summary_one``) gives exactly the
    values of the array replay's summary: counts, percentages and the three latency
    percentiles (compared with ``==``, not a tolerance), overlapping windows and merges at
    both ends included."""
    from diloco_gym.envs.schedule import _fused_summary

    env = DiLoCoSyncEnv(regime)
    env.reset(seed=11)
    ep = env.episode
    merges = [m for m in merges if m < ep.n_decisions]
    fused = _fused_summary(ep, merges, env.params, env.sidecar)
    want = replay_schedule(ep, merges, env.params, env.sidecar).summary()
    assert fused is not None
    assert fused == want
    assert [type(v) for v in fused.values()] == [type(v) for v in want.values()]


def test_the_one_call_summary_leaves_what_it_does_not_take_to_the_array_replay():
    """A schedule outside the episode (a negative or too late merge, a batch of schedules)
    is not taken by the one-call summary; the summary then replays it as before."""
    from diloco_gym.envs.schedule import _fused_summary

    env = DiLoCoSyncEnv("bursty")
    env.reset(seed=0)
    ep = env.episode
    for merges in ([-1, 10], [10_000], [[1, 20]]):
        assert _fused_summary(ep, merges, env.params, env.sidecar) is None
    with pytest.raises(IndexError):
        schedule_summary(ep, [10_000], env.params, env.sidecar)


@pytest.mark.parametrize("merges", [[], [3, 20, 40], [5, 6]])
def test_a_summary_without_percentiles_is_the_summary_less_them(merges):
    """``percentiles=False`` (the fleet's per-site summaries): the same values, bit for bit,
    without ``p50_ms``, ``p95_ms`` and ``p99_ms``."""
    env = DiLoCoSyncEnv("bursty")
    env.reset(seed=4)
    full = schedule_summary(env.episode, merges, env.params, env.sidecar)
    less = schedule_summary(env.episode, merges, env.params, env.sidecar, percentiles=False)
    assert {"p50_ms", "p95_ms", "p99_ms"} <= full.keys()
    assert less == {k: v for k, v in full.items() if k not in ("p50_ms", "p95_ms", "p99_ms")}
    assert list(less) == [k for k in full if k in less]  # the same order


@pytest.mark.parametrize("fleet", [None, "docs/examples/fleet-v1.toml", "docs/examples/fleet.toml"])
def test_site_summaries_are_each_sites_schedule_summary(fleet):
    """``site_summaries`` (every site's replay in one compiled call): each site's
    ``schedule_summary(..., percentiles=False)``, value for value, for the default fleet and
    fleets of sites of different sidecars (link shares, regimes), on schedules of none, one
    and many syncs, overlapping windows and the last decision included."""
    from pathlib import Path

    import gymnasium as gym

    import diloco_gym  # noqa: F401
    from diloco_gym.envs.schedule import site_summaries

    kw = {} if fleet is None else {"fleet": str(Path(__file__).parents[2] / fleet)}
    env = gym.make("DiLoCoFleet-v1", **kw).unwrapped
    rng = np.random.default_rng(0)
    for seed in range(3):
        ep = env.build_episode(seed)
        n = ep.n_decisions
        for merges in ([], [n - 1], [0, 1, 2], sorted(rng.choice(n, 30, replace=False).tolist())):
            costs = [[float(c) for c in rng.random(len(merges))] for _ in ep.sites]
            got = site_summaries(ep.sites, merges, env.params, env.setup.sidecars, costs)
            want = [
                schedule_summary(e, merges, env.params, sc, costs=c, percentiles=False)
                for e, sc, c in zip(ep.sites, env.setup.sidecars, costs, strict=True)
            ]
            assert got == want


def test_site_summaries_refuse_what_the_summary_refuses():
    """A sync past the episode's bins: the per-site summary's own error, not a count."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401
    from diloco_gym.envs.schedule import site_summaries

    env = gym.make("DiLoCoFleet-v1").unwrapped
    ep = env.build_episode(0)
    costs = [[0.0] for _ in ep.sites]
    with pytest.raises(IndexError):
        site_summaries(ep.sites, [10_000], env.params, env.setup.sidecars, costs)
