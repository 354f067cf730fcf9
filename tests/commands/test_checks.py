"""Option checks several commands share (:mod:`diloco_gym.commands.checks`) and the replay
options they pass on (:func:`diloco_gym.commands.options.replay_options`)."""

from __future__ import annotations

import argparse
from pathlib import Path

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
        "--jobs, --stride-s, --holm-across-settings not used with --fleet (its sites, windows "
        "and loads are set in the fleet file; it runs in this process)"
    )
    assert exc.value.exit_code == 2
    # report and frontier run a fleet's episodes on --backend: only the others are refused
    checks.check_no_fleet_options(_trace_args(["--jobs", "2"]), parallel=True)
    with pytest.raises(UsageError) as exc:
        checks.check_no_fleet_options(_trace_args(["--jobs", "2", "--stride-s", "60"]), True)
    assert str(exc.value) == (
        "--stride-s not used with --fleet (its sites, windows and loads are set in the fleet file)"
    )


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


def _model(tmp_path, name, learners=None):
    """A model directory as ``train`` leaves it: ``model.zip`` and ``meta.json`` recording
    the learner calibration it was trained with (none: the default learners)."""
    import json

    d = tmp_path / name
    d.mkdir()
    (d / "model.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    config = {"algo": "ppo"}
    if learners is not None:
        config["learner_calibration_file"] = {"path": "x.json", "sha256": learners}
    (d / "meta.json").write_text(json.dumps({"algo": "ppo", "config": config}))
    return str(d)


def test_a_learned_agent_judged_with_other_learners_is_warned_about(tmp_path):
    import hashlib
    import warnings

    from diloco_gym.agents.learned import LearnerMismatchWarning, trained_learners

    cal = tmp_path / "lc.json"
    cal.write_text('{"any": 1}')
    sha = hashlib.sha256(cal.read_bytes()).hexdigest()
    same = _model(tmp_path, "same", learners=sha)
    other = _model(tmp_path, "other", learners="0" * 64)
    plain = _model(tmp_path, "plain")
    assert trained_learners(same) == sha and trained_learners(plain) == ""
    assert trained_learners("fixed-512") is None  # not a learned model
    assert trained_learners("reference-ppo-v1") == ""  # shipped, default learners
    from diloco_gym.sim.learner_calibration import shipped_path

    shipped = hashlib.sha256(Path(shipped_path()).read_bytes()).hexdigest()
    assert trained_learners("reference-ppo-v2") == shipped  # DiLoCoSync-v2's learners
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # judged with its own learners: no warning
        checks.warn_learner_mismatch(["reference-ppo-v2"], shipped_path())
    with pytest.warns(LearnerMismatchWarning, match="reference-ppo-v2 was trained with") as w:
        checks.warn_learner_mismatch(["reference-ppo-v2"], None)
    assert "(judge it with --learner-calibration shipped" in str(w[0].message)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        checks.warn_learner_mismatch([same, other, plain, "fixed-512"], str(cal))
    msgs = [str(w.message) for w in seen if w.category is LearnerMismatchWarning]
    assert len(msgs) == 2
    assert msgs[0].startswith(f"{other} was trained with learner calibration sha256 000000000000")
    assert f"judged with {cal} (sha256 {sha[:12]})" in msgs[0]
    assert msgs[1].startswith(f"{plain} was trained with the default learners")
    assert msgs[1].endswith("(judge it without --learner-calibration)")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        checks.warn_learner_mismatch([same, plain], None)  # judged with the default learners
    msgs = [str(w.message) for w in seen if w.category is LearnerMismatchWarning]
    assert len(msgs) == 1 and msgs[0].startswith(f"{same} was trained with learner calibration")
    assert "judged with the default learners" in msgs[0]


def test_the_mismatch_warning_is_one_line_on_the_command_line(tmp_path, capsys, monkeypatch):
    from diloco_gym import cli

    model = _model(tmp_path, "m", learners="1" * 64)
    monkeypatch.setattr(
        "diloco_gym.eval.report.run_protocol",
        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()),
    )
    argv = ["report", "--regimes", "bursty", "--seeds", "2", "--agents", model]
    with pytest.raises(cli.CLIExit):  # stopped before any episode by the stand-in
        cli.main([*argv, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert f"diloco-gym: warning: {model} was trained with learner calibration" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--agents", "cap-aware-forecast"],
        ["frontier", "--agent", "cap-aware-forecast"],
        ["run", "--agent", "cap-aware-forecast"],
        ["report", "--agents", "link-aware-forecast"],
        ["run", "--agent", "link-aware-forecast"],
    ],
)
def test_a_fleet_only_agent_is_refused_on_a_single_host_before_any_work(argv, tmp_path, capsys):
    from diloco_gym.cli import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out)] if argv[0] != "run" else argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    name = argv[-1]
    need = {"cap-aware-forecast": "site_cap_pp", "link-aware-forecast": "link_levels"}[name]
    assert f"{name}: runs only on a fleet ({name} needs" in err and need in err
    assert not out.exists()
