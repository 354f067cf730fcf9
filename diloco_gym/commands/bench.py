"""``diloco-gym bench``: the benchmark suite ``diloco-bench-v1`` (:mod:`diloco_gym.eval.bench`,
:mod:`diloco_gym.rl.bench`): entrants scored on fixed tasks, aggregated over tasks and
training seeds, and a submission validated by replay (``--validate``)."""

from __future__ import annotations

import argparse
import time

from diloco_gym.commands import checks, options
from diloco_gym.errors import DataError, Interrupted, UsageError

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "the benchmark suite: agents scored on fixed tasks (gap captured), aggregated; --validate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench`` command's options."""
    p.add_argument("--out", default="bench", help="output directory (bench.json, bench.md, ...)")
    p.add_argument("--force", action="store_true", help="replace OUT if it holds an earlier run")
    p.add_argument(
        "--baselines",
        action="store_true",
        help="add every heuristic and every registered learned agent as an entrant",
    )
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="AGENT",
        help="an entrant of one run: a registry name, a trained run directory or model .zip, "
        "or your own scheduler as module:attr or path/to/file.py:attr; repeatable",
    )
    p.add_argument(
        "--group",
        action="append",
        nargs="+",
        default=[],
        metavar=("NAME", "AGENT"),
        help="one entrant of several runs of a configuration (training seeds): NAME then "
        "its run directories or models; repeatable",
    )
    p.add_argument(
        "--baseline",
        help="the entrant the probability of improvement is against (default "
        "online-forecast-budget when it runs, else the first entrant; 'matched random' works)",
    )
    p.add_argument("--tasks", nargs="+", help="a subset: task names (bursty@72/h) or settings")
    p.add_argument("--quick", action="store_true", help="the quick mode (few seeds and draws)")
    p.add_argument("--seeds", type=options.positive_int(2), help="custom seeds per task")
    p.add_argument("--draws", type=options.positive_int(1), help="custom matched-random draws")
    p.add_argument(
        "--real-traces",
        metavar="DIR",
        help="folder holding the public real traces (default: $DILOCO_GYM_REAL_TRACES)",
    )
    p.add_argument(
        "--validate",
        metavar="SUBMISSION",
        help="replay a submission file's agents and check its claimed scores",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="largest accepted |claimed - replayed| gap captured with --validate (default 0.005)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    options.add_trust_arg(p)
    options.add_sealing_arg(p)
    options.add_backend_args(p)


def _entrants(args: argparse.Namespace) -> list:
    from diloco_gym.eval.bench import Entrant, entrant_kinds
    from diloco_gym.rl.bench import baseline_entrants

    # --baselines: the registry's agents that run on some task of the suite (an agent
    # that needs a capped fleet, such as cap-aware-forecast, runs on none)
    base = baseline_entrants() if args.baselines else []
    out = [e for e in base if all(entrant_kinds(a) for a in e.agents)]
    for a in args.agent:
        checks.check_agent(a)
        out.append(Entrant(a, (a,)))
    for g in args.group:
        if len(g) < 2:
            raise UsageError(f"--group {' '.join(g)}: give NAME then at least one agent")
        for a in g[1:]:
            checks.check_agent(a)
        out.append(Entrant(g[0], tuple(g[1:])))
    if not out:
        raise UsageError("give entrants: --baselines, --agent AGENT or --group NAME AGENT...")
    names = [e.name for e in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"entrant {twice[0]!r} given twice; give each entrant once")
    return out


def run(args: argparse.Namespace) -> int:
    """Run the suite on the entrants (or validate a submission) and write OUT."""
    from diloco_gym.eval.bench import BenchError, mode_for

    checks.check_sandbox(args)
    checks.check_backend(args)
    started = time.perf_counter()
    try:
        if args.validate:
            return _validate(args)
        if args.tolerance is not None:
            raise UsageError("--tolerance goes with --validate")
        checks.check_out_dir(args.out, args.force)
        mode = mode_for("quick" if args.quick else "full", args.seeds, args.draws)
        entrants = _entrants(args)
        from diloco_gym.commands.jobs import command_line
        from diloco_gym.rl.bench import render_markdown, run_bench, write_bench

        doc = run_bench(
            entrants, tasks=args.tasks, mode=mode, baseline=args.baseline,
            in_process=args.in_process_agents, real_traces=args.real_traces,
            progress=not args.no_progress, backend=args.backend, jobs=args.jobs,
            ray_address=args.ray_address,
        )  # fmt: skip
        out = write_bench(doc, args.out, force=args.force, command=command_line())
    except BenchError as exc:
        raise DataError(str(exc)) if args.validate else UsageError(str(exc)) from None
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; nothing written ({args.out} left as it was)") from None
    aggregate = render_markdown(doc).split("## Tasks")[0].split("## Aggregate")[1]
    print(aggregate.strip())
    print(
        f"\nbench written to {out}/ (bench.md, bench.json, bench.png, submission.json) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    """``--validate FILE``: replay and compare; exit 1 with one line on a mismatch."""
    from diloco_gym.eval.bench import BenchError
    from diloco_gym.rl.bench import DEFAULT_TOLERANCE, validate_submission

    if args.agent or args.group or args.baselines or args.quick or args.seeds or args.draws:
        raise UsageError(
            "--validate takes the entrants and the mode from the submission file; "
            "drop --agent, --group, --baselines, --quick, --seeds and --draws"
        )
    tol = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if not tol >= 0:
        raise UsageError(f"--tolerance must be >= 0, got {tol}")
    try:
        res = validate_submission(
            args.validate, tasks=args.tasks, tolerance=tol,
            in_process=args.in_process_agents, real_traces=args.real_traces,
            progress=not args.no_progress,
        )  # fmt: skip
    except BenchError as exc:
        raise DataError(str(exc)) from None
    print(
        f"{args.validate}: valid: {res['checked']} claimed score(s) on {len(res['tasks'])} "
        f"task(s) match the replay within {tol:g}"
    )
    return 0
