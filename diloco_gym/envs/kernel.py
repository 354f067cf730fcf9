"""The simulation kernel: the merge-scheduling state over an explicit batch of episodes.

The rules of a decision (the corridor and budget masks, the action taken, a merge's cost,
gain and state change, the forced decisions, the reward) are written once, compiled, in
:mod:`diloco_gym.sim.jit_step`; both envs call them through
:class:`~diloco_gym.envs.fused.FusedStep`. This module holds what they act on and what
prepares them:

* :func:`episode_draws`: the draws of an episode from its seed, in their fixed order
  (:func:`episode_draws_batch` for many seeds; the episode is then built from them,
  :mod:`diloco_gym.envs.episode`).
* :class:`EnvState`: the agent-dependent state (decision, last merge, merges, budget left,
  global tokens, reward terms owed) of every episode in the batch;
  :class:`EpisodeBatch`: the per-episode constants the steps read (length, reward scale,
  learner throughputs, seed and the slot of the episode's arrays in the bank,
  :class:`~diloco_gym.envs.bank.EpisodeBank`). Their fields are rows of small 2D arrays
  (:func:`state_arrays`, :func:`batch_arrays`), which the compiled step reads.
* :class:`BudgetTables` (the feasibility tables of an exact merge budget; :class:`Budgets`
  caches them per episode length; :func:`budget_arrays` for the compiled step),
  :func:`options_at` (the masks at a decision, on scalars or arrays: the compiled rule).
* :func:`step_params` (the compiled step's parameters), :func:`reset_rows` (the start of an
  episode), :func:`check_actions` (input validation) and :func:`observe` (the observation,
  the compiled :func:`diloco_gym.sim.jit.observe_rows`).

:class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv` is this kernel with Gymnasium's vector
API around it; :class:`~diloco_gym.envs.env.DiLoCoSyncEnv` is a batch of one.
``tests/envs/test_kernel.py`` checks both against a rollout of the rules written as NumPy
over the batch axis (``tests/envs/kernel_reference.py``, the form they had before they were
compiled), ``tests/envs/test_vector.py`` both envs against each other step for step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.observation import EXO_SLICE, LEARNER_SLICE, OBS_INDEX
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_rows, compiled_step
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
    "options_at",
    "check_actions",
    "observe",
    "observe_consts",
    "observe_args",
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
    generator: SyntheticRegime,
    seeds: list[int],
    learner_params: lrn.LearnerParams,
    scratch: dict | None = None,
) -> tuple:
    """The episodes of ``seeds`` of a synthetic regime as its traces' arrays concatenated:
    ``(arrivals, prompt, output, counts, pressure, throughputs)`` (``SyntheticRegime.draw_raw``
    and the learner throughputs from each seed's generator, then one ``from_raw``, with
    its ``scratch``)."""
    raws, thrs = [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        raws.append(generator.draw_raw(rng))
        thrs.append(learner_params.draw_throughputs(rng))
    return generator.from_raw(raws, np.float64, scratch) + (np.stack(thrs),)


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
    the single-host envs; the fleet's precision surrogate, set by the env, before a merge).

    A fleet's row (the fleet env's compiled cost, :mod:`diloco_gym.sim.jit_step`) also
    has ``sites``: the cost queues its merge sums (1: one queue, the single host's), and
    ``stall_s``: the seconds each sync stalls the learners (model v1's learner credit; 0:
    none), and ``fragments``: ``F >= 2`` when a sync is one of ``F`` fragments' and its
    learner credit model v1's fragment credit (each fragment's own staleness, from the
    recorded schedule), else 0."""

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
    sites: np.ndarray
    stall_s: np.ndarray
    fragments: np.ndarray

    def __reduce__(self):
        # As EnvState's: the scalar fields stay views of their two arrays (new_batch).
        ints, floats = self.n.base, self.pct.base
        fields_i = (self.n, self.slot, self.seed, self.sites, self.fragments)
        fields_f = (self.pct, self.scale, self.max_merges, self.thr_sum, self.credit, self.stall_s)
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
    n, slot, seed, sites, fragments = ints
    pct, scale, max_merges, thr_sum, credit, stall_s = floats
    return EpisodeBatch(
        slot, n, pct, scale, max_merges, thr, thr_k, thr_sum, seed, credit, sites, stall_s,
        fragments,
    )  # fmt: skip


