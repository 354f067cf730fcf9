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
  and distinct from the report's test seeds (``report``, ``frontier`` and ``sweep`` refuse
  seeds from ``VALIDATION_SEED0`` on; :mod:`diloco_gym.eval.seed_ranges`), so choosing the
  best checkpoint does not peek at the report.

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
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.eval.rollout import run_episode
from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW, VALIDATION_SEED0
from diloco_gym.sim.regimes import REGIMES

__all__ = [
    "ALGOS",
    "TRAIN_SEED_LOW",
    "TRAIN_SEED_HIGH",
    "HELD_OUT_SEED_HIGH",
    "VALIDATION_SEED0",
    "TrainSeedWrapper",
    "HeldOutEvalCallback",
    "make_train_env",
    "train",
    "add_train_arguments",
    "run_train_command",
    "latest_checkpoint",
    "check_run_dir",
    "validation_comparison",
    "RUN_ARTEFACTS",
]

#: Algorithms ``train`` knows, by CLI name.
ALGOS = ("ppo", "maskable-ppo", "dqn")
#: Episode seeds below this are held out from training (report / run / validation); the
#: ranges are defined in :mod:`diloco_gym.eval.seed_ranges`.
HELD_OUT_SEED_HIGH = TRAIN_SEED_LOW

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

    def __init__(
        self,
        env: gym.Env,
        low: int = TRAIN_SEED_LOW,
        high: int = TRAIN_SEED_HIGH,
        seed: int | None = None,
    ) -> None:
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


#: How ``train`` batches its ``n_envs`` environments (``--vec-env``).
VEC_ENVS = ("native", "subproc", "dummy")


