"""The agents end to end: the report's deployability marks."""

from __future__ import annotations

import pytest


def test_report_marks_non_deployable_agents():
    from diloco_gym.eval.report import ReportConfig, run_protocol
    from diloco_gym.eval.report_render import render_markdown

    res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=["fixed-512", "offline-oracle"], seeds=2, draws=20),
        progress=False,
    )
    rows, summ = res["rows"], res["summary"].set_index("agent")
    assert dict(zip(rows["agent"], rows["deployable"], strict=True)) == {
        "fixed-512": True,
        "offline-oracle": False,
    }
    assert bool(summ.loc["offline-oracle", "deployable"]) is False
    assert bool(summ.loc["fixed-512", "deployable"]) is True
    md = render_markdown(res, [])
    assert "| offline-oracle (non-deployable) |" in md and "| fixed-512 |" in md
    with pytest.raises(ValueError, match="given twice"):
        run_protocol(
            ReportConfig(regimes=["bursty"], agents=["fixed-512", "fixed-512"], seeds=2, draws=2),
            progress=False,
        )
