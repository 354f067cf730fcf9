"""Pictures: an episode timeline (request rate, merge windows, violations)."""

from __future__ import annotations

import numpy as np

from diloco_gym.core import EnvParams, Episode, replay_schedule
from diloco_gym.sidecar import SidecarParams


def plot_timeline(ax, episode: Episode, schedules: dict[str, list[int]], params: EnvParams,
                  sidecar: SidecarParams, upto: int | None = None) -> None:
    """Draw the request rate, each schedule's merge windows and its violations on ``ax``.

    Args:
        schedules: label -> merge decision indices; one row of windows per label.
        upto: only draw up to this decision (rendering a running episode).
    """
    tr = episode.trace
    end_s = upto * params.decision_seconds if upto is not None else tr.duration_s
    bins = np.arange(0.0, tr.duration_s + 1.0, 1.0)
    rate, _ = np.histogram(tr.arrival_s, bins=bins)
    keep = bins[:-1] < end_s
    ax.fill_between(bins[:-1][keep], rate[keep], step="post", color="0.8", label="requests/s")
    top = max(1.0, rate.max()) * 1.05
    n_rows = max(1, len(schedules))
    band = top * 0.25 / n_rows
    colors = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown",
              "tab:pink", "tab:olive", "tab:cyan", "tab:gray"]
    for i, (label, merges) in enumerate(schedules.items()):
        y0 = top + i * band
        c = colors[i % len(colors)]
        for d in merges:
            t = d * params.decision_seconds
            if t < end_s:
                ax.broken_barh([(t, params.merge_steps * params.step_seconds)], (y0, band * 0.8),
                               color=c, alpha=0.8)
        res = replay_schedule(episode, [d for d in merges if d * params.decision_seconds < end_s],
                              params, sidecar)
        extra = res.violated & ~episode.baseline.violated
        vt = tr.arrival_s[extra & (tr.arrival_s < end_s)]
        ax.plot(vt, np.full(vt.size, y0 + band * 0.4), "|", color="black", markersize=4)
        ax.text(-2, y0 + band * 0.4, label, ha="right", va="center", fontsize=7)
    ax.set_xlim(0, tr.duration_s)
    ax.set_ylim(0, top + n_rows * band)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests / s")


def timeline_rgb(episode: Episode, merges: list[int], params: EnvParams, sidecar: SidecarParams,
                 upto: int | None = None) -> np.ndarray:
    """The episode so far as an RGB array (H, W, 3) uint8."""
    # An explicit Agg canvas: a bare Figure() has no raster buffer, and switching the global
    # backend (matplotlib.use) would affect the caller's plotting.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3), dpi=80)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    plot_timeline(ax, episode, {"agent": merges}, params, sidecar, upto=upto)
    ax.set_title("requests/s (grey), merge windows (red), extra SLO violations (|)",
                 fontsize=8)
    fig.tight_layout()
    canvas.draw()
    buf = np.asarray(canvas.buffer_rgba())
    return buf[..., :3].copy()
