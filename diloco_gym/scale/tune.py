"""``diloco-gym tune``: a Ray Tune search (ASHA) over stable-baselines3 hyperparameters.

A tune file (TOML; YAML with PyYAML) fixes the training setup and gives the search space::

    name = "ppo-bursty"
    algo = "ppo"                # ppo, maskable-ppo, dqn
    regime = "bursty"
    timesteps = 200000          # per training seed, at most (ASHA stops weak trials early)
    eval_every = 20000          # timesteps between validations (ASHA's rungs)
    grace_timesteps = 40000     # ASHA: no trial stops before this
    reduction_factor = 3
    num_samples = 16            # configurations drawn from [space]
    train_seeds = 3             # training runs per configuration (model seeds 0, 1, 2)
    validation_episodes = 10    # validation seeds 900000 .. 900009
    n_envs = 4
    vec_env = "native"
    seed = 0                    # the search's own random state

    [env]                       # DiLoCoSyncEnv keywords (EnvParams fields), optional

    [space]
    learning_rate = { loguniform = [1e-5, 1e-3] }
    gamma = { uniform = [0.98, 0.999] }
    n_steps = { choice = [128, 256, 512] }
    ent_coef = [0.0, 0.01]      # a list is a choice
    batch_size = 128            # a scalar is fixed

Selection uses only the validation seeds (``VALIDATION_SEED0 + i``): the metric a trial
reports at each rung is the mean exact-replay sync-excess % over its training seeds of each
model's mean over the validation episodes. Training episodes draw their seeds from
``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)`` (>= 10**6) on every backend, and the report's test
seeds (``--seed0`` .. , 0 .. 19 by default) are never played. The best configuration's
best-validating model is saved as a run directory (``model.zip`` + ``meta.json``, as
``diloco-gym train`` writes) that ``diloco-gym report --agent OUT/best`` accepts.
"""

from __future__ import annotations

import inspect
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationInfo, field_validator, model_validator

from diloco_gym.tables import Table, TableError, validate_table

__all__ = ["TuneSpec", "load_tune", "run_tune", "tune_trial"]

_FIXED = {
    "name": str,
    "algo": str,
    "regime": str,
    "timesteps": int,
    "eval_every": int,
    "grace_timesteps": int,
    "reduction_factor": int,
    "num_samples": int,
    "train_seeds": int,
    "validation_episodes": int,
    "n_envs": int,
    "vec_env": str,
    "seed": int,
}
_DISTRIBUTIONS = ("uniform", "loguniform", "choice", "randint")
METRIC = "val_sync_excess_pct"
#: Fixed settings that must be at least 1 (``reduction_factor`` at least 2).
_AT_LEAST_ONE = (
    "timesteps",
    "eval_every",
    "grace_timesteps",
    "num_samples",
    "train_seeds",
    "validation_episodes",
    "n_envs",
)


class TuneFileError(ValueError):
    """A malformed tune file (the message names the file and the key)."""


class TuneSpec(dict):
    """A parsed tune file: the fixed settings, ``env`` and ``space`` (a dict)."""


def load_tune(path: str | Path) -> TuneSpec:
    """Read and check a tune file.

    Raises:
        TuneFileError: (a ``ValueError``) a missing or malformed file, an unknown key or
            hyperparameter, a bad distribution, or an invalid setting.
    """
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.rl import train  # noqa: F401 - without stable-baselines3, fail first
    from diloco_gym.scale.sweep import SweepFileError, read_settings_file

    path = Path(path)
    try:
        data = read_settings_file(path)
    except SweepFileError as exc:
        raise TuneFileError(str(exc).replace("sweep file", "tune file")) from None
    space = data.pop("space", {})
    env = data.pop("env", {})
    if not isinstance(space, dict) or not space:
        raise TuneFileError(f"{path}: [space] must be a table of at least one hyperparameter")
    if not isinstance(env, dict):
        raise TuneFileError(f"{path}: [env] must be a table")
    spec = _fixed_settings(path, data)
    try:
        EnvParams(**env)
    except (TypeError, ValueError) as exc:
        raise TuneFileError(f"{path}: [env]: {' '.join(str(exc).split())}") from None
    _check_space(path, space, spec["algo"])
    spec["env"] = env
    spec["space"] = space
    spec["path"] = str(path)
    return spec


