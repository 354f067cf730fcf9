"""The fleet env's results did not change with its speed work: every observation, reward,
info and episode summary of the fleets in ``tests/envs/fleet_refs.py``, for episode seeds
0..4, digests as recorded before the change (``tests/data/fleet_refs.json``)."""

from __future__ import annotations

import json

import fleet_refs as refs
import numpy as np
import pytest

REFS = json.loads(refs.REF_PATH.read_text())


@pytest.mark.parametrize("case", list(refs.CASES))
def test_fleet_episodes_are_bit_identical_to_the_recorded_ones(case):
    if refs.versions() != REFS["versions"]:
        pytest.skip(
            f"the references were recorded with {REFS['versions']}, this is "
            f"{refs.versions()}: their transcendental functions may differ in the last bit"
        )
    env = refs.make(case)
    got = [refs.episode_digest(env, s) for s in refs.SEEDS]
    assert got == REFS["digests"][case]


def test_the_digest_sees_a_change_in_the_last_bit():
    import hashlib

    a, b = hashlib.sha256(), hashlib.sha256()
    refs.feed(a, {"r": 0.1, "x": [1, True]})
    refs.feed(b, {"r": float(np.nextafter(0.1, 1.0)), "x": [1, True]})
    assert a.hexdigest() != b.hexdigest()
