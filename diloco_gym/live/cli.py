"""``diloco-gym calibrate``: the command-line face of :func:`run_calibration`.

The main CLI wires it up with::

    sub = subparsers.add_parser("calibrate", help=...)
    add_calibrate_arguments(sub)
    ... return run_calibrate_command(args)

Exit codes: 0 complete, 1 the run failed (partial file saved, see the message),
2 bad arguments, 130 interrupted by Ctrl-C, 143 terminated by SIGTERM (partial file saved
in both). A run that does not complete writes ``NAME.partial.json`` beside ``--out
NAME.json`` and never touches ``--out`` itself. Errors are one line on stderr, never a
traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from diloco_gym.errors import DataError, UsageError

if TYPE_CHECKING:
    from diloco_gym.live.calibrate import CalibrationConfig

__all__ = [
    "add_calibrate_arguments",
    "add_merge_worker_arguments",
    "add_server_arguments",
    "run_calibrate_command",
    "sigterm_as_interrupt",
]

DEFAULT_REGIME = "sync-heavy"


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``calibrate`` options to ``parser`` (returned for chaining)."""
    parser.description = (
        "Measure real merge interference: replay a trace window open-loop against an "
        "OpenAI-compatible /v1/completions endpoint (by default a continuous-batching "
        "transformers server started here on a small local model) while real "
        "torch.distributed all-reduces and checkpoint writes run on this machine. Before "
        "the measured phases: a warm-up and a capacity probe, and the replay runs at "
        "--target-utilization of the probed capacity. Sync and no-sync control phases are "
        "repeated (--repeats) for bootstrap intervals of the effect sizes; the sidecar "
        "model is fitted and a calibration file written (usable with --calibration)."
    )
    # One helper per concern, in the order --help lists the options.
    _add_source_arguments(parser)
    add_server_arguments(parser)
    _add_load_arguments(parser)
    _add_phase_arguments(parser)
    _add_merge_arguments(parser)
    _add_output_arguments(parser)
    return parser


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The replayed trace: a regime or a trace file, and its format."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--regime",
        metavar="NAME",
        help=f"replay a window of this regime's trace (default {DEFAULT_REGIME})",
    )
    src.add_argument("--trace", metavar="FILE", help="replay a window of this trace file")
    parser.add_argument(
        "--format",
        default="auto",
        metavar="FMT",
        help="format of --trace: auto, native, azure, mooncake, burstgpt",
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server: an external endpoint, or the engine started here, and the model."""
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="http://HOST:PORT of an OpenAI-compatible server (vLLM, TGI, "
        "transformers serve, ...); without it --engine is started on 127.0.0.1",
    )
    parser.add_argument(
        "--engine",
        choices=("transformers", "builtin-fallback"),
        default="transformers",
        help="server to start without --endpoint: transformers (transformers "
        "serve --continuous-batching on a small Llama built locally from a "
        'seed; needs pip install "diloco-gym[live]") or builtin-fallback '
        "(a dependency-free server, one thread per request and no batching: "
        "not how LLM serving behaves). Default transformers",
    )
    parser.add_argument(
        "--engine-model-config",
        metavar="JSON",
        help="size of the engine's model as a JSON object (or @FILE) of "
        "vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
        "num_attention_heads, num_key_value_heads, max_position_embeddings, "
        "seed, dtype (default: a 1.4 M-parameter, 2-layer, width-128 Llama)",
    )
    parser.add_argument(
        "--engine-threads",
        type=int,
        metavar="N",
        help="torch threads of the built-in transformers engine (default: the cores "
        "the merge workers leave, at least 1; on a CPU host an engine whose threads "
        "share cores with other processes stalls unpredictably)",
    )
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="model id to request (default: the built-in model, or the first "
        "model the endpoint lists)",
    )


def _add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The offered load: window length, rate, and the capacity probe that sets it."""
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="trace window length; every sync phase and every no-sync "
        "control phase lasts this long (default 30)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="RPS",
        help="rescale the trace to this mean request rate (default: "
        "--target-utilization x the probed capacity)",
    )
    parser.add_argument(
        "--target-utilization",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="replay at this fraction of the probed capacity (default 0.5, "
        "which keeps the no-merge control inside the probe's sustainable "
        "region)",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the capacity probe (rate: --rate, else 2 req/s with a "
        "built-in engine, else the trace's own rate)",
    )
    parser.add_argument(
        "--probe-step-seconds",
        type=float,
        default=8.0,
        metavar="SECONDS",
        help="length of each step of the capacity probe's ramp (default 8)",
    )


def _add_phase_arguments(parser: argparse.ArgumentParser) -> None:
    """The phases: repeats, the overload stops, the window start."""
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="sync/control phase pairs, each pair in a seeded random order; "
        "effect sizes get bootstrap intervals over them (default 3)",
    )
    parser.add_argument(
        "--overload-inflight",
        type=int,
        metavar="N",
        help="stop the run (overload) when more requests are outstanding "
        "for longer than max(10 s, 2 x --merge-seconds), or 4x as many at "
        "any moment (default: the largest of 16, 2 x rate x "
        "--merge-seconds and 4 x rate x p95 of the probe's highest "
        "sustainable step; without a probe 64 instead of 16)",
    )
    parser.add_argument(
        "--overload-timeouts",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="stop the run (overload) when more than this fraction of a "
        "phase's answered requests timed out, after 3 (default 0.2)",
    )
    parser.add_argument(
        "--start",
        type=float,
        metavar="SECONDS",
        help="start of the trace window (default: a seeded random window)",
    )


def add_merge_worker_arguments(parser: Any) -> None:
    """The merge workers and the merge plan's timing: ``--merge-mb``, ``--workers``,
    ``--backend``, ``--merge-seconds``, ``--gap-seconds`` (shared by ``calibrate`` and
    ``validate``; ``parser`` may be an argument group)."""
    parser.add_argument(
        "--merge-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="size of the all-reduced tensor, MiB (default 64)",
    )
    parser.add_argument("--workers", type=int, default=2, help="merge worker processes (default 2)")
    parser.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="torch.distributed backend (default: nccl with CUDA, else gloo)",
    )
    parser.add_argument(
        "--merge-seconds",
        type=float,
        default=8.0,
        metavar="SECONDS",
        help="length of a merge window (default 8, the paper's)",
    )
    parser.add_argument(
        "--gap-seconds",
        type=float,
        nargs=2,
        default=(8.0, 16.0),
        metavar=("LO", "HI"),
        help="gap between merge windows, drawn uniformly (default 8 16)",
    )


def _add_merge_arguments(parser: argparse.ArgumentParser) -> None:
    """The merges: workers, tensor size, backend, schedule, control phase."""
    add_merge_worker_arguments(parser)
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="skip the no-sync control phase (halves the run; the per-token "
        "costs are then fitted on the sync phase's inactive requests)",
    )
    parser.add_argument(
        "--link-shares",
        type=float,
        nargs="+",
        default=[1.0],
        metavar="U",
        help="sync intensities to measure: link shares in (0, 1], one of them 1; with a share "
        "below 1 every repeat adds a sync phase whose merges all-reduce at that share of the "
        "full rate, and the fleet model's interference function (host_share, "
        "share_exponent) is fitted with bootstrap intervals (default: 1 only)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Requests, the failure limit, the label, the seed and the output file."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="per-request timeout (default 30)",
    )
    parser.add_argument(
        "--label",
        metavar="REGIME",
        help="regime whose entry the output file holds (default: --regime; required with --trace)",
    )
    parser.add_argument(
        "--max-failure-rate",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="a run in which more than this fraction of the sent requests "
        "failed (refused, timed out, HTTP errors, or HTTP 200 answers that are "
        "not a completion) is incomplete (default 0.5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of window, trace and schedule")
    parser.add_argument(
        "--out",
        default="calibration_live.json",
        metavar="FILE",
        help="calibration file to write (default calibration_live.json); an "
        "incomplete run writes FILE's NAME.partial.json beside it instead",
    )


