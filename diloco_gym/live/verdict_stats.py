"""The statistics of a live verdict: the live agent-minus-random difference against the
simulator's prediction for the same windows and schedules.

Each of K disjoint trace windows is a paired unit. On window ``k`` the agent's schedule
and M matched-random schedules were replayed live (and scored by the simulator,
:mod:`diloco_gym.live.verdicts`); every number is a sync-excess in percentage points (the
schedule's violation % minus the no-merge control's), so **lower is better**. The unit's
difference is ``agent - mean(random)``; a negative mean difference is a placement gain.

* :func:`verdict_summary`: the protocol's paired test (exact sign-flip p, bootstrap CI:
  :func:`~diloco_gym.eval.protocol.paired_test`) on the live and on the simulated
  differences, their verdicts in the project's wording, the per-window sign agreement,
  the effect ratio, Spearman's rank correlation of simulated and live excess over every
  replayed schedule, and the test's power;
* :func:`closed_loop_summary`: a closed-loop agent (deciding live) against its own matched
  random, and against the open-loop replay of its simulated schedule;
* :func:`markdown_section` and :func:`plot_verdicts`: the block of a verdict as Markdown
  lines and as a figure.

Every returned value is JSON-able with ``allow_nan=False``: a number that is not finite is
``None``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval.protocol import ALPHA, ZERO_TOL, gate_verdict, paired_test, units_needed
from diloco_gym.live.document import finite
from diloco_gym.text import finite_float, fmt, fmt_p, md_text

__all__ = [
    "VERDICT_WORDS",
    "REPLAY_WORDS",
    "INCONCLUSIVE",
    "window_verdict",
    "power_summary",
    "verdict_summary",
    "closed_loop_summary",
    "markdown_section",
    "plot_verdicts",
]

#: A test whose non-zero units cannot reach alpha whatever the data (never "tied" then).
INCONCLUSIVE = "inconclusive (too few windows)"
#: The verdicts of an agent against its matched random, in the protocol's wording.
VERDICT_WORDS = (
    "placement gain",
    "worse than matched random",
    "tied with matched random",
    INCONCLUSIVE,
)
#: The verdicts of the closed loop against the open-loop replay of its schedule.
REPLAY_WORDS = (
    "closed loop better than open-loop replay",
    "closed loop worse than open-loop replay",
    "closed loop tied with open-loop replay",
    INCONCLUSIVE,
)


def _vector(x: Any, what: str, k: int | None = None) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size < 1 or (k is not None and a.size != k):
        want = f"({k},)" if k is not None else "(K,) with K >= 1"
        raise ValueError(f"{what}: one value per window expected, shape {want}, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: every value must be finite (pp), got {a[~np.isfinite(a)][0]}")
    return a


def _matrix(x: Any, what: str, k: int, m: int | None = None) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != k or a.shape[1] < 1 or (m is not None and a.shape[1] != m):
        want = f"({k}, {m})" if m is not None else f"({k}, M) with M >= 1"
        raise ValueError(f"{what}: one row per window expected, shape {want}, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: every value must be finite (pp), got {a[~np.isfinite(a)][0]}")
    return a


def _alpha(alpha: float) -> float:
    if not 0 < float(alpha) < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(alpha)


def window_verdict(
    test: dict[str, Any], alpha: float = ALPHA, words: tuple[str, ...] = VERDICT_WORDS
) -> str:
    """The verdict of one paired test over windows (a :func:`paired_test` result):
    ``words[3]`` (``inconclusive (too few windows)``) when the windows with a non-zero
    difference could not reach ``alpha`` whatever the data (``min_p >= alpha``); else
    ``words[0]`` (``placement gain``) for a mean difference below 0 with ``p < alpha``,
    ``words[1]`` (``worse than matched random``) above 0, otherwise ``words[2]`` (``tied
    with matched random``). The gate of :func:`~diloco_gym.eval.protocol.gate_verdict`
    without its calibration and saturation stages."""
    alpha = _alpha(alpha)
    mean = finite_float(test.get("mean"))
    p = finite_float(test.get("p_value"))
    gate = gate_verdict(
        "calibrated",
        mean if mean is not None else 0.0,
        p if p is not None else float("nan"),
        alpha,
        n_units=int(test["n"]),
        n_nonzero=int(test["nonzero"]),
    )
    index = {
        "placement gain": 0,
        "worse than matched random": 1,
        "tied with matched random": 2,
        "inconclusive (too few episodes)": 3,
    }[gate]
    return words[index]


def power_summary(test: dict[str, Any], alpha: float = ALPHA) -> dict[str, Any]:
    """What the windows of a paired test can show: ``windows`` (K), ``nonzero`` (windows
    with a non-zero difference, the only ones that carry evidence), ``min_p`` (the
    smallest p the test can give on them), ``units_needed`` (the fewest windows whose
    smallest p is below ``alpha``) and ``sentence``, in words, e.g. "6 windows: the
    smallest p this test can give is 0.031; below 6 windows no difference can reach
    p < 0.05"."""
    alpha = _alpha(alpha)
    k, nz, min_p = int(test["n"]), int(test["nonzero"]), float(test["min_p"])
    need = units_needed(alpha)
    zero = "" if nz == k else f" ({nz} with a non-zero difference)"
    sentence = (
        f"{k} window{'s' if k != 1 else ''}{zero}: the smallest p this test can give is "
        f"{min_p:.3g}; below {need} windows no difference can reach p < {alpha:g}"
    )
    return {"windows": k, "nonzero": nz, "min_p": min_p, "units_needed": need,
            "alpha": alpha, "sentence": sentence}  # fmt: skip


