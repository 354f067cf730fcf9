"""The measurements of docs/fleet.md: the fleet protocol (diloco_gym.eval.fleet) on the
fleets of its four questions; writes the tables (Markdown, JSON) and the figures.

    python docs/examples/fleet_study.py --out docs [--seeds 20] [--draws 200] [--only q1 q2]

``--model-version 1`` runs the questions' fleets on the fleet model v1 (docs/fleet.md,
"What v1 changes"); give it another ``--out`` so the v0 results stay.
``--in-process-agents`` runs the deployable agents in this process instead of sealed in a
worker process (for a machine where the sealed worker cannot start; the numbers are the same).

Question 4 needs the public traces (Azure LLM inference 2023 code/conv, Mooncake) in
``$DILOCO_GYM_REAL_TRACES``; it is skipped when they are absent.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.report import run_protocol

HERE = Path(__file__).resolve().parent
FREE_AGENTS = ["pressure-gate", "calibrated-wa", "online-forecast", "fixed-256"]
BUDGET_AGENTS = ["online-forecast-budget", "fixed-budget"]
#: full-model syncs per 600 s window in the equal-bytes and the quantisation studies
FULL_SYNCS = 16
#: the fleet model of the questions' fleets (``--model-version``; 0: the documented runs)
MODEL_VERSION = 0
#: run the deployable agents in this process (``--in-process-agents``); default: sealed
IN_PROCESS = False


def _toml(path: Path, n_sites: int, fleet: dict, env: dict | None = None) -> Path:
    lines = ["[fleet]"]
    if MODEL_VERSION:
        fleet = {**fleet, "model_version": MODEL_VERSION}
    for k, v in fleet.items():
        lines.append(f"{k} = {json.dumps(v)}")
    if env:
        lines.append("[env]")
        for k, v in env.items():
            lines.append(f"{k} = {json.dumps(v)}")
    for i in range(n_sites):
        lines += ["[[site]]", f'name = "site{i}"', 'regime = "bursty"']
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(fleet_file: Path, agents: list[str], seeds: int, draws: int) -> dict:
    res = run_protocol(
        FleetReportConfig(
            fleet=str(fleet_file),
            agents=agents,
            seeds=seeds,
            draws=draws,
            in_process_agents=IN_PROCESS,
        )
    )
    s = res["summary"]
    dep = s[s["deployable"]]
    best = dep.loc[dep["diff_pp"].idxmin()]
    res["fleet"]["file"] = fleet_file.name  # no machine-specific path in the results
    return {
        "fleet": res["fleet"],
        "calibration_verdict": res["calibration_verdict"],
        "independent_units": res["independent_units"],
        "agents": s.to_dict(orient="records"),
        "best_agent": str(best["agent"]),
        "best_sync_excess_pct": float(best["sync_excess_pct"]),
        "best_matched_random_pct": float(best["matched_random_mean"]),
        "best_oracle_pct": float(best["oracle_same_budget_pct"]),
        "placement_value_pp": float(-best["diff_pp"]),
        "oracle_gap_pp": float(best["sync_excess_pct"] - best["oracle_same_budget_pct"]),
        "best_verdict": str(best["verdict"]),
        "best_p_holm": float(best["p_holm"]),
        "progress": {r["agent"]: r["progress"] for r in s.to_dict(orient="records")},
    }


def q1(tmp: Path, seeds: int, draws: int) -> dict:
    out = {}
    for n in (1, 2, 4, 8):
        f = _toml(tmp / f"q1_n{n}.toml", n, {"fragments": 1, "bits": 32})
        out[str(n)] = _run(f, FREE_AGENTS, seeds, draws)
        print("q1", n, out[str(n)]["best_agent"], out[str(n)]["placement_value_pp"], flush=True)
    return out


def q2(tmp: Path, seeds: int, draws: int) -> dict:
    out = {}
    for frag in (1, 2, 4, 8):
        f = _toml(
            tmp / f"q2_f{frag}.toml",
            4,
            {"fragments": frag, "bits": 32},
            {"merge_budget": FULL_SYNCS * frag},
        )
        out[str(frag)] = _run(f, BUDGET_AGENTS, seeds, draws)
        print("q2", frag, out[str(frag)]["best_sync_excess_pct"], flush=True)
    return out


def q2s(tmp: Path, seeds: int, draws: int) -> dict:
    """Question 2 with streamed fragments: each fragment spread over the whole minimum gap
    between fragment syncs (``overlap_steps = H_min / F`` inner steps)."""
    out = {}
    for frag in (1, 2, 4, 8):
        f = _toml(
            tmp / f"q2s_f{frag}.toml",
            4,
            {"fragments": frag, "bits": 32, "mode": "streamed", "overlap_steps": 128 // frag},
            {"merge_budget": FULL_SYNCS * frag},
        )
        out[str(frag)] = _run(f, BUDGET_AGENTS, seeds, draws)
        print("q2s", frag, out[str(frag)]["best_sync_excess_pct"], flush=True)
    return out


def q3(tmp: Path, seeds: int, draws: int) -> dict:
    out = {}
    for bits in (32, 16, 8, 4):
        f = _toml(
            tmp / f"q3_b{bits}.toml",
            4,
            {"fragments": 1, "bits": bits},
            {"merge_budget": FULL_SYNCS, "progress_weight": 0.0},
        )
        out[str(bits)] = _run(f, BUDGET_AGENTS, seeds, draws)
        print("q3", bits, out[str(bits)]["best_sync_excess_pct"], flush=True)
    return out


def q5(seeds: int, draws: int, seed0: int = 0) -> dict:
    """The shipped fleet agent (agents/reference/fleet-budget, or fleet-budget-v1 on model
    v1) against the budget-aware heuristics on the example fleet, held-out seeds from
    ``seed0``, at each of its training budgets."""
    v1 = MODEL_VERSION == 1
    model = HERE.parents[1] / "agents" / "reference" / ("fleet-budget-v1" if v1 else "fleet-budget")
    fleet = HERE / ("fleet-v1.toml" if v1 else "fleet.toml")
    out = {}
    for budget in (48, 64, 96):
        res = run_protocol(
            FleetReportConfig(
                fleet=str(fleet),
                agents=[*BUDGET_AGENTS, str(model)],
                seeds=seeds,
                seed0=seed0,
                draws=draws,
                env={"merge_budget": budget},
                in_process_agents=IN_PROCESS,
            )
        )
        out[str(budget)] = {
            "calibration_verdict": res["calibration_verdict"],
            "agents": res["summary"].to_dict(orient="records"),
        }
        print("q5", budget, flush=True)
    return out


def q4(tmp: Path, seeds: int, draws: int) -> dict | None:
    real = os.environ.get("DILOCO_GYM_REAL_TRACES")
    if not real or not Path(real).is_dir():
        print("q4 skipped: set DILOCO_GYM_REAL_TRACES to the directory of the public traces")
        return None
    fleet_file = HERE / "fleet-real.toml"
    if MODEL_VERSION:  # the shipped file with model_version set in its [fleet] table
        text = fleet_file.read_text().replace(
            "[fleet]\n", f"[fleet]\nmodel_version = {MODEL_VERSION}\n", 1
        )
        fleet_file = tmp / fleet_file.name
        fleet_file.write_text(text)
    return {"real": _run(fleet_file, FREE_AGENTS, seeds, draws)}


def _figure(results: dict, key: str, xlabel: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(results)
    x = np.arange(len(xs))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(x, [results[k]["best_matched_random_pct"] for k in xs], "o--", label="matched random")
    ax.plot(x, [results[k]["best_sync_excess_pct"] for k in xs], "s-", label="best deployable")
    ax.plot(x, [results[k]["best_oracle_pct"] for k in xs], "^:", label="oracle (same syncs)")
    ax.set_xticks(x, xs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fleet sync-excess (pp)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--only", nargs="+", default=["q1", "q2", "q2s", "q3", "q4"])
    ap.add_argument("--model-version", type=int, choices=(0, 1), default=0)
    ap.add_argument("--in-process-agents", action="store_true")
    ap.add_argument("--seed0", type=int, default=0, help="first episode seed (q5 only)")
    a = ap.parse_args()
    global MODEL_VERSION, IN_PROCESS
    MODEL_VERSION = a.model_version
    IN_PROCESS = a.in_process_agents
    out = Path(a.out)
    path = out / "fleet_results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if "q1" in a.only:
            results["q1"] = q1(tmp, a.seeds, a.draws)
            _figure(results["q1"], "n", "sites N", out / "fleet_sites.png",
                    "N bursty sites, F=1, 32-bit, free budget")  # fmt: skip
        if "q2" in a.only:
            results["q2"] = q2(tmp, a.seeds, a.draws)
            _figure(results["q2"], "f", "fragments F", out / "fleet_fragments.png",
                    f"4 sites, 32-bit, {FULL_SYNCS} full-model syncs / 600 s")  # fmt: skip
        if "q2s" in a.only:
            results["q2s"] = q2s(tmp, a.seeds, a.draws)
            _figure(
                results["q2s"],
                "f",
                "fragments F (streamed)",
                out / "fleet_fragments_streamed.png",
                f"4 sites, 32-bit, streamed over H_min/F, {FULL_SYNCS} full syncs / 600 s",
            )
        if "q3" in a.only:
            results["q3"] = q3(tmp, a.seeds, a.draws)
            _figure(results["q3"], "bits", "payload bits", out / "fleet_bits.png",
                    f"4 sites, F=1, {FULL_SYNCS} syncs / 600 s")  # fmt: skip
        if "q5" in a.only:
            results["q5"] = q5(a.seeds, a.draws, a.seed0)
        if "q4" in a.only:
            r4 = q4(tmp, min(a.seeds, 6), a.draws)
            if r4 is not None:
                results["q4"] = r4
    results["settings"] = {"seeds": a.seeds, "draws": a.draws, "full_syncs": FULL_SYNCS}
    if a.model_version:
        results["settings"]["model_version"] = a.model_version
    if a.in_process_agents:
        results["settings"]["in_process_agents"] = True
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
