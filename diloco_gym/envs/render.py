"""Pictures: an episode timeline (request rate, merge windows, violations)."""

from __future__ import annotations

import numpy as np

from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.schedule import replay_schedule
from diloco_gym.sim.sidecar import SidecarParams

#: One colour per schedule in the timelines, in order.
_PALETTE = [
    "tab:red",
    "tab:blue",
    "tab:green",
    "tab:purple",
    "tab:orange",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
]


def plot_timeline(
    ax,
    episode: Episode,
    schedules: dict[str, list[int]],
    params: EnvParams,
    sidecar: SidecarParams,
    upto: int | None = None,
) -> None:
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
    colors = _PALETTE
    for i, (label, merges) in enumerate(schedules.items()):
        y0 = top + i * band
        c = colors[i % len(colors)]
        for d in merges:
            t = d * params.decision_seconds
            if t < end_s:
                ax.broken_barh(
                    [(t, params.merge_steps * params.step_seconds)],
                    (y0, band * 0.8),
                    color=c,
                    alpha=0.8,
                )
        res = replay_schedule(
            episode, [d for d in merges if d * params.decision_seconds < end_s], params, sidecar
        )
        extra = res.violated & ~episode.baseline.violated
        vt = tr.arrival_s[extra & (tr.arrival_s < end_s)]
        ax.plot(vt, np.full(vt.size, y0 + band * 0.4), "|", color="black", markersize=4)
        ax.text(-2, y0 + band * 0.4, label, ha="right", va="center", fontsize=7)
    ax.set_xlim(0, tr.duration_s)
    ax.set_ylim(0, top + n_rows * band)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests / s")


def timeline_rgb(
    episode: Episode,
    merges: list[int],
    params: EnvParams,
    sidecar: SidecarParams,
    upto: int | None = None,
) -> np.ndarray:
    """The episode so far as an RGB array (H, W, 3) uint8."""
    # An explicit Agg canvas: a bare Figure() has no raster buffer, and switching the global
    # backend (matplotlib.use) would affect the caller's plotting.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3), dpi=80)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    plot_timeline(ax, episode, {"agent": merges}, params, sidecar, upto=upto)
    ax.set_title(
        "requests/s (grey), merge windows (red bars), requests that miss their SLO "
        "only because of a merge (black ticks)",
        fontsize=8,
    )
    fig.tight_layout()
    canvas.draw()
    buf = np.asarray(canvas.buffer_rgba())
    return buf[..., :3].copy()


def plot_timeline_panels(
    fig,
    episode: Episode,
    schedules: dict[str, list[int]],
    params: EnvParams,
    sidecar: SidecarParams,
) -> None:
    """Two stacked panels: the request rate, then one row per schedule with its merge
    windows (bars) and the extra SLO violations they cause (black ticks)."""
    tr = episode.trace
    gs = fig.add_gridspec(2, 1, height_ratios=[2, max(1.5, 0.45 * len(schedules))], hspace=0.08)
    ax_rate = fig.add_subplot(gs[0])
    ax = fig.add_subplot(gs[1], sharex=ax_rate)
    bins = np.arange(0.0, tr.duration_s + 1.0, 1.0)
    rate, _ = np.histogram(tr.arrival_s, bins=bins)
    ax_rate.fill_between(bins[:-1], rate, step="post", color="0.6")
    ax_rate.set_ylabel("requests / s")
    ax_rate.tick_params(labelbottom=False)
    colors = _PALETTE
    labels = list(schedules)
    for i, label in enumerate(labels):
        y = len(labels) - 1 - i
        merges = schedules[label]
        c = colors[i % len(colors)]
        ax.broken_barh(
            [
                (d * params.decision_seconds, params.merge_steps * params.step_seconds)
                for d in merges
            ],
            (y - 0.35, 0.7),
            color=c,
            alpha=0.55,
        )
        res = replay_schedule(episode, merges, params, sidecar)
        extra = res.violated & ~episode.baseline.violated
        vt = tr.arrival_s[extra]
        ax.plot(vt, np.full(vt.size, y), "|", color="black", markersize=7, alpha=0.7)
        excess = 100.0 * extra.sum() / max(1, tr.num_requests)
        ax.text(
            tr.duration_s * 1.005,
            y,
            f"{len(merges)} merge{'' if len(merges) == 1 else 's'}, +{excess:.1f} pp",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(range(len(labels)), labels[::-1], fontsize=8)
    # The key in words: a bare "|" glyph in a title does not say what a tick is.
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax_rate.legend(
        handles=[
            Patch(color="0.6", label="requests per second"),
            Patch(color="tab:red", alpha=0.55, label="merge window (one colour per agent)"),
            Line2D(
                [],
                [],
                color="black",
                marker="|",
                linestyle="none",
                markersize=9,
                label="request that misses its SLO only because of a merge",
            ),
        ],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=3,
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
    )
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlim(0, tr.duration_s)
    ax.set_xlabel("time (s)")
