"""The compiled kernel gives the outputs of diloco-gym 0.4.0 (the NumPy kernel).

References (``tests/data/compiled_refs.json`` and ``compiled_refs_obs.npz``) were recorded by
``compiled_refs.py`` from the 0.4.0 code: observations, rewards, action masks, step infos and
final episode summaries of the single env over the five regimes x ``skip_forced`` on/off x no
budget / ``merge_budget=12`` x seeds 0-4 (random actions), the vector env (8 envs x 400 steps,
both autoreset modes, fresh episodes and ``episode_pool=4``), and the default report's
``results.csv``.

How values are compared:

* integers, booleans, and floats that IEEE arithmetic alone computes from the seed's draws
  (rewards, masks, flags, merge decisions and costs, the exact observation columns, every
  info but the learners' ``progress``): **exactly** (SHA-256 digests or equality);
* floats that go through a transcendental function of the C/NumPy library (``pow``, ``exp``:
  the learners' progress and loss curve, the EWMA's bias correction), whose last bits
  differ between NumPy/numba/libm versions (the 0.4.0 code itself gives
  ``0.7071394444523724`` today where ``...715`` was recorded for one summary's progress):
  float64 values to **<= 1e-12 relative**; the float32 observation columns built from them
  (``compiled_refs.FLOAT_COLS``) to **one float32 unit in the last place** (a float64 change
  of 1e-12 relative moves a rounding to float32 by at most one unit);
* the report's ``results.csv``: its text, exactly (its numbers are printed rounded).

Outputs added since 0.4.0 are left out, and only those: the step infos' ``action_mask``
(Gymnasium's convention), results.csv's ``verdict_unit`` column and the renamed label of the
oracle's upper bound (``compiled_refs.report_fingerprint``).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from compiled_refs import (
    CASES,
    REGIMES,
    REPORT_COLUMNS_0_4_0,
    SEEDS,
    load,
    report_fingerprint,
    single_episode,
    vector_run,
)

REFS, ARRAYS = load()
REL = 1e-12


def close(got: float, want: float) -> bool:
    """``got`` within ``REL`` relative of ``want`` (equal when ``want`` is 0)."""
    return math.isclose(got, want, rel_tol=REL, abs_tol=0.0)


def same_value(got, want, where: str) -> None:
    """Recursive comparison: floats to ``REL``, anything else exactly."""
    if isinstance(want, float) and isinstance(got, (float, int)) and not isinstance(got, bool):
        assert close(float(got), want), f"{where}: {got!r} != {want!r} (rel {REL})"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys differ"
        for k in want:
            same_value(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length differs"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same_value(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def same_float32(got: np.ndarray, want: np.ndarray, where: str) -> None:
    """Equal shapes and values within one float32 unit in the last place."""
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    tol = np.spacing(np.maximum(np.abs(got), np.abs(want)).astype(np.float32))
    bad = np.abs(got.astype(np.float64) - want.astype(np.float64)) > tol
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError(
            f"{where}: {int(bad.sum())} values differ by more than one float32 ulp, first at "
            f"{tuple(int(x) for x in i)}: {got[tuple(i)]!r} != {want[tuple(i)]!r}"
        )


def check_entry(got: dict, key: str, prefix: str) -> None:
    """Compare one recorded episode or run with the one computed now."""
    want = REFS[prefix][key]
    for field, value in want.items():
        same_value(got[field], value, f"{key}: {field}")
    for name in ("obs_floats", "final_obs_floats"):
        stored = f"{prefix}|{key}#{name}"
        if stored in ARRAYS.files:
            same_float32(got[name], ARRAYS[stored], f"{key}: {name}")
        else:
            assert name not in got, f"{key}: {name} was not recorded"


@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_single_env_equals_the_recorded_0_4_0_outputs(regime):
    for skip, budget in CASES:
        for seed in SEEDS:
            key = f"{regime}|skip={skip}|budget={budget}|seed={seed}"
            check_entry(single_episode(regime, skip, budget, seed), key, "single")


def test_default_single_env_equals_the_recorded_0_4_0_outputs():
    """The fast inner loop's share of the check: the default configuration, one seed."""
    check_entry(
        single_episode("bursty", True, None, 0), "bursty|skip=True|budget=None|seed=0", "single"
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("pool", [None, 4])
def test_vector_env_equals_the_recorded_0_4_0_outputs(mode, pool):
    check_entry(vector_run(mode, pool), f"{mode}|pool={pool}", "vector")


@pytest.mark.slow
def test_default_report_results_equal_the_recorded_0_4_0_ones(tmp_path):
    from diloco_gym.cli import main

    out = tmp_path / "rep"
    assert main(["report", "--out", str(out), "--force"]) == 0
    got = report_fingerprint((out / "results.csv").read_bytes())
    assert got == REFS["report_results_csv"], "results.csv differs from 0.4.0's"


def test_report_fingerprint_of_a_0_4_0_file_is_its_own_hash():
    """The normalisation cannot hide a change: on 0.4.0's own results.csv layout it is the
    identity (a row with a different number would change the hash)."""
    header = ",".join(REPORT_COLUMNS_0_4_0)
    row = ",".join(str(i) for i in range(len(REPORT_COLUMNS_0_4_0)))
    data = f"{header}\n{row}\n".encode()
    assert report_fingerprint(data) == hashlib.sha256(data).hexdigest()
    changed = data.replace(b",3,", b",4,", 1)
    assert report_fingerprint(changed) != report_fingerprint(data)


def test_the_tolerances_catch_a_change_in_the_last_recorded_digits():
    """The float comparisons are not vacuous: a relative change of 1e-11 in a recorded
    summary float, or of two float32 units in an observation, is caught."""
    key = "bursty|skip=True|budget=None|seed=0"
    want = REFS["single"][key]["summary"]["progress"]
    same_value(want * (1 + 1e-13), want, "ok")
    with pytest.raises(AssertionError):
        same_value(want * (1 + 1e-11), want, "changed")
    obs = ARRAYS[f"single|{key}#obs_floats"]
    same_float32(obs.copy(), obs, "ok")
    bumped = obs.copy()
    bumped[3, 0] = np.nextafter(np.nextafter(bumped[3, 0], np.float32(2)), np.float32(2))
    with pytest.raises(AssertionError):
        same_float32(bumped, obs, "changed")
