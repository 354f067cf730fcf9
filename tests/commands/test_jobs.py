"""What the protocol commands share (:mod:`diloco_gym.commands.jobs`): the recorded command
line and a fleet job's errors."""

from __future__ import annotations

import argparse
import sys

import pytest

from diloco_gym.commands import jobs
from diloco_gym.errors import DataError, Interrupted
from diloco_gym.sim.fleet import FleetConfigError


def test_command_line_quotes_each_argument(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["diloco-gym", "report", "--out", "my dir"])
    assert jobs.command_line() == "diloco-gym report --out 'my dir'"


def _raise(exc: BaseException):
    def run():
        raise exc

    return run


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (FleetConfigError("bad fleet"), "bad fleet"),
        (ValueError("too short"), "too short"),
        (KeyError("no site 'x'"), "no site 'x'"),  # the key's text, not its repr
    ],
)
def test_a_failed_fleet_job_is_a_data_error(exc, message):
    args = argparse.Namespace(out="o")
    with pytest.raises(DataError) as got:
        jobs.fleet_job(args, _raise(exc), lambda res, cmd: None, "report")
    assert str(got.value) == message and got.value.exit_code == 1


def test_an_interrupted_fleet_job_names_what_was_not_written():
    args = argparse.Namespace(out="o")
    with pytest.raises(Interrupted) as got:
        jobs.fleet_job(args, _raise(KeyboardInterrupt()), lambda res, cmd: None, "frontier")
    assert str(got.value) == "interrupted; no frontier written (o left as it was)"
    assert got.value.exit_code == 130


def test_a_fleet_job_writes_with_the_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["diloco-gym", "report", "--fleet", "f.toml"])
    written = []
    result, out = jobs.fleet_job(
        argparse.Namespace(out="o"),
        lambda: {"summary": 1},
        lambda res, cmd: written.append((res, cmd)) or "o",
        "report",
    )
    assert result == {"summary": 1} and out == "o"
    assert written == [({"summary": 1}, "diloco-gym report --fleet f.toml")]
    assert isinstance(jobs.fleet_env_error(ValueError("x")), DataError)
