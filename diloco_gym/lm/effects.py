"""The schedule effects a learner calibration measured, compared within seeds.

Every schedule of a calibration runs with every seed, and a seed fixes the initial model
and every learner's batches whatever the schedule (common random numbers), so two
schedules are compared by their *paired* differences: the difference of their final
validation losses on each seed, with the seeds as the independent units.

* :func:`schedule_effects`: for every fixed interval ``H`` the design ran at full precision
  with one fragment, the paired difference of its final loss against fixed ``H_min`` (the
  corridor's short end), with a bootstrap interval, the paired t-test (the test the
  design's power is computed for) and, as a check that needs no normality, the exact
  sign-flip test of the report's protocol (:func:`diloco_gym.eval.protocol.paired_test`);
  the pre-stated contrast is fixed ``H_max`` against fixed ``H_min`` (the env's corridor
  ends), with the t-test's power for the stated target effect and the smallest effect the
  design detects (:mod:`diloco_gym.lm.power`).
* :func:`mapping_effects`: the same contrast at two mappings from inner steps to env steps,
  each run at a budget that covers one env episode at its mapping.

Relative changes are differences over the mean final loss of the reference schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["paired_differences", "schedule_effects", "mapping_effects", "ALPHA", "POWER"]

#: The test level and the power the design is stated for.
ALPHA = 0.05
POWER = 0.8


def _finals(runs: Sequence[Mapping[str, Any]], name: str) -> dict[int, float]:
    return {int(r["seed"]): float(r["merge_losses"][-1]) for r in runs if r["name"] == name}


def paired_differences(
    runs: Sequence[Mapping[str, Any]], name: str, reference: str
) -> dict[str, Any]:
    """``name`` minus ``reference`` per seed (the seeds both ran), with the mean, a
    bootstrap 95 % interval, the paired t-test's p (``p_value``), the exact sign-flip p
    (``sign_flip_p``, :func:`paired_test`, with the smallest p it can give, ``min_p``),
    the differences' standard deviation and the change relative to the
    reference's mean final loss (``relative_pct``, with its interval)."""
    from scipy.stats import ttest_rel

    from diloco_gym.eval.protocol import paired_test

    a, b = _finals(runs, name), _finals(runs, reference)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        raise ValueError(f"{name!r} and {reference!r} share {len(seeds)} seed(s); need >= 2")
    x = np.array([a[s] for s in seeds])
    y = np.array([b[s] for s in seeds])
    d = x - y
    test = paired_test(d, np.random.default_rng(0))
    ref = float(y.mean())
    sd = float(d.std(ddof=1))
    t_p = float(ttest_rel(x, y).pvalue) if sd > 0 else (1.0 if d.mean() == 0 else 0.0)
    return {
        "name": name,
        "reference": reference,
        "n": len(seeds),
        "seeds": seeds,
        "mean": test["mean"],
        "ci_low": test["ci_low"],
        "ci_high": test["ci_high"],
        "p_value": t_p,
        "sign_flip_p": test["p_value"],
        "min_p": test["min_p"],
        "sd": sd,
        "reference_loss": ref,
        "relative_pct": 100 * test["mean"] / ref,
        "relative_ci_pct": [100 * test["ci_low"] / ref, 100 * test["ci_high"] / ref],
    }


def _fixed_plain(runs: Sequence[Mapping[str, Any]], end: int | None = None) -> dict[int, str]:
    """Fixed-interval schedules at full precision with one fragment, ``{H: name}``; with
    ``end``, only those whose last merge is at that step (the same work merged: a fixed
    interval that does not divide the budget stops earlier and is not comparable)."""
    out: dict[int, str] = {}
    for r in runs:
        s = r["schedule"]
        if r["role"] == "mapping" or r["fragments"] != 1 or r["bits"] != 32 or len(s) < 1:
            continue
        if end is not None and s[-1] != end:
            continue
        gaps = np.diff([0, *s])
        if np.all(gaps == gaps[0]):
            out.setdefault(int(gaps[0]), r["name"])
    return out