class _TuneSettings(Table):
    """A tune file's fixed settings, with their defaults (``name``: the file's stem)."""

    name: str | None = None
    algo: str = "ppo"
    regime: str = "bursty"
    timesteps: int = 100_000
    eval_every: int = 10_000
    grace_timesteps: int = 20_000
    reduction_factor: int = 3
    num_samples: int = 8
    train_seeds: int = 2
    validation_episodes: int = 10
    n_envs: int = 4
    vec_env: str = "native"
    seed: int = 0

    @field_validator(*_AT_LEAST_ONE)
    @classmethod
    def _at_least_one(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {value}")
        return value

    @field_validator("reduction_factor")
    @classmethod
    def _at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"reduction_factor must be >= 2, got {value}")
        return value


def _fixed_settings(path: Path, data: dict) -> TuneSpec:
    """The file's fixed settings over the defaults, each checked (type, name, bound)."""
    from diloco_gym.rl.train import ALGOS, VEC_ENVS
    from diloco_gym.sim.regimes import REGIMES

    try:
        settings = validate_table(_TuneSettings, data)
    except TableError as err:
        if err.kind == "unknown":
            raise TuneFileError(
                f"{path}: unknown key {err.key!r}; valid keys: {', '.join(_FIXED)}, [env], [space]"
            ) from None
        if err.kind == "type":
            raise TuneFileError(
                f"{path}: {err.key} must be {_FIXED[str(err.key)].__name__}, got {err.value!r}"
            ) from None
        raise TuneFileError(f"{path}: {err.message}") from None
    spec = TuneSpec(settings.model_dump())
    from diloco_gym.scale.sweep import check_name

    name = path.stem if spec["name"] is None else spec["name"]
    spec["name"] = check_name(path, name, TuneFileError)
    for key, valid in (("algo", ALGOS), ("regime", REGIMES), ("vec_env", VEC_ENVS)):
        if spec[key] not in valid:
            raise TuneFileError(f"{path}: unknown {key} {spec[key]!r}; valid: {', '.join(valid)}")
    return spec


def _check_space(path: Path, space: dict, algo: str) -> None:
    """Every hyperparameter of ``space`` is one of ``algo``'s, with a valid distribution."""
    from diloco_gym.rl.algos import algo_class

    accepted = set(inspect.signature(algo_class(algo).__init__).parameters)
    accepted -= {"self", "policy", "env", "seed", "device", "verbose", "tensorboard_log"}
    for name, dist in space.items():
        if name not in accepted:
            raise TuneFileError(
                f"{path}: [space]: {name!r} is not a {algo} "
                f"hyperparameter; valid: {', '.join(sorted(accepted))}"
            )
        if isinstance(dist, dict):
            _check_distribution(path, name, dist)
        elif isinstance(dist, list) and not dist:
            raise TuneFileError(f"{path}: [space]: {name} is an empty choice")
        _check_values(path, name, dist)


def _check_values(path: Path, name: str, dist: Any) -> None:
    """The values ``dist`` can give ``name`` (a fixed value, each choice, a range's ends)
    obey ``train``'s hyperparameter rules (:data:`diloco_gym.rl.config.HYPERPARAMETER_RULES`:
    ``gamma = 2.0`` or ``batch_size = 0`` would reach SB3)."""
    from diloco_gym.rl.config import HYPERPARAMETER_RULES, hyperparameter_problem

    if name not in HYPERPARAMETER_RULES:
        return
    if isinstance(dist, dict):
        kind, args = next(iter(dist.items()))
        values = list(args)
        if kind == "randint":  # [low, high): the largest value drawn is high - 1
            values = [args[0], args[1] - 1]
    else:
        values = dist if isinstance(dist, list) else [dist]
    for value in values:
        why = hyperparameter_problem(name, value)
        if why is not None:
            raise TuneFileError(f"{path}: [space]: {name} {why}")


