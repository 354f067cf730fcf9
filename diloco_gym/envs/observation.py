"""The observation: its feature table (name, unit, bounds, meaning), the index and slices
of its blocks, the rate transform, and the learner block's rule (:func:`learner_features`).

The exogenous block (``EXO_SLICE``) is computed once per episode
(:func:`diloco_gym.envs.episode.episode_core_batch`); the rest follows from the
agent-dependent state at each decision (:func:`diloco_gym.envs.kernel.observe`).
"""

from __future__ import annotations

import numpy as np

from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled
from diloco_gym.sim import learners as lrn

__all__ = [
    "OBS_FEATURES",
    "OBS_DIM",
    "OBS_INDEX",
    "OBS_LOW",
    "OBS_HIGH",
    "EXO_SLICE",
    "LEARNER_SLICE",
    "squash_rate",
    "unsquash_rate",
    "obs_column",
    "learner_features",
    "learner_features_k",
    "learner_table",
]


# (name, unit / transform, low, high, meaning)
OBS_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("gap", "gap / H_max", 0.0, 1.0, "training steps since the last merge"),
    ("corridor_open", "0/1", 0.0, 1.0, "1 when gap >= H_min, so a merge is allowed"),
    (
        "loss_progress_mean",
        "clip(loss_delta / loss_clip)",
        0.0,
        1.0,
        "mean over learners of the loss reduction since the last merge",
    ),
    ("loss_progress_min", "clip(loss_delta / loss_clip)", 0.0, 1.0, "the same, slowest learner"),
    (
        "tokens_mean",
        "clip(tokens / tokens_clip)",
        0.0,
        1.0,
        "mean tokens per learner since the last merge",
    ),
    ("tokens_min", "clip(tokens / tokens_clip)", 0.0, 1.0, "the same, slowest learner"),
    ("staleness", "clip(seconds / staleness_clip_s)", 0.0, 1.0, "seconds since the last merge"),
    ("network", "[0, 1]", 0.0, 1.0, "network pressure now"),
    (
        "serving",
        "[0, 1]",
        0.0,
        1.0,
        "serving pressure: rate forecast / serving_capacity_rps, capped at 1",
    ),
    ("checkpoint", "[0, 1]", 0.0, 1.0, "checkpoint-I/O pressure now"),
    (
        "rate_now",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "request rate over the last decision interval",
    ),
    (
        "rate_forecast",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "one-step EWMA forecast of the request rate (forecast_alpha)",
    ),
    (
        "rate_baseline",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "slow EWMA of the request rate (baseline_alpha)",
    ),
    (
        "rate_trend",
        "clip((forecast - baseline) / rate_norm_rps, -1, 1)",
        -1.0,
        1.0,
        "forecast above (+) or below (-) the baseline",
    ),
    ("merges", "merges / (decisions / H_min)", 0.0, 1.0, "merges so far this episode"),
    ("time_left", "fraction", 0.0, 1.0, "fraction of the episode's decisions left"),
    ("budget_left", "fraction", 0.0, 1.0, "merges left / merge_budget (1 when there is no budget)"),
)
OBS_DIM = len(OBS_FEATURES)
OBS_INDEX = {name: i for i, (name, *_) in enumerate(OBS_FEATURES)}
OBS_LOW = np.array([f[2] for f in OBS_FEATURES], dtype=np.float32)
OBS_HIGH = np.array([f[3] for f in OBS_FEATURES], dtype=np.float32)
EXO_SLICE = slice(OBS_INDEX["network"], OBS_INDEX["rate_trend"] + 1)
LEARNER_SLICE = slice(OBS_INDEX["loss_progress_mean"], OBS_INDEX["staleness"] + 1)


def obs_column(obs, name: str):
    """Feature ``name`` of a batch of observations (an array), or of one observation (a
    NumPy scalar of the observation's dtype: arithmetic on it is NumPy's scalar arithmetic,
    the same IEEE operations as on an array, without an array's per-operation cost)."""
    obs = np.asarray(obs)
    return obs[OBS_INDEX[name]] if obs.ndim == 1 else obs[..., OBS_INDEX[name]]


