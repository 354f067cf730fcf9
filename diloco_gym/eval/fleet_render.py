"""A fleet report's and frontier's documents: report.md and report.json
(:func:`write_fleet_report`), the one writer of a fleet's output directories
(:func:`write_fleet_dir`), the summary table (:func:`fleet_summary_table`) and the oracle's
labels, from a fleet report's result (:func:`~diloco_gym.eval.report.run_protocol` of a
:class:`~diloco_gym.eval.fleet.FleetReportConfig`). The fleet's cells are in
:mod:`diloco_gym.eval.fleet`, which re-exports these names (as the single host's report
keeps its documents in :mod:`~diloco_gym.eval.report_render`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval import fleet_cap, fleet_rounds
from diloco_gym.eval.report_figures import figure_name, write_figures
from diloco_gym.eval.report_render import sandbox_sentence, verdict_notes
from diloco_gym.text import md_text

__all__ = [
    "SYNC_NAMES",
    "FLEET_LOWER_LOAD",
    "oracle_label",
    "oracle_note",
    "fleet_summary_table",
    "write_fleet_dir",
    "FleetFiles",
    "links_sentence",
    "write_fleet_report",
    "fleet_figure_summary",
]

#: The single-host summary's columns a fleet summary names after its syncs, and its names.
SYNC_NAMES = {
    "merges": "syncs",
    "merges_per_hour": "syncs_per_hour",
    "excess_per_merge_pp": "excess_per_sync_pp",
    "matched_random_pct": "matched_random_mean",
    "diff_ci_low": "ci_low",
    "diff_ci_high": "ci_high",
}
#: What a saturated fleet can change (report.md's verdict notes).
FLEET_LOWER_LOAD = (
    "Lower the sites' load in the fleet file (target_rate_rps or target_utilization of a "
    "trace site, a lighter regime) or give them sidecars with more capacity."
)


def oracle_label(worst_site_weight: float, capped: bool = False, rounds: bool = False) -> str:
    """The oracle column's heading: ``oracle pp``, or with a worst-site weight ``lambda >
    0`` ``oracle (sum + lambda x worst site) pp``: the oracle then minimises the sum plus
    ``lambda`` times the worst site's cost, and a schedule of as many syncs may have a
    lower total. ``capped`` (a per-site cap): ``uncapped`` is added, the oracle ignores the
    cap. ``rounds`` (per-site timing): ``oracle (upper bound) pp`` whatever the weight,
    the additive optimum of the summed cost replayed exactly, bracketed below by its
    certified lower bound in results.csv (``upper bound, uncapped`` with a cap)."""
    if rounds:
        return "oracle (upper bound, uncapped) pp" if capped else "oracle (upper bound) pp"
    if worst_site_weight == 0:
        return "oracle (uncapped) pp" if capped else "oracle pp"
    label = f"oracle (sum + {worst_site_weight:g} x worst site"
    return label + (", uncapped) pp" if capped else ") pp")


def oracle_note(worst_site_weight: float, rounds: bool = False) -> str:
    """The sentence that says what the oracle minimises ('' without a worst-site weight;
    ``rounds``: per-site timing, whose oracle minimises the total it reports)."""
    if worst_site_weight == 0:
        return ""
    if rounds:
        return (
            f"With worst_site_weight = {worst_site_weight:g}, each round's cost in the "
            f"agents' reward adds {worst_site_weight:g} times its worst contributing site's "
            f"(normalised to a site of mean rate); the oracle, an upper bound, minimises the "
            f"summed cost, the total it reports."
        )
    return (
        f"With worst_site_weight = {worst_site_weight:g}, the oracle minimises the summed "
        f"isolated cost plus {worst_site_weight:g} times the worst site's (normalised to a "
        f"site of mean rate), not the total it reports: it is a bound for that objective, "
        f"and a schedule with as many syncs may have a lower total sync-excess."
    )


def fleet_summary_table(summary, worst_site_weight: float = 0.0, capped: bool = False) -> str:
    """The per-agent summary as a Markdown table (the oracle column labelled by
    :func:`oracle_label`; a rounds fleet's summary, :func:`fleet_rounds.is_rounds`, has
    the rounds' upper-bound oracle)."""
    oracle = oracle_label(worst_site_weight, capped, fleet_rounds.is_rounds(summary))
    cols = [
        ("agent", "agent", "{}"),
        ("syncs_per_hour", "syncs/h", "{:.1f}"),
        ("sync_excess_pct", "sync-excess pp", "{:.3f}"),
        ("matched_random_mean", "matched random pp", "{:.3f}"),
        ("oracle_same_budget_pct", oracle, "{:.3f}"),
        ("diff_pp", "agent - random pp", "{:+.3f}"),
        ("units", "n (non-zero)", "{}"),
        ("p_holm", "p (Holm)", "{:.4f}"),
        ("gap_captured", "gap captured", "{:.2f}"),
        ("worst_site_sync_excess_pct", "worst site pp", "{:.3f}"),
        ("verdict", "verdict", "{}"),
    ]
    lines = [
        "| " + " | ".join(c[1] for c in cols) + " |",
        "|" + "|".join("---" for _ in cols) + "|",
    ]
    for _, r in summary.iterrows():
        cells = []
        for key, _, fmt in cols:
            v = r[key]
            if key == "agent" and not r["deployable"]:  # as the single-host report marks it
                cells.append(md_text(f"{v} (non-deployable)"))
            elif key == "units":  # independent units, those with a non-zero difference
                cells.append(f"{int(v)} ({int(r['nonzero_units'])})")
            elif isinstance(v, float) and not np.isfinite(v):
                cells.append("n/a")
            else:
                cells.append(md_text(fmt.format(v)))  # a name: no newline, no cell split
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_fleet_dir(
    result: dict[str, Any],
    out: str | Path,
    force: bool,
    command: str,
    files: FleetFiles,
) -> Path:
    """The one writer of the fleet's output directories (the report's and the frontier's):
    ``files.table`` as ``files.csv``; ``files.json`` with the command, the fleet, the
    configuration, the calibration verdict and ``files.extra``; ``files.md`` (a title, the
    command, ``files.body``); and whatever ``files.more(tmp)`` adds (a figure). Atomic,
    with the report's :func:`~diloco_gym.eval.output_dir.write_output_dir` rules (``force``,
    marker, lock)."""
    from diloco_gym.eval.output_dir import write_output_dir

    def fill(tmp: Path) -> None:
        files.table.to_csv(tmp / files.csv, index=False)
        payload = {
            "command": command,
            "fleet": result["fleet"],
            "config": result["config"],
            "calibration_verdict": result["calibration_verdict"],
            **files.extra,
        }
        (tmp / files.json).write_text(json.dumps(payload, indent=2, default=str))
        if files.more is not None:
            files.more(tmp)
        md = [f"# {files.title}", "", f"Command: `{command}`" if command else "", "", *files.body]
        (tmp / files.md).write_text("\n".join(md) + "\n")

    return write_output_dir(out, force, fill)


@dataclass
class FleetFiles:
    """What :func:`write_fleet_dir` writes: file names, the table, the JSON's further keys,
    the Markdown's title and body lines, and an optional extra writer (``more(tmp)``)."""

    csv: str
    table: Any
    json: str
    extra: dict[str, Any]
    md: str
    title: str
    body: list[str]
    more: Callable[[Path], None] | None = None


def links_sentence(record: dict[str, Any]) -> str:
    """report.md's sentence on changing links ('' with fixed links), with a leading space."""
    traces = record.get("link_traces")
    if traces:
        sites = ", ".join(f"{md_text(k)} (`{md_text(v)}`)" for k, v in traces.items())
        tiles = record["link_trace_tiles"]
        return (
            f" Links follow measured traces at site(s) {sites}: the episode of seed k replays "
            f"tile k mod {tiles} of them, so episodes {tiles} seeds apart share their links "
            f"and only the first seed of each tile enters the test, and "
            f"a sync's window runs from {record['sync_window_s']:.2f} s to "
            f"{record['sync_window_slowest_s']:.2f} s with every link at its lowest share."
        )
    if record.get("link_levels") is None:
        return ""
    levels = ", ".join(f"{x:g}" for x in record["link_levels"])
    probs = ", ".join(f"{x:.3g}" for x in record["link_probs"])
    return (
        f" Links change over time: each site's link runs at {levels} of its nominal rate "
        f"(probabilities {probs}; a level holds {record['link_dwell_s']:g} s on average), "
        f"and a sync's window runs from {record['sync_window_s']:.2f} s to "
        f"{record['sync_window_slowest_s']:.2f} s with every link at its lowest level."
    )


def write_fleet_report(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write report.md, results.csv and report.json to ``out`` atomically
    (:func:`write_fleet_dir`, so ``--force`` rules are the report's)."""
    f = result["fleet"]
    cap = f.get("site_cap_pp")
    body = [
        f"Fleet `{md_text(f['file'])}`: sites {', '.join(map(md_text, f['sites']))}; "
        f"F = {f['fragments']} "
        f"fragments, {f['bits']}-bit payloads ({f['payload_bytes'] / 1e6:.0f} MB per "
        f"sync), {f['mode']} mode, sync window {f['sync_window_s']:.2f} s, link share "
        f"{f['link_share']:.3f}, fragment corridor {f['corridor_decisions']} decisions, "
        f"progress factor {f['progress_factor']:.3f}.{links_sentence(f)}",
        "",
        f"Episodes: {result['config']['seeds']} (seeds {result['config']['seed0']}..), "
        f"{result['independent_units']} independent; {result['config']['draws']} "
        f"matched-random draws per episode. Agents: {result['agent_sealing']}."
        f"{sandbox_sentence(result.get('agent_sandbox'))} "
        f"Calibration verdict of the fleet: "
        f"**{result['calibration_verdict']}** (every site must transfer).",
        "",
        "Sync-excess: extra SLO-violating requests summed over sites, in percentage "
        "points of all the fleet's requests, by exact replay (agent, matched random and "
        "oracle alike); worst site: the largest site's own sync-excess (pp of its "
        "requests); n (non-zero): the independent episodes, and those where agent and "
        "matched random differ; gap captured: (matched random - agent) / (matched "
        "random - oracle); verdicts: paired sign-flip test over the independent "
        "episodes, Holm-corrected over the report's agents, as in the single-host report."
        + (" " + oracle_note(f["worst_site_weight"], f.get("timing") == "rounds")).rstrip()
        + (" " + fleet_cap.cap_note(cap, f.get("timing") == "rounds")).rstrip(),
        "",
        fleet_summary_table(result["summary"], f["worst_site_weight"], cap is not None),
        "",
        *verdict_notes(
            result["summary"], {"alpha": result["config"]["alpha"]}, {}, FLEET_LOWER_LOAD
        ),
        "## Sync-excess per site",
        "",
        "Each site's sync-excess in pp of its own requests (exact replay), mean over episodes.",
        "",
        fleet_cap.site_table(result["summary"], f["sites"], cap is not None),
        "",
        *fleet_rounds.rounds_markdown(f, result["rows"], list(result["summary"]["agent"])),
        "## Calibration per site",
        "",
    ]
    for r in result["calibration"].to_dict(orient="records"):
        body.append(f"- {md_text(r['site'])}: {r['verdict']} (measured on {r['measured_on']})")
    figures = fleet_figure_summary(result)
    name = figure_name(figures["regime"].iloc[0]) if len(figures) else None
    if name is not None:  # the single host's figure, the fleet as one setting
        body += ["", f"![{md_text(f['file'])}]({name})"]
    extra = {
        "calibration": result["calibration"].to_dict(orient="records"),
        "independent_units": result["independent_units"],
        "summary": result["summary"].to_dict(orient="records"),
        "elapsed_s": result["elapsed_s"],
        "agent_sealing": result["agent_sealing"],
        "agent_sandbox": result.get("agent_sandbox"),
        "figures": [] if name is None else [name],
    }

    def draw(tmp: Path) -> None:
        write_figures({"summary": figures}, tmp, sync="sync")

    files = FleetFiles(
        "results.csv", result["rows"], "report.json", extra, "report.md", "Fleet report", body,
        more=draw,
    )  # fmt: skip
    return write_fleet_dir(result, out, force, command, files)


def fleet_figure_summary(result: dict[str, Any]) -> Any:
    """A fleet report's summary as the single host's report figures read it: the columns
    under the single host's names, the fleet as one regime named after its file
    (``fleet:<stem>``)."""
    s = result["summary"].rename(columns={v: k for k, v in SYNC_NAMES.items()})
    s["regime"] = f"fleet:{Path(result['fleet']['file']).stem}"
    return s
