"""The benchmark suite's results: entrants run on the suite's tasks
(:mod:`diloco_gym.eval.bench`), aggregated over tasks and training seeds, written as
``bench.json``, ``bench.md``, ``bench.png`` and ``submission.json``; and a submission
validated by replay.

Aggregation (:mod:`diloco_gym.rl.aggregate`, Agarwal et al., NeurIPS 2021): an entrant's
scores form a runs x tasks matrix (runs: its training seeds; one row for a heuristic); its
**IQM** over every score of the tasks where every run has one, a **stratified bootstrap**
95 % interval (runs resampled within each task; one run gives a point interval: the
variation across test seeds is in each task's own interval), and the **probability of
improvement** ``P(X > Y)`` over the chosen baseline entrant, averaged over the tasks both
have, with its interval. Matched random (0 on every task) and the oracle (1) are listed as
references, their scores computed by the same formula from the tasks' curves.

Validation (:func:`validate_submission`): a submission file names the suite, its mode and,
per entrant, its agents (one per run) and claimed gap captured per task. Its agents are
replayed on the claimed tasks (or a subset) in the stated mode, and every claimed score
must match the replay within a tolerance; the first mismatch is a one-line error naming the
file, the entrant, the task and both numbers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval.bench import (
    MODES,
    SUITE_NAME,
    BenchError,
    BenchMode,
    BenchTask,
    Entrant,
    mode_for,
    run_tasks,
    select_tasks,
    suite_hash,
    suite_record,
    suite_tasks,
)
from diloco_gym.rl.aggregate import iqm, probability_of_improvement, stratified_bootstrap_ci

__all__ = [
    "RANDOM",
    "ORACLE",
    "REACHABLE",
    "DEFAULT_BASELINE",
    "BOOT_REPS",
    "DEFAULT_TOLERANCE",
    "baseline_entrants",
    "aggregate",
    "run_bench",
    "write_bench",
    "render_markdown",
    "bench_figure",
    "read_submission",
    "validate_submission",
    "gap",
]

#: The reference entrants' names: matched random, the oracle and the rate-clairvoyant
#: reference (what knowing the rate function reaches; synthetic regimes only).
RANDOM, ORACLE, REACHABLE = "matched random", "oracle", "reachable (rate-clairvoyant)"
#: The default baseline of the probability of improvement: the best deployable heuristic
#: of docs/frontier.md.
DEFAULT_BASELINE = "online-forecast-budget"
#: Bootstrap resamples of every interval (a fixed generator: same scores, same intervals).
BOOT_REPS = 2000
#: Largest accepted |claimed - replayed| gap captured in a validation (absolute): the
#: replay is deterministic on one machine; the slack allows floating-point differences of
#: another machine's numpy or torch.
DEFAULT_TOLERANCE = 0.005


def gap(agent: float, random: float, oracle: float) -> float | None:
    """``(random - agent) / (random - oracle)``: 0 is matched random, 1 the oracle; None
    when the oracle is no better than random."""
    span = random - oracle
    return None if not span > 1e-9 else (random - agent) / span


def baseline_entrants() -> list[Entrant]:
    """``--baselines``: every agent of the registry, one entrant each: the budget-aware
    heuristics first, then the others, then the learned agents (when the ``rl`` extra is
    installed). ``no-sync`` is left out (it never merges: no budget holds it). An agent
    added to the registry joins by itself."""
    import importlib.util

    from diloco_gym.agents.registry import AGENTS, BUDGETED, LEARNED

    learned = importlib.util.find_spec("sb3_contrib") is not None
    names = list(BUDGETED) + [n for n in AGENTS if n not in BUDGETED and n not in LEARNED]
    names += [n for n in AGENTS if n in LEARNED and learned]
    return [Entrant(n, (n,)) for n in names if n != "no-sync"]


# ----------------------------------------------------------------------------- aggregate
def _matrix(scores: dict[str, list[float | None]], tasks: list[str]) -> tuple[np.ndarray, list]:
    """The runs x tasks matrix of the tasks where every run has a score."""
    kept = [t for t in tasks if t in scores and all(v is not None for v in scores[t])]
    if not kept:
        return np.empty((0, 0)), []
    return np.array([[scores[t][r] for t in kept] for r in range(len(scores[kept[0]]))]), kept


def aggregate(
    entrants: dict[str, dict[str, list[float | None]]],
    tasks: list[BenchTask],
    baseline: str,
    reps: int = BOOT_REPS,
    seed: int = 20211206,
) -> dict[str, dict[str, Any]]:
    """Per entrant: IQM over its tasks and runs with a stratified-bootstrap 95 % interval,
    the probability of improvement over ``baseline`` (on the tasks both have) with its
    interval, and the IQM per setting.

    Args:
        entrants: ``{name: {task: [score per run]}}`` (None: undefined or not run).
        tasks: the tasks, in order.
        baseline: the name of the baseline entrant (one of ``entrants``).
    """
    if baseline not in entrants:
        raise BenchError(
            f"baseline {baseline!r} is not an entrant; entrants: {', '.join(entrants)}"
        )
    rng = np.random.default_rng(seed)
    names = [t.name for t in tasks]
    base, base_tasks = _matrix(entrants[baseline], names)
    out = {}
    for name, scores in entrants.items():
        mat, kept = _matrix(scores, names)
        rec: dict[str, Any] = {
            "tasks": len(kept),
            "runs": int(mat.shape[0]),
            "iqm": None,
            "iqm_ci": [None, None],
            "probability_of_improvement": None,
            "probability_of_improvement_ci": [None, None],
            "by_setting": {},
        }
        if kept:
            point, lo, hi = stratified_bootstrap_ci(iqm, mat, reps=reps, rng=rng)
            rec.update(iqm=point, iqm_ci=[lo, hi])
            common = [t for t in kept if t in base_tasks]
            if common and name != baseline:
                x = mat[:, [kept.index(t) for t in common]]
                y = base[:, [base_tasks.index(t) for t in common]]
                p, plo, phi = stratified_bootstrap_ci(
                    probability_of_improvement, x, y, reps=reps, rng=rng
                )
                rec.update(probability_of_improvement=p, probability_of_improvement_ci=[plo, phi])
            for setting in dict.fromkeys(t.setting for t in tasks):
                cols = [i for i, t in enumerate(kept) if t.startswith(f"{setting}@")]
                if cols:
                    rec["by_setting"][setting] = iqm(mat[:, cols])
        out[name] = rec
    return out


# ---------------------------------------------------------------------------------- run
def _as_spec(agent: Any, registered: list[str]) -> str:
    """An agent argument, or an object (as :func:`diloco_gym.evaluate` takes) filed for this
    process's run."""
    if isinstance(agent, str):
        return agent
    from diloco_gym.agents.user import as_agent, register_object

    spec = register_object(as_agent(agent))
    registered.append(spec)
    return spec


