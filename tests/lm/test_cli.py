"""The ``calibrate-learners`` options and command body (``diloco_gym/lm/cli.py``): the
integer checks, the refusals of a bad ``--out``, and the trainer configuration and corpus
cap handed to :func:`~diloco_gym.lm.calibrate.calibrate_learners` (a stand-in here: no
training)."""

from __future__ import annotations

import argparse

import pytest

from diloco_gym.cli import main
from diloco_gym.errors import UsageError
from diloco_gym.lm import calibrate
from diloco_gym.lm.cli import (
    _int_at_least,
    add_calibrate_learners_arguments,
    run_calibrate_learners_command,
)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_calibrate_learners_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def captured(monkeypatch):
    """Replace the calibration with a stand-in that records its keywords."""
    seen: dict = {}

    def fake(**kw):
        seen.update(kw)
        return {
            "params": {"drift_steps": 12.345},
            "validation": {
                "spearman_rho": 0.9,
                "spearman_p": 0.0123,
                "mae": 0.01234,
                "schedules": 7,
            },
            "effects": {"power": {"verdict": "detected: +1.00 %"}},
        }

    monkeypatch.setattr(calibrate, "calibrate_learners", fake)
    return seen


def test_int_at_least_parses_and_names_the_bound():
    parse = _int_at_least(2)
    assert parse("2") == 2 and parse("10") == 10
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer, got 'x'"):
        parse("x")
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 2, got 1"):
        parse("1")


def test_cli_refuses_to_overwrite_and_bad_values(tmp_path, capsys):
    out = tmp_path / "lc.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--tiny", "--out", str(out)])
    assert info.value.code == 2
    assert "exists; pass --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--seeds", "1", "--out", str(tmp_path / "x.json")])
    assert info.value.code == 2
    assert "--seeds" in capsys.readouterr().err


def test_out_must_be_a_file_in_an_existing_directory(tmp_path, captured):
    with pytest.raises(UsageError, match="is a directory; give a file name"):
        run_calibrate_learners_command(_args("--out", str(tmp_path)))
    with pytest.raises(UsageError, match="does not exist"):
        run_calibrate_learners_command(_args("--out", str(tmp_path / "no" / "lc.json")))
    assert captured == {}  # nothing ran


def test_an_existing_out_is_replaced_with_force_or_resumed(tmp_path, captured):
    out = tmp_path / "lc.json"
    out.write_text("{}")
    for flag in ("--force", "--resume"):
        captured.clear()
        assert run_calibrate_learners_command(_args("--tiny", "--out", str(out), flag)) == 0
        assert captured["resume"] is (flag == "--resume")


def test_tiny_keeps_the_tiny_model_and_caps_the_corpus(tmp_path, captured, capsys):
    out = tmp_path / "lc.json"
    args = _args("--tiny", "--out", str(out), "--learners", "8", "--d-model", "64", "--quiet")
    assert run_calibrate_learners_command(args) == 0
    cfg = captured["config"]
    assert cfg == {**calibrate.TINY, "threads": 1, "outer_lr": 0.7, "outer_momentum": 0.5}
    assert captured["max_bytes"] == 200_000 and captured["seeds"] == 3
    assert captured["heldout_seeds"] == 1 and captured["jobs"] == 1
    assert captured["out"] == out and captured["bootstrap"] == 100
    printed = capsys.readouterr()
    assert printed.out.strip() == (
        f"{out}: drift 12.35 inner steps; held-out Spearman rho 0.90 (p 0.0123), MAE 0.0123 "
        "nats/byte over 7 schedules; H_max vs H_min detected: +1.00 %"
    )


def test_full_size_takes_the_model_options(tmp_path, captured):
    args = _args(
        "--out", str(tmp_path / "lc.json"), "--learners", "3", "--layers", "2", "--threads", "2"
    )
    run_calibrate_learners_command(args)
    cfg = captured["config"]
    assert cfg["total_steps"] == 160 and cfg["num_learners"] == 3  # covers one episode
    assert captured["seeds"] == 10 and captured["heldout_seeds"] == 3
    assert captured["env_steps_per_inner_step"] == 32.0 and captured["mapping_check"] is None
    assert captured["target_effect"] == calibrate.DEFAULT_TARGET_EFFECT
    assert cfg["d_model"] == 128 and cfg["n_layers"] == 2 and cfg["threads"] == 2
    assert captured["max_bytes"] == 8_000_000
    args = _args("--tiny", "--out", str(tmp_path / "b.json"), "--total-steps", "24")
    run_calibrate_learners_command(args)
    assert captured["config"]["total_steps"] == 24
    args = _args(
        "--out",
        str(tmp_path / "c.json"),
        "--mapping",
        "16",
        "--mapping-check",
        "64",
        "--seeds",
        "6",
        "--heldout-seeds",
        "2",
        "--jobs",
        "2",
        "--target-effect",
        "0.02",
    )
    run_calibrate_learners_command(args)
    assert captured["config"]["total_steps"] == 320  # one episode at 16 env steps a step
    assert captured["env_steps_per_inner_step"] == 16.0 and captured["mapping_check"] == 64.0
    assert (captured["seeds"], captured["heldout_seeds"], captured["jobs"]) == (6, 2, 2)
    assert captured["target_effect"] == 0.02


def test_too_few_fit_seeds_are_refused_before_any_run(tmp_path, captured):
    args = _args("--out", str(tmp_path / "lc.json"), "--seeds", "4", "--heldout-seeds", "3")
    with pytest.raises(UsageError, match="--heldout-seeds 3 leaves 1 fit seed"):
        run_calibrate_learners_command(args)
    assert captured == {}


def test_the_command_line_is_recorded_and_progress_goes_to_stderr(
    tmp_path, captured, capsys, monkeypatch
):
    out = tmp_path / "lc.json"
    monkeypatch.setattr(
        "sys.argv", ["diloco-gym", "calibrate-learners", "--tiny", "--out", str(out)]
    )
    run_calibrate_learners_command(_args("--tiny", "--out", str(out)))
    assert captured["command"] == f"diloco-gym calibrate-learners --tiny --out {out}"
    captured["progress"]("a progress line")
    assert capsys.readouterr().err == "a progress line\n"
    monkeypatch.setattr("sys.argv", ["python"])
    run_calibrate_learners_command(_args("--tiny", "--out", str(out), "--force", "--quiet"))
    assert captured["command"] == "diloco-gym calibrate-learners"
    captured["progress"]("not shown")
    assert capsys.readouterr().err == ""
