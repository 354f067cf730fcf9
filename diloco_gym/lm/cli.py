"""The options and the body of ``diloco-gym calibrate-learners`` (torch is imported only
when the command runs)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from diloco_gym.errors import UsageError

__all__ = ["add_calibrate_learners_arguments", "run_calibrate_learners_command"]


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v

    return parse


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def add_calibrate_learners_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="learner_calibration.json", help="calibration file to write")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--seeds",
        type=_int_at_least(3),
        default=None,
        help="seeds; every schedule runs with each (common random numbers; default 10, 3 "
        "with --tiny)",
    )
    p.add_argument(
        "--heldout-seeds",
        type=_int_at_least(1),
        default=None,
        help="the last seeds, kept from the fit and used to validate it (default 30 %% of "
        "--seeds, at least 1)",
    )
    p.add_argument(
        "--total-steps",
        type=_int_at_least(2),
        default=None,
        help="inner steps per learner (default: the shortest multiple of 2 H_max that covers "
        "one env episode, 160 at the default mapping; 16 with --tiny)",
    )
    p.add_argument(
        "--mapping",
        type=_positive_float,
        default=32.0,
        help="env steps one inner step stands for (the corridor is [128, 512] env steps)",
    )
    p.add_argument(
        "--mapping-check",
        type=_positive_float,
        default=None,
        help="a second mapping at which the corridor's ends are also run, each covering one "
        "episode there: how much the price depends on the mapping",
    )
    p.add_argument(
        "--target-effect",
        type=_positive_float,
        default=None,
        help="the relative loss change of fixed H_max against fixed H_min the design's "
        "power is stated for (default 0.01: 1 %%)",
    )
    p.add_argument("--jobs", type=_int_at_least(1), default=1, help="trainings run at once")
    p.add_argument("--learners", type=_int_at_least(1), default=4, help="K, DiLoCo learners")
    p.add_argument("--threads", type=_int_at_least(1), default=1, help="torch threads")
    p.add_argument("--d-model", type=_int_at_least(8), default=128, help="model width")
    p.add_argument("--layers", type=_int_at_least(1), default=4, help="transformer blocks")
    p.add_argument("--outer-lr", type=float, default=0.7, help="outer SGD learning rate")
    p.add_argument(
        "--outer-momentum",
        type=float,
        default=0.5,
        help="outer Nesterov momentum (0.9 in Douillard et al.; 0.5 measured better at this "
        "scale, docs/learners.md)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse the runs of <out>.runs.jsonl made with the same configuration",
    )
    p.add_argument(
        "--bootstrap", type=_int_at_least(10), default=100, help="bootstrap draws (intervals)"
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny model and budget (seconds; what the tests run), not a calibration to use",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_calibrate_learners_command(args: argparse.Namespace) -> int:
    from diloco_gym.lm.calibrate import (
        DEFAULT_TARGET_EFFECT,
        TINY,
        calibrate_learners,
        covering_steps,
    )

    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    if out.exists() and not (args.force or args.resume):
        raise UsageError(f"--out {out} exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    config = dict(TINY) if args.tiny else {}
    if args.total_steps is not None:
        config["total_steps"] = args.total_steps
    elif not args.tiny:
        config["total_steps"] = covering_steps(args.mapping)
    seeds = args.seeds or (3 if args.tiny else 10)
    heldout = args.heldout_seeds or max(1, round(0.3 * seeds))
    if seeds - heldout < 2:
        raise UsageError(
            f"--heldout-seeds {heldout} leaves {seeds - heldout} fit seed(s) of "
            f"--seeds {seeds}; the fit needs at least 2"
        )
    config["num_learners"] = args.learners if not args.tiny else config["num_learners"]
    config["threads"] = args.threads
    config["outer_lr"] = args.outer_lr
    config["outer_momentum"] = args.outer_momentum
    if not args.tiny:
        config["d_model"] = args.d_model
        config["n_layers"] = args.layers
    command = (
        "diloco-gym calibrate-learners "
        + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("calibrate-learners") + 1 :])
        if "calibrate-learners" in sys.argv
        else "diloco-gym calibrate-learners"
    )

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    doc = calibrate_learners(
        out=out,
        seeds=seeds,
        heldout_seeds=heldout,
        config=config,
        env_steps_per_inner_step=args.mapping,
        mapping_check=args.mapping_check,
        target_effect=args.target_effect or DEFAULT_TARGET_EFFECT,
        jobs=args.jobs,
        bootstrap=args.bootstrap,
        command=command,
        max_bytes=200_000 if args.tiny else 8_000_000,
        progress=say,
        resume=args.resume,
    )
    v = doc["validation"]
    rho = (
        "n/a" if v["spearman_rho"] is None else f"{v['spearman_rho']:.2f} (p {v['spearman_p']:.3g})"
    )
    print(
        f"{out}: drift {doc['params']['drift_steps']:.2f} inner steps; held-out Spearman rho "
        f"{rho}, MAE {v['mae']:.4f} nats/byte over {v['schedules']} schedules; "
        f"H_max vs H_min {doc['effects']['power']['verdict']}"
    )
    return 0