def _power(contrast: dict[str, Any], target_relative: float) -> dict[str, Any]:
    """The power statement of the contrast: the target effect in nats/byte, the power the
    design had for it at the measured spread, the seeds it would need, the smallest
    effect detectable with :data:`POWER`, and the verdict."""
    from diloco_gym.lm.power import detectable_effect, paired_power, seeds_needed

    n, sd = contrast["n"], contrast["sd"]
    target = target_relative * contrast["reference_loss"]
    out: dict[str, Any] = {
        "alpha": ALPHA,
        "power": POWER,
        "target_relative": target_relative,
        "target_nats": target,
        "sd": sd,
    }
    if sd > 0 and n >= 2:
        out["power_at_target"] = paired_power(target, sd, n, ALPHA)
        out["seeds_needed"] = seeds_needed(target, sd, POWER, ALPHA)
        mde = detectable_effect(sd, n, POWER, ALPHA)
        out["detectable_nats"] = mde
        out["detectable_relative"] = mde / contrast["reference_loss"]
    if contrast["p_value"] < ALPHA:
        out["verdict"] = (
            f"detected: {contrast['relative_pct']:+.2f} % (paired t p "
            f"{contrast['p_value']:.3g}, sign-flip p {contrast['sign_flip_p']:.3g})"
        )
    elif "detectable_relative" in out:
        out["verdict"] = (
            f"inconclusive: not detected at alpha {ALPHA} (p {contrast['p_value']:.3g}); an "
            f"effect of {100 * out['detectable_relative']:.2f} % or more would have been "
            f"detected with {100 * POWER:.0f} % power"
        )
    else:
        out["verdict"] = "inconclusive: the differences have no spread to state a power for"
    return out


def schedule_effects(
    runs: Sequence[Mapping[str, Any]], corridor: tuple[int, int], target_relative: float
) -> dict[str, Any]:
    """The paired effects of a calibration's runs (see the module docstring):
    ``{"reference", "curve", "contrast", "power"}``; ``curve`` has one row per fixed
    interval that ends where fixed ``H_min`` does (``h`` in inner steps, with
    ``h_relative`` = ``h / H_min``)."""
    lo, hi = corridor
    fixed = _fixed_plain(runs)
    if lo not in fixed or hi not in fixed:
        raise ValueError(f"the runs need fixed-{lo} and fixed-{hi} (the corridor's ends)")
    ends = {r["schedule"][-1] for r in runs if r["name"] == fixed[lo]}
    fixed = _fixed_plain(runs, end=max(ends))
    ref = fixed[lo]
    curve = []
    for h in sorted(fixed):
        if h == lo:
            continue
        row = paired_differences(runs, fixed[h], ref)
        curve.append({"h": h, "h_relative": h / lo, **row})
    contrast = next(c for c in curve if c["h"] == hi)
    return {
        "reference": ref,
        "curve": curve,
        "contrast": contrast,
        "power": _power(contrast, target_relative),
    }


def mapping_effects(
    runs: Sequence[Mapping[str, Any]], corridors: Mapping[float, tuple[int, int]]
) -> list[dict[str, Any]]:
    """The corridor's-ends contrast at each mapping (env steps per inner step ->
    ``(H_min, H_max)`` in inner steps at that mapping): the main design's fixed runs for
    the mapping whose schedules it has, the ``map-fixed-*`` runs of the mapping check for
    the other."""
    fixed = _fixed_plain(runs)
    out = []
    for mapping, (lo, hi) in corridors.items():
        a, b = f"map-fixed-{hi}", f"map-fixed-{lo}"
        names = {r["name"] for r in runs}
        if a not in names or b not in names:
            a, b = fixed.get(hi, ""), fixed.get(lo, "")
        row = paired_differences(runs, a, b)
        budget = max(r["schedule"][-1] for r in runs if r["name"] == a)
        out.append(
            {"env_steps_per_inner_step": mapping, "corridor": [lo, hi], "budget": budget, **row}
        )
    return out