def _train_seed_vector_env():
    """The native vector env with :class:`TrainSeedWrapper`'s seed rule (built lazily: the
    class derives from :class:`~diloco_gym.envs.vector.DiLoCoSyncVectorEnv`)."""
    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    class TrainSeedVectorEnv(DiLoCoSyncVectorEnv):
        """Every episode seed of env ``i`` drawn from ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)``
        by a generator seeded with the seed ``reset`` gives env ``i``, exactly as a
        :class:`TrainSeedWrapper` does: a training episode can never use a held-out seed,
        and env ``i`` plays the episodes of the ``dummy`` / ``subproc`` kinds' env ``i``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._train_rngs: list[np.random.Generator] = [
                np.random.default_rng() for _ in range(self.num_envs)
            ]
            #: the episode seeds used so far (for audits and tests).
            self.train_episode_seeds: list[int] = []

        def _next_seed(self, i: int, seed: int | None) -> int:
            if seed is not None:
                self._train_rngs[i] = np.random.default_rng(seed)
            episode_seed = int(self._train_rngs[i].integers(TRAIN_SEED_LOW, TRAIN_SEED_HIGH))
            self.train_episode_seeds.append(episode_seed)
            return episode_seed

    return TrainSeedVectorEnv


def make_train_vec_env(
    kind: str, regime: str, seed: int, n_envs: int, env_kwargs: dict[str, Any] | None = None
):
    """The SB3 vector env ``train`` learns on.

    Args:
        kind: ``"native"`` (:class:`~diloco_gym.rl.sb3.SB3VecEnv` over the batched native
            vector env in this process: the ``n_envs`` envs step as one array operation),
            ``"subproc"`` (SB3's ``SubprocVecEnv``: one process per env) or ``"dummy"``
            (SB3's ``DummyVecEnv``: the envs one after another).
        regime, env_kwargs: the training environment.
        seed: env ``i``'s episode-seed generator starts from ``seed + i`` (every kind).
        n_envs: environments.

    Returns:
        The vector env, with episode statistics (``Monitor`` / ``VecMonitor``).
    """
    env_kwargs = dict(env_kwargs or {})
    if kind == "native":
        from gymnasium.vector import AutoresetMode
        from stable_baselines3.common.vec_env import VecMonitor

        from diloco_gym.rl.sb3 import SB3VecEnv

        venv = _train_seed_vector_env()(
            n_envs, regime=regime, autoreset_mode=AutoresetMode.SAME_STEP, **env_kwargs
        )
        vec = VecMonitor(SB3VecEnv(venv))
        vec.seed(seed)
        return vec

    def env_fn(i: int) -> Callable[[], gym.Env]:
        return lambda: make_train_env(regime, seed + i, env_kwargs)

    fns = [env_fn(i) for i in range(n_envs)]
    if kind == "dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(fns)
    if kind == "subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv(fns, start_method="spawn")
    raise ValueError(f"unknown vec env {kind!r}; valid: {', '.join(VEC_ENVS)}")


def _train_episode_seeds(vec_env) -> list[int]:
    """The training episode seeds a vector env from :func:`make_train_vec_env` used."""
    inner = getattr(vec_env, "venv", None)
    native = getattr(inner, "venv", None)
    if native is not None and hasattr(native, "train_episode_seeds"):
        return list(native.train_episode_seeds)
    return [s for seeds in vec_env.get_attr("episode_seeds") for s in seeds]


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
        return {
            "n_steps": n_steps,
            "batch_size": 256,
            "n_epochs": 10,
            "learning_rate": 3e-4,
            "gamma": 0.995,
            "gae_lambda": 0.95,
            "ent_coef": 0.01,
            "clip_range": 0.2,
            "policy_kwargs": arch,
        }
    if algo == "dqn":
        return {
            "learning_rate": 5e-4,
            "buffer_size": 100_000,
            "learning_starts": int(min(5_000, max(64, timesteps // 10))),
            "batch_size": 64,
            "gamma": 0.995,
            "train_freq": 4,
            "target_update_interval": 1_000,
            "exploration_fraction": 0.3,
            "exploration_final_eps": 0.02,
            "policy_kwargs": arch,
        }
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
    seed with :func:`diloco_gym.eval.rollout.run_episode`, records ``eval/sync_excess_pct``
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

    def __init__(
        self,
        env: DiLoCoSyncEnv,
        seeds: list[int],
        eval_freq: int,
        best_path: Path | None,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        bad = [s for s in seeds if not 0 <= s < HELD_OUT_SEED_HIGH]
        if bad:
            raise ValueError(
                f"evaluation seeds must be held out (< {HELD_OUT_SEED_HIGH}); got {bad[:5]}"
            )
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
        row = {
            "timesteps": int(self.model.num_timesteps),
            "sync_excess_pct": float(np.mean([r["sync_excess_pct"] for r in res])),
            "merges": float(np.mean([r["merges"] for r in res])),
            "mean_reward": float(np.mean([r["return"] for r in res])),
        }
        self.history.append(row)
        if getattr(self.model, "_logger", None) is not None:  # set once learn() started
            for k in ("sync_excess_pct", "merges", "mean_reward"):
                self.logger.record(f"eval/{k}", row[k])
        if row["sync_excess_pct"] < self.best_sync_excess:
            self.best_sync_excess = row["sync_excess_pct"]
            if self.best_path is not None:
                self.model.save(self.best_path)
        if self.verbose:
            print(
                f"eval @ {row['timesteps']}: sync-excess {row['sync_excess_pct']:.3f} %, "
                f"{row['merges']:.1f} merges, return {row['mean_reward']:.3f}"
            )
        return row


def _versions() -> dict[str, str]:
    import stable_baselines3
    import torch

    import diloco_gym

    out = {
        "diloco_gym": diloco_gym.__version__,  # the trace generator's draws per seed
        "python": platform.python_version(),
        "stable_baselines3": stable_baselines3.__version__,
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
    }
    try:
        import sb3_contrib

        out["sb3_contrib"] = sb3_contrib.__version__
    except ImportError:  # pragma: no cover - part of the rl extra
        pass
    return out


#: What a training run writes in its directory (``--force`` removes these and nothing else).
RUN_ARTEFACTS = ("model.zip", "best_model.zip", "meta.json", "checkpoints", "tb")


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the run's metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the run's metadata is not a JSON object")
    return meta


def check_run_dir(
    out: str | Path,
    algo: str,
    regime: str,
    resume: bool = False,
    force: bool = False,
    apply: bool = True,
) -> Path | None:
    """Check the output directory of a training run before anything is written.

    A missing or empty directory starts a new run. An existing run (a directory with
    ``meta.json``, written when a run starts) is continued only with ``resume`` and the
    same algorithm and regime as its metadata, or replaced with ``force`` (which removes
    the files in :data:`RUN_ARTEFACTS` and nothing else). A non-empty directory that is
    not a run is never used.

    Args:
        apply: with ``force``, remove the previous run's files (``False``: only check).

    Returns:
        With ``resume``, the file to continue from (the latest checkpoint, else
        ``model.zip``); otherwise ``None``.

    Raises:
        FileExistsError: ``out`` holds a run (without ``resume`` / ``force``), is not a
            directory, or is a non-empty directory that is not a run.
        FileNotFoundError: ``resume`` and there is no run (or nothing to continue from).
        ValueError: ``resume`` with another algorithm or regime than the run's, or both
            ``resume`` and ``force``.
    """
    out = Path(out)
    if resume and force:
        raise ValueError(
            "--resume and --force exclude each other: --resume continues the "
            "run in OUT, --force replaces it"
        )
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    meta_path = out / "meta.json"
    non_empty = out.is_dir() and any(out.iterdir())
    if resume:
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"--resume: there is no training run in {out} (no "
                f"meta.json); leave out --resume to start a new run"
            )
        meta = _read_meta(meta_path)
        for key, want in (("algo", algo), ("regime", regime)):
            if meta.get(key) != want:
                flag = "--algo" if key == "algo" else "--regime"
                raise ValueError(
                    f"--resume: {out} is a {meta.get('algo')} run on "
                    f"{meta.get('regime')}; it cannot continue with {flag} "
                    f"{want} (pass {flag} {meta.get(key)}, or --force to "
                    f"start over)"
                )
        start = latest_checkpoint(out)
        if start is None and (out / "model.zip").is_file():
            start = out / "model.zip"
        if start is None:
            raise FileNotFoundError(
                f"--resume: {out} has no checkpoint and no model.zip to continue from"
            )
        return start
    if not non_empty:
        return None
    if not meta_path.is_file():
        raise FileExistsError(
            f"{out} is not empty and is not a diloco-gym training run (no "
            f"meta.json); choose another --out"
        )
    if not force:
        meta = _read_meta(meta_path)
        raise FileExistsError(
            f"{out} already holds a training run ({meta.get('algo')} on "
            f"{meta.get('regime')}, {meta.get('status', 'complete')}); "
            f"pass --resume to continue it or --force to replace it"
        )
    for name in RUN_ARTEFACTS if apply else ():
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    return None


def train(
    algo: str,
    regime: str = "bursty",
    timesteps: int = 200_000,
    seed: int = 0,
    out: str | Path = "runs/train",
    n_envs: int = 4,
    eval_episodes: int = 10,
    eval_freq: int = 10_000,
    checkpoint_freq: int = 50_000,
    resume: bool = False,
    progress_bar: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    hyperparameters: dict[str, Any] | None = None,
    verbose: int = 0,
    command: str | None = None,
    force: bool = False,
    vec_env: str = "native",
) -> Path:
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
        n_envs: environments, batched as ``vec_env`` says.
        eval_episodes: validation episodes per evaluation (seeds ``VALIDATION_SEED0 + i``);
            ``0`` disables evaluation.
        eval_freq: evaluate every this many timesteps (summed over envs); ``0``: only at
            the end.
        checkpoint_freq: save a checkpoint every this many timesteps; ``0`` disables.
        resume: continue the run in ``out`` (same algorithm and regime, checked against
            its ``meta.json``) from its latest checkpoint, else its ``model.zip``, up to
            ``timesteps`` in total (``reset_num_timesteps=False``).
        progress_bar: show SB3's progress bar (needs tqdm and rich).
        env_kwargs: extra ``DiLoCoSyncEnv`` keyword arguments (``EnvParams`` fields).
        hyperparameters: overrides of :func:`default_hyperparameters`.
        verbose: SB3 verbosity (0 silent).
        command: the command line to record in ``meta.json``.
        force: replace an existing run in ``out`` (see :func:`check_run_dir`).
        vec_env: ``"native"`` (default), ``"subproc"`` or ``"dummy"``; see
            :func:`make_train_vec_env`. Same seed and kind, same model.

    Returns:
        The path of the saved ``model.zip``.

    Raises:
        FileExistsError, FileNotFoundError, ValueError: see :func:`check_run_dir`.
    """
    import torch
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.utils import set_random_seed

    if vec_env not in VEC_ENVS:
        raise ValueError(f"unknown vec env {vec_env!r}; valid: {', '.join(VEC_ENVS)}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if timesteps < 1 or n_envs < 1 or eval_episodes < 0 or eval_freq < 0 or checkpoint_freq < 0:
        raise ValueError(
            "timesteps and n_envs must be >= 1; eval_episodes, eval_freq and "
            "checkpoint_freq must be >= 0"
        )
    env_kwargs = dict(env_kwargs or {})
    out = Path(out)
    start = check_run_dir(out, algo, regime, resume=resume, force=force)
    out.mkdir(parents=True, exist_ok=True)
    if start is None:
        # Written first, so that an interrupted run can be resumed (and checked) later.
        (out / "meta.json").write_text(
            json.dumps(
                {
                    "algo": algo,
                    "regime": regime,
                    "seed": int(seed),
                    "status": "training",
                    "command": command,
                    "name": f"learned:{algo}-{regime}",
                },
                indent=2,
            )
            + "\n"
        )
    torch.set_num_threads(1)
    set_random_seed(seed)
    started = time.perf_counter()

    cls = _algo_class(algo)
    vec_kind = vec_env
    vec_env = make_train_vec_env(vec_kind, regime, seed, n_envs, env_kwargs)
    hp = default_hyperparameters(algo, n_envs, timesteps)
    hp.update(hyperparameters or {})

    ckpt = start
    if ckpt is not None:
        model = cls.load(ckpt, env=vec_env, device="cpu", tensorboard_log=str(out / "tb"))
        buffer = ckpt.with_name(
            ckpt.name.replace("_steps.zip", "_steps.pkl").replace(
                "rl_model_", "rl_model_replay_buffer_"
            )
        )
        if algo == "dqn" and ckpt.parent.name == "checkpoints" and buffer.exists():
            model.load_replay_buffer(buffer)
        # fresh, reproducible streams for the continuation
        model.set_random_seed(seed + int(model.num_timesteps))
        vec_env.seed(seed + int(model.num_timesteps))
        if verbose:
            print(f"resuming from {ckpt} at {model.num_timesteps} timesteps")
    else:
        model = cls(
            "MlpPolicy",
            vec_env,
            seed=seed,
            device="cpu",
            verbose=verbose,
            tensorboard_log=str(out / "tb"),
            **hp,
        )
    done = int(model.num_timesteps)
    remaining = max(0, int(timesteps) - done)

    callbacks: list[BaseCallback] = []
    if checkpoint_freq > 0:
        callbacks.append(
            CheckpointCallback(
                save_freq=max(1, checkpoint_freq // n_envs),
                save_path=str(out / "checkpoints"),
                name_prefix="rl_model",
                save_replay_buffer=(algo == "dqn"),
                verbose=0,
            )
        )
    evaluator = None
    if eval_episodes > 0:
        seeds = [VALIDATION_SEED0 + i for i in range(eval_episodes)]
        evaluator = HeldOutEvalCallback(
            DiLoCoSyncEnv(regime=regime, **env_kwargs),
            seeds,
            eval_freq=max(1, eval_freq // n_envs) if eval_freq > 0 else 0,
            best_path=out / "best_model.zip",
            verbose=verbose,
        )
        callbacks.append(evaluator)
    if remaining > 0:
        model.learn(
            total_timesteps=remaining,
            callback=CallbackList(callbacks),
            reset_num_timesteps=ckpt is None,
            progress_bar=progress_bar,
            tb_log_name=algo,
        )
    final_eval = None
    if evaluator is not None:
        if evaluator.model is None:  # learn() did not run (resumed at the target)
            evaluator.init_callback(model)
        final_eval = evaluator.evaluate()
    model_path = out / "model.zip"
    model.save(model_path)
    train_seeds = sorted(set(_train_episode_seeds(vec_env)))
    assert all(TRAIN_SEED_LOW <= s < TRAIN_SEED_HIGH for s in train_seeds)
    base = DiLoCoSyncEnv(regime=regime, **env_kwargs)
    meta = {
        "algo": algo,
        "regime": regime,
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": int(timesteps),
        "seed": int(seed),
        "n_envs": int(n_envs),
        "vec_env": vec_kind,
        "resumed_from": str(ckpt) if ckpt is not None else None,
        "env_kwargs": env_kwargs,
        "env_params": asdict(base.params),
        "hyperparameters": {k: v for k, v in hp.items()},
        "seed_ranges": {
            "train_episode_seeds": [TRAIN_SEED_LOW, TRAIN_SEED_HIGH],
            "held_out_below": HELD_OUT_SEED_HIGH,
            "validation_seeds": [VALIDATION_SEED0, VALIDATION_SEED0 + eval_episodes],
        },
        "train_episodes_this_run": len(train_seeds),
        "final_validation": final_eval,
        "best_validation_sync_excess_pct": (
            evaluator.best_sync_excess if evaluator is not None else None
        ),
        "evaluations": evaluator.history if evaluator is not None else [],
        "train_seconds": round(time.perf_counter() - started, 1),
        "command": command,
        "versions": _versions(),
        "name": f"learned:{algo}-{regime}",
        "status": "complete",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    vec_env.close()
    return model_path


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``diloco-gym train`` options to ``parser``."""
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="RL algorithm")
    parser.add_argument("--regime", default="bursty", help=f"one of {', '.join(REGIMES)}")
    parser.add_argument(
        "--timesteps",
        type=int,
        default=200_000,
        help="total agent decisions to train for (default 200000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    parser.add_argument(
        "--out",
        default="runs/train",
        help="output directory: model.zip, meta.json, tb/, checkpoints/; an "
        "existing run needs --resume or --force",
    )
    parser.add_argument(
        "--n-envs", type=int, default=4, help="environments stepped together (default 4)"
    )
    parser.add_argument(
        "--vec-env",
        choices=VEC_ENVS,
        default="native",
        help="how the --n-envs envs are batched: native (one batched env in "
        "this process, default), subproc (one process per env) or dummy "
        "(one after another)",
    )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=10,
        help="validation episodes per evaluation, seeds 900000+ (0: none)",
    )
    parser.add_argument(
        "--eval-freq",
        type=int,
        default=10_000,
        help="evaluate every N timesteps (default 10000; 0: only at the end)",
    )
    parser.add_argument(
        "--checkpoint-freq",
        type=int,
        default=50_000,
        help="checkpoint every N timesteps (default 50000; 0: none)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUT (same --algo and --regime as its "
        "meta.json) from its latest checkpoint",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the training run in OUT (removes its model, meta, "
        "checkpoints and logs; other files stay)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", type=int, default=0, help="SB3 verbosity (0, 1, 2)")


class _ActionCounter:
    """Wraps an agent and counts the merges it *chooses* (action 1); the env adds the
    merges forced at the H_max limit on its own."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.name = agent.name
        self.chosen = 0

    def predict(self, obs, **kwargs):
        action, state = self.agent.predict(obs, **kwargs)
        self.chosen += int(int(np.asarray(action).reshape(-1)[0]) == 1)
        return action, state


def validation_comparison(
    model: str | Path | Any,
    regime: str,
    seeds: list[int],
    env_kwargs: dict[str, Any] | None = None,
    draws: int = 200,
) -> dict[str, Any]:
    """The trained agent next to fixed-512 and its matched random on validation seeds.

    Matched random is scored as in ``diloco-gym report``: per episode, the mean
    sync-excess of ``draws`` schedules drawn uniformly among those with the agent's own
    number of merges.

    Args:
        model: a trained model file, or an agent (``predict`` / ``name``).
        regime: the validation regime.
        seeds: validation episode seeds.
        env_kwargs: extra ``DiLoCoSyncEnv`` keyword arguments.
        draws: matched-random draws per episode.

    Returns:
        ``{"seeds", "agent", "fixed-512", "matched random"}`` (each with mean
        ``sync_excess_pct`` and ``merges_per_hour``), ``"chosen_merges"`` (merges the
        policy chose, over all episodes, the rest being forced) and
        ``"same_schedules_as_fixed_512"`` (episodes whose merges equal fixed-512's).
    """
    from agents.learned import load_learned_agent
    from agents.registry import make_agent
    from diloco_gym.eval import protocol

    env = DiLoCoSyncEnv(regime=regime, **(env_kwargs or {}))
    agent = _ActionCounter(load_learned_agent(model) if isinstance(model, (str, Path)) else model)
    fixed = make_agent("fixed-512")
    rows: dict[str, list[tuple[float, float]]] = {
        "agent": [],
        "fixed-512": [],
        "matched random": [],
    }
    same = 0
    for seed in seeds:
        res = run_episode(env, agent, seed)
        ep = env.episode
        assert ep is not None  # run_episode() reset env
        per_hour = 3600.0 / ep.trace.duration_s
        m = int(res["merges"])
        counts = protocol.counts_for(ep.n_decisions, env.params, max(m, 40))
        mr = protocol.envelope(
            ep,
            m,
            draws,
            np.random.default_rng([seed, m, 7]),
            env.params,
            env.sidecar,
            counts=counts,
        )
        rows["agent"].append((res["sync_excess_pct"], m * per_hour))
        rows["matched random"].append((float(mr.mean()), m * per_hour))
        ref = run_episode(env, fixed, seed)
        rows["fixed-512"].append((ref["sync_excess_pct"], ref["merges"] * per_hour))
        same += int(list(res["merge_decisions"]) == list(ref["merge_decisions"]))
    out: dict[str, Any] = {"seeds": [int(s) for s in seeds], "agent_name": agent.name}
    for key, vals in rows.items():
        arr = np.array(vals, dtype=float)
        out[key] = {
            "sync_excess_pct": float(arr[:, 0].mean()),
            "merges_per_hour": float(arr[:, 1].mean()),
        }
    out["chosen_merges"] = agent.chosen
    out["same_schedules_as_fixed_512"] = same
    return out


def format_comparison(cmp: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The lines ``train`` prints for :func:`validation_comparison`: (table, warnings)."""
    seeds = cmp["seeds"]
    lines = [
        f"validation episodes (seeds {seeds[0]}..{seeds[-1]}, deterministic policy), means:",
        f"  {'':<28} {'sync-excess %':>13} {'merges/h':>9}",
    ]
    for key, label in (
        ("agent", cmp["agent_name"]),
        ("fixed-512", "fixed-512"),
        ("matched random", "matched random (same merges)"),
    ):
        r = cmp[key]
        lines.append(f"  {label:<28} {r['sync_excess_pct']:>13.3f} {r['merges_per_hour']:>9.1f}")
    warnings = []
    n = len(seeds)
    if cmp["chosen_merges"] == 0:
        warnings.append(
            f"warning: the policy never chose to merge in the {n} validation episodes: every "
            f"merge it made was forced at the H_max limit, so it schedules like fixed-512 "
            f"({cmp['same_schedules_as_fixed_512']} of {n} episodes identical). Train longer "
            f"(--timesteps) or check the reward."
        )
    elif cmp["same_schedules_as_fixed_512"] == n:
        warnings.append(
            f"warning: the policy's merges equal fixed-512's in all {n} "
            f"validation episodes. Train longer (--timesteps)."
        )
    return lines, warnings


def run_train_command(args: argparse.Namespace) -> int:
    """Run ``diloco-gym train`` with parsed ``args``; returns the exit status.

    After training it prints the final model's validation result next to fixed-512 and
    its matched random, and warns when the policy never chooses to merge.
    """
    from diloco_gym.errors import UsageError

    if args.regime not in REGIMES:
        raise UsageError(f"unknown regime {args.regime!r}; valid regimes: {', '.join(REGIMES)}")
    if args.timesteps < 1 or args.n_envs < 1:
        raise UsageError("--timesteps and --n-envs must be >= 1")
    if args.eval_episodes < 0 or args.eval_freq < 0 or args.checkpoint_freq < 0:
        raise UsageError("--eval-episodes, --eval-freq and --checkpoint-freq must be >= 0")
    try:
        check_run_dir(
            args.out, args.algo, args.regime, resume=args.resume, force=args.force, apply=False
        )
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = train(
        args.algo,
        regime=args.regime,
        timesteps=args.timesteps,
        seed=args.seed,
        out=args.out,
        n_envs=args.n_envs,
        eval_episodes=args.eval_episodes,
        eval_freq=args.eval_freq,
        checkpoint_freq=args.checkpoint_freq,
        resume=args.resume,
        progress_bar=not args.no_progress,
        verbose=args.verbose,
        command=command,
        force=args.force,
        vec_env=args.vec_env,
    )
    meta_path = path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    print(f"saved {path} ({meta['timesteps']} timesteps, {meta['train_seconds']} s)")
    n_val = args.eval_episodes if args.eval_episodes > 0 else 10
    cmp = validation_comparison(path, args.regime, [VALIDATION_SEED0 + i for i in range(n_val)])
    meta["validation_comparison"] = cmp
    meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    lines, warnings = format_comparison(cmp)
    print("\n".join(lines))
    for w in warnings:
        print(w, file=sys.stderr)
    return 0
