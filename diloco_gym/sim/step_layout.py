"""The layout of the compiled step's arrays (:mod:`diloco_gym.sim.jit_step`), importable
without numba: the rows of the state's and the episode constants' arrays, the order of the
step's parameters and of its per-row outputs, and its status codes."""

from __future__ import annotations

__all__ = [
    "STATE_INT",
    "STATE_FLOAT",
    "BATCH_INT",
    "BATCH_FLOAT",
    "INT_PARAMS",
    "FLOAT_PARAMS",
    "STEP_OUT_INT",
    "STEP_OUT_FLOAT",
    "NEED_COST",
]

#: rows of the state's int64 array and float64 array (one column per episode).
STATE_INT = ("d", "last", "m_left", "n_merges")
STATE_FLOAT = (
    "tokens", "excess_sum", "excess_requests", "progress_sum", "pend_excess", "pend_progress",
)  # fmt: skip
#: rows of the episode constants' int64 and float64 arrays.
BATCH_INT = ("n", "slot", "seed", "sites", "fragments")
BATCH_FLOAT = ("pct", "scale", "max_merges", "thr_sum", "credit", "stall_s")
#: the step's integer and float parameters, in their array order.
INT_PARAMS = (
    "h_min", "h_max", "budget", "skip_forced", "decision_interval", "merge_bins", "horizon",
    "m0_bins",
)  # fmt: skip
FLOAT_PARAMS = (
    "decision_seconds", "drift_s", "merge_overhead_s", "loss_floor", "loss_scale",
    "tokens_scale", "loss_exponent", "loss_clip", "tokens_clip", "staleness_clip_s",
    "excess_weight", "progress_weight", "sigma1", "slo_s", "slots",
)  # fmt: skip
#: per-row outputs of a step: ints and floats (the last ones hold a stopped step's place).
STEP_OUT_INT = (
    "merged", "overridden", "truncated", "can_defer", "can_merge", "status", "phase",
    "need_decision",
)  # fmt: skip
STEP_OUT_FLOAT = ("excess", "progress", "reward", "excess_a", "progress_a", "excess_f",
                  "progress_f")  # fmt: skip
#: the status of a step or an advance stopped at a merge whose cost is unknown.
NEED_COST = 2
