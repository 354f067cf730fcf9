"""What a run replays and when (:mod:`diloco_gym.live.plan`)."""

from __future__ import annotations

from diloco_gym.live.calibrate import (
    CalibrationConfig,
    plan_merges,
)
from diloco_gym.live.plan import phase_order


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
