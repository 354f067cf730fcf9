"""What a run replays and when (:mod:`diloco_gym.live.plan`)."""

from __future__ import annotations

from diloco_gym.live.calibrate import (
    CalibrationConfig,
    plan_merges,
)
from diloco_gym.live.plan import level_name, level_share, phase_order


def test_plan_merges_fits_the_phase():
    cfg = CalibrationConfig(merge_seconds=8.0, gap_seconds=(8.0, 16.0), lead_seconds=2.0)
    plan = plan_merges(120.0, cfg)
    assert plan == plan_merges(120.0, cfg)  # seeded
    assert plan[0][0] == 2.0 and all(s + n <= 120.0 for s, n in plan)
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(plan, plan[1:], strict=False)]
    assert all(8.0 - 1e-9 <= g <= 16.0 + 1e-9 for g in gaps)
    assert len(plan_merges(5.0, cfg)) == 1  # a short phase still gets one merge


def test_phase_order_is_seeded_and_pairs_sync_with_control():
    cfg = CalibrationConfig(repeats=6, seed=4)
    order = phase_order(cfg)
    assert order == phase_order(cfg)
    for k in range(6):
        assert sorted(n for n, r in order if r == k) == ["control", "sync"]
    firsts = [order[2 * k][0] for k in range(6)]
    assert set(firsts) == {"sync", "control"}  # randomized within pairs, not fixed
    assert [n for n, _ in phase_order(CalibrationConfig(repeats=2, control=False))] == [
        "sync",
        "sync",
    ]


def test_phase_order_with_link_shares_permutes_every_phase_of_a_repeat():
    """With shares below 1 each repeat holds a control, a full-rate and one sync phase per
    share, in a seeded permutation; without them the order is the plain pairs' order."""
    cfg = CalibrationConfig(seed=5, repeats=4, link_shares=(1.0, 0.5, 0.25))
    order = phase_order(cfg)
    assert order == phase_order(cfg)  # seeded
    for k in range(4):
        names = [n for n, rep in order if rep == k]
        assert sorted(names) == ["control", "sync", "sync@0.25", "sync@0.5"]
    assert len({tuple(n for n, rep in order if rep == k) for k in range(4)}) > 1
    plain = phase_order(CalibrationConfig(seed=5, repeats=4))
    assert all(n in ("sync", "control") for n, _ in plain) and len(plain) == 8
    assert level_name(1.0) == "sync" and level_name(0.25) == "sync@0.25"
    assert level_share("sync@0.25") == 0.25 and level_share("sync") == 1.0