def new_state(b: int) -> EnvState:
    """An all-zero state of ``b`` rows (:func:`reset_rows` starts their episodes). Its fields
    are the rows of two arrays, ``(4, b)`` int64 and ``(6, b)`` float64
    (:func:`state_arrays`), in the compiled step's order
    (:data:`diloco_gym.sim.step_layout.STATE_INT`, ``STATE_FLOAT``)."""
    return _state_of(np.zeros((4, b), dtype=np.int64), np.zeros((6, b)))


def state_arrays(state: EnvState) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays whose rows are ``state``'s fields (:func:`new_state`)."""
    ints, floats = state.d.base, state.tokens.base
    assert ints is not None and ints.shape[0] == 4 and floats is not None
    return ints, floats


def new_batch(b: int, k: int) -> EpisodeBatch:
    """An empty episode batch of ``b`` rows and ``k`` learners (slot ``i`` for row ``i``). Its
    scalar fields are the rows of a ``(5, b)`` int64 and a ``(6, b)`` float64 array
    (:func:`batch_arrays`; :data:`diloco_gym.sim.step_layout.BATCH_INT`, ``BATCH_FLOAT``)."""
    ints = np.zeros((5, b), dtype=np.int64)
    floats = np.zeros((6, b))
    batch = _batch_of(ints, floats, np.zeros((b, k)), np.zeros((k, b)))
    batch.slot[:] = np.arange(b)
    batch.sites[:] = 1
    batch.n[:] = 1
    batch.max_merges[:] = 1.0
    batch.credit[:] = 1.0
    return batch


def batch_arrays(batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays whose rows are ``batch``'s scalar fields (:func:`new_batch`)."""
    ints, floats = batch.n.base, batch.pct.base
    assert ints is not None and ints.shape[0] == 5 and floats is not None
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
    the order of :data:`~diloco_gym.sim.step_layout.INT_PARAMS` and a float64 array in the
    order of ``FLOAT_PARAMS``.
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
    """``(can_merge, can_defer)`` at decision ``d`` (scalars or arrays alike, elementwise):
    the compiled rule :func:`diloco_gym.sim.jit_step.options_one`.

    Without a budget: merge iff ``gap >= H_min``; defer iff ``gap < H_max``. With a budget,
    additionally a merge must leave a feasible completion and a deferral a feasible next
    merge (or, with no merges left, the tail must already be safe).
    """
    arrays = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (d, last, m_left)))
    flat = [np.ascontiguousarray(a).ravel() for a in arrays]
    can_merge = np.empty(flat[0].size, dtype=bool)
    can_defer = np.empty(flat[0].size, dtype=bool)
    reach, prefix = (_NO_REACH, _NO_TABLE) if budget is None else (budget.reach, budget.prefix)
    b = -1 if params.merge_budget is None or budget is None else params.merge_budget
    compiled_step().options_many(
        *flat, n, params.h_min, params.h_max, b, reach, prefix, can_merge, can_defer
    )
    shape = arrays[0].shape
    if not shape:
        return bool(can_merge[0]), bool(can_defer[0])
    return can_merge.reshape(shape), can_defer.reshape(shape)


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
    advance,
) -> None:
    """Start the episodes of rows ``idx`` (their constants already in ``batch``).

    The episode starts just after a merge (gap 0). With ``skip_forced``, merges forced
    before the agent's first real choice (possible only with a tight merge budget) are
    applied now and their reward terms owed to the first step (a reset returns no reward).
    ``advance(idx) -> (excess, progress)`` applies them (the envs' compiled advance,
    :meth:`~diloco_gym.envs.fused.FusedStep.advance`).

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
        ex, pr = advance(idx)
        state.pend_excess[idx] = ex
        state.pend_progress[idx] = pr
        if np.any(state.d[idx] >= batch.n[idx]):
            raise ValueError(
                f"merge_budget={params.merge_budget} leaves the agent no decision "
                f"in this episode (every merge is forced)"
            )


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
