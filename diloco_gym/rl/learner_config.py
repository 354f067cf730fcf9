"""A training config's learner calibration: ``[env] learner_calibration = "learners.json"``.

The file (from ``diloco-gym calibrate-learners``; :mod:`diloco_gym.sim.learner_calibration`)
gives every env of the run its learner model: the loss curve, drift and merge overhead
behind the learner observations and the ``progress_weight`` reward. Like ``calibration``
and ``trace``, a relative path is taken from the working directory the command runs in;
the name ``"shipped"`` is the calibration shipped with the package (``DiLoCoSync-v2``'s).

* :func:`problem`: the file is read and checked (schema, bounds) with the rest of the
  config, before anything is trained or written;
* :func:`train_env_kwargs` (``TrainConfig.env_kwargs()``): every training and validation
  env (each ``vec_env`` kind, the batched native env included, and the behaviour-cloning
  episodes) gets ``learner_calibration=<absolute path>`` (``"shipped"`` kept as the name)
  among its ``DiLoCoSyncEnv`` keyword arguments;
* :func:`record`: ``meta.json`` records that path in ``env_kwargs`` (so
  ``DiLoCoSyncEnv(regime, **meta["env_kwargs"])`` rebuilds the env), the path as given and
  this record (absolute path, SHA-256) in ``config``, and the learner model itself in
  ``learner_params``.

Judge such a policy in envs with the same learners: ``diloco-gym report`` or ``diloco-gym
frontier`` with ``--learner-calibration`` and the same file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = [
    "problem",
    "learner_calibration_path",
    "train_env_kwargs",
    "record",
]


def problem(value: str | None) -> str | None:
    """What is wrong with the learner calibration file ``value`` (one line, to follow
    ``[env] learner_calibration``), or ``None``: no file, or a valid one."""
    if value is None:
        return None
    if not value.strip():
        return " must name a file, got ''"
    from diloco_gym.sim.learner_calibration import learner_params, load_learner_calibration

    try:
        learner_params(load_learner_calibration(value))
    except (OSError, ValueError) as exc:  # LearnerCalibrationError is a ValueError
        return ": " + " ".join(str(exc).split())
    return None


def learner_calibration_path(value: str | None) -> str | None:
    """``value`` as an absolute path (a relative one from the working directory; the name
    ``"shipped"``: the calibration shipped with the package)."""
    from diloco_gym.sim.learner_calibration import resolve_path

    return None if value is None else str(Path(resolve_path(value)).expanduser().resolve())


def train_env_kwargs(env_params: dict[str, Any], learner_calibration: str | None) -> dict:
    """The ``DiLoCoSyncEnv`` keyword arguments of every env of a run: the ``EnvParams``
    overrides, and ``learner_calibration`` (absolute) when the config names one."""
    kw = dict(env_params)
    if learner_calibration is not None:
        kw["learner_calibration"] = _portable(learner_calibration)
    return kw


def _portable(value: str) -> str:
    """``"shipped"`` as it is (every installation resolves it to its own packaged file, so a
    shipped agent's ``meta.json`` rebuilds its env anywhere), any other file absolute."""
    from diloco_gym.sim.learner_calibration import SHIPPED

    return SHIPPED if value == SHIPPED else str(learner_calibration_path(value))


def record(value: str | None) -> dict[str, Any]:
    """``{"learner_calibration_file": {"path", "sha256"}}`` for meta.json's ``config``
    (``{}`` without a file; ``path`` absolute, or ``"shipped"``; ``sha256`` is ``None`` if
    the file is gone since the check)."""
    path = learner_calibration_path(value)
    if value is None or path is None:
        return {}
    try:
        digest: str | None = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"learner_calibration_file": {"path": _portable(value), "sha256": digest}}
