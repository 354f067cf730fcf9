"""Claims about a learned agent that hold across training seeds: train a configuration with
several seeds, judge every run on held-out test seeds, aggregate across the runs.

Three steps, each a subcommand of ``python -m diloco_gym.rl.seeds``:

``train``
    Runs one training command per seed into ``OUT/NAME-sSEED``: ``diloco-gym train`` with
    the arguments after ``--`` and ``--seed SEED`` (a fleet run gives ``--fleet FILE`` or a
    config with ``fleet`` there, as any train run). A complete run already there is kept (a
    rerun with the same seed would give the same model), so an interrupted study
    continues.
``evaluate``
    Judges the runs on test seeds with ``diloco-gym frontier``'s machinery
    (:func:`diloco_gym.eval.frontier.run_frontier`; or the fleet report at each fleet budget
    with ``--fleet``), beside the heuristics, with the model each run would ship
    (``--select best``: ``best_model.zip``, the run's best validation checkpoint by its
    ``select_by`` rule, as the shipped budget agents; ``final``: ``model.zip``). Writes the
    per-agent table ``budgets.csv`` and ``agents.json`` (which agent is which run).
``summarize``
    Reads the evaluations and the runs' validation histories and writes ``summary.json``,
    ``summary.md`` and ``learning_curves.png``: per configuration and test block the
    interquartile mean of gap captured across runs and tasks (regime x budget) with a
    stratified-bootstrap 95 % interval, per task the runs' gap captured (IQM, min, max,
    the shipped seed), and the probability of improvement over the best heuristic of that
    task (the heuristic with the highest gap captured on the same test seeds, so the
    choice favours the heuristic); the curves are the validation gap captured (or
    sync-excess) of every run against timesteps with their IQM (:mod:`diloco_gym.rl.aggregate`).

Gap captured is ``(matched random - agent) / (matched random - oracle)`` per task, over the
test seeds, as the frontier computes it (0: random placement, 1: the oracle at that budget).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.rl.aggregate import iqm, probability_of_improvement, stratified_bootstrap_ci
from diloco_gym.rl.learner_config import learner_calibration_path

__all__ = [
    "run_dir",
    "train_seeds",
    "select_model",
    "evaluate_runs",
    "evaluate_fleet_runs",
    "fleet_budgets_table",
    "summarize",
    "family_claims",
    "main",
]

#: Bootstrap resamples of every interval (fixed seed: same inputs, same intervals).
BOOT_REPS = 2000


def run_dir(out: Path, name: str, seed: int) -> Path:
    """The run directory of configuration ``name`` with training seed ``seed``."""
    return Path(out) / f"{name}-s{seed}"


def _complete(run: Path) -> bool:
    meta = run / "meta.json"
    if not (run / "model.zip").is_file() or not meta.is_file():
        return False
    from diloco_gym.sim import parsing

    try:  # within DILOCO_GYM_MAX_SETTINGS_BYTES and DILOCO_GYM_MAX_NESTING
        doc = parsing.parse_json(parsing.read_text(meta), str(meta))
        return isinstance(doc, dict) and doc.get("status", "complete") == "complete"
    except ValueError:
        return False


def train_seeds(
    name: str, seeds: Sequence[int], out: Path, train_args: Sequence[str]
) -> list[Path]:
    """Train ``name`` once per seed (``train_args`` plus ``--seed``); complete runs are kept.

    Raises:
        ValueError: ``train_args`` give ``--seed``, ``--out`` or ``--force`` themselves.
    """
    given = {a.split("=")[0] for a in train_args}
    clash = sorted(given & {"--seed", "--out", "--force", "--resume"})
    if clash:
        raise ValueError(f"train arguments: {', '.join(clash)} are set per seed by the study")
    runs = []
    for seed in seeds:
        run = run_dir(out, name, seed)
        runs.append(run)
        if _complete(run):
            print(f"{run}: complete, kept", flush=True)
            continue
        argv = [*train_args, "--seed", str(seed), "--out", str(run)]
        from diloco_gym.rl.command import add_train_arguments, run_train_command

        parser = argparse.ArgumentParser(prog="diloco-gym train")
        add_train_arguments(parser)
        full = ["train", *argv, "--no-progress"] + (["--force"] if run.exists() else [])
        code = run_train_command(parser.parse_args(full[1:]), argv=full)
        if code != 0:
            raise RuntimeError(f"{run}: training exited with status {code}")
    return runs


def select_model(run: Path, dest: Path, select: str) -> Path:
    """Copy the model ``run`` would ship (``best``: ``best_model.zip``, else the final
    model; ``final``: ``model.zip``) with its ``meta.json`` to ``dest/model.zip``."""
    src = run / "best_model.zip" if select == "best" else run / "model.zip"
    if select == "best" and not src.is_file():
        src = run / "model.zip"
    if not src.is_file():
        wanted = "best_model.zip or model.zip" if select == "best" else "model.zip"
        raise FileNotFoundError(f"{run}: no model to evaluate (no {wanted})")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest / "model.zip")
    shutil.copyfile(run / "meta.json", dest / "meta.json")
    return dest


@dataclass(frozen=True)
class _Learned:
    """A run under evaluation: its configuration, seed and selected model's directory."""

    name: str
    seed: int
    path: Path


