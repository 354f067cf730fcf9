"""The command table of :mod:`diloco_gym.cli`: each registered module has its help line,
``add_arguments`` and ``run``, and is a sub-command of the parser that runs it."""

from __future__ import annotations

import argparse

import pytest

from diloco_gym import cli


def _choices() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [
        a for a in cli.build_parser(None)._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return dict(sub.choices)


def test_table_names_are_distinct_and_moved_modules_are_under_commands():
    names = [name for name, _ in cli.COMMANDS]
    assert names and len(names) == len(set(names))
    for name, module in cli.COMMANDS:
        assert module.__name__ == f"diloco_gym.commands.{name.replace('-', '_')}", name


@pytest.mark.parametrize(("name", "module"), cli.COMMANDS)
def test_each_module_is_registered_with_its_run(name, module):
    assert isinstance(module.HELP, str) and module.HELP
    assert callable(module.add_arguments) and callable(module.run)
    p = _choices()[name]
    assert p.get_default("func") is module.run
    fresh = argparse.ArgumentParser()
    module.add_arguments(fresh)
    assert {a.dest for a in fresh._actions} == {a.dest for a in p._actions} - {"func"}


def test_every_command_of_the_parser_runs_something():
    for name, p in _choices().items():
        assert callable(p.get_default("func")), name
