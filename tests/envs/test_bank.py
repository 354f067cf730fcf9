"""The episode bank (diloco_gym/envs/bank.py): rows built from seeds are deterministic,
chunked, in order and bit-identical per episode; a pool episode is the single env's
episode with every decision costed; the bank's arrays live in its store, grow with
headroom, and cost merges lazily exactly as the pool's precomputed table."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.bank import BUILD_CHUNK, EpisodeBank, build_rows, pool_row
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.kernel import max_merges
from diloco_gym.envs.observation import EXO_SLICE, OBS_HIGH, OBS_LOW
from diloco_gym.envs.reward import reward_per_request
from diloco_gym.envs.vector import DiLoCoSyncVectorEnv


@pytest.fixture(scope="module")
def spec():
    """The bursty vector env's build spec."""
    return DiLoCoSyncVectorEnv(2)._spec


@pytest.fixture(scope="module")
def single():
    return DiLoCoSyncEnv("bursty")


def _k(spec) -> int:
    return int(pool_row(spec, 0)["thr"].shape[-1])


def test_rows_are_deterministic_and_in_the_order_of_the_seeds(spec):
    (a,) = build_rows(spec, [7, 3, 9])
    (b,) = build_rows(spec, [7, 3, 9])
    assert a["seeds"].tolist() == [7, 3, 9]
    for key in ("exo", "prefmin", "counts", "pct", "thr"):
        np.testing.assert_array_equal(a[key], b[key])
    (c,) = build_rows(spec, [3])
    np.testing.assert_array_equal(a["exo"][1], c["exo"][0])  # bit-identical per episode
    np.testing.assert_array_equal(a["counts"][1:2], c["counts"])
    assert not np.array_equal(a["exo"][0], a["exo"][1])  # other seeds, other episodes


def test_rows_are_built_in_chunks_of_build_chunk(spec):
    seeds = list(range(100, 100 + BUILD_CHUNK + 3))
    batches = build_rows(spec, seeds)
    assert [len(b["seeds"]) for b in batches] == [BUILD_CHUNK, 3]
    assert np.concatenate([b["seeds"] for b in batches]).tolist() == seeds
    assert build_rows(spec, []) == []


def test_rows_stay_in_bounds(spec, single):
    (rows,) = build_rows(spec, [0, 1])
    n = rows["n"]
    single.reset(seed=0)
    assert n == single.episode.n_decisions
    assert rows["exo"].shape == (2, n, EXO_SLICE.stop - EXO_SLICE.start)
    assert rows["exo"].dtype == np.float32
    assert np.all(rows["exo"] >= OBS_LOW[EXO_SLICE]) and np.all(rows["exo"] <= OBS_HIGH[EXO_SLICE])
    assert np.all(rows["counts"] > 0)
    np.testing.assert_array_equal(rows["pct"], 100.0 / rows["counts"])
    assert rows["scale"] == reward_per_request(spec.rate_rps, 600.0) == 1000.0 / (8.0 * 600.0)
    assert rows["prefmin"].shape == (2, n)


def test_a_pool_episode_is_the_single_envs_episode(spec, single):
    a, b = pool_row(spec, 5), pool_row(spec, 5)
    single.reset(seed=5)
    ep = single.episode
    assert a["n"] == ep.n_decisions and a["seed"] == 5
    np.testing.assert_array_equal(a["exo"], ep.exo)
    np.testing.assert_array_equal(a["cost"], ep.merge_cost)
    np.testing.assert_array_equal(a["cost"], b["cost"])  # deterministic
    assert np.all(np.isfinite(a["cost"])) and np.all(a["cost"] >= 0) and a["cost"].max() > 0
    assert a["pct"] == 100.0 / ep.n_requests
    assert a["scale"] == ep.reward_per_request


def test_the_arrays_live_in_the_store(spec):
    store: dict = {}
    bank = EpisodeBank(2, spec.params, spec.sidecar, _k(spec), store=store)
    assert set(store) == {"_bank_" + name for name in EpisodeBank.FIELDS}
    assert store["_bank_n"] is bank.n and bank.n.shape == (2,)
    bank.seed = np.array([4, 5])
    assert store["_bank_seed"].tolist() == [4, 5]
    bank.params = spec.params  # not a field: an ordinary attribute
    assert "_bank_params" not in store
    with pytest.raises(AttributeError, match="EpisodeBank has no attribute 'nope'"):
        _ = bank.nope