def run_bench(
    entrants: Sequence[Entrant],
    *,
    tasks: Sequence[str] | None = None,
    mode: BenchMode | str = "full",
    baseline: str | None = None,
    in_process: bool = False,
    real_traces: str | None = None,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run ``entrants`` on the suite's ``tasks`` (all by default) in ``mode`` and aggregate.

    An entrant's agents are agent arguments (a registry name, a run directory or model
    ``.zip``, ``module:attr``, ``path/to/file.py:attr``) or objects as
    :func:`diloco_gym.evaluate` takes them (run in this process's cells, sealed;
    ``backend="serial"``).

    Returns:
        The bench document (``bench.json``'s content; :func:`write_bench` writes it).
    """
    from diloco_gym.agents.user import unregister_object

    record = suite_record()
    the_mode = MODES[mode] if isinstance(mode, str) else mode
    chosen = select_tasks(tasks)
    registered: list[str] = []
    try:
        named = [
            Entrant(e.name, tuple(_as_spec(a, registered) for a in e.agents), e.description)
            for e in entrants
        ]
        if len({e.name for e in named}) != len(named):
            raise BenchError("entrant names must be distinct")
        if {RANDOM, ORACLE, REACHABLE} & {e.name for e in named}:
            raise BenchError(f"{RANDOM!r}, {ORACLE!r} and {REACHABLE!r} are the references' names")
        known = [e.name for e in named] + [RANDOM, ORACLE, REACHABLE]
        if baseline is not None and baseline not in known:
            raise BenchError(
                f"baseline {baseline!r} is not an entrant; entrants: {', '.join(known)}"
            )
        res = run_tasks(
            named, chosen, the_mode, in_process=in_process, real_traces=real_traces,
            progress=progress, backend=backend, jobs=jobs, ray_address=ray_address,
        )  # fmt: skip
    finally:
        for spec in registered:
            unregister_object(spec)
    import diloco_gym
    from diloco_gym.eval.report_render import sandbox_record

    doc = _document(record, the_mode, chosen, named, res, baseline)
    doc["agent_sandbox"] = sandbox_record(in_process)
    doc["package_version"] = diloco_gym.__version__
    return doc


def _document(
    record: dict[str, Any],
    mode: BenchMode,
    tasks: list[BenchTask],
    entrants: list[Entrant],
    res: dict[str, Any],
    baseline: str | None,
) -> dict[str, Any]:
    """The bench document from :func:`~diloco_gym.eval.bench.run_tasks`' result."""
    ran = [t for t in tasks if t.name in res["references"]]
    refs = res["references"]
    table: dict[str, dict[str, list[float | None]]] = {}
    docs = []
    for e in entrants:
        scores = {
            t.name: [res["scores"][t.name][a]["gap_captured"] for a in e.agents]
            for t in ran
            if e.name not in res["not_run"] or t.name not in res["not_run"][e.name]
        }
        table[e.name] = scores
        details = {
            t: [{"agent": a, "name": res["names"][a], **res["scores"][t][a]} for a in e.agents]
            for t in scores
        }
        docs.append(
            {
                "name": e.name,
                "kind": "entrant",
                "description": e.description,
                "agents": list(e.agents),
                "scores": scores,
                "details": details,
                "not_run": res["not_run"].get(e.name, {}),
            }
        )
    picks = (
        (RANDOM, "matched_random_pct"),
        (ORACLE, "oracle_pct"),
        (REACHABLE, "rate_clairvoyant_pct"),
    )
    for name, pick in picks:
        scores = {
            t.name: [
                gap(
                    refs[t.name][pick],
                    refs[t.name]["matched_random_pct"],
                    refs[t.name]["oracle_pct"],
                )
            ]
            for t in ran
            if refs[t.name][pick] is not None
        }
        table[name] = scores
        docs.append({"name": name, "kind": "reference", "agents": [], "scores": scores})
    chosen = baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in table else entrants[0].name)
    agg = aggregate(table, ran, chosen)
    for d in docs:
        d["aggregate"] = agg[d["name"]]
    doc: dict[str, Any] = {
        "suite": record["suite"],
        "suite_hash": record["suite_hash"],
        "mode": mode.name,
        "counts": {
            "seeds": mode.seeds,
            "draws": mode.draws,
            "fleet_seeds": mode.fleet_seeds,
            "fleet_draws": mode.fleet_draws,
            "test_seed0": record["test_seed0"],
        },
        "tasks": [{**t.__dict__, "unit": t.unit} for t in ran],
        "references": {t.name: refs[t.name] for t in ran},
        "skipped": res["skipped"],
        "baseline": chosen,
        "entrants": docs,
        "bootstrap_reps": BOOT_REPS,
        "elapsed_s": float(res["elapsed_s"]),
    }
    if mode.name == "custom":
        doc["custom"] = {"seeds": mode.seeds, "draws": mode.draws}
    return doc


