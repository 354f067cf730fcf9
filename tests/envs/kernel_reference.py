"""The kernel's rules as NumPy code over a batch axis (the form they had before the compiled
step): the reference the compiled step (:mod:`diloco_gym.sim.jit_step`) is tested against,
rule for rule and in whole rollouts. Not part of the package: the package has one form of
each rule, the compiled one."""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.envs import kernel
from diloco_gym.envs.kernel import Budgets, BudgetTables, EnvState, EpisodeBatch
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import learners as lrn


def options_at(d, last, m_left, params: EnvParams, n: int, budget: BudgetTables | None):
    """``(can_merge, can_defer)`` at decision ``d`` (scalars or arrays alike).

    Without a budget: merge iff ``gap >= H_min``; defer iff ``gap < H_max``. With a budget,
    additionally a merge must leave a feasible completion and a deferral must leave a
    feasible next merge (or, with no merges left, the tail must already be safe).
    """
    gap = d - last
    can_merge = gap >= params.h_min
    can_defer = gap < params.h_max
    if budget is None:
        return can_merge, can_defer
    m1 = np.maximum(m_left - 1, 0)
    dd = np.minimum(d, n - 1)
    can_merge = can_merge & (m_left > 0) & budget.reach[m1, dd]
    lo = np.maximum(d + 1, last + params.h_min)
    hi = np.minimum(last + params.h_max, n - 1)
    lo_c = np.minimum(lo, n)
    hi_c = np.clip(hi + 1, 0, n)
    later = (budget.prefix[m1, np.maximum(hi_c, lo_c)] - budget.prefix[m1, lo_c]) > 0
    tail_safe = budget.reach[0, np.minimum(last, n - 1)]
    can_defer = can_defer & np.where(m_left > 0, later, tail_safe)
    return can_merge, can_defer


def options(
    state: EnvState,
    batch: EpisodeBatch,
    idx: np.ndarray | None,
    params: EnvParams,
    budgets: Budgets,
):
    """``(can_merge, can_defer)`` of rows ``idx`` (``None``: all): :func:`options_at`,
    grouped by episode length when there is a budget."""
    sl = slice(None) if idx is None else idx
    d, last, m_left = state.d[sl], state.last[sl], state.m_left[sl]
    p = params
    if p.merge_budget is None:
        return options_at(d, last, m_left, p, 0, None)
    n = batch.n[sl]
    lengths = np.unique(n)
    if lengths.size == 1:
        n0 = int(lengths[0])
        return options_at(d, last, m_left, p, n0, budgets.tables(n0))
    can_merge = np.empty(d.shape, dtype=bool)
    can_defer = np.empty(d.shape, dtype=bool)
    for n0 in lengths:
        sel = n == n0
        can_merge[sel], can_defer[sel] = options_at(
            d[sel], last[sel], m_left[sel], p, int(n0), budgets.tables(int(n0))
        )
    return can_merge, can_defer


def resolve(want, can_merge, can_defer):
    """``(merge, overridden)``: the action taken and whether it differs from the one asked.

    A merge happens when asked and allowed, or when deferring is not allowed; elementwise
    on arrays and on Python/NumPy booleans alike.
    """
    merge = (want & can_merge) | (can_defer ^ True)
    return merge, merge != want


def reward(excess, progress, params: EnvParams):
    """``-excess_weight * excess + progress_weight * progress`` (both terms as paid)."""
    return -params.excess_weight * excess + params.progress_weight * progress


def apply_merges(
    state: EnvState,
    batch: EpisodeBatch,
    idx: np.ndarray | int,
    params: EnvParams,
    lp: lrn.LearnerParams,
    cost,
) -> tuple[Any, Any]:
    """Merge now in rows ``idx`` (an index array, or one row's index): the learners' gain,
    the merge's isolated cost (``cost(idx, d)``), and the state after it. The same
    arithmetic runs on arrays and, for one row, on Python scalars (the single env).

    Returns:
        ``(excess, gain)`` per merge (scalars for one row): the reward's sync-excess term
        (cost times the episode's reward scale) and the global loss decrease.
    """
    if isinstance(idx, int) or np.ndim(idx) == 0:  # one row: the array form of [row]
        ex, gain = apply_merges(state, batch, np.array([int(idx)]), params, lp, cost)
        return float(ex[0]), float(gain[0])
    d = state.d[idx]
    gap_s = (d - state.last[idx]) * params.decision_seconds
    added, gain = lrn.merge_gain(gap_s, state.tokens[idx], batch.thr[idx], lp)
    gain = gain * batch.credit[idx]  # x 1.0 (exact) but in a fleet with quantised syncs
    state.tokens[idx] += added
    c = cost(idx, d)
    state.last[idx] = d
    state.m_left[idx] -= 1
    state.n_merges[idx] += 1
    state.excess_sum[idx] += c * batch.pct[idx]  # additive sync-excess %, for the summary
    state.excess_requests[idx] += c
    state.progress_sum[idx] += gain
    return c * batch.scale[idx], gain


