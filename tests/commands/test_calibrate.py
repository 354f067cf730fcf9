"""The ``calibrate`` command (:mod:`diloco_gym.commands.calibrate`): its options come from the
``live`` extra, only when ``calibrate`` is the command being run; without the extra, one line."""

from __future__ import annotations

import argparse
import sys

import pytest

from diloco_gym.cli import build_parser, main
from diloco_gym.commands import calibrate


def _calibrate_parser(command: str | None) -> argparse.ArgumentParser:
    (sub,) = [
        a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return sub.choices["calibrate"]


def test_calibrate_options_only_for_calibrate():
    assert calibrate.SLOW_OPTIONS is True
    assert {a.dest for a in _calibrate_parser("run")._actions} == {"help"}
    assert len(_calibrate_parser("calibrate")._actions) > 1
    assert _calibrate_parser("calibrate").get_default("func") is calibrate.run


def test_bad_options_are_argparse_usage_errors(fails):
    pytest.importorskip("diloco_gym.live.cli")
    line = fails(["calibrate", "--bogus"], 2)
    assert line == "diloco-gym: error: unrecognized arguments: --bogus (see: diloco-gym --help)"
    line = fails(["calibrate", "--engine-threads", "many"], 2)
    assert line.startswith("diloco-gym calibrate: error: argument --engine-threads: invalid ")


def test_without_live_it_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diloco_gym.live.cli", None)  # import -> ImportError
    p = argparse.ArgumentParser()
    calibrate.add_arguments(p)
    assert {a.dest for a in p._actions} == {"help"}
    with pytest.raises(SystemExit) as exc:
        main(["calibrate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco-gym: calibrate needs the 'live' extra: pip install ")
    assert len(err.strip().splitlines()) == 1
