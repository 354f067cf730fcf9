"""Published effects of the sync interval H on DiLoCo's model quality, to set beside ours.

The learner surrogate (:mod:`diloco_gym.sim.learner_calibration`) prices a merge schedule's
model-quality cost; it should agree with the published DiLoCo results on the direction and
rough size of the effect of H. This module holds the published points we could read as
numbers (:data:`PUBLISHED`), reduces every one to a *relative change in loss* against its
source's reference interval (:func:`relative_change`), computes the same quantity from our
own calibration runs (:func:`measured_h_effect`) and from the fitted surrogate
(:func:`surrogate_h_effect`), and draws them on one figure
(:func:`plot_h_effect`): x the sync interval relative to the reference interval (log
scale), y the relative change in loss in percent.

**What is here, and how it was read** (docs/learners.md, "Published H effects", has the
sentences and table rows each value was read from):

* DiLoCo (Douillard et al., arXiv 2311.08105 v3, Section 3.1, "Communication frequency"):
  Figure 4 varies H over 50-2000 for a 150M model, 8 replicas, non-i.i.d. C4 shards, but
  prints no values; the text gives one number, the perplexity at H = 1000 is 2.9 % above
  that at H = 50. Converting it to loss needs the perplexity at H = 50, which the paper does
  not print; it lies between 15.02 / 1.029 and 15.02 (15.02 is the H = 500 run of Tables 2
  and 3, and the text says that communicating more often improves perplexity and that the
  degradation is mild up to H = 1000), so the loss change is given with that range.
* Khaled et al., "Understanding Outer Optimizers in Local SGD" (arXiv 2509.10439, NeurIPS
  2025), appendix Table 3, "Varying H (Local Steps) at 150M, M = 4": C4 validation
  perplexity at H = 50, 150, 250, 500, 1000, 2000 for four outer optimizers (the rows at
  H = 50 are in the table's "Local SGD Experiments" part). Nesterov with outer learning
  rate 0.7 is DiLoCo's setting.
* Streaming DiLoCo (Douillard et al., arXiv 2501.18512), Table 6: C4 evaluation loss of
  Streaming DiLoCo with overlapped FP4 communication at H = 30 and H = 100, M = 2 and 4,
  for six model sizes from 35M to 1B parameters (Chinchilla-optimal tokens).

Not here, because no number could be read: the H ablation of the DiLoCo scaling-law paper
(Charles et al., arXiv 2503.09799, Section 5.1 / Appendix E.1: H in 1-300, plotted only), the
per-H curves of Streaming DiLoCo's Figure 13, and OpenDiLoCo's (arXiv 2407.07852) runs at
H = 50 / 500 (150M) and 125 / 500 (1.1B), whose values were found only in secondary
summaries.

**Units.** Every change is a fraction (0.01 is 1 %); the figure shows percent. Perplexity
``P`` is converted to loss as ``ln P`` (nats), so a perplexity series' change is
``ln P_H / ln P_ref - 1``. Each value is given with the interval its printed rounding
allows (half a unit of the last printed digit on both values); it is no confidence
interval: the sources report one run per setting.

numpy only at import; matplotlib is imported by :func:`plot_h_effect` alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from diloco_gym.sim.learner_calibration import LearnerCalibration

__all__ = [
    "METRICS",
    "PUBLISHED",
    "Change",
    "Series",
    "measured_h_effect",
    "plot_h_effect",
    "relative_change",
    "surrogate_h_effect",
    "env_default_h_effect",
]

#: The metrics a series may report. ``perplexity_ratio``: the perplexity at each H divided
#: by that at the reference H, as the source states it (the reference perplexity itself
#: unprinted, bounded by ``reference_range``).
METRICS = ("loss", "perplexity", "perplexity_ratio")


@dataclass(frozen=True)
class Series:
    """One published curve of a metric against H: one source, model, replica count and
    setting, each point ``(H, value)`` as printed.

    ``reference_h`` is the interval the changes are taken against (one of the series' own
    H for ``loss`` and ``perplexity``; for ``perplexity_ratio`` the interval the stated
    ratios are relative to). ``resolution`` is half a unit of the last printed digit.
    ``label`` groups series in the figure's legend (one colour and entry per label).
    """

    key: str
    source: str
    arxiv: str
    where: str
    model: str
    replicas: int
    setting: str
    metric: str
    reference_h: int
    points: tuple[tuple[int, float], ...]
    resolution: float
    label: str
    reference_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        where = f"Series {self.key!r}"
        if self.metric not in METRICS:
            raise ValueError(f"{where}: metric must be one of {METRICS}, got {self.metric!r}")
        if not self.points:
            raise ValueError(f"{where}: points is empty")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"{where}: replicas must be an int >= 1, got {self.replicas!r}")
        if not _positive(self.reference_h):
            raise ValueError(f"{where}: reference_h must be > 0, got {self.reference_h!r}")
        if not (_finite(self.resolution) and self.resolution >= 0):
            raise ValueError(f"{where}: resolution must be finite and >= 0")
        seen: set[float] = set()
        for i, (h, value) in enumerate(self.points):
            if not _positive(h):
                raise ValueError(f"{where}: points[{i}] H must be > 0, got {h!r}")
            if h in seen:
                raise ValueError(f"{where}: points[{i}] repeats H = {h}")
            seen.add(h)
            if not _finite(value) or value - self.resolution <= self._lowest():
                raise ValueError(
                    f"{where}: points[{i}] value must be finite and above "
                    f"{self._lowest()} by more than the resolution, got {value!r}"
                )
        if self.metric == "perplexity_ratio":
            if self.reference_h in seen:
                raise ValueError(f"{where}: a perplexity_ratio series lists no reference point")
            lo_hi = self.reference_range
            if lo_hi is None or not (_finite(lo_hi[0]) and _finite(lo_hi[1])):
                raise ValueError(f"{where}: perplexity_ratio needs a finite reference_range")
            if not 1.0 < lo_hi[0] <= lo_hi[1]:
                raise ValueError(f"{where}: reference_range must satisfy 1 < low <= high")
        elif self.reference_h not in seen:
            raise ValueError(
                f"{where}: reference_h {self.reference_h} is not one of the series' H "
                f"({sorted(seen)})"
            )

    def _lowest(self) -> float:
        """The value every printed value must exceed: perplexities above 1 (so that their
        loss is positive), losses and ratios above 0."""
        return 1.0 if self.metric == "perplexity" else 0.0


class Change(NamedTuple):
    """One point's relative change in loss against its series' reference interval, as a
    fraction, with the interval the printed rounding allows."""

    h: float
    h_relative: float
    change: float
    low: float
    high: float


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


_DILOCO_SETUP = "C4, non-i.i.d. shards, 24,000 pretraining + 64,000 DiLoCo steps"
_KHALED_WHERE = (
    "appendix Table 3, 'Varying H (Local Steps) at 150M, M = 4' "
    "(the H = 50 rows: its 'Local SGD Experiments' part)"
)
_KHALED_H = (50, 150, 250, 500, 1000, 2000)
#: appendix Table 3 of arXiv 2509.10439, perplexity per outer optimizer at the H above.
_KHALED = {
    "nesterov-0.7": ("Nesterov, outer lr 0.7 (DiLoCo)", (17.25, 17.90, 18.09, 17.95, 18.16, 18.40)),
    "nesterov-1.0": ("Nesterov, outer lr 1.0", (16.38, 16.79, 17.12, 18.15, 18.75, 18.36)),
    "sgd-1.0": ("SGD, outer lr 1.0 (averaging)", (17.75, 17.58, 18.20, 18.44, 18.18, 18.11)),
    "sf-sgd-2.0": ("Schedule-Free SGD, lr 2.0, b1 0.2", (16.88, 16.96, 16.97, 17.18, 17.29, 17.59)),
}
_STREAMING_SIZES = ("35M", "100M", "200M", "300M", "500M", "1B")
#: Table 6 of arXiv 2501.18512: evaluation loss at (H = 30, H = 100) per model size.
_STREAMING = {
    2: ((3.53, 3.56), (3.21, 3.22), (2.98, 3.00), (2.81, 2.83), (2.67, 2.69), (2.48, 2.50)),
    4: ((3.60, 3.64), (3.25, 3.29), (3.02, 3.05), (2.84, 2.87), (2.70, 2.73), (2.50, 2.53)),
}


def _published() -> tuple[Series, ...]:
    out = [
        Series(
            key="diloco-2023",
            source="Douillard et al. 2023, DiLoCo",
            arxiv="2311.08105",
            where="v3, Section 3.1 'Communication frequency' (text; Figure 4 prints no values)",
            model="150M",
            replicas=8,
            setting=f"Nesterov outer lr 0.7, momentum 0.9; {_DILOCO_SETUP}",
            metric="perplexity_ratio",
            reference_h=50,
            points=((1000, 1.029),),
            resolution=0.0005,
            label="DiLoCo 2023, 150M, k=8 (ref H=50)",
            reference_range=(15.02 / 1.029, 15.02),
        )
    ]
    for key, (setting, values) in _KHALED.items():
        out.append(
            Series(
                key=f"khaled-2025-{key}",
                source="Khaled et al. 2025, Understanding Outer Optimizers in Local SGD",
                arxiv="2509.10439",
                where=_KHALED_WHERE,
                model="150M",
                replicas=4,
                setting=f"{setting}; C4, from scratch, batch 512 x 1024 tokens",
                metric="perplexity",
                reference_h=50,
                points=tuple(zip(_KHALED_H, values, strict=True)),
                resolution=0.005,
                label=f"Khaled 2025, 150M, M=4, {setting} (ref H=50)",
            )
        )
    for m, rows in _STREAMING.items():
        for size, (at30, at100) in zip(_STREAMING_SIZES, rows, strict=True):
            out.append(
                Series(
                    key=f"streaming-2025-{size}-m{m}",
                    source="Douillard et al. 2025, Streaming DiLoCo",
                    arxiv="2501.18512",
                    where="Table 6",
                    model=size,
                    replicas=m,
                    setting="overlapped FP4 communication; C4, Chinchilla-optimal tokens",
                    metric="loss",
                    reference_h=30,
                    points=((30, at30), (100, at100)),
                    resolution=0.005,
                    label=f"Streaming DiLoCo 2025, 35M-1B, M={m} (ref H=30)",
                )
            )
    return tuple(out)


#: Every published point read as a number (module docstring; docs/learners.md).
PUBLISHED: tuple[Series, ...] = _published()


def _as_loss(metric: str, value: float) -> float:
    return math.log(value) if metric == "perplexity" else value


def relative_change(points: Iterable[Series] = PUBLISHED) -> dict[str, list[Change]]:
    """Per series (keyed by :attr:`Series.key`), the relative change in loss of every point
    against the series' reference interval, the reference itself (change 0) included.

    ``loss``: ``L_H / L_ref - 1``. ``perplexity``: the same on ``ln P``. ``perplexity_ratio``
    (a stated ``P_H / P_ref``): ``ln(ratio) / ln P_ref``, central at the middle of
    ``reference_range``. ``low`` and ``high`` take every printed value at the ends of its
    rounding (and ``P_ref`` at the ends of its range).
    """
    series = list(points)
    if not series:
        raise ValueError("relative_change: points is empty (give at least one Series)")
    out: dict[str, list[Change]] = {}
    for s in series:
        if not isinstance(s, Series):
            raise ValueError(f"relative_change: expected Series items, got {type(s).__name__}")
        if s.key in out:
            raise ValueError(f"relative_change: series key {s.key!r} appears twice")
        r, h0 = s.resolution, float(s.reference_h)
        rows: list[Change] = []
        if s.metric == "perplexity_ratio":
            assert s.reference_range is not None  # checked by Series
            p_lo, p_hi = s.reference_range
            rows.append(Change(h0, 1.0, 0.0, 0.0, 0.0))
            for h, ratio in s.points:
                mid = math.log(ratio) / math.log(0.5 * (p_lo + p_hi))
                low = math.log(ratio - r) / math.log(p_hi)
                high = math.log(ratio + r) / math.log(p_lo)
                rows.append(Change(float(h), h / h0, mid, min(low, high), max(low, high)))
        else:
            ref = dict(s.points)[s.reference_h]
            for h, v in s.points:
                if h == s.reference_h:
                    rows.append(Change(float(h), 1.0, 0.0, 0.0, 0.0))
                    continue
                loss = _as_loss(s.metric, v)
                change = loss / _as_loss(s.metric, ref) - 1.0
                low = _as_loss(s.metric, v - r) / _as_loss(s.metric, ref + r) - 1.0
                high = _as_loss(s.metric, v + r) / _as_loss(s.metric, ref - r) - 1.0
                rows.append(Change(float(h), h / h0, change, low, high))
        out[s.key] = sorted(rows, key=lambda c: c.h)
    return out


def _fixed_final(i: int, run: Mapping[str, Any]) -> tuple[int, int, int, float] | None:
    """``(H, last step, seed, final loss)`` of a plain fixed-H run (schedule ``[H, 2H,
    ...]``, one fragment, full precision), ``None`` for any other; a malformed run is a
    ``ValueError`` naming ``runs[i]`` and its field."""
    sched = run.get("schedule")
    if not isinstance(sched, list) or not sched:
        raise ValueError(f"measured_h_effect: runs[{i}].schedule must be a non-empty list")
    h = sched[0]
    if not _positive(h):
        raise ValueError(f"measured_h_effect: runs[{i}].schedule[0] must be > 0, got {h!r}")
    fixed = sched == [h * (k + 1) for k in range(len(sched))]
    if not fixed or run.get("fragments", 1) != 1 or run.get("bits", 32) != 32:
        return None
    losses = run.get("merge_losses")
    if not isinstance(losses, list) or len(losses) != len(sched):
        raise ValueError(f"measured_h_effect: runs[{i}].merge_losses must list one loss per merge")
    loss = losses[-1]
    if not (_finite(loss) and loss > 0):
        raise ValueError(f"measured_h_effect: runs[{i}].merge_losses[-1] must be > 0")
    s = run.get("seed")
    if not isinstance(s, int):
        raise ValueError(f"measured_h_effect: runs[{i}].seed must be an int, got {s!r}")
    return h, sched[-1], s, float(loss)


def measured_h_effect(
    runs: Sequence[Mapping[str, Any]],
    reference_h: int,
    *,
    draws: int = 1000,
    seed: int = 0,
) -> list[tuple[float, float, float, float]]:
    """Our own H effect, from the runs of a learner calibration (its ``runs`` list; the
    run records of :mod:`diloco_gym.lm.fit`): the fixed-H runs (schedule ``[H, 2H, ...]``,
    one fragment, full precision) that end at the same step as the reference's; a mapping
    check's runs (role ``"mapping"``) are left out, and two fixed-H runs of one H at
    different budgets are a ``ValueError``.

    Per H: ``(H / reference_h, change, low, high)``, where ``change`` is the mean over seeds
    of ``final_loss(H, seed) / final_loss(reference_h, seed) - 1`` (paired by seed, seeds
    run at both intervals only) and ``low``/``high`` the 2.5 and 97.5 percentiles of that
    mean over ``draws`` resamples of the seeds with replacement (the seed is the
    independent unit, as in the fit's intervals). Sorted by H; the reference (0, 0, 0)
    included.
    """
    if not _positive(reference_h):
        raise ValueError(f"measured_h_effect: reference_h must be > 0, got {reference_h!r}")
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"measured_h_effect: draws must be an int >= 1, got {draws!r}")
    final: dict[int, dict[int, float]] = {}
    end: dict[int, int] = {}
    for i, run in enumerate(runs):
        got = _fixed_final(i, run)
        if got is None or run.get("role") == "mapping":
            continue  # not a plain fixed-H run, or a mapping check's (another budget)
        h, last, s, loss = got
        if end.setdefault(h, last) != last:
            raise ValueError(
                f"measured_h_effect: runs[{i}] is fixed H = {h} at a budget ending at step "
                f"{last}, another fixed-{h} run ends at {end[h]}: give one budget's runs"
            )
        final.setdefault(h, {})[s] = loss
    if reference_h not in final:
        raise ValueError(
            f"measured_h_effect: no fixed-H run at reference_h = {reference_h} "
            f"(fixed H present: {sorted(final)})"
        )
    rng = np.random.default_rng(seed)
    out: list[tuple[float, float, float, float]] = []
    ref = final[reference_h]
    for h in sorted(final):
        if end[h] != end[reference_h]:
            continue  # a different budget: not comparable
        seeds = sorted(set(final[h]) & set(ref))
        if not seeds:
            continue
        rel = np.array([final[h][s] / ref[s] - 1.0 for s in seeds])
        means = rel[rng.integers(0, len(rel), size=(draws, len(rel)))].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        out.append((h / reference_h, float(rel.mean()), float(lo), float(hi)))
    return out


def _relative_rows(
    final: Any, hs: Sequence[int], reference_h: int
) -> list[tuple[float, float, float, float]]:
    """``(H / reference_h, change, change, change)`` per H of ``hs`` (sorted, once each),
    ``change = final(H) / final(reference_h) - 1``: a prediction's rows for
    :func:`plot_h_effect` (a prediction has no interval)."""
    ref = final(reference_h)
    out = []
    for h in sorted(set(hs)):
        c = final(h) / ref - 1.0
        out.append((h / reference_h, c, c, c))
    return out


def surrogate_h_effect(
    cal: LearnerCalibration,
    hs: Sequence[int],
    reference_h: int,
    total_steps: int,
) -> list[tuple[float, float, float, float]]:
    """The learner surrogate's H effect: for each fixed interval ``H`` of ``hs`` (merges at
    ``H, 2H, ...`` up to ``total_steps`` inner steps, which ``H`` must divide, so that every
    schedule spends the same budget), ``(H / reference_h, change, change, change)`` with
    ``change = predict_final_loss(H) / predict_final_loss(reference_h) - 1`` (a prediction
    has no interval). Rows in the form :func:`plot_h_effect` takes."""
    from diloco_gym.sim.learner_calibration import predict_final_loss

    for name, v in (("reference_h", reference_h), ("total_steps", total_steps)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise ValueError(f"surrogate_h_effect: {name} must be an int > 0, got {v!r}")
    if not hs:
        raise ValueError("surrogate_h_effect: hs is empty")
    for name, h in [(f"hs[{i}]", h) for i, h in enumerate(hs)] + [("reference_h", reference_h)]:
        if not (isinstance(h, int) and not isinstance(h, bool) and h > 0):
            raise ValueError(f"surrogate_h_effect: {name} must be an int > 0, got {h!r}")
        if total_steps % h:
            raise ValueError(
                f"surrogate_h_effect: H = {h} does not divide total_steps = {total_steps}"
            )

    def final(h: int) -> float:
        return predict_final_loss(np.arange(h, total_steps + 1, h, dtype=float), cal)

    return _relative_rows(final, hs, reference_h)


def env_default_h_effect(
    hs: Sequence[int],
    reference_h: int,
    duration_s: float = 600.0,
    learners: Any = None,
    step_seconds: float = 0.14,
) -> list[tuple[float, float, float, float]]:
    """The env's own learner surrogate's H effect (:class:`~diloco_gym.sim.learners.
    LearnerParams`, the defaults unless ``learners`` is given): fixed intervals of ``H`` env
    steps over one episode of ``duration_s`` from the episode's initial tokens, the learners
    at their median throughput; per H, ``(H / reference_h, change, change, change)`` with
    ``change`` the global loss after the last merge relative to fixed ``reference_h``'s,
    minus 1 (rows in the form :func:`plot_h_effect` takes). The merge rule is the env's
    (:func:`~diloco_gym.sim.learners.merge_gain`)."""
    from diloco_gym.sim import learners as lrn

    p = learners if learners is not None else lrn.LearnerParams()
    if not hs:
        raise ValueError("env_default_h_effect: hs is empty")
    for name, h in [(f"hs[{i}]", h) for i, h in enumerate(hs)] + [("reference_h", reference_h)]:
        if not (isinstance(h, int) and not isinstance(h, bool) and h > 0):
            raise ValueError(f"env_default_h_effect: {name} must be an int > 0, got {h!r}")
    if not (_finite(duration_s) and duration_s > 0):
        raise ValueError(f"env_default_h_effect: duration_s must be > 0, got {duration_s!r}")
    throughputs = np.full(p.num_learners, float(p.throughput_tokens_per_s))

    def final(h: int) -> float:
        gap = h * step_seconds
        tokens = float(p.initial_tokens)
        for _ in range(int(duration_s // gap + 1e-9)):
            added, _drop = lrn.merge_gain(gap, tokens, throughputs, p)
            tokens += added
        return float(lrn.loss(tokens, p))

    return _relative_rows(final, hs, reference_h)


def _check_measured(
    measured: Sequence[Sequence[float]], name: str = "measured"
) -> list[tuple[float, ...]]:
    rows = [tuple(m) for m in measured]
    if not rows:
        raise ValueError(
            f"plot_h_effect: {name} is empty (give (h_relative, change, low, high) rows)"
        )
    names = ("h_relative_to_reference", "relative_loss_change", "ci_low", "ci_high")
    for i, row in enumerate(rows):
        if len(row) != 4:
            raise ValueError(f"plot_h_effect: {name}[{i}] must have 4 fields {names}")
        for field, v in zip(names, row, strict=True):
            if not _finite(v):
                raise ValueError(f"plot_h_effect: {name}[{i}].{field} must be finite, got {v!r}")
        if row[0] <= 0:
            raise ValueError(
                f"plot_h_effect: {name}[{i}].h_relative_to_reference must be > 0, got {row[0]!r}"
            )
        if not row[2] <= row[1] <= row[3]:
            raise ValueError(f"plot_h_effect: {name}[{i}] needs ci_low <= change <= ci_high")
    return rows


#: The colours of ``plot_h_effect``'s extra lines, in order (repeated past the fifth).
_EXTRA_COLOURS = ("0.35", "tab:olive", "tab:cyan", "tab:gray", "gold")


def _draw_published(ax: Any, published: list[Series]) -> None:
    """The published series on ``ax``: one colour per label, rounding intervals as bars."""
    changes = relative_change(published)
    series = {s.key: s for s in published}
    colours: dict[str, Any] = {}
    cycle = iter(
        ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    )
    for key, pts in changes.items():
        label = series[key].label
        first = label not in colours
        if first:
            colours[label] = next(cycle, "tab:gray")
        x = np.array([c.h_relative for c in pts])
        y = np.array([c.change for c in pts]) * 100
        err = np.array([[c.change - c.low for c in pts], [c.high - c.change for c in pts]]) * 100
        ax.errorbar(
            x,
            y,
            yerr=err,
            color=colours[label],
            marker="o",
            ms=4,
            lw=1.2,
            alpha=0.75,
            capsize=2,
            label=label if first else None,
        )


def plot_h_effect(
    measured: Sequence[Sequence[float]],
    path: str | os.PathLike[str],
    *,
    published: Iterable[Series] = PUBLISHED,
    measured_label: str = "this project (measured)",
    also: Sequence[tuple[str, Sequence[Sequence[float]]]] = (),
) -> None:
    """Draw the published H effects and ``measured`` on one figure and save it (PNG,
    written atomically) to ``path``.

    ``measured``: rows ``(h_relative_to_reference, relative_loss_change, ci_low, ci_high)``,
    changes as fractions (as :func:`measured_h_effect` returns them). x: the sync interval
    relative to each series' reference interval, log scale; y: the relative change in loss,
    percent. Published points carry their rounding interval, measured ones their ``ci``.
    ``also``: further ``(label, rows)`` lines of the same form (e.g.
    :func:`surrogate_h_effect`), drawn dashed.
    """
    rows = _check_measured(measured)
    extra = [(label, _check_measured(r, f"also[{i}]")) for i, (label, r) in enumerate(also)]
    published = list(published)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from diloco_gym.io import save_atomic

    fig = Figure(figsize=(8.5, 5.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw_published(ax, published)
    x = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows]) * 100
    err = np.array([[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]]) * 100
    order = np.argsort(x)
    ax.errorbar(
        x[order],
        y[order],
        yerr=err[:, order],
        color="black",
        marker="s",
        ms=6,
        lw=2.2,
        capsize=3,
        label=measured_label,
        zorder=5,
    )
    for (label, extra_rows), colour in zip(extra, _EXTRA_COLOURS * 2, strict=False):
        pts = sorted(extra_rows)
        ax.plot(
            [r[0] for r in pts],
            [r[1] * 100 for r in pts],
            color=colour,
            ls="--",
            marker="^",
            ms=5,
            lw=1.8,
            label=label,
            zorder=4,
        )
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sync interval H / reference interval H_ref (log scale)")
    ax.set_ylabel("relative change in loss (%)")
    ax.set_title("Effect of the sync interval on loss: published DiLoCo results and ours")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_atomic(lambda tmp: fig.savefig(tmp, format="png", dpi=120), path)
