"""``diloco-gym validate``: the command-line face of
:func:`~diloco_gym.live.validate.run_validation`.

Exit codes: 0 complete, 1 the run failed (partial file saved, see the message), 2 bad
arguments, 130 interrupted by Ctrl-C, 143 terminated by SIGTERM. Errors are one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from diloco_gym.errors import DataError, UsageError
from diloco_gym.live.cli import (
    add_merge_worker_arguments,
    add_server_arguments,
    sigterm_as_interrupt,
)

__all__ = ["add_validate_arguments", "run_validate_command", "held_out_setting"]


def held_out_setting(text: str) -> tuple[str, float]:
    """``SOURCE:U`` (a regime or a trace file, and a utilization) as a pair."""
    source, sep, u = text.rpartition(":")
    try:
        value = float(u)
    except ValueError:
        value = float("nan")
    if not sep or not source or not 0 < value < 10:
        raise argparse.ArgumentTypeError(
            f"--held-out {text!r}: expected SOURCE:U, a regime or trace file and a "
            f"utilization in (0, 10), e.g. bursty:0.5"
        )
    return source, value


def add_validate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``validate`` options to ``parser`` (returned for chaining)."""
    from diloco_gym.live.validate import MODES

    parser.description = (
        "Check the fitted simulator against a real serving engine with real merges, on "
        "settings the fit never saw: latency percentiles and SLO violations (fidelity), the "
        "agent-minus-matched-random verdict replayed live (verdicts), and the agent deciding "
        "live through the deployment controller (closed-loop). One session: the engine, "
        "the merge workers, one capacity probe, then the calibration and the modes. Writes "
        "a JSON document (schema-checked), a Markdown page and figures."
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="modes to run (default: all three)",
    )
    add_server_arguments(parser)
    _add_calibration_arguments(parser)
    _add_window_arguments(parser)
    _add_run_arguments(parser)
    return parser


def _configs(args: argparse.Namespace) -> tuple[Any, Any]:
    """The validation's and the session's configurations (``ValueError``: usage)."""
    from diloco_gym.live.config import CalibrationConfig
    from diloco_gym.live.engine import EngineModelConfig
    from diloco_gym.live.merges import MergeConfig
    from diloco_gym.live.probe import ProbeConfig
    from diloco_gym.live.validate import ValidateConfig

    fitted = None
    if args.calibration:
        from diloco_gym.eval.calibration import load_calibration

        fitted = load_calibration(args.calibration).fitted_sidecar
        if fitted is None:
            raise ValueError(
                f"{args.calibration}: field fitted_sidecar: the file has no fitted sidecar "
                f"(write one with diloco-gym calibrate)"
            )
    vcfg = ValidateConfig(
        modes=tuple(dict.fromkeys(args.modes)),
        calibration_source=args.calibration_regime,
        calibration_utilization=args.calibration_utilization,
        duration_s=args.duration,
        repeats=args.repeats,
        held_out=tuple(args.held_out),
        slo_ms=args.slo_ms,
        regime=args.regime,
        utilization=args.utilization,
        windows=args.windows,
        window_s=args.window_seconds,
        draws=args.draws,
        agent=args.agent,
        time_scale=args.time_scale,
        fitted=fitted,
        seed=args.seed,
    )
    engine_model = (
        EngineModelConfig.from_json(args.engine_model_config)
        if args.engine_model_config
        else EngineModelConfig()
    )
    cfg = CalibrationConfig(
        seed=args.seed,
        model=args.model,
        timeout_s=args.timeout,
        merge=MergeConfig(workers=args.workers, merge_mb=args.merge_mb, backend=args.backend),
        merge_seconds=args.merge_seconds,
        gap_seconds=tuple(args.gap_seconds),
        engine=args.engine,
        engine_model=engine_model,
        engine_threads=args.engine_threads,
        probe=ProbeConfig(step_s=args.probe_step_seconds),
        target_utilization=args.calibration_utilization,
        repeats=args.repeats,
    )
    return vcfg, cfg


def _check_sources(vcfg: Any) -> None:
    from diloco_gym.live.plan import check_source
    from diloco_gym.sim.regimes import REGIMES

    for source in vcfg.sources:
        if source not in REGIMES:
            check_source(source)


