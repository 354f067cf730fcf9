"""``diloco-gym train``: the command line of the trainer (:mod:`diloco_gym.rl.trainer`).

The options (:func:`add_train_arguments`), their merge with a config file
(:func:`resolve_config`: the flag's value if given, else the file's, else the built-in
default), the run's env layout, and the command itself (:func:`run_train_command`), which
prints the final model's validation result.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from diloco_gym.eval.seed_ranges import VALIDATION_SEED0
from diloco_gym.rl.algos import ALGOS, SELECT_BY, VEC_ENVS
from diloco_gym.rl.config import (
    ConfigError,
    TrainConfig,
    check_config,
    load_config_file,
    parse_config,
)
from diloco_gym.rl.env_specs import build_env_specs
from diloco_gym.rl.run_dir import check_run_dir, read_meta
from diloco_gym.rl.trainer import train
from diloco_gym.rl.validation import (
    format_budget_validation,
    format_comparison,
    validation_comparison,
    write_validation_curve,
)
from diloco_gym.sim.regimes import REGIMES

__all__ = ["add_train_arguments", "resolve_config", "run_layout", "run_train_command"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``diloco-gym train`` options to ``parser``.

    Options that a config file can set default to ``None`` here: the value is the flag's
    if given, else the file's, else the built-in default (:func:`resolve_config`).
    """
    parser.add_argument(
        "--config",
        default=None,
        help="training config file (TOML): [train], [env] (regimes, trace or fleet, budgets, "
        "reward weights, any EnvParams field) and [algo] (hyperparameters); flags "
        "override it; see docs/training.md",
    )
    parser.add_argument("--algo", choices=ALGOS, default=None, help="RL algorithm (default ppo)")
    parser.add_argument(
        "--regime", default=None, help=f"one of {', '.join(REGIMES)} (default bursty)"
    )
    parser.add_argument(
        "--fleet",
        default=None,
        metavar="FILE",
        help="train on a fleet of sites (DiLoCoFleet-v1, its TOML file) instead of a regime; "
        "--budgets then count fragment syncs per hour (docs/fleet.md)",
    )
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=None,
        metavar="PER_HOUR",
        help="train one budget-conditioned policy across these merge budgets, in merges "
        "per hour (each converted to merges per episode: 60 = 10 per 600 s episode)",
    )
    parser.add_argument(
        "--timesteps",
        type=int,
        default=None,
        help="total agent decisions to train for (default 200000)",
    )
    parser.add_argument("--seed", type=int, default=None, help="training seed (default 0)")
    parser.add_argument(
        "--out",
        default="runs/train",
        help="output directory: model.zip, meta.json, tb/, checkpoints/; an "
        "existing run needs --resume or --force",
    )
    _add_run_arguments(parser)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of how the run goes: envs, validation, checkpoints, resume or replace."""
    parser.add_argument(
        "--n-envs",
        type=int,
        default=None,
        help="environments stepped together (default 4; with budgets one per regime and budget)",
    )
    parser.add_argument(
        "--vec-env",
        choices=VEC_ENVS,
        default=None,
        help="how the --n-envs envs are batched: native (one batched env in "
        "this process, default without budgets), subproc (one process per env) or dummy "
        "(one after another; default with budgets)",
    )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=None,
        help="validation episodes per evaluation, seeds 900000+ (default 10; 0: none)",
    )
    parser.add_argument(
        "--eval-freq",
        type=int,
        default=None,
        help="evaluate every N timesteps (default 10000; 0: only at the end)",
    )
    parser.add_argument(
        "--select-by",
        choices=SELECT_BY,
        default=None,
        help="how best_model.zip is chosen among the evaluations: vs_random (default: the "
        "lowest sync-excess minus matched random at the policy's own merges) or sync_excess "
        "(the lowest sync-excess, which favours merging less)",
    )
    parser.add_argument(
        "--checkpoint-freq",
        type=int,
        default=None,
        help="checkpoint every N timesteps (default 50000; 0: none)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUT (same --algo and --regime as its "
        "meta.json) from its latest checkpoint",
    )
    parser.add_argument(
        "--trust-model-file",
        action="store_true",
        help="with --resume: load the checkpoint (and a DQN run's replay buffer) with "
        "stable-baselines3's own loader, which unpickles it (runs code in it): only for "
        "files you trust. By default a checkpoint is rebuilt from its JSON and tensor-only "
        "weights, or refused",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the training run in OUT (removes its model, meta, "
        "checkpoints and logs; other files stay)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", type=int, default=0, help="SB3 verbosity (0, 1, 2)")


def resolve_config(args: argparse.Namespace):
    """The run's :class:`~diloco_gym.rl.config.TrainConfig`: the config file's values
    (``--config``), overridden by the flags given, checked as a whole.

    Raises:
        ConfigError: an invalid file, value or combination (one line).
    """
    path = "command line"
    if args.config is not None:
        data, source = load_config_file(args.config)
        path = source["path"]
        cfg = parse_config(data, path)
        cfg.source = source
    else:
        cfg = TrainConfig()
    for key in (
        "algo",
        "timesteps",
        "seed",
        "n_envs",
        "vec_env",
        "eval_episodes",
        "eval_freq",
        "select_by",
        "checkpoint_freq",
    ):
        value = getattr(args, key)
        if value is not None:
            setattr(cfg, key, value)
    if args.regime is not None and getattr(args, "fleet", None) is not None:
        raise ConfigError("command line: give --regime or --fleet, not both")
    if args.regime is not None:
        cfg.regimes = [args.regime]
        cfg.trace = None
        cfg.fleet = None
    if getattr(args, "fleet", None) is not None:
        cfg.fleet = args.fleet
        cfg.trace = None
    if args.budgets is not None:
        cfg.budgets_per_hour = [float(b) for b in args.budgets]
    check_config(cfg, path)
    return cfg


def _learners_sha(learner_calibration: str | None) -> str:
    """The SHA-256 of a config's learner calibration file (``""``: none, the default
    learners), as ``meta.json`` records it."""
    from diloco_gym.rl.learner_config import record

    rec = record(learner_calibration).get("learner_calibration_file")
    return (rec or {}).get("sha256") or ""


def run_layout(cfg: Any) -> tuple[list[Any] | None, str, int]:
    """``(env_specs, vec_env, n_envs)`` of a resolved config: env kinds when the run has
    budgets, several regimes, a trace or a calibration file (``None``: the plain regime),
    and the vector env and env count (defaults: native and 4, or dummy and one env per
    kind).

    Raises:
        ConfigError: the native vector env asked for several env kinds.
    """
    path = cfg.source["path"] if cfg.source else "command line"
    specs = None
    if (
        cfg.budgets_per_hour is not None
        or len(cfg.regimes) > 1
        or cfg.trace is not None
        or cfg.fleet is not None
        or cfg.calibration is not None
    ):
        specs = build_env_specs(cfg, path)
    vec_env = cfg.vec_env or ("native" if specs is None else "dummy")
    if specs is not None and vec_env == "native":
        raise ConfigError(
            f"{path}: vec_env native runs a single regime without budgets, "
            f"calibration or fleet; use dummy or subproc"
        )
    n_envs = cfg.n_envs if cfg.n_envs is not None else (4 if specs is None else len(specs))
    return specs, vec_env, n_envs


def run_train_command(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run ``diloco-gym train`` with parsed ``args``; returns the exit status.

    ``argv`` is the command line to record in meta.json (``diloco-gym`` and these
    arguments; default ``sys.argv[1:]``).

    After training it prints the final model's validation result: next to fixed-512 and
    its matched random (warning when the policy never chooses to merge), or, for a
    budget-conditioned run, per regime and budget next to matched random and the oracle.
    """
    from diloco_gym.errors import UsageError

    try:
        cfg = resolve_config(args)
        specs, vec_env, n_envs = run_layout(cfg)
        check_run_dir(
            args.out,
            cfg.algo,
            cfg.label,
            resume=args.resume,
            force=args.force,
            apply=False,
            learners=_learners_sha(cfg.learner_calibration) if args.resume else None,
        )
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    record = cfg.record()
    record.update(n_envs=n_envs, vec_env=vec_env)
    if cfg.source is not None:
        record["file"] = cfg.source
    given = sys.argv[1:] if argv is None else argv
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in given)
    from diloco_gym.agents.safe_model import UnsafeModelError
    from diloco_gym.errors import DataError

    try:
        path_model = _train(args, cfg, specs, vec_env, n_envs, record, command)
    except UnsafeModelError as exc:  # a checkpoint refused (or above a limit) on --resume
        raise DataError(str(exc)) from None
    _print_validation(path_model, cfg, specs is not None)
    return 0


