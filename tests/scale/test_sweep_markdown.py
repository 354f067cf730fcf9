"""diloco_gym/scale/sweep_markdown.py: the sweep's summary.md: its header, the table of
every point and agent (single-host or fleet columns, floats to 3 significant digits), the
failed cells and the incomplete points, each section only when it has something to say."""

from __future__ import annotations

import pandas as pd

from diloco_gym.scale import fleet_points
from diloco_gym.scale.sweep_markdown import REPORT_COLUMNS, sweep_markdown


def _summary(columns, n=2) -> pd.DataFrame:
    rows = []
    for i in range(n):
        row = {c: f"{c}{i}" for c in columns}
        row.update(point=i, **{"grid.regime": ["bursty", "ordinary"][i]})
        for c in ("sync_excess_pct", "diff_pp", "p_holm"):
            if c in columns:
                row[c] = 1.23456 * (i + 1)
        rows.append(row)
    return pd.DataFrame(rows)


def test_empty_sweep_is_the_header_only():
    text = sweep_markdown("s", "s.toml", 0, [], False)(pd.DataFrame(), [], [])
    assert text == "# Sweep s\n\nSweep file: `s.toml`; 0 point(s) over no axis.\n"


def test_single_host_table():
    render = sweep_markdown("grid", "g.toml", 2, ["regime"], False)
    text = render(_summary(REPORT_COLUMNS), [], [])
    lines = text.splitlines()
    assert lines[2] == "Sweep file: `g.toml`; 2 point(s) over regime."
    header = "| " + " | ".join(["point", "grid.regime", *REPORT_COLUMNS]) + " |"
    i = lines.index(header)
    assert lines[i + 1] == "|" + "---|" * (2 + len(REPORT_COLUMNS))
    assert lines[i + 2].startswith("| 0 | bursty | agent0 | units0 | nonzero_units0 | 1.23 |")
    assert "| 2.47 |" in lines[i + 3]  # 2.46912 to 3 significant digits
    assert "Fleet points" not in text and "## Failed" not in text and "## Incomplete" not in text


def test_fleet_table_uses_the_fleet_columns_and_note():
    render = sweep_markdown("f", "f.toml", 1, ["regime", "bits"], True)
    summary = _summary(fleet_points.MARKDOWN_COLUMNS, n=1).assign(**{"grid.bits": 8})
    text = render(summary, [], [])
    assert "1 point(s) over regime, bits." in text
    cols = ["point", "grid.regime", "grid.bits", *fleet_points.MARKDOWN_COLUMNS]
    assert "| " + " | ".join(cols) + " |" in text.splitlines()
    assert "worst_site_sync_excess_pct: the worst site's own sync-excess" in text


def test_failed_cells_and_incomplete_points():
    errors = [
        {"point": 0, "cell": "unit 3", "error": "ValueError: bad"},
        {"point": 1, "cell": "calibration", "error": "OSError: gone"},
    ]
    render = sweep_markdown("s", "s.toml", 2, ["regime"], False)
    text = render(pd.DataFrame(), errors, ["point 1: 2 of 5 cells done"])
    assert "## Failed cells (2)\n\n- point 0, unit 3: ValueError: bad\n" in text
    assert "- point 1, calibration: OSError: gone\n" in text
    assert text.endswith("## Incomplete\n\n- point 1: 2 of 5 cells done\n")
    assert "| point |" not in text  # no summary, no table


def test_the_renderer_is_reusable():
    render = sweep_markdown("s", "s.toml", 2, ["regime"], False)
    summary = _summary(REPORT_COLUMNS)
    assert render(summary, [], []) == render(summary, [], [])
    assert render(summary, [], ["late"]) != render(summary, [], [])