# ------------------------------------------------------------------------------- output
def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _cell(values: list[float | None]) -> str:
    """A task cell: one run's score, or several runs' IQM with their range."""
    vals = [v for v in values if v is not None]
    if len(vals) != len(values) or not vals:
        return "-"
    if len(vals) == 1:
        return _num(vals[0])
    return f"{iqm(np.array(vals)):.2f} ({min(vals):.2f}..{max(vals):.2f})"


def _sealing(record: dict[str, Any] | None) -> str:
    """How the deployable agents ran, for bench.md's header."""
    from diloco_gym.eval.report_render import sandbox_sentence

    if not record:
        return ""
    if record.get("level") == "none":
        return " Agents ran in the evaluating process (--in-process-agents), not sealed."
    return " Deployable agents ran sealed." + sandbox_sentence(record)


def render_markdown(doc: dict[str, Any]) -> str:
    """bench.md: the aggregate table, then one table per task."""
    ents = sorted(
        doc["entrants"],
        key=lambda e: -(e["aggregate"]["iqm"] if e["aggregate"]["iqm"] is not None else -9),
    )
    official = doc["mode"] != "custom"
    lines = [
        f"# {doc['suite']} ({doc['mode']} mode)",
        "",
        f"Suite hash `{doc['suite_hash'][:16]}`"
        + (f", diloco-gym {doc['package_version']}" if doc.get("package_version") else "")
        + f"; {len(doc['tasks'])} task(s); "
        f"{doc['counts']['seeds']} seeds per regime task, {doc['counts']['draws']} "
        f"matched-random draws (fleet: {doc['counts']['fleet_seeds']} episodes, "
        f"{doc['counts']['fleet_draws']} draws), test seeds from {doc['counts']['test_seed0']}; "
        f"{doc['elapsed_s']:.1f} s."
        + ("" if official else " Custom counts: not the suite's numbers.")
        + _sealing(doc.get("agent_sandbox")),
        "",
        "Score: gap captured, `(matched random - agent) / (matched random - oracle)` at the "
        "task's budget (0 = matched random, 1 = the oracle). Aggregate: IQM over tasks and "
        "training runs with a stratified-bootstrap 95 % interval (runs resampled within "
        f"tasks), and the probability of improvement over **{doc['baseline']}**.",
        "",
    ]
    for task, why in doc["skipped"].items():
        lines.append(f"* skipped {task}: {why}")
    settings = list(dict.fromkeys(t["setting"] for t in doc["tasks"]))
    lines += [
        "",
        "## Aggregate",
        "",
        "| entrant | runs | tasks | IQM [95 % CI] | P(improvement) [95 % CI] | "
        + " | ".join(settings)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(settings),
    ]
    for e in ents:
        a = e["aggregate"]
        p, (plo, phi) = a["probability_of_improvement"], a["probability_of_improvement_ci"]
        poi = "-" if p is None else f"{p:.2f} [{_num(plo)}, {_num(phi)}]"
        per = " | ".join(_num(a["by_setting"].get(s)) for s in settings)
        name = e["name"] if e["kind"] == "entrant" else f"*{e['name']}*"
        lines.append(
            f"| {name} | {a['runs']} | {a['tasks']} | {_num(a['iqm'])} "
            f"[{_num(a['iqm_ci'][0])}, {_num(a['iqm_ci'][1])}] | {poi} | {per} |"
        )
    lines += ["", "## Tasks", ""]
    for t in doc["tasks"]:
        ref = doc["references"][t["name"]]
        reach = (
            ""
            if ref["reachable"] is None
            else f"; reachable (rate-clairvoyant) {ref['reachable']:.2f}"
        )
        lines += [
            f"### {t['name']}",
            "",
            f"Matched random {ref['matched_random_pct']:.2f} %, oracle {ref['oracle_pct']:.2f} % "
            f"sync-excess over {ref['units']} unit(s){reach}"
            + ("" if ref["defined"] else "; gap captured undefined (the oracle is no better)"),
            "",
            "| entrant | gap captured | [95 % CI over units] | sync-excess % |",
            "|---|---|---|---|",
        ]
        for e in ents:
            if e["kind"] != "entrant" or t["name"] not in e["scores"]:
                continue
            runs = e["details"][t["name"]]
            ci = (
                f"[{_num(runs[0]['gap_ci'][0])}, {_num(runs[0]['gap_ci'][1])}]"
                if len(runs) == 1
                else f"{len(runs)} runs"
            )
            pct = np.mean([r["sync_excess_pct"] for r in runs])
            lines.append(f"| {e['name']} | {_cell(e['scores'][t['name']])} | {ci} | {pct:.2f} |")
        lines.append("")
    return "\n".join(lines)


