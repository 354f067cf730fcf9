"""The learner surrogate: loss curve, reports, merge gains, batching and validation."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym import LearnerParams
from diloco_gym.sim import learners as lrn

P = LearnerParams()


def test_loss_decreases_in_tokens_towards_the_floor():
    tokens = np.concatenate([[0.0], np.logspace(3, 14, 60)])
    loss = lrn.loss(tokens, P)
    assert np.all(np.diff(loss) < 0)
    assert loss[0] == pytest.approx(P.loss_floor + P.loss_scale)
    assert loss[-1] == pytest.approx(P.loss_floor, abs=0.05)
    assert np.all(loss > P.loss_floor)
    # Power law: at T = tokens_scale the excess over the floor is 2 ** -exponent of the start.
    assert lrn.loss(P.tokens_scale, P) - P.loss_floor == pytest.approx(
        P.loss_scale * 2**-P.loss_exponent
    )


def test_reports_grow_with_throughput_and_gap():
    thr = np.array([5e3, 1e4, 2e4, 4e4])
    delta, tau = lrn.reports(30.0, 1e6, thr, P)
    assert delta.shape == tau.shape == (4,)
    np.testing.assert_allclose(tau, thr * 30.0)
    assert np.all(np.diff(delta) > 0) and np.all(np.diff(tau) > 0)
    delta2, tau2 = lrn.reports(60.0, 1e6, thr, P)
    assert np.all(delta2 > delta) and np.all(tau2 > tau)
    zero_d, zero_t = lrn.reports(0.0, 1e6, thr, P)
    np.testing.assert_array_equal(zero_d, 0.0)
    np.testing.assert_array_equal(zero_t, 0.0)
    # A model trained longer gains less from the same local work (diminishing returns).
    late, _ = lrn.reports(30.0, 1e9, thr, P)
    assert np.all(late < delta)


def test_reports_are_batched():
    thr = np.array([[5e3, 1e4], [2e4, 3e4], [1e3, 9e3]])
    gaps = np.array([10.0, 20.0, 30.0])
    toks = np.array([0.0, 1e6, 1e8])
    delta, tau = lrn.reports(gaps, toks, thr, P)
    assert delta.shape == tau.shape == (3, 2)
    for b in range(3):
        d1, t1 = lrn.reports(gaps[b], toks[b], thr[b], P)
        np.testing.assert_allclose(delta[b], d1, rtol=1e-14)
        np.testing.assert_allclose(tau[b], t1, rtol=1e-14)


def test_merge_gain_efficiency_falls_with_the_gap():
    thr = np.array([1e4, 2e4, 3e4])
    gaps = np.array([1.0, 20.0, 60.0, 120.0, 240.0, 1200.0])
    added, decrease = lrn.merge_gain(gaps, 1e6, thr, P)
    efficiency = added / (gaps * thr.sum())
    np.testing.assert_allclose(efficiency, 1.0 / (1.0 + gaps / P.drift_s))
    assert np.all(np.diff(efficiency) < 0)
    assert efficiency[3] == pytest.approx(0.5)  # at gap == drift_s half the work is kept
    assert np.all(np.diff(added) > 0)  # but a longer gap still adds more tokens in total
    assert np.all(decrease > 0)
    np.testing.assert_allclose(decrease, lrn.loss(1e6, P) - lrn.loss(1e6 + added, P))
    zero_added, zero_decrease = lrn.merge_gain(0.0, 1e6, thr, P)
    assert zero_added == 0.0 and zero_decrease == 0.0


def test_throughputs_are_seeded_sorted_and_log_normal():
    a = P.draw_throughputs(np.random.default_rng(0))
    b = P.draw_throughputs(np.random.default_rng(0))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (P.num_learners,)
    assert np.all(np.diff(a) >= 0)
    many = LearnerParams(num_learners=4000).draw_throughputs(np.random.default_rng(1))
    assert np.median(many) == pytest.approx(P.throughput_tokens_per_s, rel=0.03)
    assert np.std(np.log(many)) == pytest.approx(P.throughput_sigma, rel=0.05)
    same = LearnerParams(throughput_sigma=0.0).draw_throughputs(np.random.default_rng(2))
    np.testing.assert_array_equal(same, P.throughput_tokens_per_s)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_learners", 0),
        ("num_learners", 2.5),
        ("num_learners", True),
        ("num_learners", "8"),
        ("throughput_tokens_per_s", -1.0),
        ("throughput_tokens_per_s", "fast"),
        ("throughput_sigma", -0.1),
        ("loss_floor", float("nan")),
        ("loss_scale", 0.0),
        ("loss_exponent", float("inf")),
        ("tokens_scale", None),
        ("drift_s", 0),
        ("initial_tokens", -5.0),
    ],
)
def test_bad_learner_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"LearnerParams\.{field}"):
        LearnerParams(**{field: value})


def test_learner_params_accept_numpy_numbers():
    p = LearnerParams(num_learners=np.int64(3), drift_s=np.float32(60.0))
    assert p.draw_throughputs(np.random.default_rng(0)).shape == (3,)


def test_loss_is_the_compiled_power_law_with_the_c_librarys_pow():
    """``learners.loss`` gives, value for value and shape for shape, ``floor + scale * (1 +
    T / tokens_scale) ** -exponent`` with the C library's ``pow`` (``math.pow``): the law the
    envs' compiled step and observation use, so ``env.learner_reports`` agrees with them bit
    for bit on every CPU (NumPy's vectorised ``power`` may differ in the last bit)."""
    import math

    rng = np.random.default_rng(5)
    tokens = rng.random((3, 4, 5)) * 1e10

    def want(t):
        return P.loss_floor + P.loss_scale * math.pow(1.0 + t / P.tokens_scale, -P.loss_exponent)

    got = lrn.loss(tokens, P)
    assert got.shape == tokens.shape
    assert got.tolist() == np.vectorize(want)(tokens).tolist()
    scalar = lrn.loss(1.5e9, P)
    assert np.ndim(scalar) == 0 and float(scalar) == want(1.5e9)
    assert lrn.loss(np.zeros(0), P).shape == (0,)
