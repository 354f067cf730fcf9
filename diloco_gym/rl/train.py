"""``diloco-gym train``'s public names in one place (the modules of 0.5.0's ``train.py``).

The code lives in the modules named below; this module only re-exports them, so that
``from diloco_gym.rl.train import train`` (and the other names 0.5.0 exported) keeps
working:

* :mod:`diloco_gym.rl.trainer`: :func:`train` and its steps (seed discipline, outputs);
* :mod:`diloco_gym.rl.command`: the command line (:func:`add_train_arguments`,
  :func:`run_train_command`);
* :mod:`diloco_gym.rl.train_envs`: the training envs (:class:`TrainSeedWrapper`, the one
  vector-env builder);
* :mod:`diloco_gym.rl.run_dir`: the run directory (checks, checkpoints, atomic writes);
* :mod:`diloco_gym.rl.validation`: the held-out validation and the validation curve;
* :mod:`diloco_gym.rl.imitation`: the behaviour-cloning warm start;
* :mod:`diloco_gym.rl.algos`: the algorithm table.
"""

from __future__ import annotations

from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW, VALIDATION_SEED0
from diloco_gym.rl.algos import ALGOS, VEC_ENVS, algo_class, default_hyperparameters
from diloco_gym.rl.algos import library_versions as _versions
from diloco_gym.rl.command import add_train_arguments, resolve_config, run_train_command
from diloco_gym.rl.imitation import behaviour_clone, fit_to_actions, teacher_samples
from diloco_gym.rl.run_dir import (
    RUN_ARTEFACTS,
    check_run_dir,
    checkpoints_newest_first,
    latest_checkpoint,
    model_file_problem,
)
from diloco_gym.rl.run_dir import save_atomic as _save_atomic
from diloco_gym.rl.train_envs import (
    TrainSeedWrapper,
    make_train_env,
    make_train_vec_env,
    make_vec_env,
)
from diloco_gym.rl.train_envs import train_episode_seeds as _train_episode_seeds
from diloco_gym.rl.trainer import train
from diloco_gym.rl.validation import (
    HELD_OUT_SEED_HIGH,
    HeldOutEvalCallback,
    format_budget_validation,
    format_comparison,
    validation_comparison,
    validation_curve_rows,
    write_validation_curve,
)

#: 0.5.0's private name of :func:`~diloco_gym.rl.algos.algo_class` (``scale/tune.py``
#: still reads it).
_algo_class = algo_class

__all__ = [
    "ALGOS",
    "VEC_ENVS",
    "TRAIN_SEED_LOW",
    "TRAIN_SEED_HIGH",
    "HELD_OUT_SEED_HIGH",
    "VALIDATION_SEED0",
    "TrainSeedWrapper",
    "HeldOutEvalCallback",
    "make_train_env",
    "make_train_vec_env",
    "make_vec_env",
    "train",
    "add_train_arguments",
    "resolve_config",
    "run_train_command",
    "latest_checkpoint",
    "checkpoints_newest_first",
    "check_run_dir",
    "model_file_problem",
    "validation_comparison",
    "format_comparison",
    "format_budget_validation",
    "validation_curve_rows",
    "write_validation_curve",
    "behaviour_clone",
    "teacher_samples",
    "fit_to_actions",
    "default_hyperparameters",
    "RUN_ARTEFACTS",
    "_algo_class",
    "_versions",
    "_save_atomic",
    "_train_episode_seeds",
]