def bench_figure(doc: dict[str, Any]):
    """The IQM of every entrant with its 95 % interval (a matplotlib ``Figure``, drawn
    without pyplot)."""
    from matplotlib.figure import Figure

    ents = [e for e in doc["entrants"] if e["aggregate"]["iqm"] is not None]
    ents.sort(key=lambda e: e["aggregate"]["iqm"])
    fig = Figure(figsize=(7.0, 0.35 * len(ents) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(len(ents))
    mid = np.array([e["aggregate"]["iqm"] for e in ents])
    lo = np.array([e["aggregate"]["iqm_ci"][0] for e in ents])
    hi = np.array([e["aggregate"]["iqm_ci"][1] for e in ents])
    colors = ["0.5" if e["kind"] == "reference" else "tab:blue" for e in ents]
    ax.errorbar(mid, y, xerr=[mid - lo, hi - mid], fmt="none", ecolor="black", capsize=3, lw=1)
    ax.scatter(mid, y, c=colors, zorder=3)
    ax.set_yticks(y, [e["name"] for e in ents], fontsize=8)
    ax.axvline(0.0, color="tab:orange", lw=1, ls="--")
    ax.axvline(1.0, color="black", lw=1, ls=":")
    ax.set_xlabel("gap captured, IQM over tasks and runs [95 % CI]")
    ax.set_title(f"{doc['suite']} ({doc['mode']}): 0 = matched random, 1 = oracle", fontsize=10)
    ax.grid(axis="x", color="0.9")
    fig.tight_layout()
    return fig


def submission_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The submission file of a bench document's entrants (the references left out)."""
    sub: dict[str, Any] = {
        "suite": doc["suite"],
        "suite_hash": doc["suite_hash"],
        "mode": doc["mode"],
    }
    if "custom" in doc:
        sub["custom"] = doc["custom"]
    sub["entrants"] = [
        {k: e[k] for k in ("name", "description", "agents", "scores")}
        for e in doc["entrants"]
        if e["kind"] == "entrant"
    ]
    return sub


def _check_result(doc: dict[str, Any], where: str) -> None:
    from diloco_gym.eval.calibration.schema import CalibrationFileError, validate_schema

    try:
        validate_schema(json.loads(json.dumps(doc)), _schema("bench_result"), where)
    except CalibrationFileError as exc:
        raise BenchError(str(exc)) from None


def write_bench(
    doc: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write ``bench.json`` (checked against ``data/bench_result.schema.json``),
    ``bench.md``, ``bench.png`` and ``submission.json`` to ``out``, atomically and with the
    report's ``--force`` rules (:func:`diloco_gym.eval.output_dir.write_output_dir`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from diloco_gym.eval.output_dir import write_output_dir

    doc = {**doc, "command": command}
    _check_result(doc, "bench.json")

    def fill(tmp: Path) -> None:
        (tmp / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
        (tmp / "submission.json").write_text(json.dumps(submission_of(doc), indent=2) + "\n")
        (tmp / "bench.md").write_text(render_markdown(doc))
        fig = bench_figure(doc)
        FigureCanvasAgg(fig)
        fig.savefig(tmp / "bench.png", dpi=90)

    return write_output_dir(out, force, fill)


# --------------------------------------------------------------------------- validation
def _schema(name: str) -> dict:
    from importlib import resources

    text = resources.files("diloco_gym").joinpath(f"data/{name}.schema.json").read_text()
    return json.loads(text)


def _resolve(spec: str, base: Path) -> str:
    """An agent argument of a submission, paths taken relative to the file's folder."""
    from diloco_gym.agents.registry import AGENTS
    from diloco_gym.agents.user import is_user_spec

    if spec in AGENTS:
        return spec
    if is_user_spec(spec):
        file, _, attr = spec.rpartition(":")
        if file.endswith(".py") and not Path(file).is_absolute():
            return f"{base / file}:{attr}"
        return spec
    p = Path(spec).expanduser()
    return str(p if p.is_absolute() else base / p)


def read_submission(path: str | Path) -> dict[str, Any]:
    """A submission file, checked: size and nesting limits, JSON, the schema
    (``data/bench_submission.schema.json``), the suite's name and hash, known task names,
    one score per agent, and every agent path present. Agent paths are made relative to the
    file's folder (``entrants[i].agents`` then holds what will run). Nothing is loaded.

    Raises:
        BenchError: one line naming the file and the field.
    """
    where = str(path)
    doc = _parsed(path)

    def bad(field: str, why: str) -> BenchError:
        return BenchError(f"{where}: field {field!r}: {why}")

    if doc["suite"] != SUITE_NAME:
        raise bad("suite", f"{doc['suite']!r} is not this package's suite {SUITE_NAME!r}")
    if doc["suite_hash"] != suite_hash():
        raise bad("suite_hash", f"{doc['suite_hash'][:12]}... is not {SUITE_NAME}'s task list")
    if (doc["mode"] == "custom") != ("custom" in doc):
        raise bad("custom", "give the seeds and draws exactly when mode is 'custom'")
    known = {t.name for t in suite_tasks()}
    base = Path(path).resolve().parent
    names: set[str] = set()
    for i, e in enumerate(doc["entrants"]):
        if e["name"] in names or e["name"] in (RANDOM, ORACLE, REACHABLE):
            raise bad(f"entrants[{i}].name", f"{e['name']!r} is taken; give distinct names")
        names.add(e["name"])
        for task, values in e["scores"].items():
            field = f"entrants[{i}].scores.{task}"
            if task not in known:
                raise bad(field, f"unknown task; valid: {', '.join(sorted(known))}")
            if len(values) != len(e["agents"]):
                raise bad(field, f"{len(values)} score(s) for {len(e['agents'])} agent(s)")
        e["agents"] = [
            _present(spec, base, bad, f"entrants[{i}].agents[{j}]")
            for j, spec in enumerate(e["agents"])
        ]
    return doc


def _parsed(path: str | Path) -> Any:
    """A submission's JSON within the settings-file limits, checked against its schema."""
    from diloco_gym.eval.calibration.schema import CalibrationFileError, validate_schema
    from diloco_gym.sim import parsing

    where = str(path)
    try:
        doc = parsing.parse_json(parsing.read_text(path), where)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise BenchError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise BenchError(f"{where}: not UTF-8 text") from None
    except ValueError as exc:  # a size or nesting limit (LimitError), naming the file
        raise BenchError(str(exc)) from None
    try:
        validate_schema(doc, _schema("bench_submission"), where)
    except CalibrationFileError as exc:
        raise BenchError(str(exc)) from None
    return doc


def _present(spec: str, base: Path, bad: Any, field: str) -> str:
    """An agent argument with its path relative to ``base``; a named file must exist."""
    from diloco_gym.agents.registry import AGENTS
    from diloco_gym.agents.user import OBJECT_PREFIX, is_user_spec

    if spec.startswith(OBJECT_PREFIX):
        raise bad(field, f"{spec!r} was an object of one Python process; submit file.py:attr")
    full = _resolve(spec, base)
    code_file = is_user_spec(full) and ".py:" in full
    target = full.rpartition(":")[0] if code_file else full
    is_path = full not in AGENTS and (not is_user_spec(full) or code_file)
    if is_path and not Path(target).exists():
        raise bad(field, f"{target} does not exist")
    return full


def validate_submission(
    path: str | Path,
    *,
    tasks: Sequence[str] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    in_process: bool = False,
    real_traces: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay a submission's agents on its claimed tasks (those ``tasks`` select, when
    given: task names or settings) in its mode and compare each claimed score with the replay.

    Returns:
        ``{"checked": number of scores compared, "tasks": [...], "doc": the replay's
        bench document}``.

    Raises:
        BenchError: a bad file (see :func:`read_submission`), ``tasks`` that select none
            of the claimed tasks, or the first claimed score that differs from the replay by
            more than ``tolerance`` (one line: file, entrant, task, run, both numbers).
    """
    sub = read_submission(path)
    claimed = list(dict.fromkeys(t for e in sub["entrants"] for t in e["scores"]))
    if tasks:
        wanted = {t.name for t in select_tasks(tasks)}
        if not wanted & set(claimed):
            raise BenchError(
                f"{path}: no claimed score for {', '.join(tasks)} (--tasks); the file claims "
                f"{', '.join(claimed)}"
            )
        claimed = [t for t in claimed if t in wanted]
    if sub["mode"] == "custom":
        mode = mode_for("quick", seeds=sub["custom"]["seeds"], draws=sub["custom"]["draws"])
    else:
        mode = MODES[sub["mode"]]
    entrants = [
        Entrant(e["name"], tuple(e["agents"]), e.get("description", "")) for e in sub["entrants"]
    ]
    doc = run_bench(
        entrants, tasks=claimed, mode=mode, baseline=entrants[0].name, in_process=in_process,
        real_traces=real_traces, progress=progress,
    )  # fmt: skip
    replayed = {e["name"]: e["scores"] for e in doc["entrants"]}
    checked = 0
    for e in sub["entrants"]:
        for task in claimed:
            if task not in e["scores"]:
                continue
            if task in doc["skipped"]:
                raise BenchError(
                    f"{path}: task {task} could not be replayed: {doc['skipped'][task]}"
                )
            got = replayed[e["name"]].get(task, [None] * len(e["agents"]))
            for r, (want, have) in enumerate(zip(e["scores"][task], got, strict=True)):
                agree = (want is None and have is None) or (
                    want is not None and have is not None and abs(want - have) <= tolerance
                )
                if not agree:
                    raise BenchError(
                        f"{path}: entrant {e['name']}, task {task}, run {r} "
                        f"({e['agents'][r]}): claimed gap captured {_num(want, '.4f')}, "
                        f"the replay gives {_num(have, '.4f')} (tolerance {tolerance:g})"
                    )
                checked += 1
    return {"checked": checked, "tasks": claimed, "doc": doc}