class _Distribution(Table):
    """One ``{kind = [...]}`` entry of ``[space]``: exactly one kind, with valid arguments
    (``[low, high]`` with ``low < high``, ``0 < low`` for ``loguniform``; a non-empty list
    for ``choice``)."""

    uniform: list | None = None
    loguniform: list | None = None
    choice: list | None = None
    randint: list | None = None

    @model_validator(mode="after")
    def _one_valid_kind(self) -> _Distribution:
        (kind,) = self.model_fields_set  # exactly one: checked before validation
        args = getattr(self, kind)
        if not args or (
            kind != "choice"
            and (
                len(args) != 2
                or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
                or not args[0] < args[1]
                or (kind == "loguniform" and args[0] <= 0)
            )
        ):
            raise ValueError("bad arguments")
        return self


def _check_distribution(path: Path, name: str, dist: dict) -> None:
    """One ``{kind = [...]}`` distribution: a known kind with valid arguments."""
    if len(dist) != 1 or next(iter(dist)) not in _DISTRIBUTIONS:
        raise TuneFileError(
            f"{path}: [space]: {name} must be one of "
            f"{{{' | '.join(_DISTRIBUTIONS)} = [...]}}, a list "
            f"(a choice) or a value; got {dist!r}"
        )
    try:
        validate_table(_Distribution, dist)
    except TableError:
        kind, args = next(iter(dist.items()))
        raise TuneFileError(
            f"{path}: [space]: {name} = {{{kind} = {args!r}}}: "
            f"give [low, high] with 0 < low < high for loguniform, "
            f"low < high otherwise, a non-empty list for choice"
        ) from None


def _search_space(space: dict) -> dict:
    from ray import tune

    out = {}
    for name, dist in space.items():
        if isinstance(dist, dict):
            kind, args = next(iter(dist.items()))
            out[name] = tune.choice(args) if kind == "choice" else getattr(tune, kind)(*args)
        elif isinstance(dist, list):
            out[name] = tune.choice(dist)
        else:
            out[name] = dist
    return out


def _validate(model, env, seeds: list[int]) -> float:
    """Mean exact-replay sync-excess % of ``model`` over the validation ``seeds``."""
    from diloco_gym.agents.learned import LearnedAgent
    from diloco_gym.eval.rollout import run_episode

    agent = LearnedAgent(model, name="tune")
    return float(np.mean([run_episode(env, agent, s)["sync_excess_pct"] for s in seeds]))


def tune_trial(config: dict) -> None:
    """One Tune trial (module-level: workers import it by name): ``train_seeds`` models of
    one configuration trained in lockstep, validated every ``eval_every`` timesteps; the
    mean is reported to Tune with the best-validating model as the checkpoint."""
    import torch
    from ray import tune
    from stable_baselines3.common.utils import set_random_seed

    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.rl import train as tr
    from diloco_gym.rl.algos import algo_class

    fixed = config["_fixed"]
    hp = {k: v for k, v in config.items() if k != "_fixed"}
    algo, regime, env_kwargs = fixed["algo"], fixed["regime"], fixed["env"]
    val_seeds = [tr.VALIDATION_SEED0 + i for i in range(fixed["validation_episodes"])]
    # Selection on validation seeds only: never a report seed, never a training seed.
    assert all(tr.VALIDATION_SEED0 <= s < tr.HELD_OUT_SEED_HIGH for s in val_seeds)
    torch.set_num_threads(1)
    cls = algo_class(algo)
    models, envs = [], []
    for seed in range(fixed["train_seeds"]):
        set_random_seed(seed)
        vec = tr.make_train_vec_env(fixed["vec_env"], regime, seed, fixed["n_envs"], env_kwargs)
        params = tr.default_hyperparameters(algo, fixed["n_envs"], fixed["timesteps"])
        params.update(hp)
        models.append(cls("MlpPolicy", vec, seed=seed, device="cpu", verbose=0, **params))
        envs.append(vec)
    eval_env = DiLoCoSyncEnv(regime=regime, **env_kwargs)
    done = 0
    while done < fixed["timesteps"]:
        chunk = min(fixed["eval_every"], fixed["timesteps"] - done)
        scores = []
        for model in models:
            model.learn(total_timesteps=chunk, reset_num_timesteps=False)
            scores.append(_validate(model, eval_env, val_seeds))
        done += chunk
        best = int(np.argmin(scores))
        with tempfile.TemporaryDirectory() as tmp:
            models[best].save(Path(tmp) / "model.zip")
            (Path(tmp) / "trial.json").write_text(
                json.dumps(
                    {
                        "hyperparameters": hp,
                        "train_seed": best,
                        "timesteps": done,
                        "validation_sync_excess_pct_per_seed": scores,
                    },
                    default=str,
                )
            )
            tune.report(
                {
                    METRIC: float(np.mean(scores)),
                    "timesteps": done,
                    "best_seed_val_sync_excess_pct": scores[best],
                },
                checkpoint=tune.Checkpoint.from_directory(tmp),
            )
    for vec in envs:
        vec.close()