def _test(
    diff: np.ndarray, seed: int, alpha: float, words: tuple[str, ...] = VERDICT_WORDS
) -> dict[str, Any]:
    """The paired test of ``diff`` (its rng seeded from ``seed``) and its verdict."""
    out = paired_test(diff, np.random.default_rng(int(seed)))
    out["verdict"] = window_verdict(out, alpha, words)
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
    """Spearman's rho and its p-value, ``None`` when undefined (a constant input)."""
    from scipy.stats import spearmanr

    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = spearmanr(x, y)
    return finite_float(res[0]), finite_float(res[1])


def _rank_correlation(sim: np.ndarray, live: np.ndarray) -> dict[str, Any]:
    """Spearman of simulated vs live excess over every schedule (``(K, S)`` arrays, the
    agent's in column 0), and per window when a window has at least 3 schedules."""
    rho, p = _spearman(sim.ravel(), live.ravel())
    per = [_spearman(s, v)[0] for s, v in zip(sim, live, strict=True)] if sim.shape[1] >= 3 else []
    defined = [r for r in per if r is not None]
    return {
        "rho": rho,
        "p_value": p,
        "n": int(sim.size),
        "per_window": per,
        "per_window_mean": float(np.mean(defined)) if defined else None,
    }


def verdict_summary(
    agent_live: Any,
    random_live: Any,
    agent_sim: Any,
    random_sim: Any,
    seed: int = 0,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """Compare the live agent-minus-random difference with the simulator's, window by window.

    Args:
        agent_live: ``(K,)`` live sync-excess (pp) of the agent's schedule per window: the
            live violation % of its phase minus the live control phase's.
        random_live: ``(K, M)`` live sync-excess of each window's M matched-random schedules.
        agent_sim, random_sim: the simulator's sync-excess of the same schedules.
        seed: seeds the bootstrap (and the Monte Carlo test above 20 windows).
        alpha: the test's level.

    Returns:
        ``windows`` (K), ``draws`` (M), ``alpha``;
        ``live`` / ``sim``: :func:`~diloco_gym.eval.protocol.paired_test` of ``agent -
        mean(random)`` (``n``, ``mean``, ``p_value``, ``ci_low``, ``ci_high``, ``min_p``,
        ``nonzero``) plus ``verdict`` (:data:`VERDICT_WORDS`) and ``diffs`` (per window);
        ``verdicts_agree``; ``agreement``: ``per_window`` (the live and simulated
        differences have the same sign), ``agreeing`` and ``fraction``; ``effect_ratio``
        (live mean difference / simulated, ``None`` when the simulated one is 0, at most
        :data:`~diloco_gym.eval.protocol.ZERO_TOL`);
        ``rank_correlation``: ``rho``, ``p_value``, ``n`` (Spearman over all K (M + 1)
        schedules), ``per_window`` and ``per_window_mean`` (within each window, when
        M >= 2); ``power``: :func:`power_summary` of the live test.

    Raises:
        ValueError: a shape that does not match (one line naming the argument) or a value
            that is not finite.
    """
    alpha = _alpha(alpha)
    a_live = _vector(agent_live, "agent_live")
    k = a_live.size
    r_live = _matrix(random_live, "random_live", k)
    a_sim = _vector(agent_sim, "agent_sim", k)
    r_sim = _matrix(random_sim, "random_sim", k, r_live.shape[1])
    d_live = a_live - r_live.mean(axis=1)
    d_sim = a_sim - r_sim.mean(axis=1)
    live = _test(d_live, seed, alpha) | {"diffs": d_live}
    sim = _test(d_sim, seed, alpha) | {"diffs": d_sim}
    same = np.sign(d_live) == np.sign(d_sim)
    ratio = float(live["mean"]) / sim["mean"] if abs(sim["mean"]) > ZERO_TOL else None
    out = {
        "windows": k,
        "draws": int(r_live.shape[1]),
        "alpha": alpha,
        "live": live,
        "sim": sim,
        "verdicts_agree": live["verdict"] == sim["verdict"],
        "agreement": {
            "per_window": same,
            "agreeing": int(same.sum()),
            "fraction": float(same.mean()),
        },
        "effect_ratio": ratio,
        "rank_correlation": _rank_correlation(
            np.column_stack([a_sim, r_sim]), np.column_stack([a_live, r_live])
        ),
        "power": power_summary(live, alpha),
    }
    return finite(out)


def closed_loop_summary(
    closed_live: Any,
    random_live: Any,
    replay_live: Any = None,
    seed: int = 0,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """A closed-loop agent (deciding live, on the engine's own observations) per window.

    Args:
        closed_live: ``(K,)`` live sync-excess (pp) of the closed loop's merges.
        random_live: ``(K, M)`` live sync-excess of its matched random (the same number of
            merges as the closed loop launched in that window).
        replay_live: ``(K,)`` live sync-excess of the open-loop replay of the agent's
            simulated schedule on the same windows, or ``None``.

    Returns:
        ``windows``, ``draws``, ``alpha``; ``vs_random``: the paired test of ``closed -
        mean(random)`` with ``verdict`` (:data:`VERDICT_WORDS`) and ``diffs``;
        ``vs_replay``: the paired test of ``closed - replay`` with ``verdict``
        (:data:`REPLAY_WORDS`: does the closed loop keep the open loop's excess) and
        ``diffs``, or ``None`` without ``replay_live``; ``power``: :func:`power_summary`
        of ``vs_random``.
    """
    alpha = _alpha(alpha)
    closed = _vector(closed_live, "closed_live")
    k = closed.size
    rand = _matrix(random_live, "random_live", k)
    d_rand = closed - rand.mean(axis=1)
    vs_random = _test(d_rand, seed, alpha) | {"diffs": d_rand}
    vs_replay = None
    if replay_live is not None:
        d_rep = closed - _vector(replay_live, "replay_live", k)
        vs_replay = _test(d_rep, seed, alpha, REPLAY_WORDS) | {"diffs": d_rep}
    out = {
        "windows": k,
        "draws": int(rand.shape[1]),
        "alpha": alpha,
        "vs_random": vs_random,
        "vs_replay": vs_replay,
        "power": power_summary(vs_random, alpha),
    }
    return finite(out)


def _kind_values(schedules: list[dict], kind: str, key: str) -> list[float]:
    return [
        v
        for s in schedules
        if s.get("kind") == kind and (v := finite_float(s.get(key))) is not None
    ]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _window_row(w: dict[str, Any], closed: bool) -> str:
    """One window's table row (means over its random draws; ``n/a`` where missing)."""
    sch = w.get("schedules", [])
    agent = [s for s in sch if s.get("kind") == "agent"]
    merges = int(agent[0]["merges"]) if agent else None
    a_sim = _mean(_kind_values(sch, "agent", "sim_excess_pp"))
    a_live = _mean(_kind_values(sch, "agent", "live_excess_pp"))
    r_sim = _mean(_kind_values(sch, "random", "sim_excess_pp"))
    r_live = _mean(_kind_values(sch, "random", "live_excess_pp"))
    diff = a_live - r_live if a_live is not None and r_live is not None else None
    cells = [md_text(w.get("window", "")), "n/a" if merges is None else str(merges)]
    cells += [fmt(x) for x in (a_sim, a_live, r_sim, r_live, diff)]
    if closed:
        cells.append(fmt(_mean(_kind_values(sch, "closed-loop", "live_excess_pp"))))
    return "| " + " | ".join(cells) + " |"


def _p(x: Any) -> str:
    """A p-value as text (:func:`~diloco_gym.text.fmt_p`), ``n/a`` when missing."""
    v = finite_float(x)
    return "n/a" if v is None else fmt_p(v)


def _test_line(label: str, t: dict[str, Any] | None) -> str:
    if not t:
        return f"- {label}: no test."
    return (
        f"- {label}: mean difference {fmt(t.get('mean'))} pp "
        f"[95 % CI {fmt(t.get('ci_low'))}, {fmt(t.get('ci_high'))}], "
        f"p = {_p(t.get('p_value'))} over {t.get('n')} windows: {t.get('verdict')}."
    )


def markdown_section(block: dict[str, Any]) -> list[str]:
    """A verdict block as Markdown lines: a per-window table (window, merges, the agent's
    simulated and live excess, its matched random's (mean), the live difference; a
    closed-loop column when the block has one), the live and simulated tests, the
    agreement, the rank correlation and the power sentence.

    ``block``: ``{"agent", "regime", "windows": [{"window", "start_s", "duration_s",
    "control_violation_pct", "schedules": [{"kind": "agent" | "random" | "closed-loop",
    "merges", "sim_excess_pp", "live_excess_pp"}]}], "summary": verdict_summary(...),
    "closed_loop": closed_loop_summary(...) or None}``.
    """
    windows = block.get("windows", [])
    closed = any(s.get("kind") == "closed-loop" for w in windows for s in w.get("schedules", []))
    head = ["window", "merges", "agent sim pp", "agent live pp", "random sim pp (mean)"]
    head += ["random live pp (mean)", "live diff pp"] + (["closed-loop live pp"] if closed else [])
    lines = [
        f"### {md_text(block.get('agent', 'agent'))} on {md_text(block.get('regime', ''))}",
        "",
        "Sync-excess in percentage points over the live no-merge control (lower is better); "
        "a difference is the agent minus the mean of its matched random.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += [_window_row(w, closed) for w in windows]
    s = block.get("summary") or {}
    lines += ["", _test_line("Live", s.get("live")), _test_line("Simulator", s.get("sim"))]
    if s:
        agree = s.get("agreement", {})
        same = "agree" if s.get("verdicts_agree") else "disagree"
        lines.append(
            f"- The live and simulated verdicts {same}; the difference has the same sign in "
            f"{agree.get('agreeing')} of {s.get('windows')} windows; effect ratio (live / "
            f"simulated) {fmt(s.get('effect_ratio'))}."
        )
        rc = s.get("rank_correlation", {})
        per = rc.get("per_window_mean")
        lines.append(
            f"- Rank correlation of simulated and live excess (Spearman, {rc.get('n')} "
            f"schedules): rho = {fmt(rc.get('rho'))}, p = {_p(rc.get('p_value'))}"
            + (f"; within windows, mean rho = {fmt(per)}." if per is not None else ".")
        )
        lines.append(f"- Power: {s.get('power', {}).get('sentence', 'n/a')}.")
    c = block.get("closed_loop")
    if c:
        lines.append(_test_line("Closed loop vs its matched random (live)", c.get("vs_random")))
        if c.get("vs_replay"):
            lines.append(_test_line("Closed loop vs open-loop replay (live)", c["vs_replay"]))
        lines.append(f"- Closed-loop power: {c.get('power', {}).get('sentence', 'n/a')}.")
    return lines


def _per_window(block: dict[str, Any], key: str) -> tuple[list, list]:
    """Per window, the agent-minus-random difference of ``key`` and the half-width of its
    95 % interval from the random draws' spread (1.96 standard errors; 0 with one draw)."""
    diffs, half = [], []
    for w in block.get("windows", []):
        sch = w.get("schedules", [])
        a = _mean(_kind_values(sch, "agent", key))
        r = _kind_values(sch, "random", key)
        diffs.append(a - float(np.mean(r)) if a is not None and r else np.nan)
        half.append(1.96 * float(np.std(r, ddof=1)) / math.sqrt(len(r)) if len(r) >= 2 else 0.0)
    return diffs, half


def plot_verdicts(block: dict[str, Any], path: str | Path) -> Path:
    """Draw a verdict block (:func:`markdown_section`'s) to a PNG at ``path`` (Agg, without
    pyplot). Left: the simulated vs the live sync-excess of every replayed schedule (the
    agent's highlighted, the diagonal dashed). Right: per window, the live and simulated
    agent-minus-random difference, each with the 95 % interval of its random draws' mean
    (1.96 standard errors), and at the right their means with the paired test's bootstrap
    95 % CI. Returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from diloco_gym.io import save_atomic

    path = Path(path)
    fig = Figure(figsize=(11, 4.6))
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    styles = {"random": ("tab:gray", "o", 20), "agent": ("tab:red", "*", 140)}
    styles["closed-loop"] = ("tab:blue", "D", 50)
    everything = []
    for kind, (color, marker, size) in styles.items():
        pts = [
            (x, y)
            for w in block.get("windows", [])
            for s in w.get("schedules", [])
            if s.get("kind") == kind
            and (x := finite_float(s.get("sim_excess_pp"))) is not None
            and (y := finite_float(s.get("live_excess_pp"))) is not None
        ]
        everything += pts
        if pts:
            xy = np.array(pts)
            left.scatter(xy[:, 0], xy[:, 1], c=color, marker=marker, s=size, label=kind)
    if everything:
        lo, hi = float(np.min(everything)), float(np.max(everything))
        left.plot([lo, hi], [lo, hi], ls="--", c="black", lw=0.8)
        left.legend(loc="best", fontsize=8)
    left.set_xlabel("simulated sync-excess (pp)")
    left.set_ylabel("live sync-excess (pp)")
    left.set_title("every replayed schedule")
    _draw_diffs(right, block)
    fig.suptitle(f"{block.get('agent', 'agent')} on {block.get('regime', '')}")
    fig.tight_layout()
    save_atomic(lambda tmp: fig.savefig(tmp, dpi=90, format="png"), path)
    return path


def _draw_diffs(ax: Any, block: dict[str, Any]) -> None:
    """The right panel of :func:`plot_verdicts`."""
    k = len(block.get("windows", []))
    x = np.arange(k, dtype=float)
    summary = block.get("summary") or {}
    for key, name, shift, color in (
        ("live_excess_pp", "live", -0.12, "tab:red"),
        ("sim_excess_pp", "sim", 0.12, "tab:gray"),
    ):
        d, h = _per_window(block, key)
        ax.errorbar(x + shift, d, yerr=h, fmt="o", c=color, capsize=3, label=name)
        t = summary.get(name) or {}
        m, lo, hi = (finite_float(t.get(c)) for c in ("mean", "ci_low", "ci_high"))
        if m is not None and lo is not None and hi is not None:
            err = [[m - lo], [hi - m]]
            ax.errorbar([k + 0.5 + shift], [m], yerr=err, fmt="s", c=color, capsize=4)
    ax.axhline(0.0, c="black", lw=0.8)
    ticks = [str(w.get("window", i)) for i, w in enumerate(block.get("windows", []))]
    ax.set_xticks(list(x) + [k + 0.5], ticks + ["mean"])
    ax.set_xlabel("window")
    ax.set_ylabel("agent - matched random (pp)")
    ax.set_title("lower is better")
    ax.legend(loc="best", fontsize=8)
