"""The parallel variants of the compiled per-row rules, for a large batch on idle cores.

Each variant splits its rows (merges, envs or episodes) into one contiguous block per
numba thread and runs the serial rule's range function of :mod:`diloco_gym.sim.jit` on each
block. Every row is computed alone, in the same operations, so the results are
bit-identical to the serial rule's (``tests/sim/test_jit_parallel.py``). The variants take
their block count as an argument (:func:`blocks`): a compiled function that reads the
thread count cannot be cached on disk.

Only the main thread enters them (:func:`parallel_ok`): numba's default threading layer
(workqueue) must not be entered from two threads at once. They pay only when the cores are
idle: a parallel region waits for its slowest thread, and on a machine whose cores are busy
one is several times slower than the serial loop (``benchmarks/README.md``).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import get_num_threads, prange

from diloco_gym.sim.jit import (
    cost_queue_range,
    episode_core_range,
    observe_range,
)
from diloco_gym.sim.jit_cache import njit
from diloco_gym.sim.jit_step import observe_all, step_range

__all__ = [
    "parallel_ok",
    "blocks",
    "observe_rows",
    "episode_core_rows",
    "cost_queue_rows",
    "step_rows",
]


def parallel_ok(items: int, at_least: int) -> bool:
    """Whether a batch of ``items`` rows should take a parallel variant: at least
    ``at_least`` of them (below that, starting the threads costs more than it saves), more
    than one numba thread (``NUMBA_NUM_THREADS=1`` turns the variants off) and the calling
    thread is the main thread."""
    return (
        items >= at_least
        and get_num_threads() > 1
        and threading.current_thread() is threading.main_thread()
    )


def blocks(items: int) -> int:
    """The block count of a parallel variant for ``items`` rows: one per numba thread, at
    most one per row."""
    return max(1, min(int(items), get_num_threads()))


@njit(cache=True)
def _lo(c, nc, m):  # pragma: no cover - compiled
    """The first row of block ``c`` of ``nc`` over ``m`` rows (block ``nc`` starts at ``m``)."""
    return (c * m) // nc


@njit(cache=True, parallel=True)
def observe_rows(
    d, last, n, n_merges, m_left, slot, tokens, thr, max_merges, exo, h_min, h_max,
    decision_seconds, budget, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
    staleness_clip_s, out, nc,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`diloco_gym.sim.jit.observe_rows`, one block of rows per thread."""
    m = d.size
    for c in prange(nc):
        observe_range(
            d, last, n, n_merges, m_left, slot, tokens, thr, max_merges, exo, h_min, h_max,
            decision_seconds, budget, floor, scale, tokens_scale, exponent, loss_clip,
            tokens_clip, staleness_clip_s, out, _lo(c, nc, m), _lo(c + 1, nc, m),
        )  # fmt: skip
    return 0


@njit(cache=True, parallel=True)
def episode_core_rows(
    arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di, fa, fb,
    norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain, step_s, cap_s,
    slots, slo_s, exo, pdec, pbin, m0, s, prefmin, base_s, req_bin, flat_bin, latency,
    violated, nc,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`diloco_gym.sim.jit.episode_core_rows`, one block of episodes per thread."""
    b = offsets.size - 1
    for c in prange(nc):
        episode_core_range(
            arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di,
            fa, fb, norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain,
            step_s, cap_s, slots, slo_s, exo, pdec, pbin, m0, s, prefmin, base_s, req_bin,
            flat_bin, latency, violated, _lo(c, nc, b), _lo(c + 1, nc, b),
        )  # fmt: skip
    return 0


@njit(cache=True, parallel=True)
def cost_queue_rows(
    base_s, req_bin, violated, offsets, m0, s, cap_s, lost_frac, m0_bins, out_rows, width, w,
    s_out, d_out, ptr, rbin, base, m0_kept, nc,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`diloco_gym.sim.jit.cost_queue_rows`, one block of episodes per thread (the
    episodes' ``out_rows`` are distinct)."""
    b = offsets.size - 1
    for c in prange(nc):
        cost_queue_range(
            base_s, req_bin, violated, offsets, m0, s, cap_s, lost_frac, m0_bins, out_rows,
            width, w, s_out, d_out, ptr, rbin, base, m0_kept, _lo(c, nc, b), _lo(c + 1, nc, b),
        )  # fmt: skip
    return 0


@njit(cache=True, parallel=True)
def step_rows(
    rows, want, ist, fst, bi, bf, thr, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase,
    qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of, exo, obs, nc,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`diloco_gym.sim.jit_step.step_rows`, one block of rows per thread (a row's step
    reads and writes only its own columns; a shared cost memo is only read: an episode pool's
    full table), then the observation."""
    m = rows.size
    bad = np.full(nc, -1)
    for c in prange(nc):
        bad[c] = step_range(
            rows, want, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin,
            qbase, qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of,
            _lo(c, nc, m), _lo(c + 1, nc, m),
        )  # fmt: skip
    observe_all(ist, fst, bi, bf, thr, ip, fp, exo, obs)
    for c in range(nc):
        if bad[c] >= 0:
            return bad[c]
    return -1