def run_tune(
    spec: TuneSpec,
    out: str | Path,
    jobs: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the search; save the best model as the run directory ``out/best``.

    Returns:
        ``{"best_dir", "config", "metric", "trials", "errored", "all_tied"}`` (``all_tied``:
        every finished trial scored the same, so the choice of the best is arbitrary).

    Raises:
        ModuleNotFoundError: Ray (with Tune) is not installed (the ``ray`` extra).
        RuntimeError: every trial failed.
    """
    from diloco_gym.backends import init_ray, require_ray

    require_ray()
    try:
        from ray import tune  # noqa: F401 - checked here, used by _make_tuner
        from ray.tune.schedulers import ASHAScheduler  # noqa: F401
        from ray.tune.search.basic_variant import BasicVariantGenerator  # noqa: F401
    except ImportError:
        from diloco_gym.backends import RAY_EXTRA_HINT

        raise ModuleNotFoundError(RAY_EXTRA_HINT.replace("Ray is", "Ray Tune is")) from None
    from diloco_gym.rl import train  # noqa: F401 - without stable-baselines3, fail first

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    init_ray(jobs, ray_address)
    started = time.perf_counter()
    result_grid = _make_tuner(spec, out, progress).fit()
    # ResultGrid is indexable and sized; its Results' optional fields are checked below
    # (error, metrics), so they are handled as untyped values here.
    grid: list[Any] = [result_grid[i] for i in range(len(result_grid))]
    best, errored = _best_result(grid)
    best_dir = out / "best"
    trial = _save_best(spec, best, best_dir, len(grid), errored, started)
    trials = [
        {
            **{k: v for k, v in r.config.items() if k != "_fixed"},
            "timesteps": (r.metrics or {}).get("timesteps"),
            METRIC: (r.metrics or {}).get(METRIC, math.nan),
            "error": None if r.error is None else " ".join(str(r.error).split())[:200],
        }
        for r in grid
    ]
    (out / "trials.json").write_text(json.dumps(trials, indent=2, default=str) + "\n")
    return {
        "best_dir": best_dir,
        "config": trial["hyperparameters"],
        "metric": float(best.metrics[METRIC]),
        "trials": len(grid),
        "errored": errored,
        "all_tied": _all_tied(grid),
    }


def _all_tied(grid: list[Any]) -> bool:
    """Whether two or more trials finished and all scored exactly the same validation metric
    (the search then chose nothing: for example every model learned never to merge)."""
    scores = [
        r.metrics[METRIC] for r in grid if r.error is None and r.metrics and METRIC in r.metrics
    ]
    return len(scores) >= 2 and len(set(scores)) == 1


def _make_tuner(spec: TuneSpec, out: Path, progress: bool) -> Any:
    """The Tuner: ASHA on the validation metric over ``spec``'s space, results in
    ``out/ray_results``."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    fixed = {
        k: spec[k]
        for k in (
            "algo",
            "regime",
            "timesteps",
            "eval_every",
            "train_seeds",
            "validation_episodes",
            "n_envs",
            "vec_env",
        )
    }
    fixed["env"] = dict(spec["env"])
    space = {**_search_space(spec["space"]), "_fixed": fixed}
    scheduler = ASHAScheduler(
        time_attr="timesteps",
        max_t=spec["timesteps"],
        grace_period=min(spec["grace_timesteps"], spec["timesteps"]),
        reduction_factor=spec["reduction_factor"],
    )
    return tune.Tuner(
        tune.with_resources(tune_trial, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="min",
            scheduler=scheduler,
            num_samples=spec["num_samples"],
            search_alg=BasicVariantGenerator(random_state=spec["seed"]),
        ),
        run_config=tune.RunConfig(
            name=spec["name"], storage_path=str(out / "ray_results"), verbose=1 if progress else 0
        ),
    )


