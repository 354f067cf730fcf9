"""The paired schedule effects of a learner calibration (``diloco_gym/lm/effects.py``) on
synthetic runs whose effect is known."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.lm.effects import mapping_effects, paired_differences, schedule_effects


def _run(name, h, total, seed, final, role="fit", fragments=1, bits=32):
    return {
        "name": name,
        "role": role,
        "schedule": list(range(h, total + 1, h)),
        "fragments": fragments,
        "bits": bits,
        "seed": seed,
        "initial_loss": 5.5,
        "merge_losses": [4.0, final],
    }


def _runs(effect_per_doubling: float, seeds: int = 8, noise: float = 0.01) -> list[dict]:
    out = []
    for s in range(seeds):
        rng = np.random.default_rng(s)
        base = 2.6 + rng.normal(0, 0.05)  # the seed's own level: paired away
        for h in (2, 4, 8, 16, 32):
            final = base + effect_per_doubling * np.log2(h / 4) + rng.normal(0, noise)
            out.append(_run(f"fixed-{h}", h, 160, s, final))
        out.append(_run("fixed-4-F2", 4, 160, s, base + 1.0, fragments=2))  # not a plain run
        out.append(_run("fixed-6", 6, 160, s, base + 1.0))  # ends at 156: not comparable
        out.append(_run("map-fixed-8", 8, 320, s, base, role="mapping"))
        out.append(_run("map-fixed-32", 32, 320, s, base + 3 * effect_per_doubling, role="mapping"))
    return out


def test_paired_differences_are_per_seed_and_remove_the_seed_level():
    runs = _runs(0.02)
    d = paired_differences(runs, "fixed-16", "fixed-4")
    finals = {(r["name"], r["seed"]): r["merge_losses"][-1] for r in runs}
    by_hand = [finals[("fixed-16", s)] - finals[("fixed-4", s)] for s in range(8)]
    assert d["n"] == 8 and d["mean"] == pytest.approx(np.mean(by_hand))
    assert d["sd"] == pytest.approx(np.std(by_hand, ddof=1))
    assert d["sd"] < 0.03  # the seed level (sd 0.05) is gone
    assert d["ci_low"] <= d["mean"] <= d["ci_high"]
    ref = np.mean([finals[("fixed-4", s)] for s in range(8)])
    assert d["relative_pct"] == pytest.approx(100 * d["mean"] / ref)


def test_a_real_effect_is_detected_and_none_is_inconclusive():
    found = schedule_effects(_runs(0.02), (4, 16), target_relative=0.01)
    c = found["contrast"]
    assert c["name"] == "fixed-16" and c["reference"] == "fixed-4"
    assert c["mean"] == pytest.approx(0.04, abs=0.015) and c["p_value"] < 0.05
    assert found["power"]["verdict"].startswith("detected")
    assert [row["h"] for row in found["curve"]] == [2, 8, 16, 32]  # plain fixed runs only
    none = schedule_effects(_runs(0.0), (4, 16), target_relative=0.01)
    pw = none["power"]
    assert none["contrast"]["p_value"] > 0.05  # these seeds' noise gives p 0.73
    assert pw["verdict"].startswith("inconclusive") and "0.95 %" in pw["verdict"]
    assert pw["detectable_nats"] == pytest.approx(0.0249, abs=1e-4)
    assert 0.8 < pw["power_at_target"] < 0.9 and pw["seeds_needed"] == 8


def test_schedule_effects_need_the_corridor_ends():
    runs = [r for r in _runs(0.02) if r["name"] != "fixed-16"]
    with pytest.raises(ValueError, match="fixed-16"):
        schedule_effects(runs, (4, 16), 0.01)


def test_a_pair_needs_two_shared_seeds():
    runs = [r for r in _runs(0.02) if r["seed"] == 0]
    with pytest.raises(ValueError, match="share 1 seed"):
        paired_differences(runs, "fixed-16", "fixed-4")


def test_mapping_effects_take_the_check_runs_for_the_second_mapping():
    rows = mapping_effects(_runs(0.02), {32.0: (4, 16), 16.0: (8, 32)})
    main, check = rows
    assert (main["name"], main["reference"], main["budget"]) == ("fixed-16", "fixed-4", 160)
    assert (check["name"], check["reference"], check["budget"]) == (
        "map-fixed-32",
        "map-fixed-8",
        320,
    )
    assert check["mean"] == pytest.approx(0.06, abs=1e-9)
