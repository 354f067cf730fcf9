"""Where the time of a default ``diloco-gym report`` (or ``frontier``) goes.

    python benchmarks/time_split.py                       # the default report, sealed agents
    python benchmarks/time_split.py --in-process-agents   # the same, agents in this process
    python benchmarks/time_split.py frontier --seeds 10   # the frontier (any of its options)

Runs the command in this process exactly as the CLI does (the serial backend: cells run
elsewhere would escape the timers, so ``--backend`` is refused) and times, with wall clocks
around whole calls (no profiler, so the parts cost what they cost in a normal run):

* the agents' episodes: every env step and every agent decision of the units, with the
  sealed workers' messages (``eval.rollout.run_episodes``), with the decisions counted;
* scoring: the matched-random controls, the exact replays of the agents' schedules and
  the oracle (``eval.protocol.matched_control``, ``score_episode``, ``oracle_score``);
* the calibration check (``eval.cells._calibration_cell``: the simulated effect sizes);
* the statistics (the report's ``summarise``, the frontier's tables of tests);
* the frontier's episode builds and its rate-clairvoyant reference curve;
* the figures (``write_figures`` / ``frontier_figure`` and saving them);
* everything else in the command (plans, episode builds, statistics, tables, files);
* the start-up: importing the CLI and its modules before the command runs.

The parts that do not depend on how fast an env steps or an agent decides (everything but
the episodes) bound from below what any faster env or agent can give the command. Only the
outermost of nested timed calls counts, so no time is counted twice.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

T_START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diloco_gym import cli  # noqa: E402
from diloco_gym.eval import cells, protocol, report_figures, rollout  # noqa: E402
from diloco_gym.eval import frontier as frontier_mod  # noqa: E402
from diloco_gym.eval import report as report_mod  # noqa: E402

T_IMPORTED = time.perf_counter()

#: The parts timed, in the order printed.
PARTS = (
    "agents' episodes",
    "scoring",
    "calibration check",
    "statistics",
    "episode builds",
    "rate-clairvoyant reference",
    "figures",
)
SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
_DEPTH = [0]


def _timed(part: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _DEPTH[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                SPENT[part] += time.perf_counter() - t0
                CALLS[part] += 1

    return wrapper


def _count_decisions(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        results = fn(*args, **kwargs)
        CALLS["decisions"] += sum(int(r.get("steps", 0)) for r in results)
        return results

    return wrapper


def _patch() -> None:
    episodes = _timed("agents' episodes", _count_decisions(rollout.run_episodes))
    rollout.run_episodes = episodes
    frontier_mod.run_episodes = episodes
    for name in ("matched_control", "score_episode", "oracle_score"):
        setattr(protocol, name, _timed("scoring", getattr(protocol, name)))
    cells._calibration_cell = _timed("calibration check", cells._calibration_cell)
    figures = _timed("figures", report_figures.write_figures)
    report_figures.write_figures = report_mod.write_figures = figures
    report_mod.summarise = _timed("statistics", report_mod.summarise)
    frontier_mod._tables = _timed("statistics", frontier_mod._tables)
    frontier_mod.episode_from_seed = _timed("episode builds", frontier_mod.episode_from_seed)
    for name in ("expected_cost_pp", "rate_clairvoyant_schedule"):
        setattr(
            frontier_mod, name, _timed("rate-clairvoyant reference", getattr(frontier_mod, name))
        )
    frontier_mod.frontier_figure = _timed("figures", frontier_mod.frontier_figure)
    frontier_mod._save_png = _timed("figures", frontier_mod._save_png)


def main(argv: list[str]) -> int:
    import tempfile

    command = argv[:1] if argv[:1] in (["report"], ["frontier"]) else ["report"]
    rest = argv[1:] if argv[:1] == command else argv
    if any(a == "--backend" or a.startswith("--backend=") for a in rest):
        # the timers wrap this process's functions: cells run elsewhere would go uncounted
        print("time_split.py: times this process only; run it without --backend", file=sys.stderr)
        return 2
    out = Path(tempfile.mkdtemp(prefix="diloco-split-")) / "out"
    _patch()
    t0 = time.perf_counter()
    code = cli.main([*command, *rest, "--out", str(out), "--no-progress"])
    total = time.perf_counter() - t0
    startup = T_IMPORTED - T_START
    print(f"\n{command[0]} {' '.join(rest)}: {total + startup:.2f} s in this process")
    print(f"  start-up (importing the CLI and its modules)  {startup:6.2f} s")
    for part in PARTS:
        print(f"  {part:<45} {SPENT[part]:6.2f} s")
    print(f"  {'everything else':<45} {total - sum(SPENT.values()):6.2f} s")
    n = CALLS["decisions"]
    if n:
        per = SPENT["agents' episodes"] / n * 1e6
        print(f"  agent decisions: {n:,} ({per:.1f} us each, env step and sealing included)")
    fixed = total + startup - SPENT["agents' episodes"]
    print(f"  everything but the episodes: {fixed:.2f} s")
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
