"""``diloco-gym train``: train an RL merge scheduler with stable-baselines3.

Seed discipline (training and evaluation seeds are disjoint *by construction*):

* **Training** episodes always reset with an explicit episode seed drawn from
  ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH) = [10**6, 2**30)`` by :class:`TrainSeedWrapper`,
  whose generator is seeded from the training seed (``seed + env index``). A training run
  never sees a trace whose episode seed is below ``10**6``.
* **Held-out** seeds are ``[0, 10**6)`` (``HELD_OUT_SEED_HIGH``). ``diloco-gym report`` and
  ``diloco-gym run`` use seeds ``0 .. 19`` by default, so their episodes are held out.
* The **validation** seeds of the periodic evaluation during training (model selection,
  ``best_model.zip``) are ``VALIDATION_SEED0 + i = 900_000 + i``: held out from training,
  and distinct from the report's test seeds, so choosing the best checkpoint does not
  peek at the report.

The evaluation callback (:class:`HeldOutEvalCallback`) plays deterministic episodes on the
fixed validation seeds and logs the exact replayed sync-excess % (``eval/sync_excess_pct``),
the merges per episode and the mean return to TensorBoard, keeping ``best_model.zip`` (the
lowest sync-excess) in the output directory. SB3's ``EvalCallback`` is not used because it
resets a vector env without fixed per-episode seeds, so successive evaluations would see
different traces.

Outputs in ``out``: ``model.zip`` (final model), ``meta.json`` (algorithm, regime, seeds,
env parameters, command line, library versions, evaluation history), ``best_model.zip``,
``checkpoints/`` (``CheckpointCallback``; ``--resume`` continues from the latest) and
``tb/`` (TensorBoard logs).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from diloco_gym.env import DiLoCoSyncEnv
from diloco_gym.regimes import REGIMES
from diloco_gym.rollout import run_episode

__all__ = ["ALGOS", "TRAIN_SEED_LOW", "TRAIN_SEED_HIGH", "HELD_OUT_SEED_HIGH",
           "VALIDATION_SEED0", "TrainSeedWrapper", "HeldOutEvalCallback", "make_train_env",
           "train", "add_train_arguments", "run_train_command", "latest_checkpoint"]

#: Algorithms ``train`` knows, by CLI name.
ALGOS = ("ppo", "maskable-ppo", "dqn")
#: Training episode seeds are drawn from ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)``.
TRAIN_SEED_LOW = 10**6
TRAIN_SEED_HIGH = 2**30
#: Episode seeds below this are held out from training (report / run / validation).
HELD_OUT_SEED_HIGH = TRAIN_SEED_LOW
#: First validation seed of the evaluation during training (held out, not a report seed).
VALIDATION_SEED0 = 900_000

_CHECKPOINT_RE = re.compile(r"_(\d+)_steps\.zip$")


class TrainSeedWrapper(gym.Wrapper):
    """Reset the wrapped env only with episode seeds from the training range.

    ``reset(seed=s)`` re-seeds the wrapper's own generator with ``s``; every reset (seeded
    or not, e.g. a vector env's auto-reset) then draws the episode seed from
    ``[low, high)`` with that generator and resets the env with it. The seed passed to
    ``reset`` never reaches the env directly, so a training episode can never use a
    held-out seed.

    Args:
        env: the environment (a :class:`DiLoCoSyncEnv`, possibly wrapped).
        low: smallest training episode seed (default ``TRAIN_SEED_LOW``).
        high: one past the largest training episode seed (default ``TRAIN_SEED_HIGH``).
        seed: initial seed of the wrapper's generator (``None``: from OS entropy).
    """

    def __init__(self, env: gym.Env, low: int = TRAIN_SEED_LOW, high: int = TRAIN_SEED_HIGH,
                 seed: int | None = None) -> None:
        super().__init__(env)
        if not 0 <= low < high:
            raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
        self.low = int(low)
        self.high = int(high)
        self._seed_rng = np.random.default_rng(seed)
        #: the episode seeds used so far (for audits and tests).
        self.episode_seeds: list[int] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        episode_seed = int(self._seed_rng.integers(self.low, self.high))
        self.episode_seeds.append(episode_seed)
        return self.env.reset(seed=episode_seed, options=options)


def make_train_env(regime: str, seed: int, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One training env: ``Monitor(TrainSeedWrapper(DiLoCoSyncEnv(regime)))``.

    ``Monitor`` is outermost: it replaces the env's final ``info["episode_summary"]`` replay
    summary with SB3's ``{"r", "l", "t"}`` episode statistics.
    """
    from stable_baselines3.common.monitor import Monitor

    env = DiLoCoSyncEnv(regime=regime, **(env_kwargs or {}))
    return Monitor(TrainSeedWrapper(env, seed=seed))


