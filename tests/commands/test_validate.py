"""The ``validate`` command (:mod:`diloco_gym.commands.validate`): its options come from the
``live`` extra, only when ``validate`` is the command being run; without the extra, one line."""

from __future__ import annotations

import argparse
import sys

import pytest

from diloco_gym.cli import build_parser, main
from diloco_gym.commands import validate


def _validate_parser(command: str | None) -> argparse.ArgumentParser:
    (sub,) = [
        a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return sub.choices["validate"]


def test_validate_options_only_for_validate():
    assert validate.SLOW_OPTIONS is True
    assert {a.dest for a in _validate_parser("run")._actions} == {"help"}
    parser = _validate_parser("validate")
    dests = {a.dest for a in parser._actions}
    assert {"modes", "endpoint", "held_out", "windows", "agent", "calibration", "out"} <= dests
    assert parser.get_default("func") is validate.run


def test_without_live_it_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diloco_gym.live.validate_cli", None)  # ImportError
    p = argparse.ArgumentParser()
    validate.add_arguments(p)
    assert {a.dest for a in p._actions} == {"help"}
    with pytest.raises(SystemExit) as exc:
        main(["validate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco-gym: validate needs the 'live' extra: pip install ")
    assert len(err.strip().splitlines()) == 1
