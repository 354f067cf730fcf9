"""Option checks several commands share (:mod:`diloco_gym.commands.checks`) and the replay
options they pass on (:func:`diloco_gym.commands.options.replay_options`)."""

from __future__ import annotations

import argparse

import pytest

from diloco_gym.commands import checks, options
from diloco_gym.errors import UsageError


def _trace_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    options.add_trace_args(p)
    options.add_backend_args(p)
    p.add_argument("--holm-across-settings", action="store_true")
    return p.parse_args(argv)


def test_fleet_runs_refuse_every_option_they_do_not_use():
    checks.check_no_fleet_options(_trace_args([]))  # the defaults pass
    checks.check_no_fleet_options(argparse.Namespace())  # so does a command without them
    with pytest.raises(UsageError) as exc:
        checks.check_no_fleet_options(
            _trace_args(["--jobs", "2", "--stride-s", "60", "--holm-across-settings"])
        )
    assert str(exc.value) == (
        "--jobs, --stride-s, --holm-across-settings not used with --fleet (a fleet runs "
        "serially; its sites, windows and loads are set in the fleet file)"
    )
    assert exc.value.exit_code == 2


def test_an_output_directory_of_other_files_is_a_usage_error(tmp_path):
    from diloco_gym.eval.outlock import release_out_locks

    (tmp_path / "notes.txt").write_text("mine")
    try:
        with pytest.raises(UsageError) as exc:
            checks.check_out_dir(str(tmp_path), force=True)
        assert exc.value.exit_code == 2 and "no diloco-gym report marker" in str(exc.value)
        assert (tmp_path / "notes.txt").read_text() == "mine"
        checks.check_out_dir(str(tmp_path / "new"), force=False)  # a new directory is fine
    finally:
        release_out_locks()  # as main() does when a command ends


def test_replay_options_with_and_without_the_stride():
    args = _trace_args(["--trace", "t.csv", "--window-s", "120", "--rate-scale", "2"])
    opts = options.replay_options(args)
    assert opts == {
        "trace": "t.csv",
        "trace_format": "auto",
        "window_s": 120.0,
        "sidecar": None,
        "rate_scale": 2.0,
        "target_utilization": None,
        "stride_s": None,
    }
    assert "stride_s" not in options.replay_options(args, stride=False)