def _select_all(
    runs: Path, names: Sequence[str], seeds: Sequence[int], select: str, out: Path
) -> list[_Learned]:
    chosen = []
    for name in names:
        for seed in seeds:
            dest = out / "agents" / f"{name}-s{seed}"
            chosen.append(
                _Learned(name, seed, select_model(run_dir(runs, name, seed), dest, select))
            )
    return chosen


def _write_agents(out: Path, learned: list[_Learned], agent_names: list[str], extra: dict) -> None:
    record = {
        "learned": [
            {"config": lr.name, "seed": lr.seed, "agent": an, "path": str(lr.path)}
            for lr, an in zip(learned, agent_names, strict=True)
        ],
        **extra,
    }
    (out / "agents.json").write_text(json.dumps(record, indent=2) + "\n")


def evaluate_runs(
    runs: Path,
    names: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    regimes: Sequence[str],
    heuristics: Sequence[str],
    test_seeds: int = 100,
    seed0: int = 0,
    draws: int = 1000,
    select: str = "best",
    budgets_per_hour: Sequence[float] | None = None,
    jobs: int = 1,
    free: bool = False,
    learner_calibration: str | None = None,
) -> Path:
    """Judge every run of ``names`` x ``seeds`` beside ``heuristics``: budget-conditioned
    models on the frontier's budget grid, or (``free``) models that choose their own merge
    rate as free points (task ``REGIME@free``, each at its own merges per hour). With
    ``learner_calibration`` (a file, or ``"shipped"``: ``DiLoCoSync-v2``'s learners) every
    agent acts in envs with its learner model, as the frontier's ``--learner-calibration``.
    Writes ``out/budgets.csv`` (one row per regime x budget x agent) and
    ``out/agents.json``. Returns ``out``."""
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.frontier import DEFAULT_BUDGETS_PER_HOUR, FrontierConfig, run_frontier

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    learned = _select_all(Path(runs), names, seeds, select, out)
    specs = [str(lr.path) for lr in learned] + list(heuristics)
    agent_names = [a.name for a in make_agents(specs)]
    config = FrontierConfig(
        regimes=list(regimes),
        budgets_per_hour=list(budgets_per_hour or DEFAULT_BUDGETS_PER_HOUR),
        budget_agents=[] if free else specs,
        free_agents=specs if free else ["fixed-512"],  # a free point is required
        seeds=test_seeds,
        seed0=seed0,
        draws=draws,
        in_process_agents=True,  # the study's own models and the shipped heuristics
        learner_calibration=learner_calibration_path(learner_calibration),
    )
    backend = "processes" if jobs > 1 else "serial"
    result = run_frontier(config, progress=False, backend=backend, jobs=jobs)
    table = result["free"] if free else result["budgets"]
    if free:
        table.insert(1, "budget_per_hour", "free")
    table.to_csv(out / "budgets.csv", index=False)
    result["pairwise"].to_csv(out / "pairwise.csv", index=False)
    extra = {
        "heuristics": list(heuristics),
        "regimes": list(regimes),
        "test_seeds": [seed0, seed0 + test_seeds - 1],
        "draws": draws,
        "select": select,
        "learner_calibration": learner_calibration_path(learner_calibration),
        "elapsed_s": round(result["elapsed_s"], 1),
    }
    _write_agents(out, learned, agent_names[: len(learned)], extra)
    return out


