"""Train an RL merge scheduler with stable-baselines3: :func:`train`, in named steps.

Seed discipline (training and evaluation seeds are disjoint *by construction*):

* **Training** episodes always reset with an explicit episode seed drawn from
  ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH) = [10**6, 2**30)``
  (:class:`~diloco_gym.rl.train_envs.TrainSeedWrapper`), whose generator is seeded from the
  training seed (``seed + env index``). A training run never sees a trace whose episode
  seed is below ``10**6``.
* **Held-out** seeds are ``[0, 10**6)``. ``diloco-gym report`` and ``diloco-gym run`` use
  seeds ``0 .. 19`` by default, so their episodes are held out.
* The **validation** seeds of the periodic evaluation (model selection, ``best_model.zip``)
  are ``900_000 + i`` (:mod:`diloco_gym.rl.validation`), distinct from every test seed.

Outputs in ``out``: ``model.zip`` (final model), ``meta.json`` (algorithm, regime, seeds,
env parameters, command line, library versions, evaluation history), ``best_model.zip``,
``checkpoints/`` (``--resume`` continues from the latest) and ``tb/`` (TensorBoard logs);
:mod:`diloco_gym.rl.run_dir` checks the directory first.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW, VALIDATION_SEED0
from diloco_gym.rl.algos import (
    ALGOS,
    VEC_ENVS,
    algo_class,
    default_hyperparameters,
    library_versions,
)
from diloco_gym.rl.config import policy_kwargs_for_sb3
from diloco_gym.rl.imitation import behaviour_clone
from diloco_gym.rl.run_dir import (
    check_run_dir,
    model_file_problem,
    read_meta,
    save_atomic,
    write_start_meta,
)
from diloco_gym.rl.train_envs import make_vec_env, regime_spec, train_episode_seeds
from diloco_gym.rl.validation import HeldOutEvalCallback, eval_envs, is_fleet
from diloco_gym.sim.regimes import REGIMES

__all__ = ["TrainRequest", "train", "shaping_discount_warning"]


@dataclass(frozen=True)
class TrainRequest:
    """The arguments of one :func:`train` call, checked.

    Attributes:
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
        env_kwargs: extra ``DiLoCoSyncEnv`` keyword arguments (``EnvParams`` fields, and
            ``learner_calibration``: a learner calibration file, best absolute, whose
            learner model every training and validation env uses).
        hyperparameters: overrides of
            :func:`~diloco_gym.rl.algos.default_hyperparameters`.
        command: the command line to record in ``meta.json``.
        vec_env: ``"native"`` (default), ``"subproc"`` or ``"dummy"``; see
            :func:`~diloco_gym.rl.train_envs.make_vec_env`. Same seed and kind, same model.
        env_specs: env kinds (:class:`~diloco_gym.rl.config.EnvSpec`: regime or trace,
            merge budget) that env ``i`` cycles through (``specs[i % len(specs)]``);
            ``None``: every env is ``regime`` with ``env_kwargs``. Needs ``vec_env``
            ``"dummy"`` or ``"subproc"``.
        obs_transform: ``"budget"``: the policy sees the budget features of
            :mod:`diloco_gym.envs.budget_features` (every spec needs a merge budget);
            recorded in meta.json so that the loaded agent computes them too.
        config: the resolved configuration (and its file) to record in meta.json.
        bc_teacher: warm-start a new model by imitating this registry agent
            (:func:`~diloco_gym.rl.imitation.behaviour_clone`, ``bc_episodes`` episodes per
            env kind, ``bc_epochs`` passes) before reinforcement learning; the model right
            after it is evaluated at timestep 0. Needs ``env_specs``.
        select_by: how validation chooses ``best_model.zip``
            (:data:`~diloco_gym.rl.algos.SELECT_BY`; meta.json's ``best_model_selection``).

    Raises:
        ValueError: an unknown algorithm, regime or vector env, no env kind, a count below
            its minimum, or an observation transform without budgets (one line).
    """

    algo: str
    regime: str
    timesteps: int
    seed: int
    out: Path
    n_envs: int
    eval_episodes: int
    eval_freq: int
    checkpoint_freq: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] | None = None
    command: str | None = None
    vec_env: str = "native"
    env_specs: list[Any] | None = None
    obs_transform: str | None = None
    config: dict[str, Any] | None = None
    bc_teacher: str | None = None
    bc_episodes: int = 20
    bc_epochs: int = 5
    select_by: str = "vs_random"

    def __post_init__(self) -> None:
        if self.vec_env not in VEC_ENVS:
            raise ValueError(f"unknown vec env {self.vec_env!r}; valid: {', '.join(VEC_ENVS)}")
        if self.algo not in ALGOS:
            raise ValueError(f"unknown algo {self.algo!r}; valid: {', '.join(ALGOS)}")
        if self.env_specs is None and self.regime not in REGIMES:
            raise ValueError(f"unknown regime {self.regime!r}; valid: {', '.join(REGIMES)}")
        if self.env_specs is not None and not self.env_specs:
            raise ValueError("env_specs: give at least one env kind")
        counts = (self.eval_episodes, self.eval_freq, self.checkpoint_freq)
        if self.timesteps < 1 or self.n_envs < 1 or min(counts) < 0:
            raise ValueError(
                "timesteps and n_envs must be >= 1; eval_episodes, eval_freq and "
                "checkpoint_freq must be >= 0"
            )
        if self.obs_transform is not None and any(
            s.merge_budget is None for s in self.env_specs or [None]
        ):
            raise ValueError(
                f"obs_transform {self.obs_transform!r} needs env_specs that all have a merge budget"
            )
        if self.bc_teacher is not None and self.env_specs is None:
            raise ValueError("behaviour cloning needs env_specs (a config with budgets)")

    @property
    def specs(self) -> list[Any]:
        """The env kinds the vector env cycles through (a plain run: its regime)."""
        return list(self.env_specs) if self.env_specs is not None else [regime_spec(self.regime)]


def shaping_discount_warning(env_kwargs: dict[str, Any], hp: dict[str, Any]) -> str | None:
    """A warning when the merge-debt shaping's discount is not the agent's: the shaping
    ``gamma * phi(s') - phi(s)`` leaves the best policies unchanged only with the agent's
    own ``gamma`` (envs/shaping.py). ``None`` when they agree or nothing is shaped."""
    from diloco_gym.envs.params import EnvParams

    if env_kwargs.get("reward_shaping", "none") == "none" or "gamma" not in hp:
        return None
    shaping = float(env_kwargs.get("shaping_gamma", EnvParams.shaping_gamma))
    gamma = float(hp["gamma"])
    if abs(shaping - gamma) <= 1e-12:
        return None
    return (
        f"diloco-gym: warning: the merge-debt shaping's discount (shaping_gamma {shaping:g}) "
        f"is not the agent's (gamma {gamma:g}), so the shaping may change which policies "
        f"are best; set [env] shaping_gamma = {gamma:g}"
    )


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
    select_by: str = "vs_random",
    trust_model_file: bool = False,
) -> Path:
    """Train an RL scheduler and save ``out/model.zip`` and ``out/meta.json``.

    The arguments are those of :class:`TrainRequest` (documented there), plus:
    ``resume`` (continue the run in ``out``: same algorithm and regime, checked against its
    ``meta.json``, from its latest checkpoint, else its ``model.zip``, up to ``timesteps``
    in total; a run killed after its last checkpoint gets its final evaluation, model.zip
    and meta.json; a complete run that already has ``timesteps`` is left as it is, with a
    line that says so), ``force`` (replace an existing run in ``out``; see
    :func:`~diloco_gym.rl.run_dir.check_run_dir`), ``progress_bar`` (SB3's, needs tqdm and
    rich), ``verbose`` (SB3 verbosity, 0 silent) and ``trust_model_file`` (``--resume`` loads
    the checkpoint, and a DQN run's replay buffer, with stable-baselines3's own loader, which
    unpickles them, with a warning naming each file; otherwise the checkpoint is rebuilt from
    its JSON and tensors by :func:`~diloco_gym.agents.safe_model.load_model_safely`, or
    refused, and a replay buffer file is left unread).

    Returns:
        The path of the saved ``model.zip``.

    Raises:
        FileExistsError, FileNotFoundError, ValueError: see
            :func:`~diloco_gym.rl.run_dir.check_run_dir` and :class:`TrainRequest`.
    """
    req = TrainRequest(
        algo=algo,
        regime=regime,
        timesteps=timesteps,
        seed=seed,
        out=Path(out),
        n_envs=n_envs,
        eval_episodes=eval_episodes,
        eval_freq=eval_freq,
        checkpoint_freq=checkpoint_freq,
        env_kwargs=dict(env_kwargs or {}),
        hyperparameters=hyperparameters,
        command=command,
        vec_env=vec_env,
        env_specs=env_specs,
        obs_transform=obs_transform,
        config=config,
        bc_teacher=bc_teacher,
        bc_episodes=bc_episodes,
        bc_epochs=bc_epochs,
        select_by=select_by,
    )
    return _run(req, resume, force, progress_bar, verbose, trust_model_file)


def _run(
    req: TrainRequest, resume: bool, force: bool, progress_bar: bool, verbose: int, trust: bool
) -> Path:
    """The steps of :func:`train`, in the order that fixes its random streams."""
    start = _prepare_out(req, resume, force, verbose)
    if start is not None and _already_complete(req):
        return req.out / "model.zip"
    started = _seed_everything(req.seed)
    venv = make_vec_env(
        req.vec_env, req.specs, req.seed, req.n_envs, req.env_kwargs, req.obs_transform
    )
    hp = default_hyperparameters(req.algo, req.n_envs, req.timesteps)
    hp.update(req.hyperparameters or {})
    if (note := shaping_discount_warning(req.env_kwargs, hp)) is not None:
        print(note, file=sys.stderr)
    model = _build_model(req.algo, venv, hp, req.seed, req.out, start, verbose, trust)
    remaining = max(0, int(req.timesteps) - int(model.num_timesteps))
    bc_record = _warm_start(req, model, start, verbose)
    evaluator = _evaluator(req, model, bc_record is not None, verbose)
    if remaining > 0:
        _learn(req, model, remaining, start is None, evaluator, progress_bar)
    final_eval = None
    if evaluator is not None:
        # learn() did not run (resumed from a checkpoint at the target): SB3 sets the
        # callback's model only in learn()
        if getattr(evaluator, "model", None) is None:
            evaluator.init_callback(model)
        final_eval = evaluator.evaluate()
    model_path = req.out / "model.zip"
    save_atomic(model.save, model_path)
    meta = _final_meta(req, model, venv, hp, start, evaluator, final_eval, bc_record, started)
    (req.out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    venv.close()
    return model_path


def _prepare_out(req: TrainRequest, resume: bool, force: bool, verbose: int) -> Path | None:
    """Check and create the run directory; a fresh start writes its start metadata.
    Returns the file to resume from (``None``: a fresh start)."""
    start = check_run_dir(req.out, req.algo, req.regime, resume=resume, force=force)
    req.out.mkdir(parents=True, exist_ok=True)
    if start is None:
        if resume and verbose:
            print(f"nothing saved in {req.out} before it stopped: starting the run afresh")
        write_start_meta(req.out, req.algo, req.regime, req.seed, req.command)
    return start


def _already_complete(req: TrainRequest) -> bool:
    """Whether ``--resume`` found a completed run that already has ``req.timesteps``: its
    ``meta.json`` says ``complete`` and its ``model.zip`` is intact. Then nothing is
    trained or rewritten (every output is already there) and a line says so."""
    if model_file_problem(req.out / "model.zip") is not None:
        return False
    meta = read_meta(req.out / "meta.json")
    done = meta.get("timesteps")
    if meta.get("status") != "complete" or not isinstance(done, int) or done < req.timesteps:
        return False
    print(
        f"{req.out} is a complete run of {done} timesteps (--timesteps {req.timesteps}): "
        f"nothing to train; pass a larger --timesteps to continue it"
    )
    return True


def _seed_everything(seed: int) -> float:
    """One torch thread (the same model on any core count) and every global generator
    seeded; returns the start time."""
    import torch
    from stable_baselines3.common.utils import set_random_seed

    torch.set_num_threads(1)
    set_random_seed(seed)
    return time.perf_counter()


def _warm_start(
    req: TrainRequest, model: Any, start: Path | None, verbose: int
) -> dict[str, Any] | None:
    """Behaviour cloning of a new model (not of a resumed one); its record or ``None``."""
    if req.bc_teacher is None or start is not None:
        return None
    assert req.env_specs is not None  # TrainRequest checks it
    record = behaviour_clone(
        model,
        req.env_specs,
        req.bc_teacher,
        req.bc_episodes,
        req.bc_epochs,
        req.seed,
        req.env_kwargs,
        req.obs_transform,
    )
    if verbose:
        print(f"behaviour cloning: {record}")
    return record


def _evaluator(
    req: TrainRequest, model: Any, cloned: bool, verbose: int
) -> HeldOutEvalCallback | None:
    """The validation callback (``None`` without validation episodes); a cloned policy is
    evaluated once now, at timestep 0."""
    if req.eval_episodes <= 0:
        return None
    evaluator = HeldOutEvalCallback(
        eval_envs(req.env_specs, req.regime, req.env_kwargs),
        [VALIDATION_SEED0 + i for i in range(req.eval_episodes)],
        eval_freq=max(1, req.eval_freq // req.n_envs) if req.eval_freq > 0 else 0,
        best_path=req.out / "best_model.zip",
        verbose=verbose,
        obs_transform=req.obs_transform,
        select_by=req.select_by,
    )
    if cloned:
        evaluator.init_callback(model)
        evaluator.evaluate()  # the cloned policy, at timestep 0
    return evaluator


def _learn(
    req: TrainRequest,
    model: Any,
    remaining: int,
    fresh: bool,
    evaluator: HeldOutEvalCallback | None,
    progress_bar: bool,
) -> None:
    """Reinforcement learning for ``remaining`` timesteps, with checkpoints and validation."""
    from stable_baselines3.common.callbacks import CallbackList

    callbacks = _callbacks(req.algo, req.out, req.n_envs, req.checkpoint_freq, evaluator)
    model.learn(
        total_timesteps=remaining,
        callback=CallbackList(callbacks),
        reset_num_timesteps=fresh,
        progress_bar=progress_bar,
        tb_log_name=req.algo,
    )


def _build_model(
    algo: str,
    vec_env,
    hp: dict[str, Any],
    seed: int,
    out: Path,
    ckpt: Path | None,
    verbose: int,
    trust: bool = False,
):
    """A new model, or the one of ``ckpt`` continued with fresh reproducible streams:
    rebuilt without unpickling, or with ``trust`` (``--trust-model-file``) by
    stable-baselines3's own loader, warning with the file's name."""
    cls = algo_class(algo)
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
    buffer = ckpt.with_name(
        ckpt.name.replace("_steps.zip", "_steps.pkl").replace(
            "rl_model_", "rl_model_replay_buffer_"
        )
    )
    has_buffer = algo == "dqn" and ckpt.parent.name == "checkpoints" and buffer.exists()
    if trust:
        from diloco_gym.agents.learned import warn_trusted_load
        from diloco_gym.agents.safe_model import preflight_trusted

        preflight_trusted(ckpt)  # the size limits hold for a trusted file too
        warn_trusted_load(ckpt)
        model = cls.load(ckpt, env=vec_env, device="cpu", tensorboard_log=str(out / "tb"))
        if has_buffer:
            warn_trusted_load(buffer)
            model.load_replay_buffer(buffer)
    else:
        from diloco_gym.agents.safe_model import load_model_safely

        model = load_model_safely(
            ckpt, algo, vec_env, hp, seed=seed, tensorboard_log=str(out / "tb"), verbose=verbose
        )
        if has_buffer:
            print(
                f"diloco-gym: warning: {buffer} is not loaded (a replay buffer file is a "
                f"pickle, read only with --trust-model-file): the run continues with an empty "
                f"replay buffer",
                file=sys.stderr,
            )
    # fresh, reproducible streams for the continuation
    model.set_random_seed(seed + int(model.num_timesteps))
    vec_env.seed(seed + int(model.num_timesteps))
    if verbose:
        print(f"resuming from {ckpt} at {model.num_timesteps} timesteps")
    return model


def _atomic_checkpoint_callback(base: type) -> type:
    """SB3's ``CheckpointCallback`` whose files are written atomically
    (:func:`~diloco_gym.rl.run_dir.save_atomic`): a kill while saving leaves the previous
    checkpoints and no torn file."""

    class AtomicCheckpointCallback(base):
        def _on_step(self) -> bool:
            if self.n_calls % self.save_freq == 0:
                save_atomic(self.model.save, Path(self._checkpoint_path(extension="zip")))
                buffer = getattr(self.model, "replay_buffer", None)
                if self.save_replay_buffer and buffer is not None:
                    path = Path(self._checkpoint_path("replay_buffer_", extension="pkl"))
                    save_atomic(self.model.save_replay_buffer, path)
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
    req: TrainRequest,
    model: Any,
    venv: Any,
    hp: dict[str, Any],
    start: Path | None,
    evaluator: HeldOutEvalCallback | None,
    final_eval: dict[str, Any] | None,
    bc_record: dict[str, Any] | None,
    started: float,
) -> dict[str, Any]:
    """The meta.json of a finished run."""
    train_seeds = sorted(set(train_episode_seeds(venv)))
    assert all(TRAIN_SEED_LOW <= s < TRAIN_SEED_HIGH for s in train_seeds)
    if req.env_specs is None:
        base_env = DiLoCoSyncEnv(regime=req.regime, **req.env_kwargs)
    else:
        base_env = req.env_specs[0].make(req.env_kwargs)
    base_params = base_env.params
    meta = {
        "algo": req.algo,
        "regime": req.regime,
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": int(req.timesteps),
        "seed": int(req.seed),
        "n_envs": int(req.n_envs),
        "vec_env": req.vec_env,
        "resumed_from": str(start) if start is not None else None,
        "env_kwargs": req.env_kwargs,
        "env_params": asdict(base_params),
        # the learner model of every env (a learner calibration's, or the default)
        "learner_params": (
            asdict(base_env.learner_params) if hasattr(base_env, "learner_params") else None
        ),
        "hyperparameters": dict(hp),
        "seed_ranges": {
            "train_episode_seeds": [TRAIN_SEED_LOW, TRAIN_SEED_HIGH],
            "held_out_below": TRAIN_SEED_LOW,
            "validation_seeds": [VALIDATION_SEED0, VALIDATION_SEED0 + req.eval_episodes],
        },
        "train_episodes_this_run": len(train_seeds),
        "final_validation": final_eval,
        "best_validation_sync_excess_pct": (
            evaluator.best_sync_excess if evaluator is not None else None
        ),
        # best_model.zip's evaluation: the rule, its value and its timesteps
        "best_model_selection": evaluator.best if evaluator is not None else None,
        "evaluations": evaluator.history if evaluator is not None else [],
        "train_seconds": round(time.perf_counter() - started, 1),
        "command": req.command,
        "versions": library_versions(),
        "name": f"learned:{req.algo}-{req.regime}",
        "status": "complete",
    }
    if req.env_specs is not None:
        meta["env_specs"] = [s.record() for s in req.env_specs]
    observation: dict[str, Any] = {}
    if req.obs_transform is not None:
        from diloco_gym.envs.budget_features import BUDGET_FEATURES

        observation = {"transform": req.obs_transform, "features": list(BUDGET_FEATURES)}
    fleet_env: Any = base_env
    if is_fleet(fleet_env):  # the loaded agent checks the fleet's wider observation
        meta["fleet"] = req.env_specs[0].fleet if req.env_specs else None
        observation = {"transform": req.obs_transform, **observation}
        observation["base_size"] = int(fleet_env.observation_space.shape[0])
        observation["base_features"] = [f[0] for f in fleet_env.obs_features]
    if observation:
        meta["observation"] = observation
    if req.config is not None:
        meta["config"] = req.config
    if bc_record is not None:
        meta["behaviour_cloning"] = bc_record
    return meta