def run_validate_command(args: argparse.Namespace) -> int:
    """Run ``diloco-gym validate`` with parsed ``args``; return the exit code."""
    from diloco_gym.agents.registry import agent_names
    from diloco_gym.live.errors import CalibrationError, CalibrationTerminated
    from diloco_gym.live.validate import run_validation
    from diloco_gym.sim.traces import TraceFormatError

    try:
        vcfg, cfg = _configs(args)
        _check_sources(vcfg)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    if args.agent not in agent_names():
        raise UsageError(f"--agent {args.agent!r} is unknown; valid: {', '.join(agent_names())}")
    command = "diloco-gym validate " + shlex.join(sys.argv[2:]) if len(sys.argv) > 1 else ""
    try:
        with sigterm_as_interrupt():
            run_validation(
                args.endpoint,
                vcfg,
                cfg,
                args.out,
                command=command,
                trace_format=args.format,
                capacity_rps=args.capacity,
            )
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, CalibrationTerminated)
        print(
            f"diloco-gym: {'terminated (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'}; "
            f"partial results in {getattr(exc, 'path', '?')}",
            file=sys.stderr,
        )
        return 143 if terminated else 130
    except CalibrationError as exc:
        raise DataError(f"{exc} (partial results in {getattr(exc, 'path', '?')})") from None
    except (ValueError, TraceFormatError) as exc:
        raise UsageError(str(exc)) from None
    print(f"diloco-gym: wrote {args.out} and its Markdown page {args.out.rsplit('.', 1)[0]}.md")
    return 0


def _add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    """The calibration setting and the fidelity mode's held-out settings."""
    from diloco_gym.live.validate import HELD_OUT

    cal = parser.add_argument_group("calibration and fidelity")
    cal.add_argument(
        "--calibration",
        metavar="FILE",
        help="use this calibration file's fitted sidecar instead of calibrating in the session",
    )
    cal.add_argument(
        "--calibration-regime",
        default="sync-heavy",
        metavar="NAME",
        help="regime the sidecar is fitted on (default sync-heavy)",
    )
    cal.add_argument(
        "--calibration-utilization",
        type=float,
        default=0.5,
        metavar="U",
        help="its load, a fraction of the probed capacity (default 0.5)",
    )
    cal.add_argument(
        "--duration",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="window of the calibration and of each held-out setting (default 30)",
    )
    cal.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="control/sync phase pairs per setting (default 3)",
    )
    cal.add_argument(
        "--held-out",
        nargs="+",
        type=held_out_setting,
        default=list(HELD_OUT),
        metavar="SOURCE:U",
        help="held-out settings, a regime or trace file and a utilization (default "
        + " ".join(f"{s}:{u:g}" for s, u in HELD_OUT)
        + ")",
    )
    cal.add_argument(
        "--format",
        default="auto",
        metavar="FMT",
        help="format of trace files: auto, native, azure, mooncake, burstgpt",
    )
    cal.add_argument(
        "--slo-ms",
        type=float,
        metavar="MS",
        help="latency SLO (default: the calibration's control-phase p99)",
    )


def _add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """The verdict and closed-loop windows."""
    win = parser.add_argument_group("verdicts and closed loop")
    win.add_argument(
        "--agent",
        default="online-forecast",
        metavar="NAME",
        help="agent whose verdict is checked (default online-forecast)",
    )
    win.add_argument(
        "--regime", default="bursty", metavar="NAME", help="regime of the windows (default bursty)"
    )
    win.add_argument(
        "--utilization",
        type=float,
        default=0.3,
        metavar="U",
        help="their mean load, a fraction of the capacity (default 0.3: a bursty window "
        "reaches about twice the mean)",
    )
    win.add_argument(
        "--windows",
        type=int,
        default=8,
        metavar="K",
        help="disjoint windows, the paired units (default 8)",
    )
    win.add_argument(
        "--window-seconds",
        type=float,
        default=90.0,
        metavar="SECONDS",
        help="window length (default 90)",
    )
    win.add_argument(
        "--draws",
        type=int,
        default=2,
        metavar="M",
        help="matched-random schedules per window (default 2)",
    )
    win.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="run the env's clock X times as fast (step and merge length; "
        "default 1; below 1 for smoke runs)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The merges, the requests, the capacity, the seed and the output."""
    run = parser.add_argument_group(
        "merges and requests",
        "--merge-seconds and --gap-seconds shape the merge plans of the calibration and the "
        "held-out settings; in the windows a merge lasts the env's 57 steps (7.98 s, times "
        "--time-scale)",
    )
    add_merge_worker_arguments(run)
    run.add_argument(
        "--capacity",
        type=float,
        metavar="RPS",
        help="skip the capacity probe and take this capacity (req/s) as given",
    )
    run.add_argument(
        "--probe-step-seconds",
        type=float,
        default=8.0,
        metavar="SECONDS",
        help="step of the capacity probe (default 8)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="per-request timeout (default 30)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of windows, schedules and orders")
    run.add_argument(
        "--out",
        default="validate.json",
        metavar="FILE",
        help="document to write (default validate.json; FILE.md and figures "
        "beside it; an incomplete run writes NAME.partial.json)",
    )
