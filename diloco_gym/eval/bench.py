"""The benchmark suite ``diloco-bench-v1``: a fixed, versioned task list and one normalised
score per task, every entrant replayed by the frontier's own code.

A **task** is one setting at one merge budget: a synthetic regime (bursty, non-periodic,
sync-heavy) at a budget of the frontier's default grid (48, 60, 72, 96, 144 merges per
hour), the public Azure LLM inference trace (code, 2023) in disjoint 300 s windows at the
same grid, or the example fleet (``docs/examples/fleet.toml``) at 48, 64 and 96 fragment
syncs per 600 s episode. Its units are fixed test seeds (``TEST_SEED0`` on, disjoint from
the training seeds, ``>= 10**6``, and the validation seeds, ``>= 900000``), its
matched-random draws are seeded by (seed, budget) as in the frontier, and so are fixed too.

The **score** of an agent on a task is the frontier's gap captured at that budget,
``(matched random - agent) / (matched random - oracle)`` of the means over the task's
units: 0 is random placement with the same number of merges, 1 the oracle. Where the
rate-clairvoyant reference exists (synthetic regimes, :mod:`diloco_gym.eval.clairvoyant`)
its own gap captured is shown as what is **reachable** by a scheduler that knew the rate
function. Single-host and fleet tasks run through
:func:`diloco_gym.eval.frontier.run_frontier` (a fleet task with a fleet frontier's
configuration): agent, control and oracle by the same exact replay, deployable agents
sealed unless ``in_process``.

The task list is plain data (:data:`SETTINGS`, :func:`suite_tasks`); :func:`suite_hash`
is the SHA-256 of its canonical JSON, pinned per version name in :data:`SUITE_HASHES`: a
change to the tasks without a new version name is refused before a run and fails the
tests.

Aggregation over tasks and training seeds, the output files and submission validation
are :mod:`diloco_gym.rl.bench` (it uses :mod:`diloco_gym.rl.aggregate`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diloco_gym.text import finite_float

__all__ = [
    "SUITE_NAME",
    "SUITE_HASHES",
    "SETTINGS",
    "MODES",
    "BenchTask",
    "BenchMode",
    "Entrant",
    "BenchError",
    "suite_tasks",
    "suite_record",
    "suite_hash",
    "select_tasks",
    "mode_for",
    "entrant_kinds",
    "run_tasks",
    "real_trace_path",
]

#: The suite's version name; a change to :data:`SETTINGS` or :data:`MODES` needs a new one.
SUITE_NAME = "diloco-bench-v1"

#: The budget grid of the single-host tasks, merges per hour: the frontier's default
#: (``diloco_gym.eval.frontier.DEFAULT_BUDGETS_PER_HOUR``; a test keeps them equal).
BUDGETS_PER_HOUR = (48.0, 60.0, 72.0, 96.0, 144.0)
#: The fleet task's budgets, fragment syncs per 600 s episode (the shipped ``fleet-budget``
#: agent's training budgets, docs/training.md).
FLEET_SYNCS = (48, 64, 96)
#: First test seed of every task: below the validation seeds (900000) and the training
#: seeds (10**6), and apart from the blocks the docs report (0-99, 2000-2099, 3000-3099).
TEST_SEED0 = 5000

#: The settings of the suite. Regimes with placement signal: bursty and non-periodic carry
#: bursts a scheduler can learn to avoid (the rate-clairvoyant reference reaches about four
#: fifths of the oracle's gap there); sync-heavy is steady load where the oracle still
#: beats random (it sees the Poisson lulls) but the reference is random placement: a
#: causal agent should score about 0, so a high score there means a leak. ordinary and
#: pressure-heavy are left out: at these budgets random placement and the oracle both
#: have 0 % sync-excess (the calibration finds no measurable SLO effect), so gap captured
#: is undefined there.
SETTINGS: tuple[dict[str, Any], ...] = (
    {"setting": "bursty", "kind": "regime", "regime": "bursty"},
    {"setting": "non-periodic", "kind": "regime", "regime": "non-periodic"},
    {"setting": "sync-heavy", "kind": "regime", "regime": "sync-heavy"},
    {
        # Azure LLM inference trace 2023, code (public, CC-BY 4.0; not shipped: found in
        # --real-traces, $DILOCO_GYM_REAL_TRACES or a shared/traces/real folder).
        "setting": "azure-code",
        "kind": "trace",
        "file": "AzureLLMInferenceTrace_code.csv",
        "format": "azure",
        "sha256": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "window_s": 300.0,
    },
    {
        "setting": "fleet",
        "kind": "fleet",
        "file": "docs/examples/fleet.toml",
        "sha256": "cb89428accb2bba8f3c6c316d96dba560114ea9b21d8230a7a3efd81311a63de",
    },
)


@dataclass(frozen=True)
class BenchMode:
    """How many units and draws each task uses: ``full`` (the suite), ``quick`` (a stated
    subset: the first seeds of each block, fewer draws; for CI and smoke tests) or
    ``custom`` (other counts; results are labelled as not the suite's).

    A trace task's units are all its windows in every mode."""

    name: str
    seeds: int
    draws: int
    fleet_seeds: int
    fleet_draws: int


#: The suite's modes.
MODES = {
    "full": BenchMode("full", seeds=20, draws=1000, fleet_seeds=20, fleet_draws=200),
    "quick": BenchMode("quick", seeds=3, draws=100, fleet_seeds=2, fleet_draws=50),
}


@dataclass(frozen=True)
class BenchTask:
    """One task: a setting at one budget (merges per hour; fleet: syncs per episode)."""

    name: str
    setting: str
    kind: str
    budget: float

    @property
    def unit(self) -> str:
        return "syncs per episode" if self.kind == "fleet" else "merges per hour"


def _task_name(setting: dict[str, Any], budget: float) -> str:
    if setting["kind"] == "fleet":
        return f"{setting['setting']}@{int(budget)}/ep"
    return f"{setting['setting']}@{budget:g}/h"


def suite_tasks() -> list[BenchTask]:
    """Every task of the suite, in its fixed order."""
    out = []
    for s in SETTINGS:
        grid = FLEET_SYNCS if s["kind"] == "fleet" else BUDGETS_PER_HOUR
        out += [BenchTask(_task_name(s, b), s["setting"], s["kind"], float(b)) for b in grid]
    return out


def _hash_view() -> dict[str, Any]:
    return {
        "settings": [dict(s) for s in SETTINGS],
        "budgets_per_hour": list(BUDGETS_PER_HOUR),
        "fleet_syncs": list(FLEET_SYNCS),
        "test_seed0": TEST_SEED0,
        "modes": {k: asdict(m) for k, m in MODES.items()},
        "tasks": [t.name for t in suite_tasks()],
    }


def suite_hash() -> str:
    """SHA-256 of the suite's task list, settings, seeds and modes (canonical JSON)."""
    text = json.dumps(_hash_view(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: The task-list hash of every released version name.
SUITE_HASHES = {
    "diloco-bench-v1": "d740fab3e5ad488075689cd2543b8c668fee1b39cee36498bc29254248eb5cfc"
}


def suite_record() -> dict[str, Any]:
    """The suite as plain data: name, hash, settings, modes, tasks.

    Raises:
        RuntimeError: the task list changed without a new version name.
    """
    digest = suite_hash()
    if SUITE_HASHES.get(SUITE_NAME) != digest:
        raise RuntimeError(
            f"the task list of {SUITE_NAME} changed (hash {digest[:12]}...): give the suite "
            f"a new version name and pin its hash in SUITE_HASHES"
        )
    return {
        "suite": SUITE_NAME,
        "suite_hash": suite_hash(),
        **_hash_view(),
    }


class BenchError(ValueError):
    """A benchmark input is unusable (a submission file, a task name, a missing trace):
    one line naming the file and the field."""


def select_tasks(names: Sequence[str] | None) -> list[BenchTask]:
    """The suite's tasks named (all when ``names`` is empty), in suite order; a setting
    name selects all its budgets.

    Raises:
        BenchError: an unknown name (listing the valid ones).
    """
    tasks = suite_tasks()
    if not names:
        return tasks
    settings = {t.setting for t in tasks}
    known = {t.name for t in tasks}
    bad = [n for n in names if n not in known and n not in settings]
    if bad:
        raise BenchError(
            f"unknown task {bad[0]!r}; valid: a setting ({', '.join(sorted(settings))}) "
            f"or a task ({', '.join(t.name for t in tasks)})"
        )
    return [t for t in tasks if t.name in names or t.setting in names]


def mode_for(name: str, seeds: int | None = None, draws: int | None = None) -> BenchMode:
    """The mode ``name`` (``full``/``quick``), or ``custom`` counts when ``seeds`` or
    ``draws`` are given."""
    base = MODES[name]
    if seeds is None and draws is None:
        return base
    s = base.seeds if seeds is None else int(seeds)
    d = base.draws if draws is None else int(draws)
    if s < 2 or d < 1:
        raise BenchError(f"custom mode needs seeds >= 2 and draws >= 1, got {s} and {d}")
    return BenchMode("custom", seeds=s, draws=d, fleet_seeds=s, fleet_draws=d)


# ------------------------------------------------------------------------------ entrants
@dataclass(frozen=True)
class Entrant:
    """A contender: a name and one agent argument per run (several runs of one
    configuration, its training seeds, make one entrant; a heuristic is one run).

    An agent argument is what ``--agent`` takes: a registry name, a trained run directory
    or model ``.zip``, or your own scheduler as ``module:attr`` / ``path/to/file.py:attr``;
    :func:`diloco_gym.rl.bench.run_bench` also takes objects as :func:`diloco_gym.evaluate`
    does.
    """

    name: str
    agents: tuple[Any, ...]
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.agents:
            raise BenchError("an entrant needs a name and at least one agent")


def entrant_kinds(spec: str) -> set[str]:
    """The task kinds an agent argument can run on: a model trained on a fleet (its
    ``meta.json`` names one) runs on fleet tasks only, any other model on single-host tasks
    only; heuristics (but those of ``SINGLE_HOST_ONLY``) and your own code on both. The
    agents of ``FLEET_ONLY`` need a fleet option (a per-site serving cap, changing links)
    that the suite's fleet task does not set: they run on no task."""
    from diloco_gym.agents.registry import AGENTS, FLEET_ONLY, LEARNED, SINGLE_HOST_ONLY

    if spec in FLEET_ONLY:
        return set()
    if spec in AGENTS and spec not in LEARNED:
        return {"regime", "trace"} if spec in SINGLE_HOST_ONLY else {"regime", "trace", "fleet"}
    from diloco_gym.agents.user import is_user_spec

    p = Path(spec)
    if spec not in LEARNED and is_user_spec(spec) and not p.exists():
        return {"regime", "trace", "fleet"}
    meta: Any = None
    if spec in LEARNED:
        from diloco_gym.agents.learned import reference_meta

        meta = reference_meta(spec)
    else:
        meta_path = (p if p.is_dir() else p.parent) / "meta.json"
        if meta_path.is_file():
            from diloco_gym.sim import parsing

            try:
                meta = parsing.parse_json(parsing.read_text(meta_path), str(meta_path))
            except ValueError:
                meta = None
    fleet = isinstance(meta, dict) and bool(meta.get("fleet"))
    return {"fleet"} if fleet else {"regime", "trace"}


# ------------------------------------------------------------------------------ inputs
def _checkout() -> Path:
    """The folder above the package (a source checkout's root)."""
    return Path(__file__).resolve().parents[2]


def real_trace_path(setting: dict[str, Any], real_traces: str | None) -> tuple[Path | None, str]:
    """The real trace a trace setting names and ``""``, or ``None`` and why it is missing.
    Looked for in ``real_traces``, ``$DILOCO_GYM_REAL_TRACES``, then a ``shared/traces/real``
    folder beside the checkout. A file whose SHA-256 differs is refused.

    Raises:
        BenchError: the file found is not the suite's (another hash).
    """
    here = _checkout()
    dirs = [real_traces, os.environ.get("DILOCO_GYM_REAL_TRACES")]
    dirs += [str(here.parent / "shared" / "traces" / "real"), str(here / "shared/traces/real")]
    for d in dirs:
        if not d:
            continue
        p = Path(d) / setting["file"]
        if p.is_file():
            digest = _sha256(p)
            if digest != setting["sha256"]:
                raise BenchError(
                    f"{p}: SHA-256 {digest[:12]}... is not the suite's "
                    f"{setting['sha256'][:12]}... (task {setting['setting']}: a different file)"
                )
            return p, ""
    return None, (
        f"{setting['file']} not found (give --real-traces DIR or set DILOCO_GYM_REAL_TRACES; "
        f"public: Azure LLM inference dataset 2023)"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fleet_file() -> Path:
    """The fleet task's file (``docs/examples/fleet.toml`` of the checkout, or of the
    working directory).

    Raises:
        BenchError: not found, or not the suite's file (another SHA-256).
    """
    setting = next(s for s in SETTINGS if s["kind"] == "fleet")
    rel = setting["file"]
    for base in (_checkout(), Path.cwd()):
        p = base / rel
        if p.is_file():
            digest = _sha256(p)
            if digest != setting["sha256"]:
                raise BenchError(
                    f"{p}: SHA-256 {digest[:12]}... is not the suite's "
                    f"{setting['sha256'][:12]}... (the fleet task's file was changed)"
                )
            return p
    raise BenchError(f"{rel}: the fleet task's file is not found (run from a source checkout)")


# ------------------------------------------------------------------------------- running
#: One scored run on one task: its gap captured (None: undefined or not run), the bootstrap
#: CI over the task's units, and its mean sync-excess.
Score = dict[str, Any]


def _progress(msg: str, on: bool) -> None:
    if on:
        print(f"bench: {msg}", file=sys.stderr, flush=True)


def _reference(mr: float, orc: float, rc: float | None, units: int) -> dict[str, Any]:
    span = mr - orc
    reach = None if rc is None or not span > 1e-9 else (mr - rc) / span
    return {
        "matched_random_pct": mr,
        "oracle_pct": orc,
        "rate_clairvoyant_pct": rc,
        "reachable": reach,
        "units": units,
        "defined": bool(span > 1e-9),
    }


def _single_host(
    tasks: list[BenchTask],
    specs: list[str],
    names: dict[str, str],
    mode: BenchMode,
    in_process: bool,
    real_traces: str | None,
    run_opts: dict[str, Any],
    say: Callable[[str], None],
) -> tuple[dict[str, dict[str, Score]], dict[str, dict[str, Any]], dict[str, str]]:
    """Run the regime and trace tasks: one frontier per setting kind."""
    from diloco_gym.eval.frontier import FrontierConfig, run_frontier

    scores: dict[str, dict[str, Score]] = {}
    refs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    by = {s["setting"]: s for s in SETTINGS}
    regimes = list(dict.fromkeys(t.setting for t in tasks if t.kind == "regime"))
    traces = list(dict.fromkeys(t.setting for t in tasks if t.kind == "trace"))
    jobs: list[tuple[list[str], dict[str, Any]]] = []
    if regimes:
        jobs.append((regimes, {"regimes": [by[r]["regime"] for r in regimes]}))
    for name in traces:
        path, why = real_trace_path(by[name], real_traces)
        if path is None:
            for t in tasks:
                if t.setting == name:
                    skipped[t.name] = why
            say(f"skipping {name}: {why}")
            continue
        opts = {"trace": str(path), "trace_format": by[name]["format"]}
        jobs.append(([name], {**opts, "window_s": by[name]["window_s"]}))
    for settings, opts in jobs:
        grid = sorted({t.budget for t in tasks if t.setting in settings})
        say(
            f"{', '.join(settings)}: {len(grid)} budget(s) x {len(specs)} agent(s), "
            f"{mode.seeds if 'regimes' in opts else 'all'} unit(s) each, {mode.draws} draws"
        )
        config = FrontierConfig(
            budgets_per_hour=grid,
            budget_agents=list(specs),
            free_agents=["fixed-512"],  # a free point is required; cheap
            seeds=mode.seeds,
            seed0=TEST_SEED0,
            draws=mode.draws,
            in_process_agents=in_process,
            **opts,
        )
        res = run_frontier(config, **run_opts)
        table = res["budgets"]
        for t in tasks:
            if t.setting not in settings:
                continue
            regime = by[t.setting].get("regime") or f"replay:{Path(opts['trace']).stem}"
            at = table[(table["regime"] == regime) & (table["budget_per_hour"] == t.budget)]
            scores[t.name] = {}
            for spec in specs:
                r = at[at["agent"] == names[spec]].iloc[0]
                scores[t.name][spec] = {
                    "gap_captured": finite_float(r["gap_captured"]),
                    "gap_ci": [finite_float(r["gap_ci_low"]), finite_float(r["gap_ci_high"])],
                    "sync_excess_pct": float(r["sync_excess_pct"]),
                    "merges": float(r["merges"]),
                }
            r0 = at.iloc[0]
            rc = finite_float(r0["rate_clairvoyant_pct"]) if "rate_clairvoyant_pct" in at else None
            refs[t.name] = _reference(
                float(r0["matched_random_pct"]), float(r0["oracle_pct"]), rc, int(r0["units"])
            )
    return scores, refs, skipped


def _fleet(
    tasks: list[BenchTask],
    specs: list[str],
    names: dict[str, str],
    mode: BenchMode,
    in_process: bool,
    progress: bool,
    say: Callable[[str], None],
) -> tuple[dict[str, dict[str, Score]], dict[str, dict[str, Any]]]:
    """Run the fleet tasks: the fleet frontier at the tasks' budgets."""
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig
    from diloco_gym.eval.frontier import run_frontier

    budgets = [int(t.budget) for t in tasks]
    say(
        f"fleet: {len(budgets)} budget(s) x {len(specs)} agent(s), {mode.fleet_seeds} "
        f"episodes each, {mode.fleet_draws} draws"
    )
    report = FleetReportConfig(
        fleet=str(fleet_file()),
        agents=list(specs),
        seeds=mode.fleet_seeds,
        seed0=TEST_SEED0,
        draws=mode.fleet_draws,
        in_process_agents=in_process,
    )
    res = run_frontier(FleetFrontierConfig(report=report, budgets=budgets), progress)
    table = res["frontier"]
    scores: dict[str, dict[str, Score]] = {}
    refs: dict[str, dict[str, Any]] = {}
    for t in tasks:
        at = table[table["budget"] == int(t.budget)]
        scores[t.name] = {}
        for spec in specs:
            r = at[at["agent"] == names[spec]].iloc[0]
            scores[t.name][spec] = {
                "gap_captured": finite_float(r["gap_captured"]),
                "gap_ci": [finite_float(r["gap_ci_low"]), finite_float(r["gap_ci_high"])],
                "sync_excess_pct": float(r["sync_excess_pct"]),
                "merges": float(t.budget),
            }
        r0 = at.iloc[0]
        refs[t.name] = _reference(
            float(r0["matched_random_mean"]), float(r0["oracle_same_budget_pct"]), None,
            mode.fleet_seeds,
        )  # fmt: skip
    return scores, refs


def run_tasks(
    entrants: Sequence[Entrant],
    tasks: Sequence[BenchTask],
    mode: BenchMode,
    *,
    in_process: bool = False,
    real_traces: str | None = None,
    progress: bool = True,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Replay every entrant's runs on ``tasks``.

    Returns:
        ``{"scores": {task: {agent spec: Score}}, "references": {task: {...}},
        "skipped": {task: reason}, "not_run": {entrant: {task: reason}}, "names":
        {spec: agent name}, "elapsed_s"}``.

    Raises:
        BenchError: an entrant runs on none of the tasks; the fleet task's file missing or
            changed (checked before any episode runs).
        ValueError: an unknown agent, or the same agent in two entrants.
    """
    from diloco_gym.agents.registry import make_agents

    started = time.perf_counter()
    say = lambda msg: _progress(msg, progress)  # noqa: E731
    specs = [a for e in entrants for a in e.agents]
    names = dict(zip(specs, [a.name for a in make_agents(specs)], strict=True))
    kinds = {s: entrant_kinds(s) for s in specs}
    not_run: dict[str, dict[str, str]] = {}
    for e in entrants:
        for t in tasks:
            if any(t.kind not in kinds[a] for a in e.agents):
                where = "fleet" if t.kind == "fleet" else "single-host"
                not_run.setdefault(e.name, {})[t.name] = f"runs on no {where} task"
        if len(not_run.get(e.name, {})) == len(tasks):
            raise BenchError(f"entrant {e.name}: runs on none of the selected tasks")
    if any(t.kind == "fleet" for t in tasks):
        fleet_file()  # found and unchanged, before any episode runs
    run_opts = {"progress": progress, "backend": backend, "jobs": jobs, "ray_address": ray_address}
    single = [t for t in tasks if t.kind != "fleet"]
    fleet = [t for t in tasks if t.kind == "fleet"]
    scores: dict[str, dict[str, Score]] = {}
    refs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if single:
        on = [s for s in specs if "regime" in kinds[s]]
        sc, rf, sk = _single_host(single, on, names, mode, in_process, real_traces, run_opts, say)
        scores.update(sc), refs.update(rf), skipped.update(sk)
    if fleet:
        on = [s for s in specs if "fleet" in kinds[s]]
        sc, rf = _fleet(fleet, on, names, mode, in_process, progress, say)
        scores.update(sc), refs.update(rf)
    say(f"done in {time.perf_counter() - started:.1f} s")
    return {
        "scores": scores,
        "references": refs,
        "skipped": skipped,
        "not_run": not_run,
        "names": names,
        "elapsed_s": time.perf_counter() - started,
    }
