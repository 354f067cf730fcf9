"""``diloco-gym tune``: a Ray Tune search over SB3 hyperparameters
(:mod:`diloco_gym.scale.tune`)."""

from __future__ import annotations

import argparse

from diloco_gym.commands import checks, options
from diloco_gym.commands.extras import missing_extra
from diloco_gym.errors import Interrupted
from diloco_gym.text import count

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = (
    "Ray Tune (ASHA) search over SB3 hyperparameters, "
    "selected on validation seeds; the best model as a run directory"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``tune`` command's options."""
    p.add_argument(
        "config",
        help="tune file (TOML; YAML with PyYAML): the training setup "
        "and a [space] of hyperparameters (see docs/scale-out.md)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: tune-NAME): best/ (model.zip, "
        "meta.json: give it to report --agent), trials.json, ray_results/",
    )
    p.add_argument(
        "--backend",
        choices=("ray",),
        default="ray",
        help="Ray Tune (the extra diloco-gym[ray]); the only backend of tune",
    )
    p.add_argument(
        "--jobs",
        type=options.positive_int(1),
        default=None,
        help="CPUs of a local Ray instance (default: the CPUs available)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to connect to ('auto': the one `ray start` runs here)",
    )
    p.add_argument("--no-progress", action="store_true", help="quiet Tune output")


def run(args: argparse.Namespace) -> int:
    checks.check_backend(args)
    try:
        from diloco_gym.scale.tune import load_tune, run_tune
    except ImportError as exc:
        raise missing_extra("tune", ["rl", "ray"], exc) from None
    spec = load_tune(args.config)
    out = args.out or f"tune-{spec['name']}"
    try:
        res = run_tune(
            spec, out, jobs=args.jobs, ray_address=args.ray_address, progress=not args.no_progress
        )
    except KeyboardInterrupt:
        raise Interrupted("interrupted; no best model saved") from None
    print(
        f"tune {spec['name']}: {count(res['trials'], 'trial')}, {res['errored']} errored; best "
        f"validation sync-excess {res['metric']:.3f} % with {res['config']}"
    )
    if res.get("all_tied"):
        print(
            f"note: all {res['trials'] - res['errored']} finished trials scored the same "
            f"({res['metric']:.5f} %), so the search could not tell the configurations apart "
            f"(for example, every model learned never to merge); the saved one is the first"
        )
    print(f"best model: {res['best_dir']}/ (use: diloco-gym report --agent {res['best_dir']})")
    return 0