def evaluate_fleet_runs(
    runs: Path,
    name: str,
    seeds: Sequence[int],
    out: Path,
    fleet: str,
    budgets: Sequence[int],
    heuristics: Sequence[str],
    test_seeds: int = 20,
    seed0: int = 0,
    draws: int = 200,
    jobs: int = 1,
) -> Path:
    """As :func:`evaluate_runs` for fleet models: the frontier on the fleet
    (:func:`~diloco_gym.eval.frontier.run_frontier` of a
    :class:`~diloco_gym.eval.fleet_frontier.FleetFrontierConfig`) at each fragment-sync
    budget (``merge_budget = M``, syncs per episode). ``budgets.csv`` has the single-host
    frontier's column names, with ``regime = "fleet"``, ``budget`` the syncs per episode and
    ``budget_per_hour`` the syncs per hour of the fleet's episodes; ``pairwise.csv`` the
    agents against each other at each budget."""
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig
    from diloco_gym.eval.frontier import run_frontier

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    learned = _select_all(Path(runs), [name], seeds, "final", out)
    specs = [str(lr.path) for lr in learned] + list(heuristics)
    agent_names = [a.name for a in make_agents(specs)]
    report = FleetReportConfig(
        fleet=fleet,
        agents=specs,
        seeds=test_seeds,
        seed0=seed0,
        draws=draws,
        in_process_agents=True,  # the study's own models and the shipped heuristics
    )
    config = FleetFrontierConfig(report=report, budgets=[int(b) for b in budgets])
    backend = "processes" if jobs > 1 else "serial"
    result = run_frontier(config, progress=False, backend=backend, jobs=jobs)
    fleet_budgets_table(result).to_csv(out / "budgets.csv", index=False)
    result["pairwise"].to_csv(out / "pairwise.csv", index=False)
    extra = {
        "heuristics": list(heuristics),
        "regimes": ["fleet"],
        "fleet": fleet,
        "test_seeds": [seed0, seed0 + test_seeds - 1],
        "draws": draws,
        "select": "final",
        "elapsed_s": round(result["elapsed_s"], 1),
    }
    _write_agents(out, learned, agent_names[: len(learned)], extra)
    return out


def fleet_budgets_table(result: dict[str, Any]) -> Any:
    """A fleet frontier's table (``result["frontier"]``) under the single-host frontier's
    column names, as the study's ``budgets.csv`` holds it: ``regime = "fleet"``, the budget
    in syncs per hour of the episodes (``budget_per_hour``) and per episode (``budget``)."""
    t = result["frontier"]
    duration_s = float(result["rows"]["duration_s"].iloc[0])
    table = t.rename(
        columns={
            "matched_random_mean": "matched_random_pct",
            "oracle_same_budget_pct": "oracle_pct",
        }
    )
    table.insert(0, "regime", "fleet")
    table.insert(1, "budget_per_hour", t["budget"].astype(float) * 3600.0 / duration_s)
    return table


# ----------------------------------------------------------------------------- summary
def _budget_label(b: Any) -> str:
    try:
        return f"{float(b):g}/h"
    except ValueError:
        return str(b)  # "free"


