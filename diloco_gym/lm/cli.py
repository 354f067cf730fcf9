"""The options and the body of ``diloco-gym calibrate-learners`` (torch is imported only
when the command runs)."""

from __future__ import annotations

import argparse
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


def add_calibrate_learners_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="learner_calibration.json", help="calibration file to write")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--seeds", type=_int_at_least(2), default=3, help="seeds per schedule")
    p.add_argument(
        "--total-steps",
        type=_int_at_least(2),
        default=None,
        help="inner steps per learner (default 64; 16 with --tiny)",
    )
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
    from diloco_gym.lm.calibrate import TINY, calibrate_learners

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
        config["total_steps"] = 64
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
        seeds=args.seeds,
        config=config,
        bootstrap=args.bootstrap,
        command=command,
        max_bytes=200_000 if args.tiny else 8_000_000,
        progress=say,
        resume=args.resume,
    )
    v = doc["validation"]
    print(
        f"{out}: drift {doc['params']['drift_steps']:.2f} inner steps; held-out Spearman rho "
        f"{v['spearman_rho']}, MAE {v['mae']:.4f} nats/byte over {v['schedules']} schedules"
    )
    return 0