def forced_deferral_end(d, last, n, m_left, params: EnvParams, budgets: Budgets | None):
    """First decision after a forced deferral at ``d`` at which the options can differ (or
    the episode's end ``n``); elementwise.

    Below ``H_min`` the options cannot change until ``H_min``; with a budget, deferrals stay
    forced until the next decision from which the remaining merges can still be placed (to
    the end, with none left). Jumping over the run gives the same state as stepping through
    it: nothing happens on the way.
    """
    p = params
    below = d - last < p.h_min
    if isinstance(d, int) and p.merge_budget is None:  # one row's Python ints (as below)
        return min(n, last + p.h_min) if below else d + 1
    end = np.where(below, np.minimum(n, last + p.h_min), d + 1)
    if p.merge_budget is None:
        return end
    if np.all(below):
        return end
    assert budgets is not None  # with a merge budget
    end = np.array(end, dtype=np.int64)  # writable, also for scalar inputs
    d_, n_, m_, b_ = (np.asarray(x) for x in (d, n, m_left, below))
    for n0 in np.unique(n_[~b_]):
        sel = ~b_ & (n_ == n0)
        nxt = budgets.next_reach(int(n0))
        m1 = np.maximum(m_[sel] - 1, 0)
        # No merge left: the tail is already safe (deferral is allowed), so every remaining
        # decision is a forced deferral. Otherwise: the next decision from which the
        # remaining merges can be completed.
        end[sel] = np.where(m_[sel] > 0, nxt[m1, np.minimum(d_[sel] + 1, n0)], n0)
    return end


def advance_forced(
    state: EnvState,
    batch: EpisodeBatch,
    idx: np.ndarray | None,
    params: EnvParams,
    lp: lrn.LearnerParams,
    budgets: Budgets,
    cost,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply single-option decisions in rows ``idx`` (``None``: all) until each has a real
    choice or its episode ends; returns the merges' excess and progress per row."""
    b = state.d.size
    ex = np.zeros(b)
    pr = np.zeros(b)
    n_all = batch.n
    todo = np.flatnonzero(state.d < n_all) if idx is None else idx[state.d[idx] < n_all[idx]]
    while todo.size:
        can_merge, can_defer = options(state, batch, todo, params, budgets)
        forced = ~(can_merge & can_defer)
        todo, can_merge, can_defer = todo[forced], can_merge[forced], can_defer[forced]
        if not todo.size:
            break
        stuck = ~(can_merge | can_defer)
        if stuck.any():  # cannot happen with validated budgets
            i = int(todo[stuck][0])
            raise RuntimeError(f"no feasible action at decision {state.d[i]} (row {i})")
        d_next = state.d[todo] + 1
        defer = np.flatnonzero(~can_merge)
        if defer.size:
            r = todo[defer]
            d_next[defer] = forced_deferral_end(
                state.d[r], state.last[r], n_all[r], state.m_left[r], params, budgets
            )
        merged = todo[can_merge]
        if merged.size:
            e, g = apply_merges(state, batch, merged, params, lp, cost)
            ex[merged] += e
            pr[merged] += g
        state.d[todo] = d_next
        todo = todo[d_next < n_all[todo]]
    return ex, pr


def step(
    state: EnvState,
    batch: EpisodeBatch,
    want: np.ndarray,
    active: np.ndarray | None,
    params: EnvParams,
    lp: lrn.LearnerParams,
    budgets: Budgets,
    cost,
) -> dict[str, np.ndarray]:
    """One decision of every row (``active``: only those; ``None``: all).

    Returns:
        ``merged``, ``overridden``, ``excess`` (the sync-excess term, >= 0), ``progress``,
        ``reward`` and ``truncated`` arrays over rows (inactive rows: no merge, reward 0).
    """
    b = state.d.size
    can_merge, can_defer = options(state, batch, None, params, budgets)
    merge, overridden = resolve(want, can_merge, can_defer)
    if active is not None:
        merge &= active
        overridden &= active
    excess = np.zeros(b)
    progress = np.zeros(b)
    idx = np.flatnonzero(merge)
    if idx.size:
        excess[idx], progress[idx] = apply_merges(state, batch, idx, params, lp, cost)
    live = np.ones(b, dtype=bool) if active is None else active
    excess += state.pend_excess * live
    progress += state.pend_progress * live
    state.pend_excess[live] = 0.0
    state.pend_progress[live] = 0.0
    state.d[:] += live
    if params.skip_forced:
        ex2, pr2 = advance_forced(
            state, batch, None if active is None else np.flatnonzero(active), params, lp,
            budgets, cost,
        )  # fmt: skip
        excess += ex2
        progress += pr2
    rewards = reward(excess, progress, params)
    truncated = state.d >= batch.n
    if active is not None:
        truncated &= active
        rewards[~active] = 0.0
    return {
        "merged": merge,
        "overridden": overridden,
        "excess": excess,
        "progress": progress,
        "reward": rewards,
        "truncated": truncated,
    }


def action_masks(
    state: EnvState, batch: EpisodeBatch, params: EnvParams, budgets: Budgets
) -> np.ndarray:
    """Feasible actions of every row, ``(B, 2)`` bool ``[defer, merge]``; a row whose
    episode has ended allows both."""
    out = np.ones((state.d.size, 2), dtype=bool)
    live = np.flatnonzero(state.d < batch.n)
    if live.size:
        can_merge, can_defer = options(state, batch, live, params, budgets)
        out[live, 0] = can_defer
        out[live, 1] = can_merge
    return out


def reset_rows(state, batch, idx, params, lp, budgets, cost) -> None:
    """:func:`diloco_gym.envs.kernel.reset_rows` with the forced decisions of
    :func:`advance_forced` (this module's form)."""

    def advance(rows):
        ex, pr = advance_forced(state, batch, np.asarray(rows), params, lp, budgets, cost)
        return ex[rows], pr[rows]

    kernel.reset_rows(state, batch, idx, params, lp, advance)
