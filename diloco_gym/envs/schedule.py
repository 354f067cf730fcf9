"""A realised schedule on an episode: its merge windows (:func:`sync_mask`), its exact
replay (:func:`replay_schedule`) and its summary (:func:`schedule_summary`: the exact and
the additive sync-excess against the episode's no-merge load match).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_stats, quantile_fractions
from diloco_gym.sim.sidecar import SUMMARY_Q, ReplayResult, SidecarParams, pct_of, replay

__all__ = ["sync_mask", "replay_schedule", "schedule_summary", "site_summaries"]

_NO_Q = np.empty(0)  # no percentiles (schedule_summary's percentiles=False)


def sync_mask(merges, n_bins: int, params: EnvParams, widths=None, levels=None) -> np.ndarray:
    """Per-bin 0/1 mask of the merge windows of a schedule (decision indices).

    A ``(K, M)`` array of schedules gives a ``(K, n_bins)`` mask, one row per schedule.
    ``widths`` (steps) and ``levels`` (the mask's value) per merge, for one schedule: windows
    that differ per merge (a fleet's per-sync precision); where two windows overlap the
    larger level holds.
    """
    starts = np.asarray(merges, dtype=np.int64) * params.decision_interval
    if widths is not None or levels is not None:
        w_ = np.full(starts.size, params.merge_steps) if widths is None else np.asarray(widths)
        lv = np.ones(starts.size) if levels is None else np.asarray(levels, dtype=np.float64)
        if starts.ndim != 1 or w_.shape != starts.shape or lv.shape != starts.shape:
            raise ValueError("widths and levels need one schedule and one value per merge")
        if starts.size and (starts.min() < 0 or w_.min() < 1):
            raise ValueError("merge starts must be >= 0 and widths >= 1")
        out = np.zeros(n_bins + int(w_.max(initial=0)))
        for a, wk, level in zip(starts.tolist(), w_.tolist(), lv.tolist(), strict=True):
            seg = out[a : a + wk]
            np.maximum(seg, level, out=seg)
        return out[:n_bins]
    w = params.merge_steps
    width = n_bins + w
    if starts.ndim > 1:
        rows = starts.reshape(-1, starts.shape[-1])
        if rows.size and (rows.min() < 0 or rows.max() + w > width):
            # out-of-range starts: each row as a schedule of its own (np.add.at below)
            out = np.stack([sync_mask(r, n_bins, params) for r in rows // params.decision_interval])
            return out.reshape(starts.shape[:-1] + (n_bins,))
        mask = np.zeros((rows.shape[0], width), dtype=np.float64)
        if rows.size:
            at = rows + (np.arange(rows.shape[0]) * width)[:, None]
            mask.reshape(-1)[(at[..., None] + np.arange(w)).ravel()] = 1.0
        return mask[:, :n_bins].reshape(starts.shape[:-1] + (n_bins,))
    mask = np.zeros(width, dtype=np.float64)
    if starts.size:
        # 1 on each window (a count of overlapping windows would be capped at 1 anyway).
        if starts.min() >= 0 and starts.max() + w <= mask.size:
            mask[(starts[:, None] + np.arange(w)).ravel()] = 1.0
        else:  # out-of-range starts: np.add.at's indexing (and its IndexError), as before
            delta = np.zeros(mask.size + 1)
            np.add.at(delta, starts, 1.0)
            np.add.at(delta, starts + w, -1.0)
            mask = np.cumsum(delta)[:-1]
    return np.minimum(mask[:n_bins], 1.0)


def replay_schedule(
    episode: Episode, merges, params: EnvParams, sidecar: SidecarParams, per_sync=None
) -> ReplayResult:
    """Exact replay of the episode's requests with the merge windows of ``merges``.

    ``per_sync``: one :class:`Episode` per merge (the same requests, built with that sync's
    window and slowdown: a fleet's per-sync precision), whose ``params.merge_steps`` is the
    merge's window and ``sidecar.sync_slowdown`` its slowdown; ``None``: every merge as
    ``params`` and ``sidecar`` say.
    """
    n_bins = episode.pressure_bin.size
    if per_sync is None:
        mask = sync_mask(merges, n_bins, params)
    else:
        if len(per_sync) != len(merges):
            raise ValueError(f"per_sync has {len(per_sync)} episodes for {len(merges)} merges")
        mask = sync_mask(
            merges,
            n_bins,
            params,
            widths=[e.params.merge_steps for e in per_sync],
            levels=[e.sidecar.sync_slowdown for e in per_sync],
        )
        sidecar = replace(sidecar, sync_slowdown=1.0)  # the mask carries each slowdown
    return replay(
        episode.base_s, episode.req_bin, episode.pressure_bin, mask, sidecar, params.step_seconds
    )


def schedule_summary(
    episode: Episode,
    merges,
    params: EnvParams,
    sidecar: SidecarParams,
    per_sync=None,
    costs=None,
    percentiles: bool = True,
) -> dict:
    """Replay summary of a realised schedule, with its exact and additive sync-excess
    (``per_sync``: as :func:`replay_schedule`; each merge's additive cost is then its own
    episode's). ``costs``: the merges' isolated costs when the caller has them (an env's
    record of its schedule), else asked from the episode. ``percentiles=False``: a caller
    that reads no latency percentile (the fleet's per-site summaries) may get none
    (``p50_ms`` .. ``p99_ms`` absent; the other values the same)."""
    if per_sync is None:
        out = _fused_summary(episode, merges, params, sidecar, percentiles)
    else:
        out = None
    if out is None:
        out = replay_schedule(episode, merges, params, sidecar, per_sync).summary()
    if costs is None:
        eps = [episode] * len(merges) if per_sync is None else per_sync
        costs = [e.merge_cost_at(int(d)) for e, d in zip(eps, merges, strict=True)]
    return _against_baseline(out, episode, len(merges), costs)


def _against_baseline(out: dict, episode: Episode, merges: int, costs) -> dict:
    """A replay's summary ``out`` with the schedule's sync-excess against the episode's
    no-merge replay, and its additive excess (the sum of the merges' isolated ``costs``)."""
    base_violated = episode.baseline_violated  # its violations only (as its summary counts)
    base_pct = pct_of(base_violated, episode.baseline.violated.size)
    out["merges"] = int(merges)
    out["no_sync_violation_pct"] = base_pct
    out["sync_excess_pct"] = out["violation_pct"] - base_pct
    out["sync_excess_requests"] = out["violated"] - base_violated
    additive = sum(costs)
    out["additive_excess_requests"] = float(additive)
    out["additive_excess_pct"] = float(additive * episode.pct_per_request)
    return out


def site_summaries(
    episodes: list[Episode], merges, params: EnvParams, sidecars: list[SidecarParams], costs
) -> list[dict]:
    """``[schedule_summary(e, merges, params, sc, costs=c, percentiles=False) for e, sc, c
    in zip(episodes, sidecars, costs)]``, the same values, with every site's replay in one
    compiled call (:func:`diloco_gym.sim.jit_stats.replay_counts_sites`): one schedule (a
    fleet's syncs) at sites of their own requests and sidecars."""
    starts = np.asarray(merges, dtype=np.int64) * params.decision_interval
    counts = np.empty((len(episodes), 2))
    # each site's sidecar values, a row per value (as _fused_summary passes them)
    values = np.array(
        [[sc.pressure_gain, sc.sync_slowdown, sc.slots * params.step_seconds, sc.slots,
          sc.slo_s] for sc in sidecars],
        dtype=np.float64,
    ).T.copy()  # fmt: skip
    bad = compiled_stats().replay_counts_sites(
        tuple(np.ascontiguousarray(e.base_s, dtype=np.float64) for e in episodes),
        tuple(np.ascontiguousarray(e.req_bin, dtype=np.int64) for e in episodes),
        tuple(np.ascontiguousarray(e.pressure_bin, dtype=np.float64) for e in episodes),
        starts,
        int(params.merge_steps),
        *values,
        counts,
    )
    out = []
    for i, (e, sc, c) in enumerate(zip(episodes, sidecars, costs, strict=True)):
        if bad >= 0 and i >= bad:  # replayed one by one (the array form refuses it clearly)
            out.append(schedule_summary(e, merges, params, sc, costs=c, percentiles=False))
            continue
        n = int(e.req_bin.size)
        violated, active = int(counts[i, 0]), int(counts[i, 1])
        res: dict = {"requests": n, "violated": violated, "violation_pct": pct_of(violated, n)}
        res["sync_active_frac"] = active / n if n else 0.0
        out.append(_against_baseline(res, e, len(merges), c))
    return out


def _fused_summary(
    episode: Episode, merges, params: EnvParams, sidecar: SidecarParams, percentiles: bool = True
):
    """``replay_schedule(...).summary()`` of one schedule in one compiled call
    (:func:`diloco_gym.sim.jit_stats.replay_summary_one`, bit-identical), or ``None`` for
    a schedule it does not take (not a flat list of merge decisions inside the episode's
    bins), which the array form then replays (and refuses as it does)."""
    n_bins = episode.pressure_bin.size
    starts = np.asarray(merges, dtype=np.int64)
    if starts.ndim != 1:
        return None
    starts = starts * params.decision_interval
    if starts.size and (starts.min() < 0 or starts.max() > n_bins):
        return None
    q = quantile_fractions(SUMMARY_Q) if percentiles else _NO_Q
    out = np.empty(2 + q.size)
    req_bin = episode.req_bin
    if req_bin.size and req_bin.max() >= n_bins:
        return None  # the array form names the bin it cannot replay
    compiled_stats().replay_summary_one(
        np.ascontiguousarray(episode.base_s, dtype=np.float64),
        np.ascontiguousarray(req_bin, dtype=np.int64),
        np.ascontiguousarray(episode.pressure_bin, dtype=np.float64),
        starts,
        int(params.merge_steps),
        float(sidecar.pressure_gain),
        float(sidecar.sync_slowdown),
        float(sidecar.slots * params.step_seconds),
        float(sidecar.slots),
        float(sidecar.slo_s),
        q,
        out,
    )
    n = int(req_bin.size)
    violated, active = int(out[0]), int(out[1])
    res: dict = {"requests": n, "violated": violated, "violation_pct": pct_of(violated, n)}
    if percentiles:
        res["p50_ms"], res["p95_ms"], res["p99_ms"] = out[2:].tolist()
    res["sync_active_frac"] = active / n if n else 0.0
    return res
