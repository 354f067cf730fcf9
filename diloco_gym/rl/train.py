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
import os
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

    return _sb3_vec_env(
        kind,
        [env_fn(i) for i in range(n_envs)],
        f"unknown vec env {kind!r}; valid: {', '.join(VEC_ENVS)}",
    )


def _sb3_vec_env(kind: str, fns: list[Callable[[], gym.Env]], unknown: str) -> Any:
    """SB3's ``dummy`` or ``subproc`` vector env over ``fns`` (spawned workers); any other
    ``kind`` is a ``ValueError`` with the message ``unknown``."""
    if kind == "dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(fns)
    if kind == "subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv(fns, start_method="spawn")
    raise ValueError(unknown)


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
    found = checkpoints_newest_first(out)
    return found[0] if found else None


def checkpoints_newest_first(out: str | Path) -> list[Path]:
    """The checkpoints in ``out/checkpoints``, the one with the most timesteps first."""
    ckpt_dir = Path(out) / "checkpoints"
    found: list[tuple[int, Path]] = []
    for p in ckpt_dir.glob("*_steps.zip") if ckpt_dir.is_dir() else []:
        m = _CHECKPOINT_RE.search(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, key=lambda t: t[0], reverse=True)]


def model_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete saved model (a truncated or torn zip), or ``None``.

    A Stable-Baselines3 model file is a zip archive holding ``data`` (the parameters of
    the algorithm) and the policy weights; every member's CRC is checked.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "data" not in names or not any(n.endswith(".pth") for n in names):
                return "not a complete Stable-Baselines3 model (no data or weights)"
            bad = archive.testzip()
            if bad is not None:
                return f"member {bad!r} is corrupt (CRC mismatch)"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        return f"not a readable zip archive ({exc})"
    return None


