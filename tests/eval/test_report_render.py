"""report.md and the console table (diloco_gym/eval/report_render.py) on a tiny result (one
regime, one agent, two seeds): the sections in order, the header's wording, the
"inconclusive" verdict and its explanation when n is too small, p-value formatting, the
non-deployable mark, the overlapping-windows warning and the load sentence."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.eval.report import ReportConfig, run_protocol
from diloco_gym.eval.report_render import (
    PAPER,
    _speed,
    _units_sentence,
    console_summary,
    render_markdown,
    sealing_mode,
)

INCONCLUSIVE = "inconclusive (too few episodes)"
#: A trace replay's load, as report.json records it.
LOAD = {
    "independent": True,
    "windows": 1,
    "window_s": 600.0,
    "stride_s": 600.0,
    "trace_duration_s": 1200.4,
    "rate_scale": 2.0,
    "replayed_duration_s": 600.2,
    "mean_rate_rps": 3.14159,
    "utilization": 0.5,
}


@pytest.fixture(scope="module")
def tiny():
    cfg = ReportConfig(regimes=["bursty"], agents=["fixed-512"], seeds=2, draws=20)
    return run_protocol(cfg, progress=False)


def _with(result, **summary_columns):
    summary = result["summary"].copy()
    for col, value in summary_columns.items():
        summary[col] = value
    return {**result, "summary": summary}


def test_the_sections_come_in_order(tiny):
    md = render_markdown(tiny, ["fig_bursty.png", "timeline_bursty.png"], command="diloco-gym x")
    heads = [ln for ln in md.splitlines() if ln.startswith("#")]
    assert heads == [
        "# diloco-gym calibration report",
        "## Effect-size transfer",
        "## bursty",
        "## One episode",
        "## Notes",
    ]
    assert "Command: `diloco-gym x`" in md
    assert "![bursty](fig_bursty.png)" in md and "![timeline](timeline_bursty.png)" in md


def test_figures_and_the_command_appear_only_when_given(tiny):
    md = render_markdown(tiny, [])
    assert "Command:" not in md and "![" not in md and "## One episode" not in md


def test_the_header_states_units_draws_gate_and_sealing(tiny):
    md = render_markdown(tiny, [])
    assert (
        "2 episodes per regime (independent units: seeds 0..1). 20 matched-random draws "
        "per episode, gate at p < 0.05." in md
    )
    assert f"Deployable agents: {sealing_mode(False)}. Each ran in a worker process" in md
    unsealed = {**tiny, "config": {**tiny["config"], "in_process_agents": True}}
    unsealed["agent_sealing"] = sealing_mode(True)
    md = render_markdown(unsealed, [])
    assert f"Deployable agents: {sealing_mode(True)}. **They ran in the evaluating process" in md
    assert sealing_mode(True) != sealing_mode(False)


def test_too_few_seeds_are_inconclusive_and_the_section_says_how_many_are_needed(tiny):
    (row,) = tiny["summary"].to_dict("records")
    assert row["verdict"] == INCONCLUSIVE and row["units"] == 2
    md = render_markdown(tiny, [])
    note = next(ln for ln in md.splitlines() if ln.startswith("**fixed-512: inconclusive"))
    k = int(row["nonzero_units"])
    assert f"2 independent seeds, {k} with a non-zero difference" in note
    assert f"At least {int(row['units_needed'])} independent seeds" in note
    assert note.endswith("(--seeds).")
    table_row = next(ln for ln in md.splitlines() if ln.startswith("| fixed-512 |"))
    assert table_row.endswith(f"| {INCONCLUSIVE} |") and f"| 2 ({k}) |" in table_row
    assert "tied" not in table_row


def test_a_conclusive_verdict_gets_no_inconclusive_note(tiny):
    md = render_markdown(_with(tiny, verdict="placement gain"), [])
    assert "**fixed-512: inconclusive" not in md
    assert next(ln for ln in md.splitlines() if ln.startswith("| fixed-512 |")).endswith(
        "| placement gain |"
    )


@pytest.mark.parametrize(
    ("p", "shown"), [(1e-5, "<0.001"), (0.0004, "<0.001"), (0.0123, "0.012"), (1.0, "1.000")]
)
def test_p_values_in_the_table_and_the_console(tiny, p, shown):
    result = _with(tiny, p_value=p, p_holm=p)
    row = next(ln for ln in render_markdown(result, []).splitlines() if ln.startswith("| fixed"))
    assert f"| {shown} | {shown} |" in row
    text = console_summary(result["summary"])
    assert text.splitlines()[1].split()[-6:-4] == [shown, shown]


def test_the_console_table_heads_and_marks_non_deployable_agents(tiny):
    text = console_summary(tiny["summary"])
    head = text.splitlines()[0].split()
    assert head[:3] == ["regime", "agent", "merges/h"] and head[-1] == "verdict"
    assert "48.0" in text and "(non-deployable)" not in text
    oracle = tiny["summary"].assign(agent="offline-oracle", deployable=False)
    assert "offline-oracle (non-deployable)" in console_summary(oracle)
    md = render_markdown({**tiny, "summary": oracle}, [])
    assert "| offline-oracle (non-deployable) |" in md


def test_the_paper_numbers_are_quoted_for_a_paper_regime(tiny):
    md = render_markdown(tiny, [])
    line = next(ln for ln in md.splitlines() if ln.startswith("Paper / reference"))
    assert f"fixed-512 {PAPER['bursty']['fixed-512']}" in line


def test_overlapping_windows_get_the_warning_and_a_descriptive_table(tiny):
    result = _with(tiny, independent=False)
    result["config"] = {**tiny["config"], "trace": "t.csv"}
    result["loads"] = {"bursty": {**LOAD, "independent": False, "windows": 2}}
    md = render_markdown(result, [])
    assert "**Overlapping windows: not independent.**" in md
    assert "Descriptive only (all overlapping windows" in md
    assert "| fixed-512 (descriptive) | 2 |" in md
    assert "**Overlapping windows" not in render_markdown(tiny, [])


def test_a_saturated_regime_says_no_claim_and_what_to_do(tiny):
    md = render_markdown(_with(tiny, saturated=True, no_sync_violation_pct=70.0), [])
    assert "**No claim (saturated)**: 70.0 % of requests violate their SLO" in md
    assert "Lower the load (--rate-scale, --target-utilization)" in md


def test_the_units_sentence_of_a_trace_replay():
    result = {"config": {"trace": "t.csv", "seed0": 7}, "loads": {"t": LOAD}}
    assert _units_sentence(result) == (
        "1 window of 600 s every 600 s (disjoint windows, independent units) of the 1200 s "
        "trace replayed 2x faster (600 s, 3.14 req/s, utilization 0.50); one episode per "
        "window, window i seeded 7 + i for the added pressure series."
    )
    assert _units_sentence({"config": {"trace": "t.csv"}, "loads": {}}) == (
        "Trace windows as episodes."
    )
    assert _speed(1) == "at its own rate" and _speed(0.25) == "at 0.25x its rate"


def test_the_rendering_is_a_function_of_the_result(tiny):
    a = render_markdown(tiny, ["fig_bursty.png"])
    assert a == render_markdown(tiny, ["fig_bursty.png"])
    changed = _with(tiny, sync_excess_pct=np.float64(12.345))
    assert "| 12.35 |" in render_markdown(changed, []) and "| 12.35 |" not in a
