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


@pytest.mark.parametrize(
    "kw",
    [
        {},  # the default fleet, model v1: syncs stall the learners
        {"model_version": 0},
        {"skip_forced": False, "progress_weight": 1.0, "merge_budget": 14},
        # trace sites with correlated traffic, one sync instant
        {
            "fleet": "docs/examples/fleet-traces-corr.toml",
            "timing": "instant",
            "traffic_correlation": 0.5,
        },
        {"fragments": 2},  # model v1's fragment credit, syncs stalling the learners
        {"fragments": 4, "mode": "streamed"},  # no stall
        {"fragments": 4, "model_version": 0},
        # sites of four link shares: each request's thresholds from its own sidecar
        {"fleet": "docs/examples/fleet-v1.toml"},
        {"fleet": "docs/examples/fleet.toml", "merge_budget": 40},
    ],
    ids=[
        "default",
        "v0",
        "forced-budget",
        "trace-sites",
        "F2",
        "F4-streamed",
        "F4-v0",
        "file-v1",
        "file-budget",
    ],  # fmt: skip
)
def test_the_compiled_fleet_cost_is_the_python_one_bit_for_bit(kw):
    """The plain fleet's syncs costed (and model v1's credit) in the compiled step give
    every observation, reward, info and summary of the same env costing each sync in
    Python at the merge, on any machine (the recorded digests above need their versions)."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    kw = dict(kw)
    if "fleet" in kw:
        kw["fleet"] = str(refs.REF_PATH.parents[2] / kw["fleet"])
    compiled = gym.make("DiLoCoFleet-v1", **kw).unwrapped
    python = gym.make("DiLoCoFleet-v1", **kw).unwrapped
    assert compiled._compiled_cost
    python._compiled_cost, python._stall_s = False, 0.0
    for seed in range(8):
        assert refs.episode_digest(compiled, seed) == refs.episode_digest(python, seed)


def test_one_episode_costed_by_both_paths_keeps_one_memo():
    """An episode built once and run on each path in turn (as the report runs several
    agents on one build): both read and fill the same per-site costs, and agree."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    env = gym.make("DiLoCoFleet-v1").unwrapped
    stall = env._stall_s
    for order in ((False, True), (True, False)):
        ep = env.build_episode(3)
        runs = []
        for compiled in order:
            env._compiled_cost, env._stall_s = compiled, stall if compiled else 0.0
            env.reset(seed=3, options={"episode": ep})
            for a in refs.actions(env, 3, 1000):
                if env.step(a)[3]:
                    break
            runs.append(env.episode_summary())
        assert runs[0] == runs[1]
        merges = runs[0]["merge_decisions"]
        bank = ep.cost_bank
        for j, site in enumerate(ep.sites):
            assert site.cost_memo.base is bank  # the site's memo is its row of the bank
            assert np.array_equal(bank[1 + j, merges], [site.merge_cost_at(d) for d in merges])


@pytest.mark.parametrize(
    ("kw", "compiled"),
    [
        ({}, True),
        ({"model_version": 0}, True),
        ({"fleet": "ONE_SITE"}, False),
        ({"fragments": 2}, True),
        ({"bits_options": (32, 8)}, False),
        ({"site_cap_pp": 2.0}, False),
        ({"worst_site_weight": 0.5}, False),
        ({"link_levels": (1.0, 0.5)}, False),
        ({"timing": "rounds", "grace_s": 4.5, "quorum": 3, "h_min_steps": 256}, False),
    ],
)
def test_the_compiled_step_costs_only_the_plain_fleets_syncs(kw, compiled):
    refs.CASES["_probe"] = kw
    try:
        env = refs.make("_probe")
    finally:
        del refs.CASES["_probe"]
    assert env._compiled_cost is compiled
    assert env._batch.sites[0] == 1  # before an episode: the single env's layout
    env.reset(seed=0)
    assert env._batch.sites[0] == (env.fleet.n_sites if compiled else 1)
    assert (env._batch.stall_s[0] != 0.0) == (compiled and env.fleet.model_version >= 1)
    v1_fragments = compiled and env.fleet.model_version >= 1 and env.fleet.fragments > 1
    assert env._batch.fragments[0] == (env.fleet.fragments if v1_fragments else 0)
