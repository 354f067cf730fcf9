"""``diloco-gym sweep``: a resumable grid of protocol runs (:mod:`diloco_gym.scale.sweep`)."""

from __future__ import annotations

import argparse

from diloco_gym.commands import checks, options
from diloco_gym.errors import DataError, Interrupted, UsageError
from diloco_gym.text import count

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = (
    "a grid of protocol runs (regimes/traces or fleets, loads, "
    "calibrations, merge budgets, env parameters, agents), resumable"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``sweep`` command's options."""
    p.add_argument(
        "config",
        help="sweep file (TOML; YAML with PyYAML): fixed settings and "
        "a [grid] of axes (see docs/scale-out.md)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="sweep directory (default: sweep-NAME); cells already stored there "
        "are skipped, so rerunning resumes an interrupted sweep",
    )
    p.add_argument(
        "--retry-failed", action="store_true", help="run the cells stored with an error again"
    )
    p.add_argument(
        "--max-cells",
        type=options.positive_int(1),
        default=None,
        help="stop after this many cells (rerun to continue)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    options.add_backend_args(p)
    options.add_trust_arg(p)
    options.add_require_sandbox_arg(p)


def run(args: argparse.Namespace) -> int:
    from diloco_gym.scale.sweep import SweepDataError, load_sweep, run_sweep

    checks.check_backend(args)
    checks.check_sandbox(args)
    try:
        spec = load_sweep(args.config)  # a bad file (a ValueError) fails before any cell
    except SweepDataError as exc:  # a missing or malformed trace or calibration: data
        raise DataError(str(exc)) from None
    out = args.out or f"sweep-{spec.name}"
    try:
        res = run_sweep(
            spec,
            out,
            **options.backend_kwargs(args),
            progress=not args.no_progress,
            retry_failed=args.retry_failed,
            max_cells=args.max_cells,
        )
    except FileExistsError as exc:  # another sweep writes there now, or OUT is not a sweep's
        raise UsageError(str(exc)) from None
    except SweepDataError as exc:  # a point that cannot be planned on its data
        raise DataError(str(exc)) from None
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; the finished cells are stored in {out}/ (rerun to resume)"
        ) from None
    state = "complete" if res["complete"] else "incomplete (rerun to continue)"
    print(
        f"sweep {spec.name}: {count(len(spec.points), 'point')}, {res['cells']} cells: "
        f"{res['run']} run now, {res['skipped']} stored before, {res['failed']} failed; "
        f"{state}"
    )
    print(f"results in {out}/ (results.csv, results.parquet, summary.csv, summary.md, errors.csv)")
    if res["failed"]:
        raise DataError(
            f"sweep {spec.name}: {count(res['failed'], 'cell')} failed: "
            f"{res['failure_summary']} (all in {out}/errors.csv; --retry-failed runs them again)"
        )
    return 0