def _train(
    args: argparse.Namespace,
    cfg: TrainConfig,
    specs: list[Any] | None,
    vec_env: str,
    n_envs: int,
    record: dict[str, Any],
    command: str,
) -> Path:
    """:func:`~diloco_gym.rl.trainer.train` with the resolved configuration."""
    return train(
        cfg.algo,
        regime=cfg.label,
        timesteps=cfg.timesteps,
        seed=cfg.seed,
        out=args.out,
        n_envs=n_envs,
        eval_episodes=cfg.eval_episodes,
        eval_freq=cfg.eval_freq,
        checkpoint_freq=cfg.checkpoint_freq,
        resume=args.resume,
        progress_bar=not args.no_progress,
        env_kwargs=cfg.env_kwargs(),
        hyperparameters=cfg.hyperparameters,
        verbose=args.verbose,
        command=command,
        force=args.force,
        vec_env=vec_env,
        env_specs=specs,
        obs_transform=cfg.observation,
        config=record,
        bc_teacher=cfg.bc_teacher,
        bc_episodes=cfg.bc_episodes,
        bc_epochs=cfg.bc_epochs,
        select_by=cfg.select_by,
        trust_model_file=getattr(args, "trust_model_file", False),
    )


def _print_validation(path_model: Path, cfg: TrainConfig, budgeted: bool) -> None:
    """After training: the validation curve files, then the final validation per env kind
    (a budget run) or next to fixed-512 and matched random (recorded in meta.json), with
    a warning when the policy never chose a merge."""
    meta_path = path_model.parent / "meta.json"
    meta = read_meta(meta_path)
    print(f"saved {path_model} ({meta['timesteps']} timesteps, {meta['train_seconds']} s)")
    write_validation_curve(path_model.parent)
    if budgeted:
        print("\n".join(format_budget_validation(meta)))
        return
    n_val = cfg.eval_episodes if cfg.eval_episodes > 0 else 10
    cmp = validation_comparison(
        path_model, cfg.regimes[0], [VALIDATION_SEED0 + i for i in range(n_val)], cfg.env_kwargs()
    )
    meta["validation_comparison"] = cmp
    meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    lines, warnings = format_comparison(cmp)
    print("\n".join(lines))
    for w in warnings:
        print(w, file=sys.stderr)
