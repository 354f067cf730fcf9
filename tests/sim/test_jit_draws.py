"""The synthetic traces' compiled draws (``sim/jit_draws.py``) against NumPy's array calls
written out: the same numbers, and the generator left in the same state."""

import numpy as np
import pytest

from diloco_gym.sim import compiled, compiled_draws
from diloco_gym.sim.regimes import REGIMES, SyntheticRegime, _slice_grid
from diloco_gym.sim.traces import PRESSURE_DT_S


def _numpy_points(rng: np.random.Generator, total: float, batch: int) -> np.ndarray:
    """The unit-rate points below ``total``, drawn with NumPy's array calls: cumulative sums
    of ``batch`` standard exponentials, a further batch continuing from the last point."""
    if total <= 0.0:
        return np.zeros(0)
    x = np.cumsum(rng.standard_exponential(batch))
    while x[-1] < total:
        x = np.concatenate([x, x[-1] + np.cumsum(rng.standard_exponential(batch))])
    return x[: np.searchsorted(x, total)]


def _numpy_draw_raw(reg: SyntheticRegime, rng: np.random.Generator) -> tuple:
    """``draw_raw`` with NumPy's array calls (the burst timing and the expected counts by
    the regime's own rules, which these draws do not change)."""
    _, t, widths = _slice_grid(reg.duration_s)
    onsets = reg._onsets(rng) if reg.has_bursts else np.zeros(0)
    cum = np.empty(t.size + 1)
    total = compiled().slice_counts(
        t, widths, np.asarray(onsets, dtype=np.float64), reg.has_bursts,
        float(reg.quiet_rate_rps), float(reg.busy_rate_rps - reg.quiet_rate_rps),
        float(reg.ramp_s), float(reg.burst_s), cum,
    )  # fmt: skip
    points = _numpy_points(rng, total, int(total + 6.0 * np.sqrt(total)) + 16)
    token_u = rng.random(points.size)
    n_p = int(np.ceil(reg.duration_s / PRESSURE_DT_S - 1e-9))
    return cum, points, token_u, rng.standard_normal((2, n_p)), rng.random((2, n_p))


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_draw_raw_is_numpys_array_calls(name):
    """Every regime, periodic bursts, random bursts and none: ``draw_raw``'s arrays and the
    generator's state after it are those of NumPy's calls, seed for seed."""
    reg = REGIMES[name]
    for seed in range(6):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        got, want = reg.draw_raw(a), _numpy_draw_raw(reg, b)
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
        assert a.bit_generator.state == b.bit_generator.state


@pytest.mark.parametrize(("total", "batch"), [(50.0, 5), (50.0, 80), (3.5, 1), (0.0, 8), (-1.0, 8)])
def test_unit_points_grow_batch_by_batch_as_numpy(total, batch):
    """Small batches take the rare path (a batch that does not pass the total: a further
    one continues from its last point); a total of zero or less draws nothing."""
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    got = compiled_draws().unit_points(a, total, batch)
    np.testing.assert_array_equal(got, _numpy_points(b, total, batch))
    assert a.bit_generator.state == b.bit_generator.state
    assert np.all(got < total) and np.all(np.diff(got) > 0)


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_draw_batch_is_from_raw_of_draw_raw(name):
    """``draw_batch`` of several generators: ``from_raw`` of each one's ``draw_raw``, bit
    for bit, each generator left as ``draw_raw`` leaves it (what the learners draw next)."""
    reg = REGIMES[name]
    seeds = [3, 17, 4242, 7]
    got_rngs = [np.random.default_rng(s) for s in seeds]
    want_rngs = [np.random.default_rng(s) for s in seeds]
    got = reg.draw_batch(got_rngs)
    want = reg.from_raw([reg.draw_raw(r) for r in want_rngs], np.int64)
    for x, y in zip(got, want, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    for a, b in zip(got_rngs, want_rngs, strict=True):
        assert a.random() == b.random()


def test_a_trace_is_the_same_either_way():
    """A regime's trace (``reg(rng)``: ``draw_batch``, one compiled call) and its arrays
    with float tokens (``draw``'s other path: ``draw_raw`` then ``from_raw``) are the same
    values from the same seed."""
    reg = REGIMES["bursty"]
    t1 = reg(np.random.default_rng(5))
    arrivals, prompt, output, network, checkpoint = reg.draw(np.random.default_rng(5), np.float64)
    np.testing.assert_array_equal(t1.arrival_s, arrivals)
    np.testing.assert_array_equal(t1.prompt_tokens, prompt)
    np.testing.assert_array_equal(t1.output_tokens, output)
    np.testing.assert_array_equal(t1.network, network)
    np.testing.assert_array_equal(t1.checkpoint, checkpoint)


def test_a_generator_of_another_kind_is_refused_in_one_line():
    """The compiled draws read a NumPy ``Generator``'s bit generator: anything else (the
    legacy ``RandomState``, a seed) is refused by name before numba sees it."""
    reg = REGIMES["bursty"]
    for bad in (np.random.RandomState(0), 7):
        with pytest.raises(TypeError, match="numpy.random.Generator"):
            reg.draw_raw(bad)
        with pytest.raises(TypeError, match="numpy.random.Generator"):
            reg.draw_batch([np.random.default_rng(0), bad])
