"""The simulation kernel: the merge-scheduling dynamics over an explicit batch of episodes.

Everything an environment does between two observations is written here once, over arrays
with a leading batch axis:

* :func:`episode_draws`: the draws of an episode from its seed, in their fixed order
  (:func:`episode_draws_batch` for many seeds; the episode is then built from them,
  :mod:`diloco_gym.envs.episode`).
* :class:`EnvState`: the agent-dependent state (decision, last merge, merges, budget left,
  global tokens, reward terms owed) of every episode in the batch;
  :class:`EpisodeBatch`: the per-episode constants the steps read (length, reward scale,
  learner throughputs, seed and the slot of the episode's arrays in the bank,
  :class:`~diloco_gym.envs.bank.EpisodeBank`).
* :func:`options_at` (corridor and budget masks at a decision, on scalars or arrays) and
  :class:`BudgetTables` (the feasibility tables of an exact merge budget; :class:`Budgets`
  caches them per episode length).
* :func:`reset_rows` (the start of an episode), :func:`options` (:func:`options_at` of
  rows of the state), :func:`check_actions` (input validation), :func:`resolve` (the action taken),
  :func:`apply_merges` (a merge: its cost, training gain and state change),
  :func:`advance_forced` (decisions with a single feasible action), :func:`reward`,
  :func:`step` (one decision of every live episode) and :func:`observe` (the observation, the
  compiled :func:`diloco_gym.sim.jit.observe_rows`).

Functions update the state arrays of the rows they are given in place (the batch can be
thousands of episodes; a copy per step would cost more than the step) and return the
per-row results. :class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv` is this kernel with
Gymnasium's vector API around it. :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` is a batch of
one: it calls the same rule functions (:func:`resolve`, :func:`forced_deferral_end`,
:func:`reward`, :func:`check_actions`, :func:`max_merges`, :func:`options_at`) on Python
scalars, and computes its observation with the same compiled :func:`observe`, so no rule has a
second copy; ``tests/envs/test_vector.py`` checks both against each other step for step
and ``tests/envs/test_kernel.py`` both against a direct kernel rollout.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.observation import EXO_SLICE, LEARNER_SLICE, OBS_INDEX
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_rows
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.regimes import SyntheticRegime
from diloco_gym.sim.schedules import budget_range, completion_counts
from diloco_gym.sim.sidecar import cost_horizon

__all__ = [
    "EnvState",
    "EpisodeBatch",
    "Budgets",
    "BudgetTables",
    "episode_draws",
    "episode_draws_batch",
    "synthetic_draws",
    "is_synthetic",
    "new_state",
    "new_batch",
    "state_arrays",
    "batch_arrays",
    "step_params",
    "budget_arrays",
    "load_episodes",
    "reset_rows",
    "options",
    "options_at",
    "check_actions",
    "resolve",
    "apply_merges",
    "advance_forced",
    "forced_deferral_end",
    "reward",
    "step",
    "observe",
    "observe_consts",
    "observe_args",
    "action_masks",
    "max_merges",
]

# The compiled observation (sim.jit.observe_rows) writes the features in this layout.
assert (OBS_INDEX["gap"], OBS_INDEX["corridor_open"], OBS_INDEX["merges"]) == (0, 1, 14)
assert (OBS_INDEX["time_left"], OBS_INDEX["budget_left"]) == (15, 16)
assert LEARNER_SLICE == slice(2, 7) and EXO_SLICE == slice(7, 14)


def episode_draws(
    generator: Any, seed: int, learner_params: lrn.LearnerParams, as_trace: bool = True
) -> tuple:
    """The draws of the episode of ``seed``, in their fixed order.

    One generator, ``np.random.default_rng(seed)``, draws first the trace
    (``generator(rng)``) and then the learner throughputs
    (``learner_params.draw_throughputs``). Every episode of either env comes from here, so
    the single and the vector env give the same episode for the same seed.

    Returns:
        ``(trace, throughputs)``; with ``as_trace=False`` the trace's arrays instead,
        ``(arrivals, prompt, output, network, checkpoint, duration_s, name, throughputs)``
        (:func:`episode_draws_batch` of one seed).
    """
    if as_trace:
        rng = np.random.default_rng(seed)
        trace = generator(rng)
        return trace, learner_params.draw_throughputs(rng)
    return episode_draws_batch(generator, [seed], learner_params)[0]


def is_synthetic(generator: Any) -> bool:
    """Whether ``generator`` draws its traces as :class:`SyntheticRegime` does."""
    cls = SyntheticRegime
    return isinstance(generator, cls) and type(generator).__call__ is cls.__call__


def synthetic_draws(
    generator: SyntheticRegime, seeds: list[int], learner_params: lrn.LearnerParams
) -> tuple:
    """The episodes of ``seeds`` of a synthetic regime as its traces' arrays concatenated:
    ``(arrivals, prompt, output, counts, pressure, throughputs)`` (``SyntheticRegime.draw_raw``
    and the learner throughputs from each seed's generator, then one ``from_raw``)."""
    raws, thrs = [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        raws.append(generator.draw_raw(rng))
        thrs.append(learner_params.draw_throughputs(rng))
    return generator.from_raw(raws, np.float64) + (np.stack(thrs),)


def episode_draws_batch(
    generator: Any, seeds: list[int], learner_params: lrn.LearnerParams
) -> list[tuple]:
    """:func:`episode_draws` (``as_trace=False``) of each of ``seeds``: the same draws, and
    for a :class:`~diloco_gym.sim.regimes.SyntheticRegime` the traces' arrays made from
    them in one compiled call (``SyntheticRegime.from_raw``; no
    :class:`~diloco_gym.sim.traces.Trace` is built)."""
    if not is_synthetic(generator):
        out = []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            tr = generator(rng)
            thr = learner_params.draw_throughputs(rng)
            out.append(
                (tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.network, tr.checkpoint)
                + (tr.duration_s, tr.name, thr)
            )
        return out
    arrivals, prompt, output, counts, pressure, thrs = synthetic_draws(
        generator, seeds, learner_params
    )
    ends, gen = np.cumsum(counts), generator
    return [
        (arrivals[lo:hi], prompt[lo:hi], output[lo:hi], pressure[e, 0], pressure[e, 1])
        + (gen.duration_s, gen.name, thrs[e])
        for e, (lo, hi) in enumerate(zip((ends - counts).tolist(), ends.tolist(), strict=True))
    ]


class EnvState(NamedTuple):
    """Agent-dependent state of a batch of episodes, one entry per row (``(B,)`` arrays).

    Attributes:
        d: current decision.
        last: decision of the last merge (0 at the start: an episode starts just after one).
        m_left: merges left under the merge budget (0 without one).
        n_merges: merges launched so far.
        tokens: tokens in the global model.
        excess_sum: additive sync-excess so far (percentage points of requests).
        excess_requests: the same in requests.
        progress_sum: training progress (global loss decrease) so far.
        pend_excess / pend_progress: reward terms of merges forced before the first real
            choice of an episode, paid on its first step.
    """

    d: np.ndarray
    last: np.ndarray
    m_left: np.ndarray
    n_merges: np.ndarray
    tokens: np.ndarray
    excess_sum: np.ndarray
    excess_requests: np.ndarray
    progress_sum: np.ndarray
    pend_excess: np.ndarray
    pend_progress: np.ndarray

    def __reduce__(self):
        # Copies and pickles keep the fields views of the two arrays (new_state), which the
        # compiled step holds: the arrays travel once, the views are taken again.
        ints, floats = self.d.base, self.tokens.base
        if _rows_of(ints, self[:4]) and _rows_of(floats, self[4:]):
            return _state_of, (ints, floats)
        return EnvState, tuple(self)


class EpisodeBatch(NamedTuple):
    """The constants of each row's current episode (copied from the bank at its start, so a
    step gathers nothing): ``slot`` in the bank, ``n`` decisions, ``pct`` (percentage points
    per violated request), ``scale`` (reward units per violated request), ``max_merges``,
    ``thr`` ``(B, K)`` and ``thr_k`` ``(K, B)`` learner throughputs and ``thr_sum`` their
    sum, ``seed``, and ``credit``: the share of a merge's learner progress credited (1 in
    the single-host envs; the fleet's precision surrogate, set by the env, before a merge)."""

    slot: np.ndarray
    n: np.ndarray
    pct: np.ndarray
    scale: np.ndarray
    max_merges: np.ndarray
    thr: np.ndarray
    thr_k: np.ndarray
    thr_sum: np.ndarray
    seed: np.ndarray
    credit: np.ndarray

    def __reduce__(self):
        # As EnvState's: the scalar fields stay views of their two arrays (new_batch).
        ints, floats = self.n.base, self.pct.base
        fields_i = (self.n, self.slot, self.seed)
        fields_f = (self.pct, self.scale, self.max_merges, self.thr_sum, self.credit)
        if _rows_of(ints, fields_i) and _rows_of(floats, fields_f):
            return _batch_of, (ints, floats, self.thr, self.thr_k)
        return EpisodeBatch, tuple(self)


def _rows_of(base: Any, views: tuple) -> bool:
    """Whether ``views`` are the rows of ``base``, in order."""
    return (
        isinstance(base, np.ndarray)
        and base.ndim == 2
        and base.shape[0] == len(views)
        and all(v.base is base and np.shares_memory(v, base[k]) for k, v in enumerate(views))
    )


def _state_of(ints: np.ndarray, floats: np.ndarray) -> EnvState:
    return EnvState(*ints, *floats)


def _batch_of(ints, floats, thr, thr_k) -> EpisodeBatch:
    n, slot, seed = ints
    pct, scale, max_merges, thr_sum, credit = floats
    return EpisodeBatch(slot, n, pct, scale, max_merges, thr, thr_k, thr_sum, seed, credit)


def new_state(b: int) -> EnvState:
    """An all-zero state of ``b`` rows (:func:`reset_rows` starts their episodes). Its fields
    are the rows of two arrays, ``(4, b)`` int64 and ``(6, b)`` float64
    (:func:`state_arrays`), in the compiled step's order
    (:data:`diloco_gym.sim.jit_step.STATE_INT`, ``STATE_FLOAT``)."""
    return _state_of(np.zeros((4, b), dtype=np.int64), np.zeros((6, b)))


def state_arrays(state: EnvState) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays whose rows are ``state``'s fields (:func:`new_state`)."""
    ints, floats = state.d.base, state.tokens.base
    assert ints is not None and ints.shape[0] == 4 and floats is not None
    return ints, floats


def new_batch(b: int, k: int) -> EpisodeBatch:
    """An empty episode batch of ``b`` rows and ``k`` learners (slot ``i`` for row ``i``). Its
    scalar fields are the rows of a ``(3, b)`` int64 and a ``(5, b)`` float64 array
    (:func:`batch_arrays`; :data:`diloco_gym.sim.jit_step.BATCH_INT`, ``BATCH_FLOAT``)."""
    ints = np.zeros((3, b), dtype=np.int64)
    floats = np.zeros((5, b))
    batch = _batch_of(ints, floats, np.zeros((b, k)), np.zeros((k, b)))
    batch.slot[:] = np.arange(b)
    batch.n[:] = 1
    batch.max_merges[:] = 1.0
    batch.credit[:] = 1.0
    return batch


def batch_arrays(batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays whose rows are ``batch``'s scalar fields (:func:`new_batch`)."""
    ints, floats = batch.n.base, batch.pct.base
    assert ints is not None and ints.shape[0] == 3 and floats is not None
    return ints, floats


def max_merges(n, params: EnvParams):
    """Scale of the ``merges`` feature: the merges an ``n``-decision episode can hold at
    ``H_min`` spacing (at least 1)."""
    return np.maximum(1.0, n / params.h_min)


def load_episodes(batch: EpisodeBatch, bank: Any, idx: np.ndarray) -> None:
    """Copy the constants of the episodes in bank slots ``batch.slot[idx]`` into rows ``idx``."""
    slot = batch.slot[idx]
    batch.n[idx] = bank.n[slot]
    batch.pct[idx] = bank.pct[slot]
    batch.scale[idx] = bank.scale[slot]
    batch.max_merges[idx] = bank.max_merges[slot]
    batch.thr[idx] = bank.thr[slot]
    batch.thr_k[:, idx] = bank.thr[slot].T
    batch.thr_sum[idx] = np.sum(bank.thr[slot], axis=-1)
    batch.seed[idx] = bank.seed[slot]


class BudgetTables:
    """Feasibility tables for an exact merge budget (shared by every episode of length N).

    ``reach[m, d]``: after a merge at ``d`` with ``m`` merges still to place, a feasible
    completion exists. ``prefix[m, x]``: how many ``d < x`` have ``reach[m, d]``.
    """

    def __init__(self, n: int, h_min: int, h_max: int, budget: int) -> None:
        lo, hi = budget_range(n, h_min, h_max)  # closed form: refuse before allocating
        f = completion_counts(n, h_min, h_max, budget) if lo <= budget <= hi else None
        if f is None or f[budget, 0] <= 0:
            raise ValueError(
                f"merge_budget={budget} is infeasible for an episode of {n} "
                f"decisions (H_min={h_min}, H_max={h_max} decisions); feasible "
                f"budgets: {lo}..{hi}"
            )
        self.n, self.h_min, self.h_max, self.budget = n, h_min, h_max, budget
        self.reach = f > 0
        self.prefix = np.zeros((budget + 1, n + 1), dtype=np.int64)
        np.cumsum(self.reach, axis=1, out=self.prefix[:, 1:])


def step_params(params: EnvParams, lp: lrn.LearnerParams, sidecar: Any, m0_bins: int) -> tuple:
    """The compiled step's parameters (:mod:`diloco_gym.sim.jit_step`): an int64 array in
    the order of ``INT_PARAMS`` and a float64 array in the order of ``FLOAT_PARAMS``.
    ``m0_bins``: the bins per entry of the cost queue's no-merge slowdown (1 for one
    episode's queue, ``decision_interval`` for the episode bank's)."""
    p = params
    w = int(p.merge_steps)
    ints = np.array(
        [
            p.h_min, p.h_max, -1 if p.merge_budget is None else p.merge_budget,
            int(p.skip_forced), p.decision_interval, w, cost_horizon(sidecar, p.step_seconds, w),
            int(m0_bins),
        ],
        dtype=np.int64,
    )  # fmt: skip
    floats = np.array(
        [
            p.decision_seconds, lp.drift_s, lp.merge_overhead_s, lp.loss_floor, lp.loss_scale,
            lp.tokens_scale, lp.loss_exponent, p.loss_clip, p.tokens_clip, p.staleness_clip_s,
            p.excess_weight, p.progress_weight, 1.0 + sidecar.sync_slowdown, sidecar.slo_s,
            float(sidecar.slots),
        ],
        dtype=np.float64,
    )  # fmt: skip
    return ints, floats


_NO_TABLE = np.zeros((1, 1), dtype=np.int64)
_NO_REACH = np.zeros((1, 1), dtype=np.bool_)


def budget_arrays(budgets: Budgets, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(reach, prefix, next_reach)`` of an ``n``-decision episode's budget tables for the
    compiled step (placeholders without a merge budget)."""
    if budgets.params.merge_budget is None:
        return _NO_REACH, _NO_TABLE, _NO_TABLE
    t = budgets.tables(n)
    return t.reach, t.prefix, budgets.next_reach(n)


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


class Budgets:
    """Feasibility tables of an exact merge budget, per episode length (cached)."""

    def __init__(self, params: EnvParams) -> None:
        self.params = params
        self._tables: dict[int, BudgetTables] = {}
        self._next: dict[int, np.ndarray] = {}

    def tables(self, n: int) -> BudgetTables:
        """:class:`BudgetTables` of an ``n``-decision episode (an infeasible budget
        raises here)."""
        if n not in self._tables:
            p = self.params
            assert p.merge_budget is not None  # called only with a merge budget
            self._tables[n] = BudgetTables(n, p.h_min, p.h_max, p.merge_budget)
        return self._tables[n]

    def next_reach(self, n: int) -> np.ndarray:
        """``nxt[m, x]``: the first decision ``>= x`` after which ``m`` more merges can be
        placed feasibly (``reach[m]`` of :class:`BudgetTables`), or ``n`` if none."""
        if n not in self._next:
            reach = self.tables(n).reach
            pos = np.where(reach, np.arange(n), n)
            nxt = np.full((reach.shape[0], n + 1), n, dtype=np.int64)
            nxt[:, :n] = np.minimum.accumulate(pos[:, ::-1], axis=1)[:, ::-1]
            self._next[n] = nxt
        return self._next[n]


def reset_rows(
    state: EnvState,
    batch: EpisodeBatch,
    idx: np.ndarray | int,
    params: EnvParams,
    lp: lrn.LearnerParams,
    budgets: Budgets,
    cost,
    advance=None,
) -> None:
    """Start the episodes of rows ``idx`` (their constants already in ``batch``).

    The episode starts just after a merge (gap 0). With ``skip_forced``, merges forced
    before the agent's first real choice (possible only with a tight merge budget) are
    applied now and their reward terms owed to the first step (a reset returns no reward).
    ``advance(idx) -> (excess, progress)`` applies them (default :func:`advance_forced`;
    the single env passes its one-row loop over the same rules).

    Raises:
        ValueError: the merge budget leaves the agent no decision (every merge is forced).
    """
    state.d[idx] = 0
    state.last[idx] = 0
    state.n_merges[idx] = 0
    state.tokens[idx] = float(lp.initial_tokens)
    state.m_left[idx] = params.merge_budget if params.merge_budget is not None else 0
    state.excess_sum[idx] = 0.0
    state.excess_requests[idx] = 0.0
    state.progress_sum[idx] = 0.0
    state.pend_excess[idx] = 0.0
    state.pend_progress[idx] = 0.0
    if params.skip_forced:
        if advance is None:
            ex, pr = advance_forced(state, batch, np.asarray(idx), params, lp, budgets, cost)
            ex, pr = ex[idx], pr[idx]
        else:
            ex, pr = advance(idx)
        state.pend_excess[idx] = ex
        state.pend_progress[idx] = pr
        if np.any(state.d[idx] >= batch.n[idx]):
            raise ValueError(
                f"merge_budget={params.merge_budget} leaves the agent no decision "
                f"in this episode (every merge is forced)"
            )


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


def check_actions(actions: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Validated actions as a bool array of ``shape`` (``True`` = merge).

    Accepts integers, bools and floats equal to 0 or 1 (a one-element array for a single
    env). Raises ``ValueError`` naming the bad value: the shape, a value other than 0/1, or
    a fractional one that ``int()`` would truncate.
    """
    a = np.asarray(actions)
    if shape == ():
        if a.ndim > 1 or (a.ndim == 1 and a.size != 1):
            raise ValueError(f"action must be 0 (defer) or 1 (merge), got {actions!r}")
        a = a.reshape(())
    elif a.shape != shape:
        raise ValueError(f"actions must have shape {shape}, got {a.shape}")
    if a.dtype.kind in "iu":
        valid = bool(a.min() >= 0 and a.max() <= 1) if a.size else True
    elif a.dtype.kind == "b":
        valid = True
    elif a.dtype.kind == "f":
        valid = bool(np.all((a == 0) | (a == 1)))
    else:
        valid = False
    if not valid:
        if shape == ():
            raise ValueError(f"action must be 0 (defer) or 1 (merge), got {actions!r}")
        bad = a[(a != 0) & (a != 1)][0].item()
        raise ValueError(f"actions must be 0 (defer) or 1 (merge), got {bad!r}")
    return a == 1


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
    if isinstance(idx, int) or np.ndim(idx) == 0:  # one row: its scalar form
        return _apply_one(state, batch, int(idx), params, lp, cost)
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


def _apply_one(state: EnvState, batch: EpisodeBatch, i: int, params: EnvParams, lp, cost):
    """:func:`apply_merges` of row ``i`` alone, on the row's values as Python scalars (the
    single env): the same operations in the same order (IEEE arithmetic on Python floats
    and ints equals NumPy's on float64 and int64) and ``lrn.merge_gain``'s scalar form, so
    the state and the terms are bit for bit the same; ``cost(i, d)`` gets ``d`` as an
    ``int``."""
    d = state.d.item(i)
    gap_s = (d - state.last.item(i)) * params.decision_seconds
    added, gain, _ = lrn.merge_gain_scalar(gap_s, state.tokens.item(i), batch.thr_sum.item(i), lp)
    gain = gain * batch.credit.item(i)  # x 1.0 (exact) but in a fleet with quantised syncs
    state.tokens[i] = state.tokens.item(i) + added
    c = float(cost(i, d))
    state.last[i] = d
    state.m_left[i] = state.m_left.item(i) - 1
    state.n_merges[i] = state.n_merges.item(i) + 1
    state.excess_sum[i] = state.excess_sum.item(i) + c * batch.pct.item(i)
    state.excess_requests[i] = state.excess_requests.item(i) + c
    state.progress_sum[i] = state.progress_sum.item(i) + gain
    return c * batch.scale.item(i), gain


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


def observe_consts(params: EnvParams, lp: lrn.LearnerParams) -> tuple:
    """The parameters :func:`observe` passes to the compiled observation, in its order (an
    env builds them once: a step then passes a tuple instead of reading 12 attributes)."""
    p = params
    return (
        p.h_min, p.h_max, p.decision_seconds, -1 if p.merge_budget is None else p.merge_budget,
        lp.loss_floor, lp.loss_scale, lp.tokens_scale, lp.loss_exponent, p.loss_clip,
        p.tokens_clip, p.staleness_clip_s,
    )  # fmt: skip


def observe(
    state: EnvState,
    batch: EpisodeBatch,
    exo: np.ndarray,
    params: EnvParams,
    lp: lrn.LearnerParams,
    out: np.ndarray,
    consts: tuple | None = None,
    parallel: bool = False,
) -> np.ndarray:
    """The observation of every row into ``out`` ``(B, OBS_DIM)`` float32: the compiled
    rule :func:`diloco_gym.sim.jit.observe_rows` (both envs call it; ``parallel``: its
    parallel variant when :func:`diloco_gym.sim.jit_parallel.parallel_ok`, the same result).

    ``exo``: the bank's exogenous features, ``(slots, decisions, 7)``; the terminal
    observation (``d == n``) repeats the last decision's. ``consts``:
    :func:`observe_consts` of ``params`` and ``lp``, when the caller keeps them.
    """
    c = observe_consts(params, lp) if consts is None else consts
    rule = compiled_rows("observe_rows", parallel, out.shape[0], 256)
    rule(*observe_args(state, batch, exo, c, out))
    return out


def observe_args(state: EnvState, batch: EpisodeBatch, exo: np.ndarray, consts: tuple, out):
    """The arguments of the compiled observation (:func:`observe`), as a tuple: the state's
    and the batch's arrays are updated in place, so a caller that steps one episode keeps
    the tuple until its next reset and calls ``jit.observe_rows(*args)`` directly."""
    return (
        state.d, state.last, batch.n, state.n_merges, state.m_left, batch.slot, state.tokens,
        batch.thr, batch.max_merges, exo, *consts, out,
    )  # fmt: skip


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
