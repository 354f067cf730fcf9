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

__all__ = ["LearnerParams", "loss", "reports", "merge_gain", "merge_gain_scalar"]


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
    """Global loss after ``tokens`` training tokens."""
    # np.power, not ``**``: on a numpy scalar ``**`` takes the C library's pow, which can
    # differ in the last bit from the ufunc used on arrays; the ufunc gives every shape
    # (the single env's scalars, the vector env's batches) the same values.
    return p.loss_floor + p.loss_scale * np.power(
        1.0 + np.asarray(tokens) / p.tokens_scale, -p.loss_exponent
    )


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
    """``(effective_tokens, loss_decrease)`` of a merge after ``gap_s`` seconds."""
    gap = np.asarray(gap_s, dtype=np.float64)
    if p.merge_overhead_s:  # gaps of a merge are > 0
        eff = 1.0 / (1.0 + gap / p.drift_s + p.merge_overhead_s / gap)
    else:
        eff = 1.0 / (1.0 + gap / p.drift_s)
    added = eff * gap * np.sum(throughputs, axis=-1)
    return added, loss(global_tokens, p) - loss(np.asarray(global_tokens) + added, p)


def merge_gain_scalar(
    gap_s: float, global_tokens: float, throughput_sum: float, p: LearnerParams
) -> tuple[float, float, float]:
    """:func:`merge_gain` of one merge, for the single env's hot path.

    ``throughput_sum`` is ``np.sum(throughputs)`` (constant over an episode). The same
    operations in the same order as :func:`merge_gain` (IEEE arithmetic on Python floats
    equals numpy's on float64), and both losses from one ``np.power`` call, the ufunc
    :func:`loss` uses, so the values are bit for bit the vector env's.

    Returns:
        ``(effective_tokens, loss_decrease, loss_after)``; ``loss_after`` is
        ``loss(global_tokens + effective_tokens)``.
    """
    if p.merge_overhead_s:
        eff = 1.0 / (1.0 + gap_s / p.drift_s + p.merge_overhead_s / gap_s)
    else:
        eff = 1.0 / (1.0 + gap_s / p.drift_s)
    added = eff * gap_s * throughput_sum
    before, after = loss(np.array([global_tokens, global_tokens + added]), p).tolist()
    return added, before - after, after