def _save_atomic(save: Callable[[str], None], path: Path) -> None:
    """Write a file with ``save(tmp)`` beside ``path`` and rename it into place, so that a
    kill leaves either the old state or the complete file, never a torn one."""
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        save(str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class HeldOutEvalCallback(BaseCallback):
    """Deterministic evaluation on fixed held-out validation seeds.

    Every ``eval_freq`` callback calls (vector steps), plays one deterministic episode per
    seed and evaluation env with :func:`diloco_gym.eval.rollout.run_episode`, records
    ``eval/sync_excess_pct`` (exact replay, mean over every env and seed), ``eval/merges``
    and ``eval/mean_reward``, and saves ``best_path`` when the mean sync-excess is the
    lowest so far.

    With several evaluation envs (one per regime and budget of a budget-conditioned run)
    each history row also holds, per env label, the agent's sync-excess and, fixed once at
    the first evaluation, the matched-random mean and the oracle at that budget (by the
    report's exact scoring, ``draws`` random schedules per episode), so the validation curve
    shows the gap captured as training goes.

    Args:
        env: the evaluation env (not wrapped: it is reset with explicit held-out seeds), or
            a dict ``{label: env}``.
        seeds: episode seeds, all ``< HELD_OUT_SEED_HIGH``.
        eval_freq: evaluate every this many callback calls; ``0``: only on request.
        best_path: where to save the best model (``None``: do not save).
        verbose: print each evaluation when ``> 0``.
        obs_transform: the observation transform the policy was trained with
            (:mod:`diloco_gym.rl.wrappers`).
        draws: matched-random draws per episode for the per-env reference curves.

    Raises:
        ValueError: if a seed is not in the held-out range.
    """

    def __init__(
        self,
        env: DiLoCoSyncEnv | dict[str, DiLoCoSyncEnv],
        seeds: list[int],
        eval_freq: int,
        best_path: Path | None,
        verbose: int = 0,
        obs_transform: str | None = None,
        draws: int = 200,
    ) -> None:
        super().__init__(verbose)
        bad = [s for s in seeds if not 0 <= s < HELD_OUT_SEED_HIGH]
        if bad:
            raise ValueError(
                f"evaluation seeds must be held out (< {HELD_OUT_SEED_HIGH}); got {bad[:5]}"
            )
        self.eval_envs = dict(env) if isinstance(env, dict) else {"": env}
        self.eval_env = next(iter(self.eval_envs.values()))
        self.seeds = list(seeds)
        self.eval_freq = int(eval_freq)
        self.best_path = best_path
        self.best_sync_excess = float("inf")
        self.history: list[dict[str, Any]] = []
        self.obs_transform = obs_transform
        self.draws = int(draws)
        #: per env label: (matched-random mean, oracle) over the seeds, set at the first
        #: evaluation of a multi-env callback.
        self.references: dict[str, dict[str, float]] = {}

    def _on_step(self) -> bool:
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            self.evaluate()
        return True

    def _reference(self, label: str, env: DiLoCoSyncEnv, schedules: list) -> dict[str, float]:
        """Matched random and oracle at the agent's budget on this env's seeds (once)."""
        from diloco_gym.eval import protocol

        if label not in self.references:
            mr, orc = [], []
            for seed, sched in zip(self.seeds, schedules, strict=True):
                env.reset(seed=seed)
                ep = env.episode
                assert ep is not None
                scorer = protocol.EpisodeScorer(ep, env.params, env.sidecar)
                counts = protocol.counts_for(ep.n_decisions, env.params, max(len(sched), 1))
                sc = protocol.score_episode(
                    scorer, sched, self.draws, np.random.default_rng([seed, len(sched), 7]), counts
                )
                mr.append(sc["matched_random_mean"])
                orc.append(sc["oracle_same_budget_pct"])
            self.references[label] = {
                "matched_random_pct": float(np.mean(mr)),
                "oracle_pct": float(np.mean(orc)),
            }
        return self.references[label]

    def evaluate(self) -> dict[str, Any]:
        """Run the validation episodes now; returns the mean metrics."""
        from diloco_gym.agents.learned import LearnedAgent

        agent = LearnedAgent(self.model, name="eval", obs_transform=self.obs_transform)
        res: list[dict[str, Any]] = []
        per_env: dict[str, dict[str, float | None]] = {}
        for label, env in self.eval_envs.items():
            rows = [run_episode(env, agent, s) for s in self.seeds]
            res += rows
            if len(self.eval_envs) > 1 or env.params.merge_budget is not None:
                ref = self._reference(label, env, [r["merge_decisions"] for r in rows])
                mean = float(np.mean([r["sync_excess_pct"] for r in rows]))
                span = ref["matched_random_pct"] - ref["oracle_pct"]
                per_env[label] = {
                    "sync_excess_pct": mean,
                    **ref,
                    "gap_captured": (ref["matched_random_pct"] - mean) / span if span > 0 else None,
                }
        row: dict[str, Any] = {
            "timesteps": int(self.model.num_timesteps),
            "sync_excess_pct": float(np.mean([r["sync_excess_pct"] for r in res])),
            "merges": float(np.mean([r["merges"] for r in res])),
            "mean_reward": float(np.mean([r["return"] for r in res])),
        }
        if per_env:
            row["per_env"] = per_env
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
RUN_ARTEFACTS = (
    "model.zip",
    "best_model.zip",
    "meta.json",
    "checkpoints",
    "tb",
    "validation.csv",
    "validation.png",
)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a key given twice in one object is an error, not the last."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:60]!r}")
        out[key] = value
    return out


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(
            path.read_text(encoding="utf-8-sig"), object_pairs_hook=_no_duplicate_keys
        )
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the run's metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the run's metadata is not a JSON object")
    return meta


def _has_saved_model(out: Path) -> bool:
    """Whether the run in ``out`` saved a checkpoint or a final model."""
    return bool(checkpoints_newest_first(out)) or (out / "model.zip").is_file()


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

    With ``resume``, the latest checkpoint is verified first (:func:`model_file_problem`);
    a damaged one (truncated by a kill, say) is skipped with a warning on stderr for the
    previous one. A run killed before its first checkpoint (``meta.json`` says
    ``training`` and nothing was saved) is resumed as a fresh start.

    Returns:
        With ``resume``, the file to continue from (the latest intact checkpoint, else
        ``model.zip``; ``None``: nothing was saved, start afresh); otherwise ``None``.

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
        candidates = checkpoints_newest_first(out)
        if (out / "model.zip").is_file():
            candidates.append(out / "model.zip")
        for i, candidate in enumerate(candidates):
            problem = model_file_problem(candidate)
            if problem is None:
                return candidate
            after = candidates[i + 1] if i + 1 < len(candidates) else None
            print(
                f"diloco-gym: warning: {candidate} is damaged ({problem}); "
                + (f"continuing from {after.name} instead" if after else "no earlier one"),
                file=sys.stderr,
            )
        if not candidates and meta.get("status") == "training":
            return None  # stopped before its first checkpoint: resumed as a fresh start
        raise FileNotFoundError(
            f"--resume: {out} has no intact checkpoint and no model.zip to continue from; "
            f"--force replaces the run (it removes only the run's own files)"
        )
    if not non_empty:
        return None
    if not meta_path.is_file():
        raise FileExistsError(
            f"{out} is not empty and is not a diloco-gym training run (no "
            f"meta.json); choose another --out"
        )
    if not force:
        meta = _read_meta(meta_path)
        if meta.get("status") == "training" and not _has_saved_model(out):
            raise FileExistsError(
                f"{out} holds a {meta.get('algo')} run on {meta.get('regime')} that stopped "
                f"before its first checkpoint (nothing saved to continue from): --resume "
                f"starts it afresh, and --force is safe (it removes only the run's own files)"
            )
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


