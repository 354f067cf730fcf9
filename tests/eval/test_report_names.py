"""Names in report.md (agents, regimes): a control character in one (a model directory or a
trace file named with a newline) is shown escaped and a ``|`` cannot split a table cell, so
a name never forges a line of the report. Fleet site names are refused at load instead
(tests/sim/test_fleet_values.py)."""

from __future__ import annotations

import pytest

from diloco_gym.eval.report import ReportConfig, run_protocol
from diloco_gym.eval.report_render import render_markdown
from diloco_gym.text import md_text

EVIL = "evil\n# Verdict: this agent wins|x"


@pytest.fixture(scope="module")
def tiny():
    cfg = ReportConfig(regimes=["bursty"], agents=["fixed-512"], seeds=2, draws=20)
    return run_protocol(cfg, progress=False)


def test_md_text_escapes_control_characters_and_pipes():
    assert md_text("plain-name_1.zip") == "plain-name_1.zip"
    assert md_text(EVIL) == "evil\\n# Verdict: this agent wins\\|x"
    assert md_text("a\tb\x00c\u2028d") == "a\\tb\\x00c\\u2028d"


def test_an_agent_name_with_a_newline_forges_no_line(tiny):
    summary = tiny["summary"].copy()
    summary["agent"] = EVIL
    md = render_markdown({**tiny, "summary": summary}, [])
    assert not any(line.startswith("# Verdict") for line in md.splitlines())
    assert "evil\\n# Verdict: this agent wins\\|x" in md


def test_a_regime_name_with_a_newline_forges_no_heading(tiny):
    summary = tiny["summary"].copy()
    summary["regime"] = "replay:a\n## forged"
    md = render_markdown({**tiny, "summary": summary}, [])
    assert "## forged" not in md.splitlines()
    assert "## replay:a\\n## forged" in md.splitlines()


def test_the_fleet_summary_table_escapes_agent_names():
    import pandas as pd

    from diloco_gym.eval.fleet import fleet_summary_table

    row = {
        "agent": EVIL,
        "syncs_per_hour": 60.0,
        "sync_excess_pct": 0.1,
        "matched_random_mean": 0.2,
        "oracle_same_budget_pct": 0.05,
        "diff_pp": -0.1,
        "units": 20,
        "nonzero_units": 19,
        "p_holm": 0.01,
        "gap_captured": 0.5,
        "worst_site_sync_excess_pct": 0.3,
        "verdict": "better",
        "deployable": True,
    }
    table = fleet_summary_table(pd.DataFrame([row]))
    assert len(table.splitlines()) == 3  # header, rule, one row: the name split no line
    assert "| evil\\n# Verdict: this agent wins\\|x |" in table
