"""Tests of :mod:`diloco_gym.rl.train`: the names 0.5.0 exported still import, and each is
the object of its new home (the module holds no code of its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from diloco_gym.rl import (  # noqa: E402
    algos,
    command,
    imitation,
    run_dir,
    train,
    train_envs,
    trainer,
    validation,
)


def test_every_exported_name_is_its_home_modules_object() -> None:
    homes = (algos, command, imitation, run_dir, train_envs, trainer, validation)
    for name in train.__all__:
        obj = getattr(train, name)
        if isinstance(obj, (int, tuple)):
            continue
        assert getattr(obj, "__module__", "").startswith("diloco_gym."), name
        assert any(obj in vars(m).values() for m in homes), name
    assert train.train is trainer.train
    assert train.add_train_arguments is command.add_train_arguments
    assert train.check_run_dir is run_dir.check_run_dir
    assert train.TrainSeedWrapper is train_envs.TrainSeedWrapper


def test_the_facade_defines_nothing() -> None:
    tree = ast.parse(Path(train.__file__).read_text())
    defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == []
