"""Options shared by several ``diloco-gym`` commands: one definition each, so every command
spells, checks and documents an option the same way."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "SEED0_HELP",
    "positive_int",
    "add_trace_args",
    "add_backend_args",
    "add_seed0_arg",
    "add_calibration_arg",
    "add_trust_arg",
    "add_sealing_arg",
    "add_require_sandbox_arg",
    "add_holm_arg",
    "add_fleet_arg",
    "add_learner_calibration_arg",
    "replay_options",
]

#: Trace formats of ``--format`` (kept in step with :data:`diloco_gym.sim.loaders.FORMATS`).
TRACE_FORMATS: tuple[str, ...] = ("auto", "native", "azure", "mooncake", "burstgpt")

SEED0_HELP = (
    "first episode seed: the episodes use seeds SEED0 .. SEED0+SEEDS-1, and "
    "the same seed always gives the same trace (default %(default)s). Seeds below "
    "1,000,000 are never used in training (train draws its episode seeds from "
    "[10^6, 2^30)), so the default seeds test a trained agent on traces it never "
    "saw; another SEED0 gives an independent replication"
)


def positive_int(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", metavar="FILE", help="replay this trace file instead of a synthetic regime"
    )
    p.add_argument(
        "--format",
        default="auto",
        dest="trace_format",
        choices=TRACE_FORMATS,
        help="trace format (default: auto, by extension and header)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=600.0,
        help="with --trace: seconds per replayed window; each window is one episode (default 600)",
    )
    p.add_argument(
        "--stride-s",
        type=float,
        default=None,
        help="with --trace: seconds between window starts (default: the window, "
        "so windows are disjoint and independent; a shorter stride overlaps "
        "them and the report flags the episodes as not independent)",
    )
    p.add_argument(
        "--sidecar",
        default=None,
        metavar="REGIME",
        help="with --trace: the regime whose sidecar and calibration the replay "
        "uses (default sync-heavy; --calibration replaces it with the file's "
        "fitted sidecar when the file measured that regime)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--rate-scale",
        type=float,
        default=None,
        metavar="X",
        help="multiply the offered load: a regime's request rates, or replay a "
        "trace X times faster (every request kept, the trace X times "
        "shorter)",
    )
    load.add_argument(
        "--target-utilization",
        type=float,
        default=None,
        metavar="U",
        help="instead of --rate-scale: replay at mean offered work / sidecar "
        "capacity = U (capacity = slots / mean service time of the "
        "replayed token mix)",
    )


def backend_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``backend``, ``jobs`` and ``ray_address`` keywords of a run from
    :func:`add_backend_args`' options."""
    return {"backend": args.backend, "jobs": args.jobs, "ray_address": args.ray_address}


def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=("serial", "processes", "ray"),
        default="serial",
        help="where the cells run: this process, a local process pool, or Ray "
        "(the extra diloco-gym[ray]); results are identical on every backend",
    )
    p.add_argument(
        "--jobs",
        type=positive_int(1),
        default=None,
        help="workers for processes / a local Ray instance (default: the CPUs available)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to connect to ('auto': the one `ray start` runs here; "
        "default: start a local instance); needs --backend ray",
    )


def add_seed0_arg(p: argparse.ArgumentParser) -> None:
    """``--seed0``, the first episode seed (run, report, frontier)."""
    p.add_argument(
        "--seed0",
        type=positive_int(0),
        default=0,
        help=SEED0_HELP.replace(" (default %(default)s)", ""),
    )


def add_calibration_arg(p: argparse.ArgumentParser) -> None:
    """``--calibration``, the real-sidecar measurements (report, frontier)."""
    p.add_argument(
        "--calibration", help="real-sidecar calibration JSON (default: the shipped reference)"
    )


def add_trust_arg(p: argparse.ArgumentParser) -> None:
    """``--trust-model-file``: allow stable-baselines3's own (unpickling) model loader."""
    p.add_argument(
        "--trust-model-file",
        action="store_true",
        help="load model .zip files with stable-baselines3's own loader, which unpickles "
        "parts of the file (runs code in it): only for files you trust. By default a "
        "model is rebuilt from the zip's JSON and tensor-only weights, and refused when "
        "that is not possible",
    )


