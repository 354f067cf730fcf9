"""The ``train`` command (:mod:`diloco_gym.commands.train`): its options come from the ``rl``
extra, only when ``train`` is the command being run; without the extra, one line."""

from __future__ import annotations

import argparse
import sys

import pytest

from diloco_gym.cli import build_parser, main
from diloco_gym.commands import train


def _train_parser(command: str | None) -> argparse.ArgumentParser:
    (sub,) = [
        a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return sub.choices["train"]


def test_train_options_only_for_train():
    assert train.SLOW_OPTIONS is True
    assert {a.dest for a in _train_parser("report")._actions} == {"help"}
    assert _train_parser("report").get_default("func") is train.run


def test_without_rl_the_rest_is_kept_and_run_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)  # import -> ImportError
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    assert {a.dest for a in p._actions} == {"help", "rest"}
    assert p.parse_args(["x", "--out", "y"]).rest == ["x", "--out", "y"]
    with pytest.raises(Exception, match=r"train needs the 'rl' extra") as exc:
        train.run(argparse.Namespace())
    assert getattr(exc.value, "exit_code", None) == 2


@pytest.mark.slow
def test_bad_option_values_are_argparse_usage_errors(fails):
    pytest.importorskip("stable_baselines3")
    line = fails(["train", "--timesteps", "x"], 2)
    assert line.startswith("diloco-gym train: error: ") and "--timesteps" in line
    line = fails(["train", "--bogus"], 2)
    assert line == "diloco-gym: error: unrecognized arguments: --bogus (see: diloco-gym --help)"


def test_main_names_the_missing_extra_before_parsing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--bogus"])
    assert exc.value.code == 2
    assert "train needs the 'rl' extra" in capsys.readouterr().err


def test_cli_train_without_the_rl_extra(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)  # as if SB3 were missing
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "ppo", "--timesteps", "10", "--out", "x"])
    assert exc.value.code == 2
    assert "needs the 'rl' extra" in capsys.readouterr().err
