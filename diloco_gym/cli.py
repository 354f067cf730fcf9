"""The ``diloco-gym`` command line: run, report, train, calibrate."""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np

from diloco_gym.regimes import REGIMES

__all__ = ["main"]


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", help="replay this trace file instead of a synthetic regime")
    p.add_argument("--format", default="auto", dest="trace_format",
                   help="trace format: auto, native, azure, mooncake, burstgpt")


def _check_regime(name: str) -> str:
    if name not in REGIMES:
        raise SystemExit(f"diloco-gym: unknown regime {name!r}; valid regimes: "
                         f"{', '.join(REGIMES)}")
    return name


def cmd_run(args: argparse.Namespace) -> int:
    from agents.registry import make_agent
    from diloco_gym.env import DiLoCoSyncEnv
    from diloco_gym.rollout import run_episode

    try:
        agent = make_agent(args.agent)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"diloco-gym: {exc}") from None
    if args.trace:
        from diloco_gym.loaders import load_trace
        from diloco_gym.regimes import ReplayRegime

        tr = load_trace(args.trace, args.trace_format)
        env = DiLoCoSyncEnv(regime=ReplayRegime(tr, duration_s=min(600.0, tr.duration_s),
                                                name=tr.name,
                                                sidecar=REGIMES["sync-heavy"].sidecar))
        label = tr.name
    else:
        _check_regime(args.regime)
        env = DiLoCoSyncEnv(regime=args.regime)
        label = args.regime
    print(f"agent {agent.name} on {label}, {args.seeds} episodes")
    header = (f"{'seed':>5} {'merges':>6} {'sync-excess %':>13} {'p95 ms':>8} "
              f"{'violated':>8} {'excess req':>10}")
    print(header)
    print("-" * len(header))
    rows = []
    for seed in range(args.seed0, args.seed0 + args.seeds):
        r = run_episode(env, agent, seed)
        rows.append(r)
        print(f"{seed:>5} {r['merges']:>6} {r['sync_excess_pct']:>13.2f} {r['p95_ms']:>8.0f} "
              f"{r['violated']:>8} {r['sync_excess_requests']:>10}")
    print("-" * len(header))
    print(f"{'total':>5} {sum(r['merges'] for r in rows):>6} "
          f"{np.mean([r['sync_excess_pct'] for r in rows]):>13.2f} "
          f"{np.mean([r['p95_ms'] for r in rows]):>8.0f} {sum(r['violated'] for r in rows):>8} "
          f"{sum(r['sync_excess_requests'] for r in rows):>10}")
    print("(total row: merges, violated and excess requests are sums; sync-excess % and p95 "
          "are means over episodes)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from agents.registry import AGENTS, HEURISTICS
    from diloco_gym.report import ReportConfig, prepare_out_dir, run_protocol, write_report

    try:
        prepare_out_dir(args.out, args.force)
    except FileExistsError as exc:
        raise SystemExit(f"diloco-gym: {exc}") from None
    agents = list(HEURISTICS) if not args.agents else list(args.agents)
    agents += list(args.agent or [])
    for a in agents:
        if a not in AGENTS and not a.endswith(".zip"):
            raise SystemExit(f"diloco-gym: unknown agent {a!r}; valid agents: "
                             f"{', '.join(AGENTS)} (or a path to a trained model .zip)")
    regimes = args.regimes or list(REGIMES)
    for r in regimes:
        _check_regime(r)
    try:
        config = ReportConfig(regimes=regimes, agents=agents, seeds=args.seeds,
                              seed0=args.seed0, draws=args.draws,
                              calibration=args.calibration, trace=args.trace,
                              trace_format=args.trace_format)
        result = run_protocol(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"diloco-gym: {exc}") from None
    if not result.get("calibration_complete", True):
        print(f"diloco-gym: warning: calibration file {args.calibration} is marked incomplete "
              "(an interrupted or failed live run); verdicts rest on partial measurements",
              file=sys.stderr)
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = write_report(result, args.out, force=args.force, command=command)
    s = result["summary"]
    cols = ["regime", "agent", "merges", "sync_excess_pct", "matched_random_pct",
            "oracle_same_budget_pct", "p_value", "p_holm", "verdict"]
    with_pd = s[cols].copy()
    print(with_pd.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"\nreport written to {out}/ (report.md, results.csv, report.json, figures) "
          f"in {time.perf_counter() - started:.1f} s (episodes and statistics "
          f"{result['elapsed_s']:.1f} s)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    try:
        from diloco_gym.train import run_train_command
    except ImportError as exc:
        raise SystemExit(f"diloco-gym: training needs the 'rl' extra "
                         f"(pip install 'diloco-gym[rl]'): {exc}") from None
    return run_train_command(args)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``diloco-gym`` parser. ``train`` and ``calibrate`` take their options from modules
    that import stable-baselines3 and torch (seconds): given the ``command`` being run, the
    other commands' parsers leave them out, so ``report`` and ``--help`` start fast."""
    parser = argparse.ArgumentParser(
        prog="diloco-gym",
        description="Schedule DiLoCo outer merges on hosts shared with LLM serving, and judge "
                    "schedulers against a matched-random baseline.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run one agent on a regime or a trace, per-seed table")
    p.add_argument("--agent", required=True, help="agent name or trained model .zip")
    p.add_argument("--regime", default="bursty", help=f"one of {', '.join(REGIMES)}")
    p.add_argument("--seeds", type=int, default=20, help="number of episodes")
    p.add_argument("--seed0", type=int, default=0, help="first episode seed")
    _add_trace_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="the calibration protocol: all regimes x agents x seeds")
    p.add_argument("--out", default="report", help="report directory (default: report)")
    p.add_argument("--force", action="store_true", help="replace an existing report directory")
    p.add_argument("--seeds", type=int, default=20, help="episodes per regime (default 20)")
    p.add_argument("--seed0", type=int, default=0)
    p.add_argument("--draws", type=int, default=1000,
                   help="matched-random draws per episode (default 1000)")
    p.add_argument("--regimes", nargs="+", help="subset of regimes (default: all)")
    p.add_argument("--agents", nargs="+", help="heuristic agents (default: all)")
    p.add_argument("--agent", action="append",
                   help="an extra agent (name or trained model .zip); repeatable")
    p.add_argument("--calibration", help="real-sidecar calibration JSON (default: reference)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_trace_args(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("train", help="train an RL scheduler with stable-baselines3")
    p.set_defaults(func=cmd_train)
    add_train_arguments = None
    if command in (None, "train"):
        try:
            from diloco_gym.train import add_train_arguments
        except ImportError:  # no rl extra: main() says so before parsing
            pass
    if add_train_arguments is not None:
        add_train_arguments(p)
    else:
        p.add_argument("rest", nargs=argparse.REMAINDER)

    p = sub.add_parser("calibrate", help="measure real merge interference on a serving endpoint")
    if command in (None, "calibrate"):
        try:
            from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command

            add_calibrate_arguments(p)
            p.set_defaults(func=run_calibrate_command)
        except ImportError as exc:
            msg = str(exc)
            p.set_defaults(func=lambda _a: _unavailable("calibrate", msg))
    return parser


def _unavailable(what: str, why: str) -> int:
    print(f"diloco-gym {what} is unavailable: {why}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"] and "-h" not in argv and "--help" not in argv:
        try:
            import diloco_gym.train  # noqa: F401
        except ImportError as exc:  # the rl extra is missing: say so before argparse does
            return _unavailable("train", f"it needs the 'rl' extra "
                                         f"(pip install 'diloco-gym[rl]'): {exc}")
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else "")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
