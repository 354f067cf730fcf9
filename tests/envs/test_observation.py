"""The observation: its feature table, the rate transform, the learner block, and that its
bounds contain every observation of an episode."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv, EnvParams, LearnerParams
from diloco_gym.envs.observation import (
    EXO_SLICE,
    LEARNER_SLICE,
    OBS_DIM,
    OBS_FEATURES,
    OBS_HIGH,
    OBS_INDEX,
    OBS_LOW,
    learner_features,
    learner_features_k,
    learner_table,
    squash_rate,
    unsquash_rate,
)
from diloco_gym.sim import learners as lrn

P = LearnerParams()


def test_feature_table_index_bounds_and_slices_agree():
    names = [f[0] for f in OBS_FEATURES]
    assert OBS_DIM == len(names) == len(set(names)) == 17
    assert [OBS_INDEX[n] for n in names] == list(range(OBS_DIM))
    assert OBS_LOW.dtype == OBS_HIGH.dtype == np.float32
    assert OBS_LOW.shape == OBS_HIGH.shape == (OBS_DIM,) and np.all(OBS_LOW < OBS_HIGH)
    assert names[EXO_SLICE][0] == "network" and names[EXO_SLICE][-1] == "rate_trend"
    assert len(names[EXO_SLICE]) == 7  # the episode's exo block has 7 columns
    assert names[LEARNER_SLICE] == [
        "loss_progress_mean", "loss_progress_min", "tokens_mean", "tokens_min", "staleness",
    ]  # fmt: skip
    assert all(len(f) == 5 and f[4] for f in OBS_FEATURES)  # every feature has a meaning


def test_rate_transform_is_bounded_and_inverted():
    rates = np.array([0.0, 0.5, 8.0, 40.0, 1e4])
    x = squash_rate(rates, 8.0)
    assert np.all((x >= 0) & (x < 1)) and np.all(np.diff(x) > 0)
    assert x[2] == 0.5  # a rate equal to the norm is half way
    np.testing.assert_allclose(unsquash_rate(x, 8.0), rates, rtol=1e-9)
    assert np.isfinite(unsquash_rate(1.0, 8.0))  # the top of the range is capped


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["bursty", "sync-heavy"])
def test_bounds_contain_every_observation_of_a_random_episode(regime):
    env = DiLoCoSyncEnv(regime)
    rng = np.random.default_rng(11)
    obs, _ = env.reset(seed=5)
    seen = [obs]
    truncated = False
    while not truncated:
        obs, _, _, truncated, _ = env.step(int(rng.integers(2)))
        seen.append(obs)
    seen_a = np.stack(seen)
    assert seen_a.dtype == np.float32 and seen_a.shape[1] == OBS_DIM
    assert np.all(seen_a >= OBS_LOW) and np.all(seen_a <= OBS_HIGH)
    assert np.ptp(seen_a[:, OBS_INDEX["gap"]]) > 0  # the episode did move


def test_learner_table_features():
    params = EnvParams()
    thr = P.draw_throughputs(np.random.default_rng(0))
    table = learner_table(1e6, thr, params, P)
    assert table.shape == (params.h_max + 1, 5) and table.dtype == np.float32
    loss_mean, loss_min, tok_mean, tok_min, stale = table.T
    assert np.all(loss_min <= loss_mean + 1e-7) and np.all(tok_min <= tok_mean + 1e-7)
    for col in table.T:
        assert np.all(np.diff(col) >= 0)  # every report grows with the gap
        assert col[0] == 0.0 and np.all((col >= 0) & (col <= 1))
    gap_s = params.h_max * params.decision_seconds
    assert stale[-1] == pytest.approx(gap_s / params.staleness_clip_s)
    assert tok_min[-1] == pytest.approx(min(1.0, thr[0] * gap_s / params.tokens_clip), rel=1e-6)
    # The batched table is the stack of single ones.
    batch = learner_table(np.array([1e6, 0.0]), np.stack([thr, thr * 2]), params, P)
    assert batch.shape == (2, params.h_max + 1, 5)
    np.testing.assert_array_equal(batch[0], table)
    np.testing.assert_array_equal(batch[1], learner_table(0.0, thr * 2, params, P))


def test_one_gap_per_row_is_the_tables_row_bit_for_bit():
    """``learner_features`` with one gap per env (the vector env's call) gives each row of
    ``learner_table`` (the single env's): one rule, the same arithmetic."""
    params = EnvParams()
    rng = np.random.default_rng(2)
    thr = np.sort(rng.uniform(5e3, 2e4, (6, P.num_learners)), axis=-1)
    tok = rng.uniform(0.0, 1e8, 6)
    gaps = rng.integers(0, params.h_max + 1, 6)
    got = learner_features(gaps * params.decision_seconds, tok, thr, params, P)
    assert got.shape == (6, 5)
    for b in range(6):
        want = learner_table(tok[b], thr[b], params, P)[gaps[b]]
        assert got[b].tobytes() == want.tobytes()


def test_compiled_learner_block_equals_the_loss_function():
    """The compiled learner block (``learner_features_k``) gives the values of
    ``learners.loss`` and numpy's clip/sum arithmetic, bit for bit, for every gap."""
    p, lp = EnvParams(), lrn.LearnerParams()
    rng = np.random.default_rng(3)
    thr = np.sort(rng.uniform(5e3, 2e4, lp.num_learners))
    gaps_s = np.arange(p.h_max + 1) * p.decision_seconds
    tau_k = thr[:, None] * gaps_s
    for tok in (0.0, 1.5e5, 3.3e7):
        delta = lrn.loss(tok, lp) - lrn.loss(tok + tau_k, lp)
        clipped = np.clip(delta / p.loss_clip, 0.0, 1.0)
        tk = np.clip(tau_k / p.tokens_clip, 0.0, 1.0)
        want = np.stack(
            [
                np.ascontiguousarray(clipped.T).sum(-1) / lp.num_learners,
                clipped[0],
                np.ascontiguousarray(tk.T).sum(-1) / lp.num_learners,
                tk[0],
                np.clip(gaps_s / p.staleness_clip_s, 0.0, 1.0),
            ],
            axis=-1,
        ).astype(np.float32)
        got = learner_features_k(gaps_s, np.float64(tok), thr[:, None], p, lp)
        assert got.tobytes() == want.tobytes()
