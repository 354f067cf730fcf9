"""The report's documents: report.md (:func:`render_markdown`, section after section) and
the console summary table (:func:`console_summary`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diloco_gym.eval.summary import holm_family, scoring_summary
from diloco_gym.text import fmt as _fmt
from diloco_gym.text import fmt_p as _fmt_p
from diloco_gym.text import md_text

__all__ = [
    "render_markdown",
    "console_summary",
    "sealing_mode",
    "sandbox_record",
    "sandbox_sentence",
    "PAPER",
]

#: The paper's / reference's sync-excess % per regime and policy (docs/paper.md).
PAPER: dict[str, dict[str, float]] = {
    "sync-heavy": {
        "fixed-256": 19.2,
        "fixed-512": 11.0,
        "pressure-gate": 13.7,
        "wa-diloco": 6.46,
        "matched random (WA budget)": 6.38,
    },
    "bursty": {
        "fixed-256": 19.0,
        "fixed-512": 10.9,
        "pressure-gate": 12.7,
        "wa-diloco": 6.92,
        "matched random (WA budget)": 6.26,
        "offline-oracle": 4.45,
        "online-forecast": 5.09,
        "matched random (online budget)": 6.54,
    },
}


def sealing_mode(in_process: bool) -> str:
    """How deployable agents ran (report.json ``agent_sealing``, the report's header)."""
    from diloco_gym.eval.sealed import IN_PROCESS, SEALED

    return IN_PROCESS if in_process else SEALED


def sandbox_record(in_process: bool) -> dict[str, Any]:
    """The sealing level deployable agents ran at (report.json ``agent_sandbox``):
    ``{"level", "mechanisms", "missing", "platform"}``; level ``none`` in-process."""
    if in_process:
        return {"level": "none", "mechanisms": [], "missing": [], "platform": ""}
    from diloco_gym.eval.sealed import sandbox_status

    return sandbox_status()


def sandbox_sentence(record: dict[str, Any] | None) -> str:
    """One sentence on the sandbox level for a report's header ('' when unknown)."""
    if not record or record.get("level") in (None, "none"):
        return ""
    level, mech = record["level"], ", ".join(record.get("mechanisms", [])) or "none"
    missing = ", ".join(record.get("missing", []))
    text = f" Sandbox level: **{level}** (kernel mechanisms: {mech})"
    return text + (f"; not enforced here: {missing}." if missing else ".")


def _regime_scoring(result: dict[str, Any], regime: str) -> str:
    """One sentence on how a regime's rows were scored."""
    rows = result["rows"]
    sc = scoring_summary(rows[rows["regime"] == regime])
    n = sc["agent_episodes"]
    open_ = sc["oracle_upper_bound"] - sc.get("oracle_bound_met", 0)
    oracle = (
        "exact optimum in every episode"
        if open_ == 0
        else f"upper bound in {open_} of {n} agent-episodes"
    )
    return (
        f"Scoring: exact replay, proven equal to additive in {sc['proven_additive']} of "
        f"{n} agent-episodes; largest additive-exact gap "
        f"{sc['largest_additive_exact_gap_pp']:.3g} pp; oracle: {oracle}."
    )


#: Console summary columns: (summary column, heading, formatter).
_CONSOLE_COLUMNS: list[tuple[str, str, Any]] = [
    ("regime", "regime", str),
    ("agent", "agent", str),
    ("merges_per_hour", "merges/h", lambda x: _fmt(x, 1)),
    ("sync_excess_pct", "sync-excess %", lambda x: _fmt(x, 3)),
    ("matched_random_pct", "matched random %", lambda x: _fmt(x, 3)),
    ("oracle_same_budget_pct", "oracle @ budget %", lambda x: _fmt(x, 3)),
    ("n_nonzero", "n (non-zero)", str),
    ("p_value", "p", _fmt_p),
    ("p_holm", "p (Holm)", _fmt_p),
    ("verdict", "verdict", str),
]


def _holm_note(result: dict[str, Any]) -> str:
    """What the Holm family leaves out, for report.md's reading guide."""
    if result["config"].get("holm_across_settings"):
        return ""
    n_regimes = result["summary"]["regime"].nunique() if len(result["summary"]) else 0
    if n_regimes < 2:
        return ", not several reports or settings"
    return (
        f"; this report compares {n_regimes} regimes: report.json's "
        "p_holm_all_settings corrects across all of them, and --holm-across-settings makes "
        "the verdicts use it"
    )


def console_summary(summary: pd.DataFrame) -> str:
    """The summary table the ``report`` command prints: merge rate in merges/h and p-values
    as in report.md (``<0.001`` below 0.001); non-deployable agents are marked."""
    summary = summary.copy()
    if "deployable" in summary:
        summary["agent"] = [
            a if dep else f"{a} (non-deployable)"
            for a, dep in zip(summary["agent"], summary["deployable"], strict=True)
        ]
    summary["n_nonzero"] = (
        [
            f"{int(n)} ({int(k)})"
            for n, k in zip(summary["units"], summary["nonzero_units"], strict=True)
        ]
        if "nonzero_units" in summary
        else summary.get("units", "")
    )
    table = pd.DataFrame(
        {head: [fmt(v) for v in summary[col]] for col, head, fmt in _CONSOLE_COLUMNS}
    )
    return table.to_string(index=False)


def render_markdown(result: dict[str, Any], figures: list[str], command: str = "") -> str:
    """The human-readable report: the header, the reading guide, the effect-size transfer,
    one section per regime, the timelines and the notes."""
    lines = ["# diloco-gym calibration report", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += _header(result)
    lines += _reading_guide(result)
    lines += _transfer_section(result)
    for regime, g in result["summary"].groupby("regime", sort=False):
        lines += _regime_section(result, str(regime), g, figures)
    timelines = [f for f in figures if f.startswith("timeline_")]
    if timelines:
        lines += ["", "## One episode", ""] + [f"![timeline]({f})" for f in timelines]
    lines += _notes(result)
    return "\n".join(lines)


def _header(result: dict[str, Any]) -> list[str]:
    """The units, draws, gate and run time; how deployable agents ran; and the warning that
    overlapping windows are not independent."""
    cfg = result["config"]
    lines = [
        _units_sentence(result) + f" {cfg['draws']} matched-random draws per episode, "
        f"gate at p < {cfg['alpha']}. Ran in {result['elapsed_s']:.1f} s.",
        "",
        f"Deployable agents: {result.get('agent_sealing', sealing_mode(False))}."
        + (
            " **They ran in the evaluating process, where an agent's code can reach the "
            "env, the episode's trace, its merge costs and its seed: nothing enforces "
            "that they used observations only.**"
            if cfg.get("in_process_agents")
            else " Each ran in a worker process that held no env, trace, episode or "
            "seed and received only observations, action masks and the public "
            "parameters; the oracle ran in the evaluating process."
        )
        + sandbox_sentence(result.get("agent_sandbox")),
        "",
    ]
    if cfg.get("trace") and not bool(result["summary"]["independent"].all()):
        lines += [
            "**Overlapping windows: not independent.** The stride is shorter than the "
            "window, so neighbouring episodes share requests. Every number, p-value and "
            "verdict in the tables below comes from the disjoint windows only (picked "
            "greedily from the first: each starts at or after the previous one's end); "
            "the other windows appear only in the rows marked 'descriptive', which carry "
            "no p-value and no verdict.",
            "",
        ]
    return lines


def _reading_guide(result: dict[str, Any]) -> list[str]:
    """What the tables' columns mean."""
    return [
        "Sync-excess = SLO violation % of the replay with the agent's merges minus the "
        "same replay without merges (percentage points of requests). Matched random = "
        "schedules drawn uniformly among all feasible schedules with the agent's own "
        "number of merges in each episode. Diff = agent minus matched random (paired "
        "over episodes; exact sign-flip test; 95 % bootstrap CI; the verdict uses p "
        f"Holm-adjusted across {holm_family(result['config'])}"
        f"{_holm_note(result)}). n (non-zero) = "
        "independent units in the test (those whose difference is not exactly zero; "
        "only they can carry evidence). Gap captured = "
        "(matched random - agent) / (matched random - oracle at the same budget).",
        "",
    ]


def _transfer_section(result: dict[str, Any]) -> list[str]:
    """The effect-size transfer: each regime's real measurements beside the simulated ones,
    its load and the transfer verdict."""
    lines = [
        "## Effect-size transfer",
        "",
        f"Real-sidecar measurements: {result['calibration_source']}",
        "",
    ]
    if not result.get("calibration_complete", True):
        lines += [
            "**Warning: the calibration file is marked incomplete (an interrupted live "
            "run); its numbers rest on partial measurements.**",
            "",
        ]
    lines += [
        "The verdict is the sidecar's: its simulated effect sizes on the regime it was "
        "measured on, at the utilization it was measured at ('calibrated at U': a live "
        "file's recorded load, otherwise the regime's own load relative to the sidecar's "
        "capacity), against the real measurements. Capacity = slots / mean nominal "
        "service time of the "
        "replayed token mix (req/s); utilization = mean offered work / capacity, as "
        "replayed; over SLO when idle = requests whose nominal service time alone "
        "exceeds the SLO.",
        "",
        "| regime | measured on | simulated sidecar | real p95 high/low | sim | "
        "real p95 sync ratio | sim | calibrated at U | capacity req/s | utilization | "
        "rate scale | over SLO when idle % | verdict |",
        "|" + "---|" * 13,
    ]
    for _, r in result["calibration"].iterrows():
        lines.append(
            f"| {md_text(r['regime'])} | {r['measured_on']} | {r['sidecar']} | "
            f"{_fmt(r['real_p95_high_low'], 3)} | "
            f"{_fmt(r['sim_p95_high_low'], 3)} | {_fmt(r['real_p95_sync_ratio'], 3)} | "
            f"{_fmt(r['sim_p95_sync_ratio'], 3)} | "
            f"{_fmt(r.get('calibration_utilization'), 3)} | "
            f"{_fmt(r.get('capacity_rps'), 1)} | "
            f"{_fmt(r.get('utilization'), 3)} | {_fmt(r.get('rate_scale'), 3)} | "
            f"{_fmt(r.get('idle_violation_pct'), 1)} | {r['verdict']} |"
        )
    trace_rows = [
        r
        for _, r in result["calibration"].iterrows()
        if np.isfinite(r.get("trace_sim_p95_sync_ratio", np.nan))
    ]
    for r in trace_rows:
        lines += [
            "",
            f"For information only (not the verdict): on {md_text(r['regime'])}'s own windows "
            f"a fixed-256 schedule gives p95 high/low {_fmt(r['trace_sim_p95_high_low'], 3)}"
            f" and p95 sync ratio {_fmt(r['trace_sim_p95_sync_ratio'], 3)}; the trace's "
            f"token mix and load, not the sidecar, set these.",
        ]
    return lines


def _regime_section(
    result: dict[str, Any], regime: str, g: pd.DataFrame, figures: list[str]
) -> list[str]:
    """One regime: its load and scoring, why its verdicts are what they are, the agents'
    table (and the descriptive one of overlapping windows), the model-quality price, the
    figure and the paper's numbers."""
    cfg = result["config"]
    lines = [
        "",
        f"## {md_text(regime)}",
        "",
        f"No-sync violation rate: {g['no_sync_violation_pct'].mean():.2f} %. "
        f"Calibration: {g['calibration'].iloc[0]}. {_regime_scoring(result, regime)}",
        "",
    ]
    lines += verdict_notes(g, cfg, result.get("loads", {}).get(regime, {}))
    lines += _agent_table(g)
    if not bool(g["independent"].all()):
        lines += _descriptive_table(g)
    if "quality_cost" in g:
        lines += _quality_table(g)
    if "quality_vs_random" in g:
        from diloco_gym.eval.quality_vs_random import report_quality_lines

        lines += report_quality_lines(g)
    fig = f"fig_{regime.replace(':', '_')}.png"
    if fig in figures:
        lines += ["", f"![{md_text(regime)}]({fig})"]
    if regime in PAPER:
        lines += [
            "",
            "Paper / reference (docs/paper.md), sync-excess %: "
            + ", ".join(f"{k} {v}" for k, v in PAPER[regime].items())
            + ".",
        ]
    return lines


def _agent_table(g: pd.DataFrame) -> list[str]:
    """A regime's agents, by sync-excess: their numbers against matched random and the
    oracle, the test and the verdict."""
    lines = [
        "| agent | merges/h | sync-excess % | matched random % [5-95 %] | oracle @ same "
        "budget % | diff pp [95 % CI] | n (non-zero) | p | p (Holm) | req / 10 min | "
        "gap captured | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in g.sort_values("sync_excess_pct").iterrows():
        lines.append(
            f"| {md_text(r['agent'])}{'' if r.get('deployable', True) else ' (non-deployable)'} | "
            f"{r['merges_per_hour']:.1f} | {r['sync_excess_pct']:.2f} | "
            f"{r['matched_random_pct']:.2f} [{r['matched_random_p05']:.2f}-"
            f"{r['matched_random_p95']:.2f}] | {r['oracle_same_budget_pct']:.2f} | "
            f"{r['diff_pp']:+.2f} [{r['diff_ci_low']:+.2f}, {r['diff_ci_high']:+.2f}] | "
            f"{int(r['units'])} ({int(r['nonzero_units'])}) | "
            f"{_fmt_p(r['p_value'])} | {_fmt_p(r['p_holm'])} | "
            f"{r['diff_requests_per_10min']:+.1f} | "
            f"{_fmt(r['gap_captured'])} | {r['verdict']} |"
        )
    return lines


def _descriptive_table(g: pd.DataFrame) -> list[str]:
    """The mean difference over all overlapping windows, with no test and no verdict."""
    lines = [
        "",
        "Descriptive only (all overlapping windows, not independent: no p-value, no verdict):",
        "",
        "| agent | windows | mean diff pp |",
        "|---|---|---|",
    ]
    lines += [
        f"| {md_text(r['agent'])} (descriptive) | {int(r['units_all'])} | "
        f"{r['diff_pp_all_units']:+.2f} |"
        for _, r in g.sort_values("sync_excess_pct").iterrows()
    ]
    return lines


def _notes(result: dict[str, Any]) -> list[str]:
    """How the rows were scored, what the oracle is, and what each verdict means."""
    cfg = result["config"]
    sc = result.get("scoring") or scoring_summary(result["rows"])
    max_gap, n_rows = sc["largest_additive_exact_gap_pp"], sc["agent_episodes"]
    head = _notes_head(sc["proven_additive"], n_rows, max_gap)
    return [*head, _oracle_note(sc), *_notes_tail(cfg)]


def _oracle_note(sc: dict[str, Any]) -> str:
    """The oracle's note: where it is exact, and for the local-search oracles what their
    certified lower bounds prove (from the report's own rows)."""
    n_rows, n_bound = sc["agent_episodes"], sc["oracle_upper_bound"]
    met = sc.get("oracle_bound_met", 0)
    head = (
        "- Oracle @ same budget: the best exact schedule known. It is the exact optimum "
        "where every merge of the episode drains within H_min (then every schedule's "
        "exact sync-excess equals its additive one and the additive optimum, found by "
        "dynamic programming, is exact) or where every feasible schedule could be "
        "scored; otherwise it is the best schedule an exact local search (single-merge "
        "moves and suffix shifts, each scored by the exact replay) reaches from the "
        f"additive optimum ({n_bound} of {n_rows} agent-episodes), an upper bound on the "
        "exact optimum. For those a certified lower bound on the exact optimum is computed "
        "(oracle_lower_bound_pct in results.csv)"
    )
    if n_bound == 0:
        body = " where needed; no episode needed it here."
    elif met == n_bound:
        body = (
            f": it meets the local search's value in all {n_bound}, so every oracle here is "
            "optimal."
        )
    else:
        body = (
            f": it meets the local search's value in {met} of {n_bound} (those oracles are "
            f"optimal); in the other {n_bound - met} the exact optimum lies between the bound "
            f"and the oracle, at most {sc['oracle_certified_gap_pp_max']:.3g} pp apart."
        )
    return head + body + " Gap captured uses it."


def _notes_head(n_proven: int, n_rows: int, max_gap: float) -> list[str]:
    return [
        "",
        "## Notes",
        "",
        "- Scoring: the agent, every matched-random draw and the oracle's schedule are "
        "scored by the same exact replay of the queue (a merge's backlog is followed "
        "until it drains, and merges that start before the previous one's backlog has "
        "drained are replayed together). In "
        f"{n_proven} of {n_rows} agent-episodes every scored schedule was proven "
        "equal to the sum of its merges' isolated costs (each merge drains before the "
        "next one starts; 'additive (proven equal)' in results.csv); in the others "
        "('exact') some merge interacts with the previous one or its backlog outlives "
        "its isolated cost window, and those windows were replayed. Largest "
        "additive-exact gap over "
        f"all scored schedules: {max_gap:.3g} pp.",
    ]


def _notes_tail(cfg: dict[str, Any]) -> list[str]:
    return [
        "- 'no claim' rows: the regime's real sidecar showed no measurable merge effect "
        "(or the simulator is uncalibrated), so no SLO claim is made whatever the "
        "numbers say.",
        f"- 'no claim (saturated)': more than {cfg.get('saturation_pct', 50):g} % of "
        "requests violate their SLO with no merge at all; the median request already "
        "fails, the sidecar is overloaded, and sync-excess cannot tell whether a "
        "schedule protects a working service.",
        "- 'inconclusive (too few episodes)': with k independent paired units whose "
        "difference is not exactly zero (a zero difference carries no evidence) an exact "
        "two-sided sign-flip test cannot give p below 2/2^k (times the number of agents "
        "after the Holm correction), so a tie cannot be told from a gain; the section "
        "says how many non-zero units would be needed.",
        "",
    ]


def _quality_table(g: pd.DataFrame) -> list[str]:
    """The two-sided trade-off of a regime's agents: SLO damage (sync-excess) next to the
    model-quality price from the learner calibration."""
    lines = [
        "",
        "Model quality (learner calibration): predicted validation loss (nats/byte) after "
        "the episode's merges, and the quality cost, its excess over fixed H with the same "
        "number of merges over the same span.",
        "",
        "| agent | merges/h | sync-excess % | predicted loss | quality cost |",
        "|---|---|---|---|---|",
    ]
    for _, r in g.sort_values("sync_excess_pct").iterrows():
        lines.append(
            f"| {md_text(r['agent'])} | {r['merges_per_hour']:.1f} | {r['sync_excess_pct']:.2f} | "
            f"{r['pred_loss']:.4f} | {r['quality_cost']:+.2e} |"
        )
    return lines


def _units_sentence(result: dict[str, Any]) -> str:
    """What the statistical units of the report are."""
    cfg = result["config"]
    if not cfg.get("trace"):
        last_seed = cfg["seed0"] + cfg["seeds"] - 1
        return (
            f"{cfg['seeds']} episodes per regime (independent units: seeds "
            f"{cfg['seed0']}..{last_seed})."
        )
    load: dict[str, Any] = next(iter(result.get("loads", {}).values()), {})
    if not load:
        return "Trace windows as episodes."
    kind = (
        "disjoint windows, independent units"
        if load["independent"]
        else "overlapping windows: not independent"
    )
    plural = "" if load["windows"] == 1 else "s"
    return (
        f"{load['windows']} window{plural} of {load['window_s']:g} s every "
        f"{load['stride_s']:g} s ({kind}) of the {load['trace_duration_s']:.0f} s trace "
        f"replayed {_speed(load['rate_scale'])} ({load['replayed_duration_s']:.0f} s, "
        f"{load['mean_rate_rps']:.2f} req/s, utilization {load['utilization']:.2f}); one "
        f"episode per window, window i seeded {cfg['seed0']} + i for the added pressure "
        f"series."
    )


def _speed(scale: float) -> str:
    """``at its own rate``, ``2x faster``, ``0.5x as fast``."""
    if scale == 1:
        return "at its own rate"
    return f"{scale:.3g}x faster" if scale > 1 else f"at {scale:.3g}x its rate"


#: What a saturated single-host replay can change.
LOWER_LOAD = (
    "Lower the load (--rate-scale, --target-utilization) or use a sidecar with more capacity."
)


def verdict_notes(
    g: pd.DataFrame, cfg: dict, load: dict, lower_load: str = LOWER_LOAD
) -> list[str]:
    """Why a setting's verdicts are what they are, when that is not the test alone (the
    rows of one regime, or of a fleet, in the summary): saturation, with ``lower_load`` as
    the advice where an idle sidecar does not explain it; each inconclusive agent's units,
    the best p they could give and the units needed; overlapping windows."""
    out = []
    r = g.iloc[0]
    if bool(r["saturated"]):
        idle = load.get("idle_violation_pct", np.nan)
        text = (
            f"**No claim (saturated)**: {g['no_sync_violation_pct'].mean():.1f} % of "
            f"requests violate their SLO with no merge (threshold "
            f"{cfg.get('saturation_pct', 50):g} %). "
        )
        if np.isfinite(idle) and idle > cfg.get("saturation_pct", 50) / 2:
            text += (
                f"{idle:.1f} % of the requests exceed the SLO even on an idle sidecar "
                f"(their nominal service time alone): no load makes this replay "
                f"meaningful; it needs a sidecar (or SLO) that fits these requests."
            )
        else:
            text += lower_load
        out.append(text)
    for _, r in g[g["verdict"] == "inconclusive (too few episodes)"].iterrows():
        n, k = int(r["units"]), int(r["nonzero_units"])
        out.append(
            f"**{md_text(r['agent'])}: inconclusive (too few episodes)**: {n} independent "
            f"{r['unit']}{'' if n == 1 else 's'}, {k} with a non-zero difference; the "
            f"best p an exact test on them can give, Holm-adjusted over "
            f"{int(r['holm_family'])} agents, is {_fmt_p(r['best_p_holm'])}, not below "
            f"{cfg['alpha']}. At least {int(r['units_needed'])} independent "
            f"{r['unit']}s with a non-zero difference are needed"
            + (" (a longer trace, or shorter windows)." if r["unit"] == "window" else " (--seeds).")
        )
    if not bool(g["independent"].all()):
        out.append(
            f"Windows overlap (stride shorter than the window): **not independent**; the "
            f"test uses the {int(r['independent_units'])} disjoint windows among the "
            f"{int(r['units_all'])}, and the other windows are descriptive only."
        )
    return out + ([""] if out else [])
