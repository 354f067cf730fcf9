"""The compiled kernel gives the outputs of diloco-gym 0.4.0 (the NumPy kernel) bit for bit.

References (``tests/data/compiled_refs.json``) were recorded by ``compiled_refs.py`` from the
0.4.0 code: observations, rewards, action masks, step infos and final episode summaries of
the single env over the five regimes x ``skip_forced`` on/off x no budget / ``merge_budget=12``
x seeds 0-4 (random actions), the vector env (8 envs x 400 steps, both autoreset modes,
fresh episodes and ``episode_pool=4``), and the default report's ``results.csv``. The
comparison is exact (SHA-256 of the raw bytes; floats in the summaries by ``repr``): no
tolerance is needed, because the compiled rules do the same floating-point operations in
the same order as the NumPy ones.

Outputs added since 0.4.0 are left out of the fingerprints, and only those: the step infos'
``action_mask`` (Gymnasium's convention), results.csv's ``verdict_unit`` column and the
renamed label of the oracle's upper bound (``compiled_refs.report_fingerprint``).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from compiled_refs import (
    CASES,
    REF_PATH,
    REGIMES,
    REPORT_COLUMNS_0_4_0,
    SEEDS,
    report_fingerprint,
    single_episode,
    vector_run,
)

REFS = json.loads(REF_PATH.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_single_env_equals_the_recorded_0_4_0_outputs(regime):
    for skip, budget in CASES:
        for seed in SEEDS:
            key = f"{regime}|skip={skip}|budget={budget}|seed={seed}"
            got = single_episode(regime, skip, budget, seed)
            want = REFS["single"][key]
            for field in want:
                assert got[field] == want[field], f"{key}: {field} differs from 0.4.0"


def test_default_single_env_equals_the_recorded_0_4_0_outputs():
    """The fast inner loop's share of the check: the default configuration, one seed."""
    key = "bursty|skip=True|budget=None|seed=0"
    assert single_episode("bursty", True, None, 0) == REFS["single"][key]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("pool", [None, 4])
def test_vector_env_equals_the_recorded_0_4_0_outputs(mode, pool):
    got = vector_run(mode, pool)
    want = REFS["vector"][f"{mode}|pool={pool}"]
    for field in want:
        assert got[field] == want[field], f"{mode}, pool={pool}: {field} differs from 0.4.0"


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
