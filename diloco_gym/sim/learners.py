"""A surrogate of DiLoCo training: K learners and the global model between merges.

Model (tokens ``T``, seconds ``s``):

* Loss of a model trained on ``T`` tokens (a power law, as in scaling-law fits)::

      L(T) = loss_floor + loss_scale * (1 + T / tokens_scale) ** (-loss_exponent)

* Learner *k* processes ``throughput_k`` tokens per second (log-normal across learners,
  drawn once per episode). After ``g`` seconds since the last merge it has seen
  ``tau_k = throughput_k * g`` tokens and reports::

      tokens_k     = tau_k
      loss_delta_k = L(T_global) - L(T_global + tau_k)      (its local loss reduction)
      staleness_s  = g

* Local models drift apart as the gap grows, so a merge only keeps a fraction of the
  work: ``efficiency(g) = 1 / (1 + g / drift_s)``. With ``merge_overhead_s > 0`` (fitted
  by a learner calibration, :mod:`diloco_gym.sim.learner_calibration`) very short gaps
  lose work too: ``efficiency(g) = 1 / (1 + g / drift_s + merge_overhead_s / g)``. The merge adds
  ``efficiency(g) * sum_k tau_k`` effective tokens to the global model and resets the
  reports. The global loss decrease at a merge is the optional training-progress reward.

Everything is a pure function of (gap seconds, global tokens, throughputs), so it works on
scalars and on numpy arrays with a leading batch axis alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = ["LearnerParams", "loss", "reports", "merge_gain"]


@dataclass(frozen=True)
class LearnerParams:
    """Learner surrogate parameters.

    Attributes:
        num_learners: K, the number of learner islands.
        throughput_tokens_per_s: median per-learner throughput, tokens per second.
        throughput_sigma: log-normal spread of throughputs across learners.
        loss_floor / loss_scale / loss_exponent / tokens_scale: the loss power law.
        drift_s: gap (seconds) at which half of the local work is lost to drift.
        initial_tokens: global tokens at the start of an episode.
        merge_overhead_s: the short-gap loss of a merge (seconds; 0: none, the default).
    """

    num_learners: int = 8
    throughput_tokens_per_s: float = 12_000.0
    throughput_sigma: float = 0.3
    loss_floor: float = 2.0
    loss_scale: float = 3.0
    loss_exponent: float = 0.3
    tokens_scale: float = 2.0e7
    drift_s: float = 120.0
    initial_tokens: float = 0.0
    merge_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):  # a type check first, so that a string gives a clear error
            v = getattr(self, f.name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
                raise ValueError(f"LearnerParams.{f.name} must be a number, got {v!r}")
        if not isinstance(self.num_learners, (int, np.integer)) or self.num_learners < 1:
            raise ValueError(
                f"LearnerParams.num_learners must be an int >= 1, got {self.num_learners!r}"
            )
        for name in (
            "throughput_tokens_per_s",
            "loss_scale",
            "loss_exponent",
            "tokens_scale",
            "drift_s",
        ):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"LearnerParams.{name} must be > 0, got {v!r}")
        for name in ("throughput_sigma", "loss_floor", "initial_tokens", "merge_overhead_s"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"LearnerParams.{name} must be >= 0, got {v!r}")

    def draw_throughputs(self, rng: np.random.Generator) -> np.ndarray:
        """Per-learner throughputs (tokens/s), sorted ascending (slowest first)."""
        return np.sort(
            self.throughput_tokens_per_s
            * np.exp(rng.normal(0.0, self.throughput_sigma, self.num_learners))
        )


def loss(tokens, p: LearnerParams):
    """Global loss after ``tokens`` training tokens (a scalar or an array of any shape): the
    compiled power law the envs' step and observation use
    (:func:`diloco_gym.sim.jit.loss_one`, the C library's ``pow``), value by value."""
    from diloco_gym.sim import compiled

    t = np.asarray(tokens, dtype=np.float64)
    flat = np.ascontiguousarray(t).reshape(-1)
    out = np.empty(flat.size)
    args = (float(p.loss_floor), float(p.loss_scale), float(p.tokens_scale))
    compiled().loss_rows(flat, *args, float(p.loss_exponent), out)
    return out.reshape(t.shape)[()]


def reports(gap_s, global_tokens, throughputs: np.ndarray, p: LearnerParams):
    """Per-learner reports after ``gap_s`` seconds since the last merge.

    Args:
        gap_s: scalar or ``(B,)`` seconds since the last merge.
        global_tokens: scalar or ``(B,)`` tokens in the global model.
        throughputs: ``(K,)`` or ``(B, K)`` tokens per second.

    Returns:
        ``(loss_delta, tokens)``, each of shape ``(K,)`` or ``(B, K)``.
    """
    gap = np.asarray(gap_s, dtype=np.float64)[..., None]
    g_tok = np.asarray(global_tokens, dtype=np.float64)[..., None]
    tau = throughputs * gap
    delta = loss(g_tok, p) - loss(g_tok + tau, p)
    return delta, tau


def merge_gain(gap_s, global_tokens, throughputs: np.ndarray, p: LearnerParams):
    """``(effective_tokens, loss_decrease)`` of a merge after ``gap_s`` seconds (scalars or
    arrays, broadcast; ``throughputs`` ``(K,)`` or ``(..., K)``): the compiled rule the envs
    step with, :func:`diloco_gym.sim.jit_step.gain_one`. The learners' tokens since the last
    merge, discounted for drift (``1 / (1 + gap / drift_s [+ merge_overhead_s / gap])``),
    join the global model, and the loss power law falls accordingly."""
    from diloco_gym.sim import compiled_step

    gap, tok, thr_sum = np.broadcast_arrays(
        np.asarray(gap_s, dtype=np.float64),
        np.asarray(global_tokens, dtype=np.float64),
        np.sum(np.asarray(throughputs, dtype=np.float64), axis=-1),
    )
    fp = np.array(
        [0.0, p.drift_s, p.merge_overhead_s, p.loss_floor, p.loss_scale, p.tokens_scale]
        + [p.loss_exponent]
    )  # the first entries of the step's float parameters (sim.step_layout.FLOAT_PARAMS)
    added, decrease = np.empty(gap.size), np.empty(gap.size)
    flat = (np.ascontiguousarray(x).ravel() for x in (gap, tok, thr_sum))
    compiled_step().gain_many(*flat, fp, added, decrease)
    if not gap.shape:
        return float(added[0]), float(decrease[0])
    return added.reshape(gap.shape), decrease.reshape(gap.shape)