def make_spec_vec_env(
    kind: str,
    specs: list[Any],
    seed: int,
    n_envs: int,
    env_params: dict[str, Any] | None = None,
    obs_transform: str | None = None,
):
    """The SB3 vector env of a run over several env kinds (regimes and budgets).

    Env ``i`` is ``specs[i % len(specs)]`` (a :class:`~diloco_gym.rl.config.EnvSpec`),
    wrapped as ``Monitor(TrainSeedWrapper(BudgetFeatures(env)))`` when ``obs_transform`` is
    ``"budget"``; its episode-seed generator starts from ``seed + i``, as in
    :func:`make_train_vec_env`.

    Args:
        kind: ``"dummy"`` or ``"subproc"`` (the native vector env runs a single kind).
    """
    from stable_baselines3.common.monitor import Monitor

    from diloco_gym.rl.wrappers import BudgetFeatures

    def env_fn(i: int) -> Callable[[], gym.Env]:
        spec = specs[i % len(specs)]

        def make() -> gym.Env:
            env: gym.Env = spec.make(env_params)
            if obs_transform == "budget":
                env = BudgetFeatures(env)
            return Monitor(TrainSeedWrapper(env, seed=seed + i))

        return make

    return _sb3_vec_env(
        kind,
        [env_fn(i) for i in range(n_envs)],
        f"vec env {kind!r} cannot run several env kinds; use dummy or subproc",
    )