def _best_result(grid: list[Any]) -> tuple[Any, int]:
    """The best trial and the number that errored; RuntimeError when none finished."""
    errored = sum(1 for r in grid if r.error is not None)
    ok = [r for r in grid if r.error is None and r.metrics and METRIC in r.metrics]
    if not ok:
        first = next((r.error for r in grid if r.error is not None), None)
        raise RuntimeError(
            f"every tune trial failed ({errored} errored): {' '.join(str(first).split())[:300]}"
        )
    # The best configuration by the validation metric at its last rung, among the trials
    # that reached the furthest rung (ASHA stopped the others on the same metric earlier).
    reach = max(r.metrics["timesteps"] for r in ok)
    best = min((r for r in ok if r.metrics["timesteps"] == reach), key=lambda r: r.metrics[METRIC])
    return best, errored


def _save_best(
    spec: TuneSpec, best: Any, best_dir: Path, trials: int, errored: int, started: float
) -> dict:
    """Write the best trial's checkpoint as a run directory (``model.zip`` and the
    ``meta.json`` that ``diloco-gym train`` writes); returns the trial's record."""
    from diloco_gym.rl import train as tr

    if best_dir.exists():
        shutil.rmtree(best_dir)
    best.checkpoint.to_directory(str(best_dir))
    trial = json.loads((best_dir / "trial.json").read_text(encoding="utf-8-sig"))
    (best_dir / "trial.json").unlink()
    hp = tr.default_hyperparameters(spec["algo"], spec["n_envs"], spec["timesteps"])
    hp.update(trial["hyperparameters"])
    meta = {
        "algo": spec["algo"],
        "regime": spec["regime"],
        "timesteps": int(trial["timesteps"]),
        "timesteps_requested": int(spec["timesteps"]),
        "seed": int(trial["train_seed"]),
        "n_envs": int(spec["n_envs"]),
        "vec_env": spec["vec_env"],
        "env_kwargs": spec["env"],
        "hyperparameters": hp,
        "seed_ranges": {
            "train_episode_seeds": [tr.TRAIN_SEED_LOW, tr.TRAIN_SEED_HIGH],
            "held_out_below": tr.HELD_OUT_SEED_HIGH,
            "validation_seeds": [
                tr.VALIDATION_SEED0,
                tr.VALIDATION_SEED0 + spec["validation_episodes"],
            ],
        },
        "tune": {
            "name": spec["name"],
            "file": spec["path"],
            "trials": trials,
            "errored": errored,
            "metric": METRIC,
            "best_metric": float(best.metrics[METRIC]),
            "train_seeds": spec["train_seeds"],
            "validation_per_seed": trial["validation_sync_excess_pct_per_seed"],
            "space": spec["space"],
        },
        "best_validation_sync_excess_pct": float(min(trial["validation_sync_excess_pct_per_seed"])),
        "train_seconds": round(time.perf_counter() - started, 1),
        "versions": tr._versions(),
        "name": f"learned:{spec['algo']}-{spec['regime']}",
        "status": "complete",
    }
    (best_dir / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return trial
