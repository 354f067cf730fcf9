"""The DiLoCo trainer: the outer step against a hand computation, fragment and quantised
syncs, the quantiser, determinism, and that a tiny run learns."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from diloco_gym.lm.calibrate import TINY  # noqa: E402
from diloco_gym.lm.data import load_corpus  # noqa: E402
from diloco_gym.lm.trainer import (  # noqa: E402
    TrainConfig,
    check_schedule,
    fixed_schedule,
    fragment_groups,
    outer_step,
    quantize,
    run_diloco,
)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=200_000)


def _toy(global_vals, local_vals):
    g = [torch.tensor(v, dtype=torch.float64) for v in global_vals]
    loc = [[torch.tensor(v, dtype=torch.float64) for v in lv] for lv in local_vals]
    opt = torch.optim.SGD(g, lr=0.7, momentum=0.9, nesterov=True)
    return g, loc, opt


@pytest.mark.slow
def test_outer_step_equals_hand_computed_nesterov():
    g, loc, opt = _toy(
        [[1.0, 2.0, 3.0], [0.5, -0.5]],
        [[[0.0, 2.0, 2.0], [0.5, 0.5]], [[1.0, 1.0, 4.0], [1.5, -1.5]]],
    )
    p0 = np.array([1.0, 2.0, 3.0])
    d1 = np.mean([p0 - [0.0, 2.0, 2.0], p0 - [1.0, 1.0, 4.0]], axis=0)  # pseudo-gradient
    outer_step(g, loc, opt, [0, 1])
    buf = d1
    p1 = p0 - 0.7 * (d1 + 0.9 * buf)  # Nesterov: step along g + momentum * buf
    np.testing.assert_allclose(g[0].numpy(), p1, rtol=0, atol=1e-12)
    for lv in loc:  # every learner restarts from the new global model
        np.testing.assert_array_equal(lv[0].numpy(), g[0].numpy())
        np.testing.assert_array_equal(lv[1].numpy(), g[1].numpy())
    # A second step: the momentum buffer carries the first pseudo-gradient.
    new_locals = [p1 - [0.1, 0.2, 0.3], p1 + [0.3, 0.0, -0.1]]
    for lv, v in zip(loc, new_locals, strict=True):
        lv[0].copy_(torch.tensor(v))
    d2 = np.mean([p1 - v for v in new_locals], axis=0)
    outer_step(g, loc, opt, [0, 1])
    buf = 0.9 * buf + d2
    p2 = p1 - 0.7 * (d2 + 0.9 * buf)
    np.testing.assert_allclose(g[0].numpy(), p2, rtol=0, atol=1e-12)


def test_fragment_sync_changes_exactly_the_fragment():
    g, loc, opt = _toy(
        [[1.0, 2.0], [3.0, 4.0]], [[[0.0, 1.0], [2.0, 2.0]], [[2.0, 1.0], [5.0, 5.0]]]
    )
    before_g1 = g[1].clone()
    before_l1 = [lv[1].clone() for lv in loc]
    outer_step(g, loc, opt, [0])
    # fragment 0 moved (pseudo-gradient mean([1,1],[-1,1]) = [0, 1]) and was broadcast
    np.testing.assert_allclose(g[0].numpy(), [1.0, 2.0 - 0.7 * 1.9])
    for lv in loc:
        np.testing.assert_array_equal(lv[0].numpy(), g[0].numpy())
    # fragment 1: global value, momentum and the learners' local copies untouched
    torch.testing.assert_close(g[1], before_g1, rtol=0, atol=0)
    for lv, b in zip(loc, before_l1, strict=True):
        torch.testing.assert_close(lv[1], b, rtol=0, atol=0)
    assert g[1] not in opt.state or "momentum_buffer" not in opt.state[g[1]]


def _np_quant(x, bits):
    lo, hi = x.min(), x.max()
    s = (hi - lo) / (2**bits - 1)
    return lo + np.round((x - lo) / s) * s


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_quantised_sync_applies_the_quantised_mean(bits):
    rng = np.random.default_rng(bits)
    p0, p1 = rng.normal(size=50), rng.normal(size=7)
    locs = [[p0 + rng.normal(0, 0.1, 50), p1 + rng.normal(0, 0.1, 7)] for _ in range(3)]
    g, loc, opt = _toy([p0, p1], locs)
    outer_step(g, loc, opt, [0], bits=bits)
    d = np.mean([_np_quant(p0 - lv[0], bits) for lv in locs], axis=0)
    np.testing.assert_allclose(g[0].numpy(), p0 - 0.7 * 1.9 * d, rtol=0, atol=1e-12)
    exact = np.mean([p0 - lv[0] for lv in locs], axis=0)
    assert not np.allclose(d, exact, rtol=0, atol=1e-14)  # the quantiser did something
    np.testing.assert_array_equal(g[1].numpy(), p1)  # other fragment unchanged


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_quantize_levels_and_error(bits):
    x = torch.linspace(-1.0, 2.0, 1001, dtype=torch.float64) ** 3
    q = quantize(x, bits)
    step = float((x.max() - x.min()) / (2**bits - 1))
    assert float((q - x).abs().max()) <= step / 2 + 1e-12
    assert len(torch.unique(q)) <= 2**bits
    assert float(q.min()) >= float(x.min()) - 1e-12 and float(q.max()) <= float(x.max()) + 1e-12
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([quantize(x, 4, "stochastic", gen) for _ in range(400)])
    step4 = float((x.max() - x.min()) / 15)
    # unbiased: the mean of 400 draws is within 4 standard errors (<= step/2 / sqrt(400))
    assert float((draws.mean(0) - x).abs().max()) <= 4 * step4 / 2 / 20
    assert torch.equal(quantize(x, 32), x)
    with pytest.raises(ValueError, match="bits"):
        quantize(x, 3)


def test_fragment_groups_partition_contiguously():
    params = [torch.zeros(n) for n in (10, 3, 40, 40, 5, 80, 2)]
    for f in (1, 2, 3, 4, 7):
        groups = fragment_groups(params, f)
        assert len(groups) == f and all(groups)
        assert [i for g in groups for i in g] == list(range(len(params)))
    with pytest.raises(ValueError, match="exceeds"):
        fragment_groups(params, 8)


def test_schedule_errors_name_the_entry():
    assert check_schedule([2, 4, 8], 8) == [2, 4, 8]
    assert fixed_schedule(3, 10) == [3, 6, 9]
    with pytest.raises(ValueError, match=r"schedule\[1\] = 2 must be greater"):
        check_schedule([2, 2], 8)
    with pytest.raises(ValueError, match=r"schedule\[0\] = 9 is outside 1..8"):
        check_schedule([9], 8)
    with pytest.raises(ValueError, match="empty"):
        check_schedule([], 8)
    with pytest.raises(ValueError, match="n_heads"):
        TrainConfig(d_model=10, n_heads=4)


@pytest.mark.slow
def test_tiny_run_learns_and_is_deterministic(corpus):
    cfg = TrainConfig(**TINY)
    a = run_diloco(corpus, cfg, fixed_schedule(4, 16), seed=3)
    b = run_diloco(corpus, cfg, fixed_schedule(4, 16), seed=3)
    c = run_diloco(corpus, cfg, fixed_schedule(4, 16), seed=4)
    assert a.merge_losses == b.merge_losses and a.initial_loss == b.initial_loss
    assert a.merge_losses != c.merge_losses
    assert a.final_loss < a.merge_losses[0] < a.initial_loss
    assert a.initial_loss - a.final_loss > 0.3  # nats/byte, from about ln(256) = 5.55


@pytest.mark.slow
def test_fragments_and_bits_change_the_run(corpus):
    cfg = TrainConfig(**TINY)
    base = run_diloco(corpus, cfg, [4, 8, 12, 16], seed=0)
    frag = run_diloco(corpus, cfg, [4, 8, 12, 16], fragments=2, seed=0)
    q4 = run_diloco(corpus, cfg, [4, 8, 12, 16], bits=4, seed=0)
    assert frag.merge_losses != base.merge_losses
    assert q4.merge_losses != base.merge_losses
    again = run_diloco(corpus, cfg, [4, 8, 12, 16], bits=4, rounding="stochastic", seed=0)
    assert (
        again.merge_losses
        == run_diloco(
            corpus, cfg, [4, 8, 12, 16], bits=4, rounding="stochastic", seed=0
        ).merge_losses
    )