def run_calibrate_command(args: argparse.Namespace) -> int:
    """Run ``diloco-gym calibrate`` with parsed ``args``; return the exit code (0: a
    complete run; 1: an incomplete one, its partial file written; 130 / 143: Ctrl-C /
    SIGTERM).

    Raises:
        UsageError: a bad option value, regime or trace file (before anything runs).
        DataError: the run failed (an unreachable endpoint, a failed phase): the partial
            measurements are saved beside ``--out``.
    """
    from diloco_gym.live.calibrate import check_source, run_calibration
    from diloco_gym.live.errors import CalibrationError, CalibrationTerminated
    from diloco_gym.sim.traces import TraceFormatError

    try:
        cfg = _config_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    source = args.trace if args.trace else (args.regime or DEFAULT_REGIME)
    from diloco_gym.sim.regimes import REGIMES

    if source not in REGIMES:
        try:  # a usage error before the engine, the endpoint or the merges are touched
            check_source(source)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    # The run itself says "partial measurements saved to ..." (once); the lines below only
    # name the outcome.
    try:
        with sigterm_as_interrupt():
            result = run_calibration(
                args.endpoint, source, args.duration, args.out, trace_format=args.format, config=cfg
            )
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, CalibrationTerminated)
        saved = getattr(exc, "path", None)
        print(
            f"diloco-gym: {'terminated (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'}"
            + ("" if saved else ": no measurement saved"),
            file=sys.stderr,
        )
        return 143 if terminated else 130
    except CalibrationError as exc:
        raise DataError(str(exc)) from None
    except (ValueError, TraceFormatError) as exc:
        raise UsageError(str(exc)) from None
    why = getattr(result, "out_of_range", None)  # a stand-in result may not have it
    if why:
        print(f"diloco-gym: warning: {why}", file=sys.stderr)
    return 0 if result.complete else 1


def _config_from_args(args: argparse.Namespace) -> CalibrationConfig:
    """The run's configuration from the parsed options (a ``ValueError`` is a usage
    error, exit 2); separate so that the command reads as its exit codes."""
    from diloco_gym.live.calibrate import CalibrationConfig
    from diloco_gym.live.engine import EngineModelConfig
    from diloco_gym.live.merges import MergeConfig
    from diloco_gym.live.probe import ProbeConfig

    engine_model = (
        EngineModelConfig.from_json(args.engine_model_config)
        if args.engine_model_config
        else EngineModelConfig()
    )
    probe = None if args.no_probe else ProbeConfig(step_s=args.probe_step_seconds)
    return CalibrationConfig(
        seed=args.seed,
        start_s=args.start,
        rate_rps=args.rate,
        model=args.model,
        timeout_s=args.timeout,
        merge=MergeConfig(workers=args.workers, merge_mb=args.merge_mb, backend=args.backend),
        merge_seconds=args.merge_seconds,
        gap_seconds=tuple(args.gap_seconds),
        control=not args.no_control,
        label=args.label,
        max_error_fraction=args.max_failure_rate,
        engine=args.engine,
        engine_model=engine_model,
        engine_threads=args.engine_threads,
        probe=probe,
        target_utilization=args.target_utilization,
        repeats=args.repeats,
        overload_inflight=args.overload_inflight,
        overload_timeout_fraction=args.overload_timeouts,
        link_shares=tuple(args.link_shares),
    )


class sigterm_as_interrupt:
    """Raise :class:`CalibrationTerminated` in the main thread on SIGTERM, once.

    The run then saves its partial measurements and stops its child processes exactly as
    for Ctrl-C. Further SIGTERMs during that (bounded) clean-up are ignored so that they
    cannot cut it short; the previous handler is restored on exit.
    """

    def __enter__(self) -> None:
        from diloco_gym.live.errors import CalibrationTerminated

        def handler(signum: int, frame: FrameType | None) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise CalibrationTerminated()

        self._previous = signal.getsignal(signal.SIGTERM)
        self._installed = True
        try:
            signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread: leave SIGTERM alone
            self._installed = False

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
