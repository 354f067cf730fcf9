"""The synthetic traces' random draws, compiled: one call per trace instead of a NumPy call
per kind of draw.

numba takes a :class:`numpy.random.Generator` as an argument and draws from its bit
generator with NumPy's own algorithms (``random`` is the bit generator's ``next_double``;
``standard_exponential`` and ``standard_normal`` are NumPy's ziggurats), advancing the
caller's generator. A loop of single draws therefore gives the numbers, and leaves the
generator in the state, that NumPy's array calls of the same sizes in the same order give:
the traces and everything drawn after them are bit for bit those of the NumPy calls
(``tests/sim/test_jit_draws.py`` checks both against the NumPy calls written out).
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit import slice_counts, synthetic_rows
from diloco_gym.sim.jit_cache import njit

__all__ = ["exponential_batch", "unit_points", "draw_rows", "synthetic_batch"]


@njit(cache=True)
def exponential_batch(total):  # pragma: no cover - compiled
    """Unit-rate exponentials drawn at once for ``total`` expected arrivals: enough to pass
    ``total`` with probability ~1 - 1e-9 (:func:`unit_points` draws more if not)."""
    return int(total + 6.0 * np.sqrt(total)) + 16


@njit(cache=True)
def unit_points(rng, total, batch):  # pragma: no cover - compiled
    """The points below ``total`` of a unit-rate Poisson process: the running sums of
    standard exponentials drawn ``batch`` at a time until one passes ``total`` (a further
    batch continues from the last point: ``x[-1] + cumsum(batch)``, NumPy's order), cut
    before the first point at or past ``total``. Nothing is drawn when ``total <= 0``."""
    if total <= 0.0:
        return np.zeros(0)
    x = np.empty(batch)
    run = 0.0
    for i in range(batch):
        run += rng.standard_exponential()
        x[i] = run
    n = batch
    while x[n - 1] < total:  # rare: the batch covers the total with probability ~1 - 1e-9
        grown = np.empty(n + batch)
        grown[:n] = x[:n]
        last = x[n - 1]
        run = 0.0
        for i in range(batch):
            run += rng.standard_exponential()
            grown[n + i] = last + run
        x = grown
        n += batch
    k = 0
    while x[k] < total:  # np.searchsorted(x, total): the first point at or past it
        k += 1
    return x[:k]


@njit(cache=True)
def draw_rows(rng, total, batch, n_p):  # pragma: no cover - compiled
    """One synthetic trace's draws after its burst timing, in the generator's order: the
    unit-rate points below ``total`` (:func:`unit_points`), one uniform per point (its two
    token quantiles), ``(2, n_p)`` standard normals (the pressure noise, row by row) and
    ``(2, n_p)`` uniforms (the pressure spikes). Returns ``(points, token_u, noise,
    spike_u)``."""
    points = unit_points(rng, total, batch)
    token_u = np.empty(points.size)
    for i in range(points.size):
        token_u[i] = rng.random()
    noise = np.empty((2, n_p))
    for r in range(2):
        for j in range(n_p):
            noise[r, j] = rng.standard_normal()
    spike_u = np.empty((2, n_p))
    for r in range(2):
        for j in range(n_p):
            spike_u[r, j] = rng.random()
    return points, token_u, noise, spike_u


@njit(cache=True)
def synthetic_batch(
    rngs, onsets, onset_offsets, t, widths, bursts, quiet, lift_rps, ramp, burst, n_p, edges,
    cap, prompt_table, output_table, token_bits, scale, scale0, rho, means, spike_p, length,
    level,
):  # pragma: no cover - compiled  # fmt: skip
    """Synthetic traces ``e``, one per generator ``rngs[e]`` whose burst onsets
    ``onsets[onset_offsets[e]:onset_offsets[e + 1]]`` are drawn: each trace's expected
    arrivals per rate slice (:func:`~diloco_gym.sim.jit.slice_counts`), its draws
    (:func:`draw_rows`, the :func:`exponential_batch` of its total), then all traces'
    arrays in one :func:`~diloco_gym.sim.jit.synthetic_rows`. Returns ``(arrivals, prompt,
    output, counts, pressure)`` as ``SyntheticRegime.from_raw`` of the traces' ``draw_raw``
    (bit for bit: the same draws, the same rules)."""
    b = len(rngs)
    cum = np.empty((b, t.size + 1))
    noise = np.empty((b, 2, n_p))
    spike_u = np.empty((b, 2, n_p))
    points = []
    token_u = []
    counts = np.empty(b, dtype=np.int64)
    offsets = np.zeros(b + 1, dtype=np.int64)
    for e in range(b):
        total = slice_counts(
            t, widths, onsets[onset_offsets[e] : onset_offsets[e + 1]], bursts, quiet,
            lift_rps, ramp, burst, cum[e],
        )  # fmt: skip
        p, u, z, sp = draw_rows(rngs[e], total, exponential_batch(total), n_p)
        points.append(p)
        token_u.append(u)
        noise[e] = z
        spike_u[e] = sp
        counts[e] = p.size
        offsets[e + 1] = offsets[e] + p.size
    m = offsets[b]
    all_points = np.empty(m)
    all_u = np.empty(m)
    for e in range(b):
        all_points[offsets[e] : offsets[e + 1]] = points[e]
        all_u[offsets[e] : offsets[e + 1]] = token_u[e]
    arrivals = np.empty(m)
    prompt = np.empty(m, dtype=np.int64)
    output = np.empty(m, dtype=np.int64)
    pressure = np.empty((b, 2, n_p))
    synthetic_rows(
        all_points, offsets, cum, edges, cap, all_u, prompt_table, output_table, token_bits,
        noise, spike_u, scale, scale0, rho, means, spike_p, length, level, arrivals, prompt,
        output, pressure,
    )  # fmt: skip
    return arrivals, prompt, output, counts, pressure
