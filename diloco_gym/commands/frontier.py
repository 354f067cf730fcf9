"""``diloco-gym frontier``: sync-excess against merge rate, agents compared at equal merge
budgets with the oracle's and matched random's curves (:mod:`diloco_gym.eval.frontier`), or on
a fleet with ``--fleet`` (:mod:`diloco_gym.eval.fleet_frontier`)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from diloco_gym.commands import checks, options
from diloco_gym.commands.jobs import command_line, fleet_env_error, fleet_job, fleet_report_config
from diloco_gym.errors import DataError, Interrupted, UsageError

__all__ = ["HELP", "FLEET_FRONTIER_AGENTS", "add_arguments", "run", "fleet_budgets"]

#: The line of ``diloco-gym --help``.
HELP = (
    "sync-excess vs merge rate: agents compared at equal "
    "merge budgets, with the oracle's and matched random's curves"
)

#: The agents of ``frontier --fleet`` when none are named: they keep to a merge budget.
FLEET_FRONTIER_AGENTS = ("online-forecast-budget", "fixed-budget")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``frontier`` command's options."""
    p.add_argument("--out", default="frontier", help="output directory")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace OUT if it holds a previous diloco-gym report or frontier",
    )
    p.add_argument("--regimes", nargs="+", help="regimes (default: bursty non-periodic sync-heavy)")
    p.add_argument(
        "--budgets",
        nargs="+",
        type=float,
        metavar="MERGES_PER_HOUR",
        default=None,
        help="the budget grid in merges per hour (default 48 60 72 96 144, a 600 s episode "
        "holds 48..192/h; with --fleet: five inside the fleet episode's feasible range; "
        "on a fleet with timing = 'rounds' a budget counts rounds)",
    )
    p.add_argument(
        "--seeds",
        type=options.positive_int(2),
        default=20,
        help="episodes per regime (>= 2 for the paired tests)",
    )
    options.add_seed0_arg(p)
    p.add_argument(
        "--draws",
        type=options.positive_int(1),
        default=1000,
        help="matched-random draws per episode and budget",
    )
    p.add_argument(
        "--budget-agents",
        nargs="+",
        help="agents run with merge_budget=M at every budget (default: "
        "causal-planner online-forecast-budget fixed-budget online-forecast "
        "calibrated-wa wa-diloco pressure-gate)",
    )
    p.add_argument(
        "--free-agents",
        nargs="+",
        help="agents run at their own merge rate (default: all heuristics)",
    )
    p.add_argument(
        "--agent",
        action="append",
        help="an extra agent for both lists: a name, a trained model .zip, or your own "
        "scheduler as module:attr or path/to/file.py:attr (docs/your-scheduler.md); "
        "repeatable",
    )
    options.add_calibration_arg(p)
    options.add_learner_calibration_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    options.add_trace_args(p)
    options.add_trust_arg(p)
    options.add_sealing_arg(p)
    options.add_backend_args(p)
    options.add_holm_arg(p, "regime x budget x agent of the frontier")
    options.add_fleet_arg(p)


