"""The one message for a missing optional extra, and the commands that use it."""

from __future__ import annotations

import sys

import pytest

from diloco_gym.cli import main
from diloco_gym.commands.extras import missing_extra
from diloco_gym.errors import UsageError


def test_message_names_the_extra_and_the_pip_command():
    err = missing_extra("train", ["rl"], ImportError("No module named 'stable_baselines3'"))
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert str(err) == (
        "train needs the 'rl' extra: pip install \"diloco-gym[rl]\" "
        "(No module named 'stable_baselines3')"
    )


def test_message_for_two_extras():
    assert str(missing_extra("tune", ["rl", "ray"])) == (
        "tune needs the 'rl' and 'ray' extras: pip install \"diloco-gym[rl,ray]\""
    )


@pytest.mark.parametrize("extras", [[], [""], ["rl ray"]])
def test_bad_extra_names_are_refused(extras):
    with pytest.raises(ValueError, match="extra names"):
        missing_extra("x", extras)


def test_train_without_rl_is_one_line_with_the_pip_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)  # import -> ImportError
    with pytest.raises(SystemExit) as ex:
        main(["train", "--out", "x"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco-gym: train needs the 'rl' extra: pip install \"diloco-gym[rl]\"")
    assert len(err.strip().splitlines()) == 1


def test_report_on_ray_without_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit) as ex:
        main(["report", "--backend", "ray", "--out", str(tmp_path / "r"), "--no-progress"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "--backend ray of report needs the 'ray' extra: pip install \"diloco-gym[ray]\"" in err
