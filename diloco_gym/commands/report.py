"""``diloco-gym report``: the calibration protocol, every regime x agent x seed against the
matched-random baseline (:mod:`diloco_gym.eval.report`), or on a fleet with ``--fleet``
(:mod:`diloco_gym.eval.fleet`)."""

from __future__ import annotations

import argparse
import sys
import time

from diloco_gym.commands import checks, options
from diloco_gym.commands.jobs import command_line, fleet_job, fleet_report_config
from diloco_gym.errors import DataError, Interrupted, UsageError
from diloco_gym.sim.regimes import REGIMES

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "the calibration protocol: all regimes x agents x seeds"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``report`` command's options."""
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
        "--agent",
        action="append",
        help="an extra agent: a name, a trained model .zip, or your own scheduler as "
        "module:attr or path/to/file.py:attr (an object with predict, a class, a factory or "
        "a function f(obs) -> action; docs/your-scheduler.md); repeatable",
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


def run(args: argparse.Namespace) -> int:
    """Run the protocol the options describe, write the report directory and print the
    summary."""
    started = time.perf_counter()
    from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
    from diloco_gym.eval.report_render import console_summary
    from diloco_gym.sim.traces import TraceFormatError

    checks.check_sandbox(args)
    checks.check_backend(args)
    checks.check_out_dir(args.out, args.force)
    agents = _report_agents(args)
    if getattr(args, "fleet", None):
        if args.regimes or args.trace:
            raise UsageError("--fleet replaces --regimes and --trace (the sites are in FILE)")
        checks.check_no_fleet_options(args, parallel=True)
        return _report_fleet(args, agents)
    regimes = args.regimes or list(REGIMES)
    for r in regimes:
        checks.check_regime(r)
    checks.check_learner_calibration(args.learner_calibration)
    checks.warn_learner_mismatch(agents, args.learner_calibration)
    try:
        config = ReportConfig(
            regimes=regimes,
            agents=agents,
            **options.protocol_options(args),
            **options.replay_options(args),
        )
        config.require_choice()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_calibration(args.calibration)
    command = command_line()
    try:
        result = run_protocol(
            config,
            progress=not args.no_progress,
            **options.backend_kwargs(args),
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
    print(console_summary(result["summary"]))
    print(
        f"\nreport written to {out}/ (report.md, results.csv, report.json, figures) "
        f"in {time.perf_counter() - started:.1f} s (episodes and statistics "
        f"{result['elapsed_s']:.1f} s)"
    )
    return 0


def _check_calibration(path: str | None) -> None:
    """Load ``--calibration`` (a bad file fails before any episode, a data error) and warn on
    stderr when it is marked incomplete or measured outside its range."""
    from diloco_gym.eval import calibration as cal

    try:
        calib = cal.load_calibration(path)
    except (ValueError, KeyError) as exc:
        raise DataError(str(exc)) from None
    if not calib.complete:
        print(
            f"diloco-gym: warning: calibration file {path} is marked incomplete "
            "(an interrupted or failed live run); verdicts rest on partial measurements",
            file=sys.stderr,
        )
    if calib.out_of_range:
        print(
            f"diloco-gym: warning: calibration file {path}: {calib.out_of_range}",
            file=sys.stderr,
        )


def _report_agents(args: argparse.Namespace) -> list[str]:
    """The report's agents (``--agents`` or every heuristic, then each ``--agent``), each
    checked and given once. Budget-aware agents are refused unless ``--fleet``'s file sets
    a merge budget in its ``[env]``."""
    from diloco_gym.agents.registry import HEURISTICS

    agents = list(HEURISTICS) if not args.agents else list(args.agents)
    agents += list(args.agent or [])
    for a in agents:
        checks.check_run_agent(a, getattr(args, "fleet", None))
    twice = sorted({a for a in agents if agents.count(a) > 1})
    if twice:
        raise UsageError(
            f"agent(s) {', '.join(map(repr, twice))} given more than once; give each agent once"
        )
    return agents


def _report_fleet(args: argparse.Namespace, agents: list[str]) -> int:
    """``report --fleet FILE``: the protocol on a fleet (:func:`run_protocol` of a
    :class:`~diloco_gym.eval.fleet.FleetReportConfig`)."""
    from diloco_gym.eval.fleet import fleet_summary_table
    from diloco_gym.eval.report import run_protocol, write_report

    started = time.perf_counter()
    checks.check_out_dir(args.out, args.force)
    config = fleet_report_config(args, agents)
    result, out = fleet_job(
        args,
        lambda: run_protocol(
            config,
            progress=not args.no_progress,
            **options.backend_kwargs(args),
        ),
        lambda res, cmd: write_report(res, args.out, force=args.force, command=cmd),
        "report",
    )
    f = result["fleet"]
    print(
        fleet_summary_table(result["summary"], f["worst_site_weight"], f["site_cap_pp"] is not None)
    )
    print(
        f"\nfleet report written to {out}/ (report.md, results.csv, report.json, figure) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0