def run(args: argparse.Namespace) -> int:
    """Run the frontier the options describe, write its directory and print each regime's
    agents that no other dominates."""
    checks.check_sandbox(args)
    if getattr(args, "fleet", None):
        return _frontier_fleet(args)
    started = time.perf_counter()
    from diloco_gym.eval import frontier as fr

    checks.check_out_dir(args.out, args.force)
    regimes = args.regimes or list(fr.FrontierConfig().regimes)
    for r in regimes:
        checks.check_regime(r)
    budget_agents, free_agents = _frontier_agents(args)
    if args.stride_s is not None and abs(args.stride_s - args.window_s) > 1e-9:
        raise UsageError(
            "frontier replays disjoint windows only (independent units): drop "
            "--stride-s or set it to --window-s"
        )
    checks.check_learner_calibration(args.learner_calibration)
    checks.warn_learner_mismatch(
        list(dict.fromkeys(budget_agents + free_agents)), args.learner_calibration
    )
    checks.check_backend(args)
    try:
        config = fr.FrontierConfig(
            regimes=regimes,
            budgets_per_hour=list(args.budgets or fr.DEFAULT_BUDGETS_PER_HOUR),
            budget_agents=budget_agents,
            free_agents=free_agents,
            **options.protocol_options(args),
            **options.replay_options(args, stride=False),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result, out = _run_and_write(args, config)
    for regime in config.regimes:
        d = result["dominance"]
        d = d[d["regime"] == regime] if not d.empty else d
        print(f"{regime}: not dominated: {', '.join(fr.undominated(d)) if not d.empty else '-'}")
    print(
        f"\nfrontier written to {out}/ (frontier.md, frontier.csv, curves.csv, frontier.json, "
        f"figures) in {time.perf_counter() - started:.1f} s"
    )
    return 0


def _run_and_write(args: argparse.Namespace, config: Any) -> tuple[Any, Any]:
    """Run the frontier and write its directory: a trace too short for its windows is the
    data's fault; Ctrl-C leaves ``--out`` as it was."""
    from diloco_gym.eval import frontier as fr
    from diloco_gym.sim.traces import TraceFormatError

    command = command_line()
    try:
        result = fr.run_frontier(
            config,
            progress=not args.no_progress,
            **options.backend_kwargs(args),
        )
        out = fr.write_frontier(result, args.out, force=args.force, command=command)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    except TraceFormatError:
        raise
    except ValueError as exc:
        if args.trace and args.trace in str(exc):
            raise DataError(str(exc)) from None
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; no frontier written ({args.out} left as it was)") from None
    return result, out


def _frontier_agents(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The frontier's budget agents and free agents, each checked: ``--agent`` adds to both
    lists (the defaults too; an agent already listed stays once), a budget-aware ``--agent``
    (it needs a merge budget) to the budget grid only."""
    from diloco_gym.agents.registry import HEURISTICS, is_budget_aware_spec
    from diloco_gym.eval.frontier import DEFAULT_BUDGET_AGENTS

    extra = list(args.agent or [])
    for a in extra:  # loaded (your own code) and checked before asking it for its budget
        checks.check_agent(a)
    budget_agents = list(dict.fromkeys(list(args.budget_agents or DEFAULT_BUDGET_AGENTS) + extra))
    extra_free = [a for a in extra if not is_budget_aware_spec(a)]
    free_agents = list(dict.fromkeys(list(args.free_agents or HEURISTICS) + extra_free))
    for a in budget_agents + free_agents:
        checks.check_agent(a)
    checks.check_single_host(budget_agents + free_agents)
    return budget_agents, free_agents


def _frontier_fleet(args: argparse.Namespace) -> int:
    """``frontier --fleet FILE``: the budget frontier on a fleet (:func:`run_frontier` of a
    :class:`~diloco_gym.eval.fleet_frontier.FleetFrontierConfig`)."""
    from diloco_gym.eval.fleet_frontier import (
        FleetFrontierConfig,
        comparison_lines,
        free_lines,
        frontier_table,
    )
    from diloco_gym.eval.frontier import run_frontier, write_frontier

    started = time.perf_counter()
    if args.regimes or args.trace:
        raise UsageError("--fleet replaces --regimes and --trace (the sites are in FILE)")
    if args.learner_calibration:
        raise UsageError(
            "--learner-calibration is not used with --fleet (the fleet's learners are its own)"
        )
    checks.check_no_fleet_options(args, parallel=True)
    checks.check_backend(args)
    agents, free_agents = _fleet_agents(args)
    checks.check_out_dir(args.out, args.force)
    budgets = fleet_budgets(args)
    report = fleet_report_config(args, agents)
    try:
        config = FleetFrontierConfig(report=report, budgets=budgets, free_agents=free_agents)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result, out = fleet_job(
        args,
        lambda: run_frontier(
            config,
            progress=not args.no_progress,
            **options.backend_kwargs(args),
        ),
        lambda res, cmd: write_frontier(res, args.out, force=args.force, command=cmd),
        "frontier",
    )
    print(frontier_table(result["frontier"], result["fleet"]["worst_site_weight"]))
    compared = comparison_lines(result["pairwise"], result["dominance"])
    compared += free_lines(result["free"], result["fleet"])
    if compared:
        print("\n" + "\n".join(compared).rstrip())
    print(
        f"\nfleet frontier written to {out}/ (frontier.md, .csv, .json, .png) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


def _fleet_agents(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """A fleet frontier's budget agents (``--budget-agents``, default
    :data:`FLEET_FRONTIER_AGENTS`) and free agents (``--free-agents``, default every
    heuristic), each checked; ``--agent`` adds to both lists, a budget-aware one to the
    budget agents only (as on a single host)."""
    from diloco_gym.agents.registry import HEURISTICS, is_budget_aware_spec

    extra = list(args.agent or [])
    budget = list(dict.fromkeys([*(args.budget_agents or FLEET_FRONTIER_AGENTS), *extra]))
    free = list(args.free_agents or HEURISTICS)
    free += [a for a in extra if not is_budget_aware_spec(a)]
    free = list(dict.fromkeys(free))
    for a in budget + free:
        checks.check_agent(a)
    return budget, free


def fleet_budgets(args: argparse.Namespace) -> list[int]:
    """``--budgets`` (merges per hour) as fragment syncs per episode of the fleet's first
    test episode (rounded; distinct); by default five inside its feasible range. On a fleet
    with per-site timing a sync is a round (its opening rides the fleet env's merge, under
    the same corridor and ``merge_budget``), so the budgets count rounds."""
    from diloco_gym.envs.fleet import require_fixed_precision
    from diloco_gym.envs.fleet_rounds import make_fleet_env
    from diloco_gym.sim.schedules import budget_range

    try:
        env = make_fleet_env(fleet=args.fleet)
        require_fixed_precision(env.fleet, "frontier --fleet")
        env.reset(seed=args.seed0)
    except (ValueError, OSError) as exc:  # a FleetConfigError too
        raise fleet_env_error(exc) from None
    episode = env.episode
    assert episode is not None  # reset above
    duration_s = float(episode.trace.duration_s)
    lo, hi = budget_range(episode.n_decisions, env.params.h_min, env.params.h_max)
    if args.budgets is None:  # five budgets inside the fleet's own feasible range
        return sorted({int(round(m)) for m in np.linspace(lo, hi, 7)[1:-1]})
    per_episode = {b: int(round(b * duration_s / 3600.0)) for b in args.budgets}
    bad = [f"{b:g}/h ({m} syncs)" for b, m in per_episode.items() if not lo <= m <= hi]
    if bad:
        h = 3600.0 / duration_s
        raise UsageError(
            f"--budgets {', '.join(bad)} outside what the fleet's {duration_s:g} s episode "
            f"allows: {lo}..{hi} syncs per episode ({lo * h:g}..{hi * h:g} syncs/h)"
        )
    return sorted(set(per_episode.values()))