def add_sealing_arg(p: argparse.ArgumentParser) -> None:
    """``--in-process-agents``: the opt-out from sealed deployable agents."""
    p.add_argument(
        "--in-process-agents",
        action="store_true",
        help="run deployable agents in the evaluating process instead of each in its own "
        "worker process that receives only observations, action masks and public "
        "parameters; faster, but nothing then stops an agent's code from reaching the "
        "env, the trace or the seed (the report says so in its header)",
    )
    add_require_sandbox_arg(p)


def add_require_sandbox_arg(p: argparse.ArgumentParser) -> None:
    """``--require-sandbox``: refuse to run below the full sealing level."""
    p.add_argument(
        "--require-sandbox",
        action="store_true",
        help="refuse to run unless sealed agents get the full kernel sandbox (Linux: "
        "Landlock, user and network namespaces, the evaluator not dumpable); without it a "
        "machine that lacks a mechanism runs at a lower level, which the report states",
    )


def add_holm_arg(p: argparse.ArgumentParser, settings: str) -> None:
    """``--holm-across-settings``: one Holm family over every setting compared (report,
    frontier)."""
    p.add_argument(
        "--holm-across-settings",
        action="store_true",
        help=f"Holm-correct across every {settings} at once and give the verdicts from that "
        "stricter correction (default: one family per setting; the all-settings p is "
        "reported either way)",
    )


def add_fleet_arg(p: argparse.ArgumentParser) -> None:
    """``--fleet``, a fleet configuration (run, report, frontier) on the fleet model its
    ``[fleet]`` table's ``model_version`` names (0 by default)."""
    p.add_argument(
        "--fleet",
        metavar="FILE",
        help="run on a fleet of sites configured by this TOML file, on the fleet model its "
        "[fleet] model_version names: 0 by default (DiLoCoFleet-v0's), 1 with "
        "model_version = 1 (DiLoCoFleet-v1's) (docs/fleet.md; example: "
        "docs/examples/fleet.toml)",
    )


def _learner_calibration_file(value: str) -> str:
    """``--learner-calibration``'s value: a file, or ``shipped`` for the shipped one."""
    from diloco_gym.sim.learner_calibration import resolve_path

    return str(resolve_path(value))


def add_learner_calibration_arg(p: argparse.ArgumentParser, priced: bool = True) -> None:
    """``--learner-calibration``, the learner model fitted to real DiLoCo runs (report,
    frontier; ``run``, whose rows are not priced, with ``priced=False``)."""
    envs = (
        "learner calibration JSON (diloco-gym calibrate-learners; 'shipped': the one "
        "shipped with the package, DiLoCoSync-v2's learners): the agents' envs use "
        "its learner model (the learner observations a policy trained with it saw; the "
        "sync-excess scores do not depend on it)"
    )
    price = (
        ", and each schedule's model-quality price is added (predicted loss, cost vs fixed H "
        "at the same merges, and vs matched random at the same budget; the frontier also "
        "draws frontier_quality_REGIME.png)"
    )
    p.add_argument(
        "--learner-calibration",
        type=_learner_calibration_file,
        help=envs + (price if priced else ""),
    )


def replay_options(args: argparse.Namespace, stride: bool = True) -> dict[str, Any]:
    """The trace, window and load options (:func:`add_trace_args`) a protocol config takes
    from the command line (``stride``: the config has ``stride_s``; the frontier replays
    disjoint windows only)."""
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


def protocol_options(args: argparse.Namespace, settings: bool = True) -> dict[str, Any]:
    """The units, draws, calibration and sealing options every protocol command (``report``,
    ``frontier``, with or without ``--fleet``) hands its config; with ``settings``, also the
    learner calibration and the Holm family (the single-host protocol's)."""
    opts: dict[str, Any] = {
        "seeds": args.seeds,
        "seed0": args.seed0,
        "draws": args.draws,
        "calibration": args.calibration,
        "in_process_agents": args.in_process_agents,
    }
    if settings:
        opts["learner_calibration"] = args.learner_calibration
        opts["holm_across_settings"] = args.holm_across_settings
    return opts