def _score_tables(eval_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(record, per_config)`` of one evaluation: ``per_config[name] = (seeds, tasks,
    runs x tasks gap matrix, best-heuristic row and names)``."""
    import pandas as pd

    record = json.loads((eval_dir / "agents.json").read_text())
    df = pd.read_csv(eval_dir / "budgets.csv")
    df["task"] = df["regime"] + "@" + df["budget_per_hour"].map(_budget_label)
    heur = df[df["agent"].isin(record["heuristics"])]
    best = heur.loc[heur.groupby("task", sort=False)["gap_captured"].idxmax()]
    best = best.set_index("task")
    per_config: dict[str, Any] = {}
    for name in dict.fromkeys(r["config"] for r in record["learned"]):
        rows = [r for r in record["learned"] if r["config"] == name]
        sub = df[df["agent"].isin([r["agent"] for r in rows])]
        tasks = list(dict.fromkeys(sub["task"]))
        gap = np.array(
            [
                [
                    float(
                        sub[(sub["agent"] == r["agent"]) & (sub["task"] == t)]["gap_captured"].iloc[
                            0
                        ]
                    )
                    for t in tasks
                ]
                for r in rows
            ]
        )
        per_config[name] = {
            "seeds": [r["seed"] for r in rows],
            "tasks": tasks,
            "gap": gap,
            "best_gap": best.loc[tasks, "gap_captured"].to_numpy(dtype=float),
            "best_name": best.loc[tasks, "agent"].tolist(),
        }
    return record, per_config


def _summarize_config(c: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The aggregate measures of one configuration on one test block."""
    gap, best = c["gap"], c["best_gap"][None, :]
    point, lo, hi = stratified_bootstrap_ci(iqm, gap, reps=BOOT_REPS, rng=rng)
    poi = stratified_bootstrap_ci(probability_of_improvement, gap, best, reps=BOOT_REPS, rng=rng)
    tasks = []
    for j, task in enumerate(c["tasks"]):
        col = gap[:, j]
        t_iqm = stratified_bootstrap_ci(iqm, col[:, None], reps=BOOT_REPS, rng=rng)
        tasks.append(
            {
                "task": task,
                "gap_iqm": t_iqm[0],
                "gap_iqm_ci": [t_iqm[1], t_iqm[2]],
                "gap_min": float(col.min()),
                "gap_max": float(col.max()),
                "gap_by_seed": dict(zip(map(str, c["seeds"]), map(float, col), strict=True)),
                "best_heuristic": c["best_name"][j],
                "best_heuristic_gap": float(c["best_gap"][j]),
                "runs_above_best_heuristic": int((col > c["best_gap"][j]).sum()),
                "probability_of_improvement": probability_of_improvement(
                    col[:, None], c["best_gap"][j : j + 1][None, :]
                ),
            }
        )
    return {
        "seeds": c["seeds"],
        "gap_iqm": point,
        "gap_iqm_ci": [lo, hi],
        "probability_of_improvement": poi[0],
        "probability_of_improvement_ci": [poi[1], poi[2]],
        "tasks": tasks,
    }


def _curve(meta: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """A run's validation curve: the mean gap captured over its env kinds when recorded
    (budget runs), else the mean validation sync-excess."""
    xs, ys, kind = [], [], "gap captured (validation, mean over budgets)"
    for ev in meta.get("evaluations") or []:
        per_env = ev.get("per_env") or {}
        gaps = [r["gap_captured"] for r in per_env.values() if r.get("gap_captured") is not None]
        if per_env:
            ys.append(float(np.mean(gaps)))
        else:
            ys.append(float(ev["sync_excess_pct"]))
            kind = "sync-excess % (validation)"
        xs.append(int(ev["timesteps"]))
    return xs, ys, kind


def learning_curves(runs: Path, names: Sequence[str], seeds: Sequence[int], path: Path) -> dict:
    """Draw every run's validation curve and the IQM across seeds (one panel per
    configuration) to ``path``; returns the curves' data (configurations without a
    validation history, such as a run with --eval-episodes 0, are listed as such)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from diloco_gym.sim import parsing

    data: dict[str, Any] = {}
    for name in names:
        curves = []
        for seed in seeds:
            meta_path = run_dir(runs, name, seed) / "meta.json"
            meta = parsing.parse_json(parsing.read_text(meta_path), str(meta_path))
            curves.append((seed, *_curve(meta)))
        data[name] = curves
    drawn = [n for n in names if any(c[1] for c in data[n])]
    fig = Figure(figsize=(4.2 * max(len(drawn), 1), 3.4))
    for k, name in enumerate(drawn):
        ax = fig.add_subplot(1, max(len(drawn), 1), k + 1)
        for seed, xs, ys, _ in data[name]:
            ax.plot(xs, ys, lw=0.8, alpha=0.6, label=f"seed {seed}")
        xs0 = data[name][0][1]
        if all(c[1] == xs0 for c in data[name]):  # same evaluation points: the IQM curve
            mid = [iqm(np.array([c[2][i] for c in data[name]])) for i in range(len(xs0))]
            ax.plot(xs0, mid, color="black", lw=2, label="IQM")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("timesteps")
        ax.set_ylabel(data[name][0][3], fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))
    return {
        n: [
            {"seed": s, "timesteps": xs, "values": ys, "measure": kind}
            for s, xs, ys, kind in data[n]
        ]
        for n in names
    }


def summarize(
    evals: Sequence[Path], runs: Path, curve_names: Sequence[str], seeds: Sequence[int], out: Path
) -> dict[str, Any]:
    """Aggregate every evaluation (per configuration and test block), draw the learning
    curves of ``curve_names``, and write ``summary.json`` and ``summary.md`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20211206)
    results = []
    for e in evals:
        record, per_config = _score_tables(Path(e))
        for name, c in per_config.items():
            results.append(
                {
                    "config": name,
                    "evaluation": Path(e).name,
                    "regimes": record["regimes"],
                    "test_seeds": record["test_seeds"],
                    **_summarize_config(c, rng),
                }
            )
    curves = learning_curves(Path(runs), curve_names, seeds, out / "learning_curves.png")
    summary = {"results": results, "learning_curves": curves, "bootstrap_reps": BOOT_REPS}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(render_markdown(summary))
    return summary


def render_markdown(summary: dict[str, Any]) -> str:
    """The summary as Markdown tables: one line per configuration and test block, then
    one line per task."""
    lines = [
        "| configuration | regimes | test seeds | runs | gap captured IQM [95 % CI] "
        "| P(improvement) over the best heuristic [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary["results"]:
        a, b = r["test_seeds"]
        lines.append(
            f"| {r['config']} | {', '.join(r['regimes'])} | {a}-{b} | {len(r['seeds'])} "
            f"| {r['gap_iqm']:.2f} "
            f"[{r['gap_iqm_ci'][0]:.2f}, {r['gap_iqm_ci'][1]:.2f}] | "
            f"{r['probability_of_improvement']:.2f} [{r['probability_of_improvement_ci'][0]:.2f}, "
            f"{r['probability_of_improvement_ci'][1]:.2f}] |"
        )
    lines += [
        "",
        "| configuration | test seeds | task | gap IQM [95 % CI] | min..max | seed 0 "
        "| best heuristic (gap) | runs above it | P(improvement) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["results"]:
        a, b = r["test_seeds"]
        for t in r["tasks"]:
            s0 = t["gap_by_seed"].get("0")
            lines.append(
                f"| {r['config']} | {a}-{b} | {t['task']} | {t['gap_iqm']:.2f} "
                f"[{t['gap_iqm_ci'][0]:.2f}, {t['gap_iqm_ci'][1]:.2f}] | "
                f"{t['gap_min']:.2f}..{t['gap_max']:.2f} | "
                f"{'' if s0 is None else f'{s0:.2f}'} | {t['best_heuristic']} "
                f"({t['best_heuristic_gap']:.2f}) | {t['runs_above_best_heuristic']} of "
                f"{len(r['seeds'])} | {t['probability_of_improvement']:.2f} |"
            )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ claims
def family_claims(eval_dir: Path, runs: Sequence[str]) -> Any:
    """The shipped-agent comparison of ``diloco-gym frontier`` recomputed on a family: the
    evaluation's heuristics plus the learned ``runs`` (``NAME-sSEED``), as if only they had
    been run. Per regime x budget and learned run: its sync-excess, the best heuristic
    (lowest mean sync-excess), the paired difference with its 95 % CI, raw p and Holm p
    across the family's agent pairs at that budget, and the difference to matched random
    with Holm across the family's agents. Each test's p-value depends only on its own pair
    (fixed generators), so these equal a frontier run of that family on the same seeds.
    """
    import pandas as pd

    from diloco_gym.eval.summary import holm

    eval_dir = Path(eval_dir)
    record = json.loads((eval_dir / "agents.json").read_text())
    by_run = {f"{r['config']}-s{r['seed']}": r["agent"] for r in record["learned"]}
    unknown = [r for r in runs if r not in by_run]
    if unknown:
        raise ValueError(f"{eval_dir}: no evaluated run {unknown[0]!r}; have {sorted(by_run)}")
    learned = [by_run[r] for r in runs]
    family = set(record["heuristics"]) | set(learned)
    budgets = pd.read_csv(eval_dir / "budgets.csv")
    budgets = budgets[budgets["agent"].isin(family)].copy()
    pairs = pd.read_csv(eval_dir / "pairwise.csv")
    pairs = pairs[pairs["agent_a"].isin(family) & pairs["agent_b"].isin(family)].copy()
    keys = ["regime", "budget_per_hour"]
    for frame, col in ((budgets, "p_value"), (pairs, "p_value")):
        frame["p_family_holm"] = frame.groupby(keys)[col].transform(lambda p: holm(p.to_numpy()))
    rows = []
    for (regime, per_hour), g in budgets.groupby(keys, sort=False):
        heur = g[g["agent"].isin(record["heuristics"])]
        best = heur.loc[heur["sync_excess_pct"].idxmin()]
        for run, agent in zip(runs, learned, strict=True):
            a = g[g["agent"] == agent].iloc[0]
            rows.append(
                {
                    "regime": regime,
                    "budget_per_hour": per_hour,
                    "run": run,
                    "sync_excess_pct": a["sync_excess_pct"],
                    "gap_captured": a["gap_captured"],
                    "gap_ci": [a["gap_ci_low"], a["gap_ci_high"]],
                    "vs_random_pp": a["diff_pp"],
                    "vs_random_holm": a["p_family_holm"],
                    "best_heuristic": best["agent"],
                    "best_heuristic_pct": best["sync_excess_pct"],
                    **_pair(pairs, regime, per_hour, agent, best["agent"]),
                }
            )
    return pd.DataFrame(rows)


def _pair(pairs: Any, regime: str, per_hour: float, a: str, b: str) -> dict[str, Any]:
    """``a - b`` from the pairwise table (whichever order it holds them in)."""
    at = pairs[(pairs["regime"] == regime) & (pairs["budget_per_hour"] == per_hour)]
    row = at[(at["agent_a"] == a) & (at["agent_b"] == b)]
    sign = 1.0
    if row.empty:
        row, sign = at[(at["agent_a"] == b) & (at["agent_b"] == a)], -1.0
    r = row.iloc[0]
    lo, hi = sorted((sign * r["diff_ci_low"], sign * r["diff_ci_high"]))
    return {
        "vs_best_pp": sign * r["diff_pp"],
        "vs_best_ci": [lo, hi],
        "vs_best_p": r["p_value"],
        "vs_best_holm": r["p_family_holm"],
    }


def render_claims(table: Any) -> str:
    """:func:`family_claims` as a Markdown table."""
    lines = [
        "| regime | merges/h | run | agent % | gap [95 % CI] | agent - matched random, pp "
        "(Holm p) | best heuristic % | agent - best heuristic, pp [95 % CI] (p, Holm p) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['regime']} | {r['budget_per_hour']:g} | {r['run']} | "
            f"{r['sync_excess_pct']:.2f} | {r['gap_captured']:.2f} [{r['gap_ci'][0]:.2f}, "
            f"{r['gap_ci'][1]:.2f}] | {r['vs_random_pp']:+.2f} ({r['vs_random_holm']:.2g}) | "
            f"{r['best_heuristic']} {r['best_heuristic_pct']:.2f} | {r['vs_best_pp']:+.2f} "
            f"[{r['vs_best_ci'][0]:+.2f}, {r['vs_best_ci'][1]:+.2f}] ({r['vs_best_p']:.2g}, "
            f"{r['vs_best_holm']:.2g}) |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m diloco_gym.rl.seeds", description=__doc__.splitlines()[0]
    )
    sub = ap.add_subparsers(dest="step", required=True)
    t = sub.add_parser("train", help="one training run per seed (arguments after --)")
    t.add_argument("--name", required=True, help="the configuration's name (run folders)")
    t.add_argument("--seeds", type=int, nargs="+", required=True)
    t.add_argument("--out", required=True, help="folder of the runs (OUT/NAME-sSEED)")
    t.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the train arguments")
    for step in ("evaluate", "evaluate-fleet"):
        e = sub.add_parser(step, help="judge the runs on test seeds beside the heuristics")
        e.add_argument("--runs", required=True)
        e.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
        e.add_argument("--out", required=True)
        e.add_argument("--heuristics", nargs="+", required=True)
        e.add_argument("--test-seeds", type=int, default=100 if step == "evaluate" else 20)
        e.add_argument("--seed0", type=int, default=0, help="first test seed")
        e.add_argument("--draws", type=int, default=1000 if step == "evaluate" else 200)
        e.add_argument("--jobs", type=int, default=1, help="worker processes")
    ev, ef = sub.choices["evaluate"], sub.choices["evaluate-fleet"]
    ev.add_argument("--names", nargs="+", required=True, help="configurations")
    ev.add_argument("--regimes", nargs="+", required=True)
    ev.add_argument("--select", choices=("best", "final"), default="best")
    ev.add_argument("--budgets", type=float, nargs="+", default=None, metavar="PER_HOUR")
    ev.add_argument("--free", action="store_true", help="free points (own merge rate)")
    ev.add_argument(
        "--learner-calibration",
        default=None,
        help="the envs' learner model: a learner calibration file, or 'shipped' "
        "(DiLoCoSync-v2's); judge runs trained with one with the same",
    )
    ef.add_argument("--name", required=True)
    ef.add_argument("--fleet", required=True, help="the fleet file the models trained on")
    ef.add_argument("--budgets", type=int, nargs="+", required=True, help="syncs per episode")
    c = sub.add_parser("claims", help="a family's comparison on an evaluation's seeds")
    c.add_argument("--eval", required=True, help="an evaluation folder")
    c.add_argument("--runs", nargs="+", required=True, help="learned runs, NAME-sSEED")
    c.add_argument("--out", required=True, help="Markdown file to write")
    s = sub.add_parser("summarize", help="aggregate measures and learning curves")
    s.add_argument("--evals", nargs="+", required=True, help="evaluation folders")
    s.add_argument("--runs", required=True)
    s.add_argument("--curves", nargs="+", default=[], help="configurations to draw")
    s.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds")
    s.add_argument("--out", required=True)
    return ap


def _run_step(a: argparse.Namespace) -> None:
    if a.step == "train":
        args = a.train_args[1:] if a.train_args[:1] == ["--"] else a.train_args
        train_seeds(a.name, a.seeds, Path(a.out), args)
    elif a.step == "evaluate":
        evaluate_runs(
            Path(a.runs), a.names, a.seeds, Path(a.out), a.regimes, a.heuristics,
            a.test_seeds, a.seed0, a.draws, a.select, a.budgets, a.jobs, a.free,
            a.learner_calibration,
        )  # fmt: skip
    elif a.step == "evaluate-fleet":
        evaluate_fleet_runs(
            Path(a.runs), a.name, a.seeds, Path(a.out), a.fleet, a.budgets, a.heuristics,
            a.test_seeds, a.seed0, a.draws, a.jobs,
        )  # fmt: skip
    elif a.step == "claims":
        table = family_claims(Path(a.eval), a.runs)
        Path(a.out).write_text(render_claims(table))
        print(render_claims(table), end="")
    else:
        summarize(a.evals, Path(a.runs), a.curves, a.seeds, Path(a.out))


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2: a usage error, 1: a missing file or
    a failed run), errors as one line on stderr."""
    a = _parser().parse_args(argv)
    try:
        _run_step(a)
    except (ValueError, SystemExit) as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        print(f"python -m diloco_gym.rl.seeds: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"python -m diloco_gym.rl.seeds: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
