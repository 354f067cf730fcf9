"""The ``diloco-gym`` command line: run, report, train, calibrate.

Failure handling: every command reports a user error as one line on stderr,
``diloco-gym: <what is wrong>``, and exits with status 2 for a usage error (a bad option
value, an unknown name, an output directory it refuses to replace), 1 for a data error (a
missing, unreadable or malformed trace, calibration or model file, a trace too short for
an episode) and 130 when interrupted by Ctrl-C; never a Python traceback. Unexpected
internal errors also print one line, naming the exception; set ``DILOCO_GYM_TRACEBACK=1``
to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from diloco_gym.commands import calibrate_learners, checks, options, sweep, tune
from diloco_gym.commands.extras import missing_extra
from diloco_gym.errors import CLIError, DataError, Interrupted, UsageError
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.text import count

__all__ = ["main", "CLIError", "UsageError", "DataError", "Interrupted", "CLIExit", "exit_status"]

#: Trace formats of ``--format`` (kept in step with :data:`diloco_gym.sim.loaders.FORMATS`).
TRACE_FORMATS = options.TRACE_FORMATS


#: The commands with a module of their own under :mod:`diloco_gym.commands`, in ``--help``'s
#: order: each module has ``HELP`` (its line in ``diloco-gym --help``),
#: ``add_arguments(parser)`` and ``run(args) -> int``.
COMMANDS = (("sweep", sweep), ("tune", tune), ("calibrate-learners", calibrate_learners))


class CLIExit(SystemExit):
    """Raised by :func:`main` after it printed an error line: ``code`` is the exit status
    and ``str()`` the message (so ``pytest.raises(SystemExit, match=...)`` sees it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def exit_status(exc: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message for an exception a command raised.

    The order matters: ``TraceFormatError`` is a ``ValueError`` (data, 1) and a bare
    ``ValueError`` is a parameter that failed validation (usage, 2).
    """
    from diloco_gym.sim.traces import TraceFormatError

    try:
        from diloco_gym.live.errors import CalibrationError
    except ImportError:  # pragma: no cover - part of the package
        CalibrationError = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(exc, CLIError):
        return exc.exit_code, str(exc)
    from diloco_gym.sim.learner_calibration import LearnerCalibrationError

    if isinstance(exc, (TraceFormatError, CalibrationError, LearnerCalibrationError)):
        return 1, str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "pyarrow":  # the parquet extra
        return 1, str(exc)
    if isinstance(exc, OSError):
        if exc.strerror and exc.filename:
            return 1, f"{exc.filename}: {exc.strerror}"
        return 1, str(exc)
    if isinstance(exc, KeyError):
        return 1, str(exc.args[0]) if exc.args else repr(exc)
    if isinstance(exc, MemoryError):
        return 1, (
            "out of memory; an input implies more than this machine holds (see the "
            "README's failure handling for the size limits)"
        )
    if isinstance(exc, ValueError):
        return 2, str(exc)
    return 1, (
        f"internal error: {type(exc).__name__}: {exc} "
        f"(set DILOCO_GYM_TRACEBACK=1 to see the traceback)"
    )


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show a trace loader's warning (rows deliberately left out) as one line,
    ``diloco-gym: warning: ...``; other warnings keep Python's format."""
    from diloco_gym.sim.loaders import TraceFilterWarning

    if issubclass(category, TraceFilterWarning):
        print(f"diloco-gym: warning: {_one_line(str(message))}", file=file or sys.stderr)
        return
    _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


def _one_line(msg: str) -> str:
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


def _replay_options(args: argparse.Namespace, stride: bool = True) -> dict[str, Any]:
    """The trace, window and load options a protocol config takes from the command line
    (``stride``: the config has ``stride_s``; the frontier replays disjoint windows only)."""
    opts: dict[str, Any] = {
        "trace": args.trace,
        "trace_format": args.trace_format,
        "window_s": args.window_s,
        "sidecar": args.sidecar,
        "rate_scale": args.rate_scale,
        "target_utilization": args.target_utilization,
    }
    if stride:
        opts["stride_s"] = args.stride_s
    return opts


def cmd_run(args: argparse.Namespace) -> int:
    from diloco_gym.eval.rollout import is_deployable, run_episode

    if getattr(args, "fleet", None):
        return _run_fleet(args)
    if not args.trace:
        checks.check_regime(args.regime)
    checks.check_free_agent(args.agent)
    agent = checks.load_agent(args.agent)
    if not args.in_process_agents:
        from diloco_gym.eval.sealed import seal_agents

        agent = seal_agents([agent])[0]
    from diloco_gym.eval.report import ReportConfig
    from diloco_gym.eval.units import synthetic_units, trace_units

    # The same units as the report: seeds of a regime at the chosen load, or the trace's
    # tiled windows (one episode per window; --seeds is then unused).
    try:
        # The synthetic regime is ignored with --trace (its windows are the units).
        config = ReportConfig(
            regimes=[args.regime],
            agents=[args.agent],
            seeds=max(args.seeds, 2),
            seed0=args.seed0,
            **_replay_options(args),
        )
    except ValueError as exc:  # an invalid option value
        raise UsageError(str(exc)) from None
    try:
        if args.trace:
            units, _ = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
            label = (
                f"{units[0].env.regime_name} ({len(units)} disjoint window"
                f"{'' if len(units) == 1 else 's'} of {args.window_s:g} s)"
                if not config.overlapping
                else f"{units[0].env.regime_name} ({len(units)} overlapping windows of "
                f"{args.window_s:g} s: not independent)"
            )
        else:
            units, _ = synthetic_units(config, args.regime, None)
            units = units[: args.seeds]
            label = args.regime
    except ValueError as exc:  # the data: a trace too short for a window
        msg = str(exc)
        if args.trace and args.trace not in msg:
            msg = f"{args.trace}: {msg}"
        raise DataError(msg) from None
    print(
        f"agent {agent.name}{'' if is_deployable(agent) else ' (non-deployable)'} on "
        f"{label}, {count(len(units), 'episode')}"
    )
    header = (
        f"{'seed':>5} {'merges/h':>8} {'sync-excess %':>13} {'p95 ms':>8} "
        f"{'violated':>8} {'excess req':>10}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for unit in units:
        seed = unit.seed
        r = run_episode(unit.env, agent, seed)
        assert unit.env.episode is not None  # run_episode() reset it
        r["merges_per_hour"] = r["merges"] * 3600.0 / unit.env.episode.trace.duration_s
        unit.env.episode = None  # streamed: only one window's episode is held at a time
        rows.append(r)
        print(
            f"{seed:>5} {r['merges_per_hour']:>8.1f} {r['sync_excess_pct']:>13.2f} "
            f"{r['p95_ms']:>8.0f} {r['violated']:>8} {r['sync_excess_requests']:>10}"
        )
    print("-" * len(header))
    print(
        f"{'total':>5} {np.mean([r['merges_per_hour'] for r in rows]):>8.1f} "
        f"{np.mean([r['sync_excess_pct'] for r in rows]):>13.2f} "
        f"{np.mean([r['p95_ms'] for r in rows]):>8.0f} {sum(r['violated'] for r in rows):>8} "
        f"{sum(r['sync_excess_requests'] for r in rows):>10}"
    )
    print(
        "(total row: merges/h, sync-excess % and p95 are means over episodes; violated and "
        "excess requests are sums)"
    )
    return 0


def _fleet_env_error(exc: Exception) -> CLIError:
    """A fleet configuration error as the CLI's error: a bad file is a data error."""
    return DataError(str(exc))


def _run_fleet(args: argparse.Namespace) -> int:
    """``run --fleet FILE``: one agent on fleet episodes, per-seed table with each site's
    sync-excess (:mod:`diloco_gym.envs.fleet`)."""
    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.envs.fleet import DiLoCoFleetEnv, require_fixed_precision
    from diloco_gym.eval.rollout import is_deployable, run_episode

    if args.trace:
        raise UsageError("--fleet replaces --trace (the sites are in FILE)")
    _no_fleet_options(args)
    checks.check_free_agent(args.agent)
    agent = fleet_agent(checks.load_agent(args.agent))
    if not args.in_process_agents:
        from diloco_gym.eval.sealed import seal_agents

        agent = seal_agents([agent])[0]
    try:
        env = DiLoCoFleetEnv(fleet=args.fleet)
        require_fixed_precision(env.fleet, "run --fleet")
    except ValueError as exc:  # a FleetConfigError too
        raise _fleet_env_error(exc) from None
    names = env.setup.site_names
    print(
        f"agent {agent.name}{'' if is_deployable(agent) else ' (non-deployable)'} on fleet "
        f"{args.fleet} ({len(names)} sites, F={env.fleet.fragments}, {env.fleet.bits}-bit, "
        f"sync window {env.setup.plan.window_s:.2f} s), {args.seeds} episodes"
    )
    header = f"{'seed':>5} {'syncs/h':>8} {'sync-excess %':>13} {'worst site %':>12}  " + " ".join(
        f"{n[:10]:>10}" for n in names
    )
    print(header)
    print("-" * len(header))
    for seed in range(args.seed0, args.seed0 + args.seeds):
        r = run_episode(env, agent, seed)
        assert env.episode is not None  # run_episode() reset it
        per_h = r["merges"] * 3600.0 / env.episode.trace.duration_s
        sites = " ".join(f"{x['sync_excess_pct']:>10.2f}" for x in r["sites"])
        print(
            f"{seed:>5} {per_h:>8.1f} {r['sync_excess_pct']:>13.2f} "
            f"{r['worst_site_sync_excess_pct']:>12.2f}  {sites}"
        )
    print("(sync-excess: pp of all the fleet's requests; per site: pp of the site's requests)")
    return 0


def _no_fleet_options(args: argparse.Namespace) -> None:
    """Options a fleet run does not use are a usage error, not silently dropped."""
    unused = {
        "--backend": getattr(args, "backend", "serial") != "serial",
        "--jobs": getattr(args, "jobs", None) is not None,
        "--ray-address": getattr(args, "ray_address", None) is not None,
        "--stride-s": getattr(args, "stride_s", None) is not None,
        "--sidecar": getattr(args, "sidecar", None) is not None,
        "--rate-scale": getattr(args, "rate_scale", None) is not None,
        "--target-utilization": getattr(args, "target_utilization", None) is not None,
        "--format": getattr(args, "trace_format", "auto") != "auto",
        "--window-s": getattr(args, "window_s", 600.0) != 600.0,
        "--holm-across-settings": bool(getattr(args, "holm_across_settings", False)),
    }
    given = [k for k, v in unused.items() if v]
    if given:
        raise UsageError(
            f"{', '.join(given)} not used with --fleet (a fleet runs serially; its sites, "
            f"windows and loads are set in the fleet file)"
        )


def _fleet_job(args: argparse.Namespace, run: Any, write: Any, what: str) -> tuple[Any, Any]:
    """Run a fleet job and write its directory (``write(result, command)``): a bad fleet
    file or value is a data error; Ctrl-C leaves ``--out`` as it was."""
    from diloco_gym.sim.fleet import FleetConfigError

    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        result = run()
        return result, write(result, command)
    except (FleetConfigError, ValueError, KeyError) as exc:
        msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise DataError(msg) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; no {what} written ({args.out} left as it was)") from None


def _report_fleet(args: argparse.Namespace, agents: list[str]) -> int:
    """``report --fleet FILE``: the protocol on a fleet (:mod:`diloco_gym.eval.fleet`)."""
    from diloco_gym.eval.fleet import (
        FleetReportConfig,
        fleet_summary_table,
        run_fleet_report,
        write_fleet_report,
    )
    from diloco_gym.eval.report import prepare_out_dir

    started = time.perf_counter()
    try:
        prepare_out_dir(args.out, args.force)
    except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(str(exc)) from None
    try:
        config = FleetReportConfig(
            fleet=args.fleet,
            agents=agents,
            seeds=args.seeds,
            seed0=args.seed0,
            draws=args.draws,
            calibration=args.calibration,
            in_process_agents=args.in_process_agents,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result, out = _fleet_job(
        args,
        lambda: run_fleet_report(config, progress=not args.no_progress),
        lambda res, cmd: write_fleet_report(res, args.out, force=args.force, command=cmd),
        "report",
    )
    print(fleet_summary_table(result["summary"]))
    print(
        f"\nfleet report written to {out}/ (report.md, results.csv, report.json) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


def _report_agents(args: argparse.Namespace) -> list[str]:
    """The report's agents (``--agents`` or every heuristic, then each ``--agent``), each
    checked and given once."""
    from diloco_gym.agents.registry import HEURISTICS

    agents = list(HEURISTICS) if not args.agents else list(args.agents)
    agents += list(args.agent or [])
    for a in agents:
        checks.check_free_agent(a)
    twice = sorted({a for a in agents if agents.count(a) > 1})
    if twice:
        raise UsageError(
            f"agent(s) {', '.join(map(repr, twice))} given more than once; give each agent once"
        )
    return agents


def cmd_report(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from diloco_gym.eval import calibration as cal
    from diloco_gym.eval.report import ReportConfig, prepare_out_dir, run_protocol, write_report
    from diloco_gym.sim.traces import TraceFormatError

    checks.check_backend(args)
    try:
        prepare_out_dir(args.out, args.force)
    except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(str(exc)) from None
    agents = _report_agents(args)
    if getattr(args, "fleet", None):
        if args.regimes or args.trace:
            raise UsageError("--fleet replaces --regimes and --trace (the sites are in FILE)")
        _no_fleet_options(args)
        return _report_fleet(args, agents)
    regimes = args.regimes or list(REGIMES)
    for r in regimes:
        checks.check_regime(r)
    checks.check_learner_calibration(args.learner_calibration)
    try:
        config = ReportConfig(
            regimes=regimes,
            agents=agents,
            seeds=args.seeds,
            seed0=args.seed0,
            draws=args.draws,
            calibration=args.calibration,
            in_process_agents=args.in_process_agents,
            learner_calibration=args.learner_calibration,
            holm_across_settings=args.holm_across_settings,
            **_replay_options(args),
        )
        config.require_choice()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        calib = cal.load_calibration(args.calibration)  # a bad file fails before any episode
    except (ValueError, KeyError) as exc:
        raise DataError(str(exc)) from None
    if not calib.complete:
        print(
            f"diloco-gym: warning: calibration file {args.calibration} is marked incomplete "
            "(an interrupted or failed live run); verdicts rest on partial measurements",
            file=sys.stderr,
        )
    if calib.out_of_range:
        print(
            f"diloco-gym: warning: calibration file {args.calibration}: {calib.out_of_range}",
            file=sys.stderr,
        )
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        result = run_protocol(
            config,
            progress=not args.no_progress,
            backend=args.backend,
            jobs=args.jobs,
            ray_address=args.ray_address,
        )
        out = write_report(result, args.out, force=args.force, command=command)
    except TraceFormatError:
        raise
    except (ValueError, KeyError) as exc:  # the data: a trace too short, a regime missing
        msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        if args.trace and isinstance(exc, ValueError) and args.trace not in msg:
            msg = f"{args.trace}: {msg}"
        raise DataError(msg) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; no report written ({args.out} left as it was)") from None
    from diloco_gym.eval.report import console_summary

    print(console_summary(result["summary"]))
    print(
        f"\nreport written to {out}/ (report.md, results.csv, report.json, figures) "
        f"in {time.perf_counter() - started:.1f} s (episodes and statistics "
        f"{result['elapsed_s']:.1f} s)"
    )
    return 0


#: The agents of ``frontier --fleet`` when none are named: they keep to a merge budget.
FLEET_FRONTIER_AGENTS = ("online-forecast-budget", "fixed-budget")


def _fleet_budgets(args: argparse.Namespace) -> list[int]:
    """``--budgets`` (merges per hour) as fragment syncs per episode of the fleet's first
    test episode (rounded; distinct); by default five inside its feasible range."""
    from diloco_gym.envs.fleet import DiLoCoFleetEnv, require_fixed_precision
    from diloco_gym.sim.schedules import budget_range

    try:
        env = DiLoCoFleetEnv(fleet=args.fleet)
        require_fixed_precision(env.fleet, "frontier --fleet")
        env.reset(seed=args.seed0)
    except (ValueError, OSError) as exc:  # a FleetConfigError too
        raise _fleet_env_error(exc) from None
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


def _frontier_fleet(args: argparse.Namespace) -> int:
    """``frontier --fleet FILE``: the budget frontier on a fleet
    (:mod:`diloco_gym.eval.fleet_frontier`)."""
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.fleet_frontier import (
        FleetFrontierConfig,
        frontier_table,
        run_fleet_frontier,
        write_fleet_frontier,
    )
    from diloco_gym.eval.report import prepare_out_dir

    started = time.perf_counter()
    if args.regimes or args.trace:
        raise UsageError("--fleet replaces --regimes and --trace (the sites are in FILE)")
    if args.free_agents or args.learner_calibration:
        raise UsageError(
            "--free-agents and --learner-calibration are not used with --fleet (every "
            "agent runs at each budget)"
        )
    _no_fleet_options(args)
    agents = list(
        dict.fromkeys([*(args.budget_agents or FLEET_FRONTIER_AGENTS), *(args.agent or [])])
    )
    for a in agents:
        checks.check_agent(a)
    try:
        prepare_out_dir(args.out, args.force)
    except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(str(exc)) from None
    budgets = _fleet_budgets(args)
    try:
        report = FleetReportConfig(
            fleet=args.fleet,
            agents=agents,
            seeds=args.seeds,
            seed0=args.seed0,
            draws=args.draws,
            calibration=args.calibration,
            in_process_agents=args.in_process_agents,
        )
        config = FleetFrontierConfig(report=report, budgets=budgets)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result, out = _fleet_job(
        args,
        lambda: run_fleet_frontier(config, progress=not args.no_progress),
        lambda res, cmd: write_fleet_frontier(res, args.out, force=args.force, command=cmd),
        "frontier",
    )
    print(frontier_table(result["frontier"]))
    print(
        f"\nfleet frontier written to {out}/ (frontier.md, .csv, .json, .png) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


def _frontier_agents(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The frontier's budget agents and free agents, each checked: ``--agent`` adds to both
    lists (the defaults too; an agent already listed stays once), a budget-aware ``--agent``
    (it needs a merge budget) to the budget grid only."""
    from diloco_gym.agents.registry import HEURISTICS, is_budget_aware_spec
    from diloco_gym.eval.frontier import DEFAULT_BUDGET_AGENTS

    extra = list(args.agent or [])
    budget_agents = list(dict.fromkeys(list(args.budget_agents or DEFAULT_BUDGET_AGENTS) + extra))
    extra_free = [a for a in extra if not is_budget_aware_spec(a)]
    free_agents = list(dict.fromkeys(list(args.free_agents or HEURISTICS) + extra_free))
    for a in budget_agents + free_agents:
        checks.check_agent(a)
    return budget_agents, free_agents


def cmd_frontier(args: argparse.Namespace) -> int:
    """``diloco-gym frontier``: sync-excess against merge rate, agents compared at equal
    budgets (:mod:`diloco_gym.eval.frontier`)."""
    if getattr(args, "fleet", None):
        return _frontier_fleet(args)
    started = time.perf_counter()
    from diloco_gym.eval import frontier as fr
    from diloco_gym.eval.report import prepare_out_dir

    try:
        prepare_out_dir(args.out, args.force)
    except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(str(exc)) from None
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
    checks.check_backend(args)
    try:
        config = fr.FrontierConfig(
            regimes=regimes,
            budgets_per_hour=list(args.budgets or fr.DEFAULT_BUDGETS_PER_HOUR),
            budget_agents=budget_agents,
            free_agents=free_agents,
            seeds=args.seeds,
            seed0=args.seed0,
            draws=args.draws,
            calibration=args.calibration,
            in_process_agents=args.in_process_agents,
            learner_calibration=args.learner_calibration,
            holm_across_settings=args.holm_across_settings,
            **_replay_options(args, stride=False),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from diloco_gym.sim.traces import TraceFormatError

    try:
        result = fr.run_frontier(
            config,
            progress=not args.no_progress,
            backend=args.backend,
            jobs=args.jobs,
            ray_address=args.ray_address,
        )
        out = fr.write_frontier(result, args.out, force=args.force, command=command)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    except TraceFormatError:
        raise
    except ValueError as exc:  # a trace too short for its windows is the data's fault
        if args.trace and args.trace in str(exc):
            raise DataError(str(exc)) from None
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; no frontier written ({args.out} left as it was)") from None
    for regime in config.regimes:
        d = result["dominance"]
        d = d[d["regime"] == regime] if not d.empty else d
        print(f"{regime}: not dominated: {', '.join(fr.undominated(d)) if not d.empty else '-'}")
    print(
        f"\nfrontier written to {out}/ (frontier.md, frontier.csv, curves.csv, frontier.json, "
        f"figures) in {time.perf_counter() - started:.1f} s"
    )
    return 0


def _close_progress_bars() -> None:
    """Close open tqdm bars now, so that their last redraw (at garbage collection) does not
    land after the one-line message."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def cmd_train(args: argparse.Namespace) -> int:
    try:
        from diloco_gym.rl.train import run_train_command
    except ImportError as exc:
        raise missing_extra("train", ["rl"], exc) from None
    return run_train_command(args)


def _version() -> str:
    import diloco_gym

    return diloco_gym.__version__


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The one place a default is printed, for every command: appends ``(default: X)`` only
    where it informs: not when the help already states the default (so no option shows it
    twice), not for a required option, a ``None`` or suppressed default or an on/off flag."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or action.required
            or action.default is None
            or action.default is argparse.SUPPRESS
            or isinstance(action.default, bool)
        ):
            return text
        return super()._get_help_string(action)


def _add_commands(sub: Any, fmt: type[argparse.HelpFormatter], table: Any) -> None:
    """Register each (name, module) of ``table`` as a sub-command."""
    for name, module in table:
        p = sub.add_parser(name, help=module.HELP, formatter_class=fmt)
        module.add_arguments(p)
        p.set_defaults(func=module.run)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``diloco-gym`` parser. ``train`` and ``calibrate`` take their options from modules
    that import stable-baselines3 and torch (seconds): given the ``command`` being run, the
    other commands' parsers leave them out, so ``report`` and ``--help`` start fast."""
    parser = _Parser(
        prog="diloco-gym",
        description="Schedule DiLoCo outer merges on hosts shared with LLM serving, and judge "
        "schedulers against a matched-random baseline.",
        epilog="Exit status: 0 success, 1 a data error (missing or malformed trace, "
        "calibration or model file), 2 a usage error, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = _HelpFormatter
    _add_run_command(sub, fmt)
    _add_report_command(sub, fmt)
    _add_frontier_command(sub, fmt)
    _add_commands(sub, fmt, COMMANDS[:2])
    _add_train_command(sub, command, fmt)
    _add_calibrate_command(sub, command, fmt)
    _add_commands(sub, fmt, COMMANDS[2:])
    return parser


def _add_run_command(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``run`` command's options."""
    p = sub.add_parser(
        "run", help="run one agent on a regime or a trace, per-seed table", formatter_class=fmt
    )
    p.add_argument("--agent", required=True, help="agent name or trained model .zip")
    p.add_argument("--regime", default="bursty", help=f"one of {', '.join(REGIMES)}")
    p.add_argument("--seeds", type=options.positive_int(1), default=20, help="number of episodes")
    options.add_seed0_arg(p)
    options.add_trace_args(p)
    options.add_trust_arg(p)
    options.add_sealing_arg(p)
    options.add_fleet_arg(p)
    p.set_defaults(func=cmd_run)


def _add_report_command(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``report`` command's options."""
    p = sub.add_parser(
        "report", help="the calibration protocol: all regimes x agents x seeds", formatter_class=fmt
    )
    p.add_argument("--out", default="report", help="report directory")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace OUT if it holds a previous diloco-gym report (never the "
        "current, home or root directory, nor a directory of other files)",
    )
    p.add_argument(
        "--seeds",
        type=options.positive_int(2),
        default=20,
        help="episodes per regime (>= 2 for the paired test)",
    )
    options.add_seed0_arg(p)
    p.add_argument(
        "--draws",
        type=options.positive_int(1),
        default=1000,
        help="matched-random draws per episode",
    )
    p.add_argument("--regimes", nargs="+", help="subset of regimes (default: all)")
    p.add_argument("--agents", nargs="+", help="heuristic agents (default: all)")
    p.add_argument(
        "--agent", action="append", help="an extra agent (name or trained model .zip); repeatable"
    )
    options.add_calibration_arg(p)
    options.add_learner_calibration_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    options.add_backend_args(p)
    options.add_trace_args(p)
    options.add_trust_arg(p)
    options.add_sealing_arg(p)
    options.add_holm_arg(p, "regime x agent of the report")
    options.add_fleet_arg(p)
    p.set_defaults(func=cmd_report)


def _add_frontier_command(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``frontier`` command's options."""
    p = sub.add_parser(
        "frontier",
        help="sync-excess vs merge rate: agents compared at equal "
        "merge budgets, with the oracle's and matched random's curves",
        formatter_class=fmt,
    )
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
        "holds 48..192/h; with --fleet: five inside the fleet episode's feasible range)",
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
        "online-forecast-budget fixed-budget online-forecast calibrated-wa "
        "wa-diloco pressure-gate)",
    )
    p.add_argument(
        "--free-agents",
        nargs="+",
        help="agents run at their own merge rate (default: all heuristics)",
    )
    p.add_argument(
        "--agent",
        action="append",
        help="an extra agent (name or trained model .zip) for both lists; repeatable",
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
    p.set_defaults(func=cmd_frontier)


def _add_train_command(sub: Any, command: str | None, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``train`` command's options."""
    p = sub.add_parser(
        "train", help="train an RL scheduler with stable-baselines3", formatter_class=fmt
    )
    p.set_defaults(func=cmd_train)
    add_train_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    if command in (None, "train"):
        try:
            from diloco_gym.rl.train import add_train_arguments
        except ImportError:  # no rl extra: main() says so before parsing
            pass
    if add_train_arguments is not None:
        add_train_arguments(p)
    else:
        p.add_argument("rest", nargs=argparse.REMAINDER)


def _add_calibrate_command(
    sub: Any, command: str | None, fmt: type[argparse.HelpFormatter]
) -> None:
    """The ``calibrate`` command's options."""
    p = sub.add_parser(
        "calibrate",
        help="measure real merge interference on a serving endpoint",
        formatter_class=fmt,
    )
    if command in (None, "calibrate"):
        try:
            from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command

            add_calibrate_arguments(p)
            p.set_defaults(func=run_calibrate_command)
        except ImportError as exc:
            error = missing_extra("calibrate", ["live"], exc)

            def unavailable(_args: argparse.Namespace) -> int:
                raise error

            p.set_defaults(func=unavailable)


def main(argv: list[str] | None = None) -> int:
    """Run one ``diloco-gym`` command.

    Returns:
        The command's exit status (0 on success).

    Raises:
        SystemExit: on any error, after printing one line on stderr (a :class:`CLIExit`
            whose ``code`` is 2 for usage errors, 1 for data errors, 130 for Ctrl-C), or
            argparse's own exit for ``--help``, ``--version`` and unparsable options.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["train"] and "-h" not in argv and "--help" not in argv:
            try:
                import diloco_gym.rl.train  # noqa: F401
            except ImportError as exc:  # the rl extra is missing: say so before argparse
                raise missing_extra("train", ["rl"], exc) from None
        parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else "")
        args = parser.parse_args(argv)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # restored when the command ends
            if not getattr(args, "trust_model_file", False):
                return int(args.func(args) or 0)
            from diloco_gym.agents.learned import TRUST_ENV

            before = os.environ.get(TRUST_ENV)
            os.environ[TRUST_ENV] = "1"  # worker processes inherit it
            try:
                return int(args.func(args) or 0)
            finally:
                if before is None:
                    os.environ.pop(TRUST_ENV, None)
                else:
                    os.environ[TRUST_ENV] = before
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: B036 - Ctrl-C included: one line, no traceback
        if os.environ.get("DILOCO_GYM_TRACEBACK") and not isinstance(exc, KeyboardInterrupt):
            raise
        code, msg = exit_status(exc)
        msg = _one_line(msg)
        _close_progress_bars()
        print(f"diloco-gym: {msg}", file=sys.stderr)
        raise CLIExit(code, f"diloco-gym: {msg}") from None
    finally:
        if "diloco_gym.eval.outlock" in sys.modules:  # a refused or failed run unlocks too
            sys.modules["diloco_gym.eval.outlock"].release_out_locks()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
