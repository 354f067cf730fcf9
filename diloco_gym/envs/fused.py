"""The compiled step's arguments for an env's episodes (:mod:`diloco_gym.sim.jit_step`).

An env holds its state and episode constants as :class:`~diloco_gym.envs.kernel.EnvState` and
:class:`~diloco_gym.envs.kernel.EpisodeBatch`, whose fields are rows of small 2D arrays; the
compiled step reads those arrays, the episode's cost queue (a bank of one slot for the single
env, :attr:`diloco_gym.envs.episode.Episode.cost_source`), the budget tables and the outputs.
:class:`FusedStep` builds that argument tuple once per episode, so a decision is one
compiled call on prepared arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from diloco_gym.envs import kernel
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import bound_call, compiled_step
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.step_layout import STEP_OUT_FLOAT, STEP_OUT_INT

__all__ = ["FusedStep", "NO_THRESHOLDS", "NO_COST_QUEUE"]

#: a cost queue's thresholds when they are computed in the count (no columns).
NO_THRESHOLDS = np.empty((1, 0))
#: no cost queue (in the layout of ``Episode.cost_source``): an env that costs merges its own
#: way; the step stops at a merge whose cost is not in the memo and asks it.
NO_COST_QUEUE = (
    np.zeros((1, 0)), np.zeros((1, 0)), np.zeros((1, 0), dtype=np.int32),
    np.zeros((1, 0), dtype=np.int32), np.zeros((1, 0)), np.zeros((1, 0)), NO_THRESHOLDS,
    NO_THRESHOLDS, np.zeros((1, 0)), 1,
)  # fmt: skip


class FusedStep:
    """The compiled step of rows of one env's state (:func:`~diloco_gym.sim.jit_step.step_rows`).

    ``begin`` sets the episode's cost queue, cost memo, budget tables and exogenous
    features; ``step`` runs one decision of the given rows and writes ``oi``/``of`` (the
    per-row outputs, :data:`~diloco_gym.sim.jit_step.STEP_OUT_INT` and ``STEP_OUT_FLOAT``)
    and the observation ``obs``; ``advance`` applies a reset's forced decisions. The
    schedule of each row is recorded in ``sched_d``/``sched_c`` (its merges' decisions and
    isolated costs, in order) when ``record`` is set. ``parallel``: the step's parallel
    variant for large batches (:mod:`diloco_gym.sim.jit_parallel`).
    """

    def __init__(
        self,
        state: kernel.EnvState,
        batch: kernel.EpisodeBatch,
        params: EnvParams,
        lp: lrn.LearnerParams,
        sidecar: Any,
        budgets: kernel.Budgets,
        obs: np.ndarray,
        record: bool,
        parallel: bool = False,
    ) -> None:
        b = state.d.size
        self.params, self.lp, self.sidecar, self.budgets = params, lp, sidecar, budgets
        self.state, self.batch, self.obs, self.record = state, batch, obs, record
        self.parallel = parallel
        self._ist, self._fst = kernel.state_arrays(state)
        self._bi, self._bf = kernel.batch_arrays(batch)
        self.oi = np.zeros((b, len(STEP_OUT_INT)), dtype=np.int64)
        self.of = np.zeros((b, len(STEP_OUT_FLOAT)))
        self.sched_d = np.zeros((b, 0), dtype=np.int64)
        self.sched_c = np.zeros((b, 0))
        self._m0_bins = -1
        self._ip = self._fp = np.zeros(0)
        self._args: tuple = ()
        self._head: tuple = ()

    def begin(self, n: int, source: tuple, memo: np.ndarray, exo: np.ndarray) -> None:
        """Prepare the rows' episodes of ``n`` decisions: ``source`` their cost queue
        (:attr:`~diloco_gym.envs.episode.Episode.cost_source`), ``memo`` its cost memo
        ``(slots, n)``, ``exo`` the exogenous features ``(slots, n, 7)``."""
        *queue, m0_bins = source
        if m0_bins != self._m0_bins:
            self._ip, self._fp = kernel.step_params(self.params, self.lp, self.sidecar, m0_bins)
            self._m0_bins = m0_bins
        self._ip[3] = int(self.params.skip_forced)  # set_skip_forced lasts one episode
        if self.record and self.sched_d.shape[1] < n + 1:
            b = self.state.d.size
            self.sched_d = np.zeros((b, n + 1), dtype=np.int64)
            self.sched_c = np.zeros((b, n + 1))
        reach, prefix, nxt = kernel.budget_arrays(self.budgets, n)
        self._head = (self._ist, self._fst, self._bi, self._bf)
        tail = (self._ip, self._fp, reach, prefix, nxt, *queue, memo, self.sched_d, self.sched_c)
        self._args = (*self._head, self.batch.thr, *tail, self.oi, self.of, exo, self.obs)
        self._adv = (*self._head, *tail)

    def set_skip_forced(self, on: bool) -> None:
        """Turn ``skip_forced`` on or off for the following steps of this episode (the
        per-site timing env asks at every decision while a round is open)."""
        self._ip[3] = int(on)

    def reward(self, excess: float, progress: float) -> float:
        """The reward of the terms paid (the compiled step's rule)."""
        return float(compiled_step().reward_one(excess, progress, self._fp))

    def masks(self, rows: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = [can_defer, can_merge]`` of each row ``i`` in ``rows`` (bool ``(B, 2)``)."""
        ip, reach, prefix = self._adv[4], self._adv[6], self._adv[7]
        compiled_step().masks_rows(rows, self._ist, self._bi, ip, reach, prefix, out)

    def bound_step(self, rows: np.ndarray, want: np.ndarray) -> Callable[[], int]:
        """:meth:`step` of ``rows`` with the wants in ``want`` (read at each call) as a call
        without arguments, until the next :meth:`begin` (the single env's hot path: no
        argument tuple is built per decision). Serial only."""
        return bound_call(compiled_step().step_rows, (rows, want, *self._args))

    def step(self, rows: np.ndarray, want: np.ndarray) -> int:
        """One decision of ``rows`` (``want``: bool, per row of ``rows``) and the observation;
        returns the first row that had no feasible action, or -1 (``parallel``: the rows in
        one block per numba thread when :func:`~diloco_gym.sim.jit_parallel.parallel_ok`,
        the same result)."""
        if self.parallel:
            from diloco_gym.sim import jit_parallel as par

            if par.parallel_ok(rows.size, 256):
                rule: Any = par.step_rows  # a numba dispatcher: its arguments are the rule's
                return rule(rows, want, *self._args, par.blocks(rows.size))
        return compiled_step().step_rows(rows, want, *self._args)

    def advance(self, rows: np.ndarray) -> int:
        """A reset's forced decisions in ``rows`` (their terms owed: ``pend_excess``,
        ``pend_progress``); returns the first row that had no feasible action, or -1."""
        return compiled_step().reset_advance(rows, *self._adv)
