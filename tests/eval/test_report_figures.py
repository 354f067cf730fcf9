"""The report's figures (diloco_gym/eval/report_figures.py) on a tiny result: the PNG files
and their names (one per regime, then one timeline per regime), their size, that drawing
does not touch pyplot, the no-claim reasons and the panels' content."""

from __future__ import annotations

import matplotlib
import pytest

from diloco_gym.eval import report_figures
from diloco_gym.eval.report import ReportConfig, run_protocol

matplotlib.use("Agg")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny():
    cfg = ReportConfig(regimes=["bursty"], agents=["fixed-512"], seeds=2, draws=20)
    return run_protocol(cfg, progress=False)


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, report_figures.write_figures(tiny, out)


def test_one_png_per_regime_then_one_timeline(written):
    out, names = written
    assert names == ["fig_bursty.png", "timeline_bursty.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_the_figures_have_their_sizes_at_90_dpi(written):
    from matplotlib.image import imread

    out, _ = written
    assert imread(out / "fig_bursty.png").shape[:2] == (378, 1080)  # 12 x 4.2 in
    height, width = imread(out / "timeline_bursty.png").shape[:2]
    assert width == 1080 and height > 270  # 12 x (3 + 0.4 per schedule) in


def test_drawing_registers_no_pyplot_figure(tiny, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    report_figures.write_figures({**tiny, "timelines": {}}, tmp_path)
    assert plt.get_fignums() == before
    assert [p.name for p in tmp_path.iterdir()] == ["fig_bursty.png"]


def test_a_regime_name_with_a_colon_is_slugged(tiny, tmp_path):
    summary = tiny["summary"].assign(regime="replay:azure")
    names = report_figures.write_figures({**tiny, "summary": summary, "timelines": {}}, tmp_path)
    assert names == ["fig_replay_azure.png"] and (tmp_path / names[0]).is_file()


def test_the_regime_figure_has_the_envelope_and_the_rate_panels(tiny):
    fig = report_figures._regime_figure("bursty", tiny["summary"])
    ax, ax2 = fig.axes
    assert ax.get_title() == "bursty: agent vs its matched-random envelope"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fixed-512"]
    assert len(ax.patches) == 1  # one bar per agent
    assert ax2.get_xlabel() == "merges per hour (budget)"
    assert [t.get_text() for t in ax2.texts] == ["fixed-512"]


def test_no_claim_reasons(tiny):
    g = tiny["summary"]
    assert report_figures._no_claim_reason(g) is None
    why = report_figures._no_claim_reason(g.assign(verdict="no claim (no SLO effect)"))
    assert why is not None and "no measurable merge effect" in why
    cols = ["sync_excess_pct", "matched_random_pct", "matched_random_p95"]
    zero = g.assign(**{c: 0.0 for c in [*cols, "oracle_same_budget_pct"]})
    assert "every agent, matched random and the oracle are at 0.00 pp" in (
        report_figures._no_claim_reason(zero)
    )
    fig = report_figures._regime_figure("ordinary", zero)
    texts = [t.get_text() for a in fig.axes for t in a.texts]
    assert texts.count("no claim: no SLO effect") == 2
    assert sum(len(a.patches) for a in fig.axes) == 0 and not any(a.axison for a in fig.axes)