def test_grow_keeps_the_contents_and_adds_headroom(spec):
    bank = EpisodeBank(2, spec.params, spec.sidecar, _k(spec))
    arr = bank._grow("base", 10)
    assert arr.shape == (2, 10)
    arr[:, :] = 1.0
    same = bank._grow("base", 8)  # wide enough: the same array
    assert same is arr
    grown = bank._grow("base", 11, headroom=0.25)
    assert grown.shape == (2, 13)  # max(11, 11 * 1.25, 10 * 1.25) columns
    assert np.all(grown[:, :10] == 1.0) and np.all(grown[:, 10:] == 0.0)
    assert bank.base is grown
    assert bank._grow("base", 14).shape == (2, 16)  # at least 1.25 x the old width


def test_pool_slots_cost_merges_from_their_table(spec):
    bank = EpisodeBank(2, spec.params, spec.sidecar, _k(spec))
    ep = pool_row(spec, 2)
    bank.store_pool(1, ep)
    assert bank.n.tolist() == [0, ep["n"]] and bank.seed.tolist() == [0, 2]
    assert bank.max_merges[1] == max_merges(float(ep["n"]), spec.params)
    d = np.array([0, 100, ep["n"] - 1, 100])
    np.testing.assert_array_equal(bank.merge_costs(np.ones(4, dtype=int), d, True), ep["cost"][d])


def test_lazy_costs_of_written_rows_equal_the_pools_table(spec):
    bank = EpisodeBank(3, spec.params, spec.sidecar, _k(spec))
    (rows,) = build_rows(spec, [11, 12])
    bank.write_rows(np.array([2, 0]), rows)
    assert bank.seed.tolist() == [12, 0, 11] and bank.n.tolist() == [rows["n"], 0, rows["n"]]
    for slot, seed in ((2, 11), (0, 12)):
        want = pool_row(spec, seed)["cost"]
        d = np.arange(want.size)
        got = bank.merge_costs(np.full(d.size, slot), d, False)
        np.testing.assert_array_equal(got, want)


def test_fresh_episode_bank_is_allocated_once():
    """Request counts vary between episodes; the bank is allocated with headroom at the
    first reset, so later episodes never reallocate it (resident memory stays flat)."""
    venv = DiLoCoSyncVectorEnv(16, skip_forced=False)
    venv.reset(seed=0)
    banks = {name: getattr(venv.bank, name) for name in ("base", "rbin", "s")}
    widths = []
    table = np.random.default_rng(0).integers(0, 2, (64, 16))
    for t in range(3 * 517 + 5):  # three episodes per env
        venv.step(table[t % 64])
        widths.append(int(venv.bank.ptr[:, -1].max()))
    assert max(widths) > min(widths)  # the longest episode in the bank did change
    for name, arr in banks.items():
        assert getattr(venv.bank, name) is arr, name


def _two_pass_bank(spec, slots, seeds, size):
    """A bank filled the two-pass way: :func:`build_rows` then ``write_rows``."""
    bank = EpisodeBank(size, spec.params, spec.sidecar, _k(spec))
    done = 0
    for rows in build_rows(spec, seeds):
        k = rows["counts"].size
        bank.write_rows(np.asarray(slots[done : done + k]), rows)
        done += k
    return bank


@pytest.mark.parametrize("regime", ["bursty", "pressure-heavy", "sync-heavy"])
def test_one_call_build_writes_the_two_pass_rows_bit_for_bit(regime):
    """``EpisodeBank.build`` (draws straight into the bank, one compiled call a batch)
    leaves every array of the bank exactly as :func:`build_rows` then ``write_rows`` do,
    over more than one batch, into slots out of order."""
    spec = DiLoCoSyncVectorEnv(2, regime=regime)._spec
    seeds = list(range(40, 40 + BUILD_CHUNK + 5))
    slots = np.random.default_rng(0).permutation(len(seeds) + 3)[: len(seeds)]
    want = _two_pass_bank(spec, slots, seeds, len(seeds) + 3)
    got = EpisodeBank(len(seeds) + 3, spec.params, spec.sidecar, _k(spec))
    got.build(spec, slots, seeds)
    for name in EpisodeBank.FIELDS:
        a, b = getattr(want, name), getattr(got, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_one_call_build_of_a_replayed_trace_matches_the_two_pass_rows():
    """The same for a replayed trace's windows (a generator that is not synthetic)."""
    from dataclasses import replace

    from diloco_gym.sim.regimes import ReplayRegime, get_regime

    trace = replace(get_regime("pressure-heavy"), duration_s=3600.0)(np.random.default_rng(3))
    gen = ReplayRegime(trace, duration_s=600.0)
    spec = DiLoCoSyncVectorEnv(2, regime=gen)._spec
    seeds = [5, 6, 7]
    want = _two_pass_bank(spec, [0, 1, 2], seeds, 3)
    got = EpisodeBank(3, spec.params, spec.sidecar, _k(spec))
    got.build(spec, [0, 1, 2], seeds)
    for name in EpisodeBank.FIELDS:
        np.testing.assert_array_equal(getattr(want, name), getattr(got, name), err_msg=name)