def squash_rate(rate_rps, norm_rps: float):
    """``r / (r + norm)``: a bounded, invertible rate feature."""
    return rate_rps / (rate_rps + norm_rps)


def unsquash_rate(x, norm_rps: float):
    """Inverse of :func:`squash_rate` (requests per second)."""
    x = np.minimum(x, 1 - 1e-6)
    return norm_rps * x / (1.0 - x)


def learner_features(
    gap_s, global_tokens, throughputs: np.ndarray, params: EnvParams, lp: lrn.LearnerParams
) -> np.ndarray:
    """The learner block of the observation (``LEARNER_SLICE``) after ``gap_s`` seconds.

    Shared by :func:`learner_table` (the single env: every gap at once) and the vector env
    (one gap per env), so both compute the features with the same arithmetic.

    Args:
        gap_s: seconds since the last merge, any shape ``S`` (broadcast with the tokens).
        global_tokens: tokens in the global model, broadcastable to ``S``.
        throughputs: ``(..., K)`` tokens per second, ascending along the last axis and
            broadcastable to ``S + (K,)``.

    Returns:
        float32 ``S + (5,)``: mean and min loss progress, mean and min tokens, staleness.
    """
    gap = np.asarray(gap_s, dtype=np.float64)
    tok = np.asarray(global_tokens, dtype=np.float64)
    thr = np.asarray(throughputs, dtype=np.float64)
    k = thr.shape[-1]
    shape = np.broadcast_shapes(gap.shape, tok.shape, thr.shape[:-1])
    # Learners on the first axis, so that the means over learners are whole-array adds.
    lead = (1,) * (len(shape) - (thr.ndim - 1))
    thr_k = np.moveaxis(thr, -1, 0).reshape((k,) + lead + thr.shape[:-1])
    return learner_features_k(gap, tok, thr_k, params, lp)


def learner_features_k(
    gap_s: np.ndarray,
    global_tokens: np.ndarray,
    throughputs_k: np.ndarray,
    params: EnvParams,
    lp: lrn.LearnerParams,
) -> np.ndarray:
    """:func:`learner_features` with the throughputs learners-first, ``(K, ...)``
    broadcastable to ``(K,) + S``: the compiled rule
    :func:`diloco_gym.sim.jit.learner_block` on the broadcast rows."""
    jit = compiled()
    gap = np.asarray(gap_s, dtype=np.float64)
    tok = np.asarray(global_tokens, dtype=np.float64)
    k = throughputs_k.shape[0]
    shape = np.broadcast_shapes(gap.shape, tok.shape, throughputs_k.shape[1:])
    thr = np.moveaxis(np.broadcast_to(throughputs_k, (k,) + shape), 0, -1).reshape(-1, k)
    out = np.empty(shape + (5,), dtype=np.float32)  # float64 -> float32 on store
    jit.learner_block(
        np.broadcast_to(gap, shape).reshape(-1),
        np.broadcast_to(tok, shape).reshape(-1),
        np.ascontiguousarray(thr, dtype=np.float64),
        lp.loss_floor,
        lp.loss_scale,
        lp.tokens_scale,
        lp.loss_exponent,
        params.loss_clip,
        params.tokens_clip,
        params.staleness_clip_s,
        out.reshape(-1, 5),
    )
    return out


def learner_table(
    global_tokens, throughputs: np.ndarray, params: EnvParams, lp: lrn.LearnerParams
) -> np.ndarray:
    """Learner features for every gap ``0..H_max`` decisions, given the global tokens.

    Returns:
        float32 ``(H_max + 1, 5)`` (or ``(B, H_max + 1, 5)`` for batched inputs): mean and
        min loss progress, mean and min tokens, staleness — the ``LEARNER_SLICE`` block.
    """
    gaps_s = np.arange(params.h_max + 1) * params.decision_seconds
    tok = np.asarray(global_tokens, dtype=np.float64)
    batched = tok.ndim == 1
    g = gaps_s[None, :] if batched else gaps_s
    tk = tok[:, None] if batched else tok
    thr = throughputs[:, None, :] if batched else throughputs
    return learner_features(g, tk, thr, params, lp)
