"""The ``calibrate-learners`` command (:mod:`diloco_gym.commands.calibrate_learners`): its
options come from :mod:`diloco_gym.lm.cli`, bad values fail with one line and status 2,
and ``run`` hands over to the learner calibration and returns its status (no training
here: the run itself is tested in tests/lm/test_cli.py)."""

from __future__ import annotations

import pytest

from diloco_gym.cli import COMMANDS, build_parser
from diloco_gym.commands import calibrate_learners


def _args(argv: list[str]):
    return build_parser("calibrate-learners").parse_args(["calibrate-learners", *argv])


def test_it_is_registered_with_its_help_line():
    assert "train a tiny LM with DiLoCo" in calibrate_learners.HELP
    assert dict(COMMANDS)["calibrate-learners"] is calibrate_learners


def test_defaults():
    args = _args([])
    assert args.out == "learner_calibration.json" and args.seeds is None and args.learners == 4
    assert args.heldout_seeds is None and args.jobs == 1 and args.mapping == 32.0
    assert args.mapping_check is None and args.target_effect is None
    assert args.total_steps is None and args.d_model == 128 and args.layers == 4
    assert args.bootstrap == 100 and not (args.tiny or args.force or args.resume or args.quiet)


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--seeds", "2"], "argument --seeds: must be >= 3, got 2"),
        (["--heldout-seeds", "0"], "argument --heldout-seeds: must be >= 1, got 0"),
        (["--jobs", "0"], "argument --jobs: must be >= 1, got 0"),
        (["--mapping", "0"], "argument --mapping: must be a finite number > 0, got '0'"),
        (["--mapping-check", "nan"], "argument --mapping-check: must be a finite number > 0"),
        (["--target-effect", "x"], "argument --target-effect: must be a number, got 'x'"),
        (["--total-steps", "1"], "argument --total-steps: must be >= 2, got 1"),
        (["--learners", "0"], "argument --learners: must be >= 1, got 0"),
        (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
        (["--d-model", "7"], "argument --d-model: must be >= 8, got 7"),
        (["--layers", "0"], "argument --layers: must be >= 1, got 0"),
        (["--bootstrap", "9"], "argument --bootstrap: must be >= 10, got 9"),
        (["--seeds", "x"], "argument --seeds: must be an integer, got 'x'"),
        (["--outer-lr", "fast"], "argument --outer-lr: invalid float value: 'fast'"),
    ],
)
def test_bad_option_values_are_usage_errors(extra, wanted, fails):
    line = fails(["calibrate-learners", *extra], 2)
    assert line.startswith("diloco-gym calibrate-learners: error: ") and wanted in line


@pytest.mark.parametrize(("flag", "low"), [("--seeds", 3), ("--total-steps", 2)])
def test_boundary_values_are_accepted(flag, low):
    assert getattr(_args([flag, str(low)]), flag[2:].replace("-", "_")) == low
    assert _args(["--d-model", "8", "--bootstrap", "10"]).d_model == 8


def test_a_directory_as_out_is_refused_before_any_run(tmp_path, fails):
    assert fails(["calibrate-learners", "--out", str(tmp_path)], 2) == (
        f"diloco-gym: --out {tmp_path} is a directory; give a file name"
    )


@pytest.mark.parametrize(("status", "code"), [(None, 0), (0, 0), (3, 3)])
def test_run_returns_the_calibrations_status(monkeypatch, status, code):
    from diloco_gym.lm import cli as lm_cli

    seen = []
    monkeypatch.setattr(
        lm_cli, "run_calibrate_learners_command", lambda args: seen.append(args) or status
    )
    args = _args(["--tiny"])
    assert calibrate_learners.run(args) == code
    assert seen == [args]