def behaviour_clone(
    model: Any,
    specs: list[Any],
    teacher: str,
    episodes: int,
    epochs: int,
    seed: int,
    env_params: dict[str, Any] | None = None,
    obs_transform: str | None = None,
    learning_rate: float = 1e-3,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Warm-start ``model``'s policy by imitating a teacher agent (behaviour cloning).

    The teacher (a deployable registry agent, e.g. ``online-forecast-budget``) plays
    ``episodes`` episodes of every env kind, with episode seeds from the training range
    ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)`` drawn from a generator seeded with ``seed``; the
    policy is then fitted to its actions by cross-entropy (``epochs`` passes, Adam, torch
    generator seeded with ``seed``). Reinforcement learning continues from there. The
    teacher sees what any agent sees (observations, masks, public parameters); the policy
    sees the transformed observations it is trained on.

    Returns:
        ``{"teacher", "episodes_per_env", "samples", "merge_share", "epochs",
        "train_accuracy", "merge_recall", "final_loss"}``.
    """
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.rl.wrappers import BudgetFeatures

    rng = np.random.default_rng([seed, 77])
    xs: list[np.ndarray] = []
    ys: list[int] = []
    from diloco_gym.envs.core import OBS_INDEX

    n_raw = len(OBS_INDEX)  # the teacher reads the env's own features
    for spec in specs:
        env: gym.Env = spec.make(env_params)
        if obs_transform is not None:
            env = BudgetFeatures(env)
        agent = make_agent(teacher)
        if not getattr(agent, "deployable", True):
            raise ValueError(f"behaviour cloning needs a deployable teacher, not {teacher!r}")
        teacher_samples(env, agent, episodes, rng, n_raw, xs, ys)
    return {"teacher": teacher, "episodes_per_env": int(episodes), "samples": len(ys)} | (
        fit_to_actions(model, xs, ys, epochs, seed, learning_rate, batch_size)
    )


def teacher_samples(
    env: gym.Env,
    agent: Any,
    episodes: int,
    rng: np.random.Generator,
    n_raw: int,
    xs: list[np.ndarray],
    ys: list[int],
) -> None:
    """Append to ``xs``/``ys`` the observations and actions of ``agent`` on ``episodes``
    episodes of ``env`` (seeds from the training range, drawn from ``rng``); the teacher
    reads the first ``n_raw`` features (the env's own), the policy the whole observation."""
    from diloco_gym.eval.rollout import attach_agent

    base = env.unwrapped
    for _ in range(episodes):
        ep_seed = int(rng.integers(TRAIN_SEED_LOW, TRAIN_SEED_HIGH))
        obs, _ = env.reset(seed=ep_seed)
        ctx = attach_agent(env, agent, ep_seed)
        done = False
        while not done:
            ctx._set_mask(base.action_masks())  # type: ignore[attr-defined]
            a, _ = agent.predict(np.asarray(obs)[:n_raw])
            xs.append(np.asarray(obs, dtype=np.float32))
            ys.append(int(a))
            obs, _, terminated, truncated, _ = env.step(int(a))
            done = bool(terminated or truncated)


def fit_to_actions(
    model: Any,
    xs: list[np.ndarray],
    ys: list[int],
    epochs: int,
    seed: int,
    learning_rate: float,
    batch_size: int,
) -> dict[str, Any]:
    """Fit ``model``'s policy to the actions ``ys`` at ``xs`` (cross-entropy, Adam, ``epochs``
    passes in a torch-generator order seeded with ``seed``).

    Returns:
        ``{"merge_share", "epochs", "train_accuracy", "merge_recall", "final_loss"}``.
    """
    import torch

    x = torch.as_tensor(np.stack(xs))
    y = torch.as_tensor(np.array(ys, dtype=np.int64))
    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    gen = torch.Generator().manual_seed(int(seed))
    loss = torch.tensor(0.0)
    policy.set_training_mode(True)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch_size):
            idx = perm[i : i + batch_size]
            loss = -policy.get_distribution(x[idx]).log_prob(y[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        pred = policy.get_distribution(x).distribution.probs.argmax(dim=1)
    merges = y == 1
    return {
        "merge_share": float(merges.float().mean()),
        "epochs": int(epochs),
        "train_accuracy": float((pred == y).float().mean()),
        "merge_recall": float((pred[merges] == 1).float().mean()) if merges.any() else None,
        "final_loss": float(loss.detach()),
    }


def _check_train_args(
    algo: str, regime: str, vec_env: str, counts: dict[str, int], specs: list[Any] | None
) -> None:
    """The argument checks of :func:`train` (one-line ``ValueError``)."""
    if vec_env not in VEC_ENVS:
        raise ValueError(f"unknown vec env {vec_env!r}; valid: {', '.join(VEC_ENVS)}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")
    if specs is None and regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if specs is not None and not specs:
        raise ValueError("env_specs: give at least one env kind")
    if counts["timesteps"] < 1 or counts["n_envs"] < 1 or min(counts.values()) < 0:
        raise ValueError(
            "timesteps and n_envs must be >= 1; eval_episodes, eval_freq and "
            "checkpoint_freq must be >= 0"
        )


def _write_start_meta(out: Path, algo: str, label: str, seed: int, command: str | None) -> None:
    """meta.json of a run that has started: written first, so that an interrupted run can
    be resumed (and checked) later."""
    start = {
        "algo": algo,
        "regime": label,
        "seed": int(seed),
        "status": "training",
        "command": command,
        "name": f"learned:{algo}-{label}",
    }
    (out / "meta.json").write_text(json.dumps(start, indent=2) + "\n")


def _build_model(
    algo: str, vec_env, hp: dict[str, Any], seed: int, out: Path, ckpt: Path | None, verbose: int
):
    """A new model, or the one of ``ckpt`` continued with fresh reproducible streams."""
    from diloco_gym.rl.config import policy_kwargs_for_sb3

    cls = _algo_class(algo)
    if ckpt is None:
        return cls(
            "MlpPolicy",
            vec_env,
            seed=seed,
            device="cpu",
            verbose=verbose,
            tensorboard_log=str(out / "tb"),
            **policy_kwargs_for_sb3(hp),
        )
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
    return model


def _eval_envs(
    specs: list[Any] | None, regime: str, env_kwargs: dict[str, Any]
) -> DiLoCoSyncEnv | dict[str, DiLoCoSyncEnv]:
    """The validation env(s): one per env kind, labelled ``regime@M`` with a budget."""
    if specs is None:
        return DiLoCoSyncEnv(regime=regime, **env_kwargs)
    envs: dict[str, DiLoCoSyncEnv] = {}
    for spec in specs:
        label = spec.label if spec.merge_budget is None else f"{spec.label}@{spec.merge_budget}"
        envs[label] = spec.make(env_kwargs)
    return envs


def _atomic_checkpoint_callback(base: type) -> type:
    """SB3's ``CheckpointCallback`` whose files are written atomically (:func:`_save_atomic`):
    a kill while saving leaves the previous checkpoints and no torn file."""

    class AtomicCheckpointCallback(base):
        def _on_step(self) -> bool:
            if self.n_calls % self.save_freq == 0:
                _save_atomic(self.model.save, Path(self._checkpoint_path(extension="zip")))
                buffer = getattr(self.model, "replay_buffer", None)
                if self.save_replay_buffer and buffer is not None:
                    path = Path(self._checkpoint_path("replay_buffer_", extension="pkl"))
                    _save_atomic(self.model.save_replay_buffer, path)
            return True

    return AtomicCheckpointCallback


def _callbacks(
    algo: str,
    out: Path,
    n_envs: int,
    checkpoint_freq: int,
    evaluator: HeldOutEvalCallback | None,
) -> list[BaseCallback]:
    from stable_baselines3.common.callbacks import CheckpointCallback

    callbacks: list[BaseCallback] = []
    if checkpoint_freq > 0:
        callbacks.append(
            _atomic_checkpoint_callback(CheckpointCallback)(
                save_freq=max(1, checkpoint_freq // n_envs),
                save_path=str(out / "checkpoints"),
                name_prefix="rl_model",
                save_replay_buffer=(algo == "dqn"),
                verbose=0,
            )
        )
    if evaluator is not None:
        callbacks.append(evaluator)
    return callbacks


def _final_meta(
    request: dict[str, Any],
    model: Any,
    venv: Any,
    hp: dict[str, Any],
    start: Path | None,
    evaluator: HeldOutEvalCallback | None,
    final_eval: dict[str, Any] | None,
    bc_record: dict[str, Any] | None,
    started: float,
) -> dict[str, Any]:
    """The meta.json of a finished run (``request``: the arguments :func:`train` got)."""
    r = request
    algo, regime, env_kwargs, env_specs = r["algo"], r["regime"], r["env_kwargs"], r["env_specs"]
    train_seeds = sorted(set(_train_episode_seeds(venv)))
    assert all(TRAIN_SEED_LOW <= s < TRAIN_SEED_HIGH for s in train_seeds)
    if env_specs is None:
        base_params = DiLoCoSyncEnv(regime=regime, **env_kwargs).params
    else:
        base_params = env_specs[0].make(env_kwargs).params
    meta = {
        "algo": algo,
        "regime": regime,
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": int(r["timesteps"]),
        "seed": int(r["seed"]),
        "n_envs": int(r["n_envs"]),
        "vec_env": r["vec_env"],
        "resumed_from": str(start) if start is not None else None,
        "env_kwargs": env_kwargs,
        "env_params": asdict(base_params),
        "hyperparameters": dict(hp),
        "seed_ranges": {
            "train_episode_seeds": [TRAIN_SEED_LOW, TRAIN_SEED_HIGH],
            "held_out_below": HELD_OUT_SEED_HIGH,
            "validation_seeds": [VALIDATION_SEED0, VALIDATION_SEED0 + r["eval_episodes"]],
        },
        "train_episodes_this_run": len(train_seeds),
        "final_validation": final_eval,
        "best_validation_sync_excess_pct": (
            evaluator.best_sync_excess if evaluator is not None else None
        ),
        "evaluations": evaluator.history if evaluator is not None else [],
        "train_seconds": round(time.perf_counter() - started, 1),
        "command": r["command"],
        "versions": _versions(),
        "name": f"learned:{algo}-{regime}",
        "status": "complete",
    }
    if env_specs is not None:
        meta["env_specs"] = [s.record() for s in env_specs]
    if r["obs_transform"] is not None:
        from diloco_gym.rl.wrappers import BUDGET_FEATURES

        meta["observation"] = {"transform": r["obs_transform"], "features": list(BUDGET_FEATURES)}
    if r["config"] is not None:
        meta["config"] = r["config"]
    if bc_record is not None:
        meta["behaviour_cloning"] = bc_record
    return meta


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
    env_specs: list[Any] | None = None,
    obs_transform: str | None = None,
    config: dict[str, Any] | None = None,
    bc_teacher: str | None = None,
    bc_episodes: int = 20,
    bc_epochs: int = 5,
) -> Path:
    """Train an RL scheduler and save ``out/model.zip`` and ``out/meta.json``.

    Args:
        algo: ``"ppo"``, ``"maskable-ppo"`` (sb3-contrib, uses the env's
            ``action_masks()``; with the default ``skip_forced=True`` and no
            ``merge_budget`` both actions are always feasible, so the mask is all-true)
            or ``"dqn"``.
        regime: training regime name; with ``env_specs``, the run's label (meta.json's
            ``regime``, checked by ``resume``).
        timesteps: total environment steps (agent decisions) to train for.
        seed: training seed: seeds torch/numpy/random, the model and the envs (env ``i``'s
            episode-seed generator is seeded with ``seed + i``). Same seed, same machine and
            library versions give the same model.
        out: output directory (created).
        n_envs: environments, batched as ``vec_env`` says.
        eval_episodes: validation episodes per evaluation and env kind (seeds
            ``VALIDATION_SEED0 + i``); ``0`` disables evaluation.
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
        env_specs: env kinds (:class:`~diloco_gym.rl.config.EnvSpec`: regime or trace,
            merge budget) that env ``i`` cycles through (``specs[i % len(specs)]``);
            ``None``: every env is ``regime`` with ``env_kwargs``. Needs ``vec_env``
            ``"dummy"`` or ``"subproc"``.
        obs_transform: ``"budget"``: the policy sees the budget features of
            :mod:`diloco_gym.rl.wrappers` (every spec needs a merge budget); recorded in
            meta.json so that the loaded agent computes them too.
        config: the resolved configuration (and its file) to record in meta.json.
        bc_teacher: warm-start a new model by imitating this registry agent
            (:func:`behaviour_clone`, ``bc_episodes`` episodes per env kind, ``bc_epochs``
            passes) before reinforcement learning; the model right after it is evaluated
            at timestep 0. Needs ``env_specs``.

    Returns:
        The path of the saved ``model.zip``.

    Raises:
        FileExistsError, FileNotFoundError, ValueError: see :func:`check_run_dir`.
    """
    import torch
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.utils import set_random_seed

    counts = {
        "timesteps": timesteps,
        "n_envs": n_envs,
        "eval_episodes": eval_episodes,
        "eval_freq": eval_freq,
        "checkpoint_freq": checkpoint_freq,
    }
    _check_train_args(algo, regime, vec_env, counts, env_specs)
    if obs_transform is not None and any(s.merge_budget is None for s in env_specs or [None]):
        raise ValueError(
            f"obs_transform {obs_transform!r} needs env_specs that all have a merge budget"
        )
    env_kwargs = dict(env_kwargs or {})
    out = Path(out)
    start = check_run_dir(out, algo, regime, resume=resume, force=force)
    out.mkdir(parents=True, exist_ok=True)
    if start is None:
        if resume and verbose:
            print(f"nothing saved in {out} before it stopped: starting the run afresh")
        _write_start_meta(out, algo, regime, seed, command)
    torch.set_num_threads(1)
    set_random_seed(seed)
    started = time.perf_counter()

    if env_specs is None:
        venv = make_train_vec_env(vec_env, regime, seed, n_envs, env_kwargs)
    else:
        venv = make_spec_vec_env(vec_env, env_specs, seed, n_envs, env_kwargs, obs_transform)
    hp = default_hyperparameters(algo, n_envs, timesteps)
    hp.update(hyperparameters or {})
    model = _build_model(algo, venv, hp, seed, out, start, verbose)
    remaining = max(0, int(timesteps) - int(model.num_timesteps))
    bc_record = None
    if bc_teacher is not None and start is None:
        if env_specs is None:
            raise ValueError("behaviour cloning needs env_specs (a config with budgets)")
        bc_record = behaviour_clone(
            model, env_specs, bc_teacher, bc_episodes, bc_epochs, seed, env_kwargs, obs_transform
        )
        if verbose:
            print(f"behaviour cloning: {bc_record}")

    evaluator = None
    if eval_episodes > 0:
        evaluator = HeldOutEvalCallback(
            _eval_envs(env_specs, regime, env_kwargs),
            [VALIDATION_SEED0 + i for i in range(eval_episodes)],
            eval_freq=max(1, eval_freq // n_envs) if eval_freq > 0 else 0,
            best_path=out / "best_model.zip",
            verbose=verbose,
            obs_transform=obs_transform,
        )
    if evaluator is not None and bc_record is not None:
        evaluator.init_callback(model)
        evaluator.evaluate()  # the cloned policy, at timestep 0
    if remaining > 0:
        model.learn(
            total_timesteps=remaining,
            callback=CallbackList(_callbacks(algo, out, n_envs, checkpoint_freq, evaluator)),
            reset_num_timesteps=start is None,
            progress_bar=progress_bar,
            tb_log_name=algo,
        )
    final_eval = None
    if evaluator is not None:
        if evaluator.model is None:  # learn() did not run (resumed at the target)
            evaluator.init_callback(model)
        final_eval = evaluator.evaluate()
    model_path = out / "model.zip"
    _save_atomic(model.save, model_path)
    request = {
        "algo": algo,
        "regime": regime,
        "timesteps": timesteps,
        "seed": seed,
        "n_envs": n_envs,
        "vec_env": vec_env,
        "env_kwargs": env_kwargs,
        "eval_episodes": eval_episodes,
        "command": command,
        "env_specs": env_specs,
        "obs_transform": obs_transform,
        "config": config,
    }
    meta = _final_meta(request, model, venv, hp, start, evaluator, final_eval, bc_record, started)
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    venv.close()
    return model_path


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``diloco-gym train`` options to ``parser``.

    Options that a config file can set default to ``None`` here: the value is the flag's
    if given, else the file's, else the built-in default (:func:`resolve_config`).
    """
    parser.add_argument(
        "--config",
        default=None,
        help="training config file (TOML): [train], [env] (regimes or trace, budgets, "
        "reward weights, any EnvParams field) and [algo] (hyperparameters); flags "
        "override it; see docs/training.md",
    )
    parser.add_argument("--algo", choices=ALGOS, default=None, help="RL algorithm (default ppo)")
    parser.add_argument(
        "--regime", default=None, help=f"one of {', '.join(REGIMES)} (default bursty)"
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
    from diloco_gym.rl.config import TrainConfig, check_config, load_config_file, parse_config

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
        "checkpoint_freq",
    ):
        value = getattr(args, key)
        if value is not None:
            setattr(cfg, key, value)
    if args.regime is not None:
        cfg.regimes = [args.regime]
        cfg.trace = None
    if args.budgets is not None:
        cfg.budgets_per_hour = [float(b) for b in args.budgets]
    check_config(cfg, path)
    return cfg


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
    from diloco_gym.agents.learned import load_learned_agent
    from diloco_gym.agents.registry import make_agent
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


def _run_layout(cfg: Any) -> tuple[list[Any] | None, str, int]:
    """``(env_specs, vec_env, n_envs)`` of a resolved config: env kinds when the run has
    budgets, several regimes, a trace or a calibration file (``None``: the plain regime),
    and the vector env and env count (defaults: native and 4, or dummy and one env per
    kind).

    Raises:
        ConfigError: the native vector env asked for several env kinds.
    """
    from diloco_gym.rl.config import ConfigError, build_env_specs

    path = cfg.source["path"] if cfg.source else "command line"
    specs = None
    if (
        cfg.budgets_per_hour is not None
        or len(cfg.regimes) > 1
        or cfg.trace is not None
        or cfg.calibration is not None
    ):
        specs = build_env_specs(cfg, path)
    vec_env = cfg.vec_env or ("native" if specs is None else "dummy")
    if specs is not None and vec_env == "native":
        raise ConfigError(
            f"{path}: vec_env native runs a single regime without budgets or "
            f"calibration; use dummy or subproc"
        )
    n_envs = cfg.n_envs if cfg.n_envs is not None else (4 if specs is None else len(specs))
    return specs, vec_env, n_envs


def run_train_command(args: argparse.Namespace) -> int:
    """Run ``diloco-gym train`` with parsed ``args``; returns the exit status.

    After training it prints the final model's validation result: next to fixed-512 and
    its matched random (warning when the policy never chooses to merge), or, for a
    budget-conditioned run, per regime and budget next to matched random and the oracle.
    """
    from diloco_gym.errors import UsageError

    try:
        cfg = resolve_config(args)
        specs, vec_env, n_envs = _run_layout(cfg)
        check_run_dir(
            args.out, cfg.algo, cfg.label, resume=args.resume, force=args.force, apply=False
        )
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    record = cfg.record()
    record.update(n_envs=n_envs, vec_env=vec_env)
    if cfg.source is not None:
        record["file"] = cfg.source
    command = "diloco-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path_model = train(
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
        env_kwargs=cfg.env_params,
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
    )
    meta_path = path_model.parent / "meta.json"
    meta = _read_meta(meta_path)
    print(f"saved {path_model} ({meta['timesteps']} timesteps, {meta['train_seconds']} s)")
    write_validation_curve(path_model.parent)
    if specs is not None:
        print("\n".join(format_budget_validation(meta)))
        return 0
    n_val = cfg.eval_episodes if cfg.eval_episodes > 0 else 10
    cmp = validation_comparison(
        path_model, cfg.regimes[0], [VALIDATION_SEED0 + i for i in range(n_val)], cfg.env_params
    )
    meta["validation_comparison"] = cmp
    meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    lines, warnings = format_comparison(cmp)
    print("\n".join(lines))
    for w in warnings:
        print(w, file=sys.stderr)
    return 0


def validation_curve_rows(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The validation curve of a run from its evaluation history: one row per evaluation
    and env kind (``env = "all"``: the mean over every env and seed)."""
    rows: list[dict[str, Any]] = []
    for ev in meta.get("evaluations") or []:
        rows.append(
            {
                "timesteps": ev["timesteps"],
                "env": "all",
                "sync_excess_pct": ev["sync_excess_pct"],
                "matched_random_pct": None,
                "oracle_pct": None,
                "gap_captured": None,
                "merges": ev["merges"],
            }
        )
        for label, r in (ev.get("per_env") or {}).items():
            rows.append(
                {
                    "timesteps": ev["timesteps"],
                    "env": label,
                    "sync_excess_pct": r["sync_excess_pct"],
                    "matched_random_pct": r["matched_random_pct"],
                    "oracle_pct": r["oracle_pct"],
                    "gap_captured": r["gap_captured"],
                    "merges": None,
                }
            )
    return rows


def write_validation_curve(run_dir: str | Path) -> tuple[Path, Path] | None:
    """Write ``validation.csv`` and ``validation.png`` of a run from its ``meta.json``
    (the evaluation callback's history); ``None`` when the run has no evaluations.

    The figure shows the mean validation sync-excess against timesteps and, for a
    budget-conditioned run, the gap captured per regime and budget (0: matched random,
    1: the oracle at that budget).
    """
    import csv

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    meta = _read_meta(run_dir / "meta.json")
    rows = validation_curve_rows(meta)
    if not rows:
        return None
    csv_path = run_dir / "validation.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    envs = [e for e in dict.fromkeys(r["env"] for r in rows) if e != "all"]
    fig = Figure(figsize=(10 if envs else 5.5, 4))
    ax = fig.add_subplot(1, 2 if envs else 1, 1)
    allr = [r for r in rows if r["env"] == "all"]
    ax.plot([r["timesteps"] for r in allr], [r["sync_excess_pct"] for r in allr], marker="o")
    ax.set_xlabel("timesteps")
    ax.set_ylabel("validation sync-excess % (mean)")
    ax.set_title(f"{meta.get('algo')} on {meta.get('regime')}, seed {meta.get('seed')}")
    ax.grid(alpha=0.3)
    if len(allr) == 1:  # one evaluation: a dot, not a curve; say so on the figure
        ax.text(
            0.5,
            0.92,
            f"one evaluation only (at {allr[0]['timesteps']} timesteps): no curve; "
            "lower eval_freq or train longer",
            transform=ax.transAxes,
            ha="center",
            fontsize=8,
        )
    if envs:
        ax2 = fig.add_subplot(1, 2, 2)
        for e in envs:
            er = [r for r in rows if r["env"] == e and r["gap_captured"] is not None]
            ax2.plot([r["timesteps"] for r in er], [r["gap_captured"] for r in er], label=e)
        ax2.axhline(0.0, color="grey", lw=0.8)
        ax2.set_xlabel("timesteps")
        ax2.set_ylabel("gap captured (0 random, 1 oracle)")
        ax2.set_title("per regime @ merges per episode")
        ax2.legend(fontsize=7, ncol=2)
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    png_path = run_dir / "validation.png"
    FigureCanvasAgg(fig).print_png(str(png_path))
    return csv_path, png_path


def format_budget_validation(meta: dict[str, Any]) -> list[str]:
    """The lines ``train`` prints after a multi-env run: the final validation per env kind
    (regime@merges per episode) with matched random, the oracle and the gap captured."""
    final = meta.get("final_validation") or {}
    per_env = final.get("per_env") or {}
    if not per_env:
        return ["(no validation: --eval-episodes 0)"]
    v0, v1 = meta["seed_ranges"]["validation_seeds"]
    lines = [
        f"validation (seeds {v0}..{v1 - 1}, deterministic policy), means per env:",
        f"  {'env':<24} {'agent %':>8} {'matched random %':>17} {'oracle %':>9} {'gap':>6}",
    ]
    for label, r in per_env.items():
        gap = "n/a" if r["gap_captured"] is None else f"{r['gap_captured']:.2f}"
        lines.append(
            f"  {label:<24} {r['sync_excess_pct']:>8.3f} {r['matched_random_pct']:>17.3f} "
            f"{r['oracle_pct']:>9.3f} {gap:>6}"
        )
    return lines