def _algo_class(algo: str):
    if algo == "ppo":
        from stable_baselines3 import PPO

        return PPO
    if algo == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO
    if algo == "dqn":
        from stable_baselines3 import DQN

        return DQN
    raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")


def default_hyperparameters(algo: str, n_envs: int, timesteps: int) -> dict[str, Any]:
    """The hyperparameters ``train`` uses (an MLP 64x64 policy for every algorithm)."""
    arch = {"net_arch": [64, 64]}
    if algo in ("ppo", "maskable-ppo"):
        n_steps = 256
        return {"n_steps": n_steps, "batch_size": 256, "n_epochs": 10, "learning_rate": 3e-4,
                "gamma": 0.995, "gae_lambda": 0.95, "ent_coef": 0.01, "clip_range": 0.2,
                "policy_kwargs": arch}
    if algo == "dqn":
        return {"learning_rate": 5e-4, "buffer_size": 100_000,
                "learning_starts": int(min(5_000, max(64, timesteps // 10))),
                "batch_size": 64, "gamma": 0.995, "train_freq": 4,
                "target_update_interval": 1_000, "exploration_fraction": 0.3,
                "exploration_final_eps": 0.02, "policy_kwargs": arch}
    raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")


def latest_checkpoint(out: str | Path) -> Path | None:
    """The checkpoint in ``out/checkpoints`` with the most timesteps, or ``None``."""
    ckpt_dir = Path(out) / "checkpoints"
    best: tuple[int, Path] | None = None
    for p in ckpt_dir.glob("*_steps.zip") if ckpt_dir.is_dir() else []:
        m = _CHECKPOINT_RE.search(p.name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), p)
    return None if best is None else best[1]


class HeldOutEvalCallback(BaseCallback):
    """Deterministic evaluation on fixed held-out validation seeds.

    Every ``eval_freq`` callback calls (vector steps), plays one deterministic episode per
    seed with :func:`diloco_gym.rollout.run_episode`, records ``eval/sync_excess_pct``
    (exact replay), ``eval/merges`` and ``eval/mean_reward``, and saves ``best_path`` when
    the mean sync-excess is the lowest so far.

    Args:
        env: the evaluation env (not wrapped: it is reset with explicit held-out seeds).
        seeds: episode seeds, all ``< HELD_OUT_SEED_HIGH``.
        eval_freq: evaluate every this many callback calls; ``0``: only on request.
        best_path: where to save the best model (``None``: do not save).
        verbose: print each evaluation when ``> 0``.

    Raises:
        ValueError: if a seed is not in the held-out range.
    """

    def __init__(self, env: DiLoCoSyncEnv, seeds: list[int], eval_freq: int,
                 best_path: Path | None, verbose: int = 0) -> None:
        super().__init__(verbose)
        bad = [s for s in seeds if not 0 <= s < HELD_OUT_SEED_HIGH]
        if bad:
            raise ValueError(f"evaluation seeds must be held out (< {HELD_OUT_SEED_HIGH}); "
                             f"got {bad[:5]}")
        self.eval_env = env
        self.seeds = list(seeds)
        self.eval_freq = int(eval_freq)
        self.best_path = best_path
        self.best_sync_excess = float("inf")
        self.history: list[dict[str, float]] = []

    def _on_step(self) -> bool:
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            self.evaluate()
        return True

    def evaluate(self) -> dict[str, float]:
        """Run the validation episodes now; returns the mean metrics."""
        from agents.learned import LearnedAgent

        agent = LearnedAgent(self.model, name="eval")
        res = [run_episode(self.eval_env, agent, s) for s in self.seeds]
        row = {"timesteps": int(self.model.num_timesteps),
               "sync_excess_pct": float(np.mean([r["sync_excess_pct"] for r in res])),
               "merges": float(np.mean([r["merges"] for r in res])),
               "mean_reward": float(np.mean([r["return"] for r in res]))}
        self.history.append(row)
        if getattr(self.model, "_logger", None) is not None:  # set once learn() started
            for k in ("sync_excess_pct", "merges", "mean_reward"):
                self.logger.record(f"eval/{k}", row[k])
        if row["sync_excess_pct"] < self.best_sync_excess:
            self.best_sync_excess = row["sync_excess_pct"]
            if self.best_path is not None:
                self.model.save(self.best_path)
        if self.verbose:
            print(f"eval @ {row['timesteps']}: sync-excess {row['sync_excess_pct']:.3f} %, "
                  f"{row['merges']:.1f} merges, return {row['mean_reward']:.3f}")
        return row


def _versions() -> dict[str, str]:
    import stable_baselines3
    import torch

    import diloco_gym

    out = {"diloco_gym": diloco_gym.__version__,  # the trace generator's draws per seed
           "python": platform.python_version(), "stable_baselines3": stable_baselines3.__version__,
           "torch": torch.__version__, "gymnasium": gym.__version__, "numpy": np.__version__}
    try:
        import sb3_contrib

        out["sb3_contrib"] = sb3_contrib.__version__
    except ImportError:  # pragma: no cover - part of the rl extra
        pass
    return out


def train(algo: str, regime: str = "bursty", timesteps: int = 200_000, seed: int = 0,
          out: str | Path = "runs/train", n_envs: int = 4, eval_episodes: int = 10,
          eval_freq: int = 10_000, checkpoint_freq: int = 50_000, resume: bool = False,
          progress_bar: bool = False, env_kwargs: dict[str, Any] | None = None,
          hyperparameters: dict[str, Any] | None = None, verbose: int = 0,
          command: str | None = None) -> Path:
    """Train an RL scheduler and save ``out/model.zip`` and ``out/meta.json``.

    Args:
        algo: ``"ppo"``, ``"maskable-ppo"`` (sb3-contrib, uses the env's
            ``action_masks()``; with the default ``skip_forced=True`` and no
            ``merge_budget`` both actions are always feasible, so the mask is all-true)
            or ``"dqn"``.
        regime: training regime name.
        timesteps: total environment steps (agent decisions) to train for.
        seed: training seed: seeds torch/numpy/random, the model and the envs (env ``i``'s
            episode-seed generator is seeded with ``seed + i``). Same seed, same machine and
            library versions give the same model.
        out: output directory (created).
        n_envs: environments in the ``DummyVecEnv``.
        eval_episodes: validation episodes per evaluation (seeds ``VALIDATION_SEED0 + i``);
            ``0`` disables evaluation.
        eval_freq: evaluate every this many timesteps (summed over envs); ``0``: only at
            the end.
        checkpoint_freq: save a checkpoint every this many timesteps; ``0`` disables.
        resume: continue from the latest checkpoint in ``out/checkpoints`` (if any) up to
            ``timesteps`` in total (``reset_num_timesteps=False``).
        progress_bar: show SB3's progress bar (needs tqdm and rich).
        env_kwargs: extra ``DiLoCoSyncEnv`` keyword arguments (``EnvParams`` fields).
        hyperparameters: overrides of :func:`default_hyperparameters`.
        verbose: SB3 verbosity (0 silent).
        command: the command line to record in ``meta.json``.

    Returns:
        The path of the saved ``model.zip``.
    """
    import torch
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.utils import set_random_seed
    from stable_baselines3.common.vec_env import DummyVecEnv

    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if timesteps < 1 or n_envs < 1 or eval_episodes < 0 or eval_freq < 0 or checkpoint_freq < 0:
        raise ValueError("timesteps and n_envs must be >= 1; eval_episodes, eval_freq and "
                         "checkpoint_freq must be >= 0")
    env_kwargs = dict(env_kwargs or {})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    set_random_seed(seed)
    started = time.perf_counter()

    cls = _algo_class(algo)
    vec_env = DummyVecEnv([
        (lambda i=i: make_train_env(regime, seed + i, env_kwargs)) for i in range(n_envs)])
    hp = default_hyperparameters(algo, n_envs, timesteps)
    hp.update(hyperparameters or {})

    ckpt = latest_checkpoint(out) if resume else None
    if ckpt is not None:
        model = cls.load(ckpt, env=vec_env, device="cpu", tensorboard_log=str(out / "tb"))
        buffer = ckpt.with_name(ckpt.name.replace("_steps.zip", "_steps.pkl").replace(
            "rl_model_", "rl_model_replay_buffer_"))
        if algo == "dqn" and buffer.exists():
            model.load_replay_buffer(buffer)
        # fresh, reproducible streams for the continuation
        model.set_random_seed(seed + int(model.num_timesteps))
        vec_env.seed(seed + int(model.num_timesteps))
        if verbose:
            print(f"resuming from {ckpt} at {model.num_timesteps} timesteps")
    else:
        model = cls("MlpPolicy", vec_env, seed=seed, device="cpu", verbose=verbose,
                    tensorboard_log=str(out / "tb"), **hp)
    done = int(model.num_timesteps)
    remaining = max(0, int(timesteps) - done)

    callbacks = []
    if checkpoint_freq > 0:
        callbacks.append(CheckpointCallback(
            save_freq=max(1, checkpoint_freq // n_envs), save_path=str(out / "checkpoints"),
            name_prefix="rl_model", save_replay_buffer=(algo == "dqn"), verbose=0))
    evaluator = None
    if eval_episodes > 0:
        seeds = [VALIDATION_SEED0 + i for i in range(eval_episodes)]
        evaluator = HeldOutEvalCallback(
            DiLoCoSyncEnv(regime=regime, **env_kwargs), seeds,
            eval_freq=max(1, eval_freq // n_envs) if eval_freq > 0 else 0,
            best_path=out / "best_model.zip", verbose=verbose)
        callbacks.append(evaluator)
    if remaining > 0:
        model.learn(total_timesteps=remaining, callback=CallbackList(callbacks),
                    reset_num_timesteps=ckpt is None, progress_bar=progress_bar,
                    tb_log_name=algo)
    final_eval = None
    if evaluator is not None:
        if evaluator.model is None:  # learn() did not run (resumed at the target)
            evaluator.init_callback(model)
        final_eval = evaluator.evaluate()
    model_path = out / "model.zip"
    model.save(model_path)
    train_seeds = sorted({s for e in vec_env.envs
                          for s in e.get_wrapper_attr("episode_seeds")})
    assert all(TRAIN_SEED_LOW <= s < TRAIN_SEED_HIGH for s in train_seeds)
    base = DiLoCoSyncEnv(regime=regime, **env_kwargs)
    meta = {
        "algo": algo,
        "regime": regime,
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": int(timesteps),
        "seed": int(seed),
        "n_envs": int(n_envs),
        "resumed_from": str(ckpt) if ckpt is not None else None,
        "env_kwargs": env_kwargs,
        "env_params": asdict(base.params),
        "hyperparameters": {k: v for k, v in hp.items()},
        "seed_ranges": {"train_episode_seeds": [TRAIN_SEED_LOW, TRAIN_SEED_HIGH],
                        "held_out_below": HELD_OUT_SEED_HIGH,
                        "validation_seeds": [VALIDATION_SEED0, VALIDATION_SEED0 + eval_episodes]},
        "train_episodes_this_run": len(train_seeds),
        "final_validation": final_eval,
        "best_validation_sync_excess_pct": (evaluator.best_sync_excess
                                            if evaluator is not None else None),
        "evaluations": evaluator.history if evaluator is not None else [],
        "train_seconds": round(time.perf_counter() - started, 1),
        "command": command,
        "versions": _versions(),
        "name": f"learned:{algo}-{regime}",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    vec_env.close()
    return model_path


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``diloco-gym train`` options to ``parser``."""
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="RL algorithm")
    parser.add_argument("--regime", default="bursty", help=f"one of {', '.join(REGIMES)}")
    parser.add_argument("--timesteps", type=int, default=200_000,
                        help="total agent decisions to train for (default 200000)")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    parser.add_argument("--out", default="runs/train",
                        help="output directory: model.zip, meta.json, tb/, checkpoints/")
    parser.add_argument("--n-envs", type=int, default=4, help="parallel envs (default 4)")
    parser.add_argument("--eval-episodes", type=int, default=10,
                        help="validation episodes per evaluation, seeds 900000+ (0: none)")
    parser.add_argument("--eval-freq", type=int, default=10_000,
                        help="evaluate every N timesteps (default 10000; 0: only at the end)")
    parser.add_argument("--checkpoint-freq", type=int, default=50_000,
                        help="checkpoint every N timesteps (default 50000; 0: none)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in OUT/checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", type=int, default=0, help="SB3 verbosity (0, 1, 2)")


def run_train_command(args: argparse.Namespace) -> int:
    """Run ``diloco-gym train`` with parsed ``args``; returns the exit status."""
    if args.regime not in REGIMES:
        raise SystemExit(f"diloco-gym: unknown regime {args.regime!r}; valid regimes: "
                         f"{', '.join(REGIMES)}")
    if args.timesteps < 1 or args.n_envs < 1:
        raise SystemExit("diloco-gym: --timesteps and --n-envs must be >= 1")
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = train(args.algo, regime=args.regime, timesteps=args.timesteps, seed=args.seed,
                 out=args.out, n_envs=args.n_envs, eval_episodes=args.eval_episodes,
                 eval_freq=args.eval_freq, checkpoint_freq=args.checkpoint_freq,
                 resume=args.resume, progress_bar=not args.no_progress, verbose=args.verbose,
                 command=command)
    meta = json.loads((path.parent / "meta.json").read_text())
    fv = meta.get("final_validation") or {}
    print(f"saved {path} ({meta['timesteps']} timesteps, {meta['train_seconds']} s)")
    if fv:
        print(f"validation (seeds {VALIDATION_SEED0}+, deterministic): sync-excess "
              f"{fv['sync_excess_pct']:.3f} %, {fv['merges']:.1f} merges per episode")
    return 0
