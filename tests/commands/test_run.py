"""The ``run`` command (:mod:`diloco_gym.commands.run`): each mode's option checks (regime,
trace, fleet) fail with one line and their exit status before any episode runs; the units
and their label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import diloco_gym
from diloco_gym.cli import build_parser, main
from diloco_gym.commands import options
from diloco_gym.commands import run as run_cmd
from diloco_gym.errors import DataError
from diloco_gym.sim.loaders import FORMATS, save_native
from diloco_gym.sim.traces import Trace

FLEET_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"

TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "bursty.csv")
RUN = ["run", "--agent", "fixed-512", "--in-process-agents"]


def _args(argv: list[str]):
    return build_parser("run").parse_args(argv)


def test_format_is_a_choice_list(fails):
    assert options.TRACE_FORMATS == ("auto", *FORMATS)
    line = fails([*RUN, "--trace", "x.csv", "--format", "csvx"], 2)
    assert "invalid choice: 'csvx'" in line


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--seeds", "0"], "argument --seeds: must be >= 1, got 0"),
        (["--seeds", "-3"], "argument --seeds: must be >= 1, got -3"),
        (["--seed0", "-1"], "argument --seed0: must be >= 0, got -1"),
        (["--seeds", "two"], "argument --seeds: not an integer: 'two'"),
        (["--rate-scale", "2", "--target-utilization", "0.5"], "not allowed with argument"),
    ],
)
def test_bad_option_values_are_argparse_usage_errors(extra, wanted, fails):
    line = fails([*RUN, *extra], 2)
    assert line.startswith("diloco-gym run: error: ") and wanted in line
    assert line.endswith("(see: diloco-gym run --help)")


def test_regime_mode_checks(fails):
    assert "unknown regime 'nope'; valid regimes: " in fails([*RUN, "--regime", "nope"], 2)
    line = fails(["run", "--agent", "nope"], 2)
    assert "unknown agent 'nope'" in line and "a path to a trained model .zip" in line
    assert fails([*RUN, "--window-s", "-5"], 2) == (
        "diloco-gym: window_s must be a positive number of seconds, got -5.0"
    )
    assert fails([*RUN, "--rate-scale", "-1"], 2) == (
        "diloco-gym: rate_scale must be a positive number, got -1.0"
    )


@pytest.mark.parametrize("agent", ["fixed-budget", "reference-budget-bursty"])
def test_budget_aware_agents_are_refused(agent, fails):
    """run gives no merge budget: a budget-aware agent is a usage error naming the frontier."""
    line = fails(["run", "--agent", agent, "--seeds", "2"], 2)
    assert "runs only with one" in line and f"frontier --budget-agents {agent}" in line


def test_a_corrupt_model_file_is_a_data_error(tmp_path, fails):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"junk")
    assert "junk.zip" in fails(["run", "--agent", str(junk), "--seeds", "1"], 1)


def test_trace_mode_checks(tmp_path, fails):
    assert "missing.csv: cannot read" in fails([*RUN, "--trace", str(tmp_path / "missing.csv")], 1)
    line = fails([*RUN, "--trace", TRACE, "--window-s", "10"], 2)
    assert "10 s is too short: an episode needs at least 39.0 s" in line


def test_a_trace_too_short_for_a_window_is_a_data_error_naming_the_file(tmp_path):
    n = 30
    short = tmp_path / "short.csv"
    save_native(Trace(np.linspace(0.0, 29.7, n), np.full(n, 100), np.full(n, 10), 30.0), short)
    args = _args([*RUN, "--trace", str(short)])
    with pytest.raises(DataError, match="too short") as exc:
        run_cmd._units(args, run_cmd._config(args))
    assert exc.value.exit_code == 1 and str(short) in str(exc.value)


def test_units_and_their_labels():
    args = _args([*RUN, "--seeds", "1"])
    units, label = run_cmd._units(args, run_cmd._config(args))
    assert len(units) == 1 and label == "bursty"  # --seeds 1 (the config holds 2)
    args = _args([*RUN, "--trace", TRACE, "--format", "native", "--window-s", "100"])
    units, label = run_cmd._units(args, run_cmd._config(args))
    assert label == f"bursty ({len(units)} disjoint windows of 100 s)"
    args = _args([*RUN, "--trace", TRACE, "--format", "native", "--window-s", "100",
                  "--stride-s", "50"])  # fmt: skip
    _, label = run_cmd._units(args, run_cmd._config(args))
    assert "overlapping windows of 100 s: not independent" in label


def test_fleet_mode_checks(tmp_path, fails):
    fleet = ["run", "--agent", "pressure-gate", "--in-process-agents", "--fleet"]
    line = fails([*fleet, str(FLEET_EXAMPLE), "--trace", "x.csv"], 2)
    assert line == "diloco-gym: --fleet replaces --trace (the sites are in FILE)"
    line = fails([*fleet, str(FLEET_EXAMPLE), "--window-s", "60", "--format", "native"], 2)
    assert line.startswith("diloco-gym: --format, --window-s not used with --fleet (")
    assert "--rate-scale not used" in fails([*fleet, str(FLEET_EXAMPLE), "--rate-scale", "2"], 2)
    assert "fleet configuration file not found" in fails([*fleet, str(tmp_path / "no.toml")], 1)
    prec = tmp_path / "prec.toml"
    prec.write_text('[fleet]\nbits_options = [4, 32]\n[[site]]\nname = "bursty"\n')
    assert "run --fleet scores fixed-precision fleets only" in fails([*fleet, str(prec)], 1)
    line = fails([*fleet, str(FLEET_EXAMPLE), "--learner-calibration", "shipped"], 2)
    assert line.startswith("diloco-gym: --learner-calibration not used with --fleet (")


def test_a_fleet_with_a_merge_budget_runs_a_budget_aware_agent(tmp_path, fails, capsys):
    """As ``report --fleet``: refused without the fleet file's ``[env] merge_budget`` (the
    error names the file and the key), run at that budget with it."""
    argv = ["run", "--agent", "online-forecast-budget", "--in-process-agents", "--seeds", "2"]
    line = fails([*argv, "--fleet", str(FLEET_EXAMPLE)], 2)
    assert f"or set merge_budget in the [env] table of {FLEET_EXAMPLE}" in line
    text = FLEET_EXAMPLE.read_text()
    assert "\nh_max_steps = 512\n" in text
    budgeted = tmp_path / "fleet.toml"
    budgeted.write_text(
        text.replace("\nh_max_steps = 512\n", "\nh_max_steps = 512\nmerge_budget = 40\n")
    )
    assert main([*argv, "--fleet", str(budgeted)]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    per_seed = [r for r in rows if r[:1] in (["0"], ["1"])]
    assert len(per_seed) == 2 and all(r[1] == "240.0" for r in per_seed)  # 40 per 600 s


def test_run_judges_with_a_learner_calibration_and_warns_on_a_mismatch(capsys):
    """``run --learner-calibration shipped`` gives the agent's envs v2's learners, so a
    v2-trained agent acts as in training (no warning); without it the run warns, on
    stderr, how to judge it with its learners."""
    pytest.importorskip("stable_baselines3")
    argv = ["run", "--agent", "reference-ppo-v2", "--in-process-agents", "--seeds", "2"]
    assert main([*argv, "--learner-calibration", "shipped"]) == 0
    with_v2 = capsys.readouterr()
    assert "trained with" not in with_v2.err
    assert main(argv) == 0
    default = capsys.readouterr()
    assert "reference-ppo-v2 was trained with learner calibration sha256" in default.err
    assert "--learner-calibration shipped" in default.err
    assert default.out != with_v2.out  # the learner observations moved its merges


def test_cli_run_marks_the_oracle_non_deployable(capsys):
    assert main(["run", "--agent", "offline-oracle", "--regime", "bursty", "--seeds", "2"]) == 0
    assert "agent offline-oracle (non-deployable) on bursty" in capsys.readouterr().out


def test_cli_run_prints_per_seed_table(capsys):
    assert main(["run", "--agent", "wa-diloco", "--regime", "bursty", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "sync-excess %" in out and "total" in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 "))]) == 2


def test_cli_run_unknown_names(capsys):
    with pytest.raises(SystemExit, match="valid agents"):
        main(["run", "--agent", "nope", "--regime", "bursty", "--seeds", "1"])
    with pytest.raises(SystemExit, match="valid regimes: ordinary"):
        main(["run", "--agent", "fixed-256", "--regime", "burst", "--seeds", "1"])


def test_cli_run_on_a_trace_file(tmp_path, capsys):
    from diloco_gym.sim.loaders import save_native

    tr = diloco_gym.get_regime("bursty")(np.random.default_rng(0))
    path = tmp_path / "t.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    assert (
        main(
            [
                "run",
                "--agent",
                "fixed-512",
                "--trace",
                str(path),
                "--format",
                "native",
                "--seeds",
                "2",
            ]
        )
        == 0
    )
    assert "fixed-512 on t" in capsys.readouterr().out


def test_run_on_a_rounds_fleet_takes_the_own_rule(fails, capsys):
    root = Path(diloco_gym.__file__).resolve().parents[1]
    rounds = str(root / "docs" / "examples" / "fleet-rounds.toml")
    argv = ["run", "--fleet", rounds, "--agent", "pressure-gate+own", "--seeds", "2"]
    assert main([*argv, "--in-process-agents"]) == 0
    out = capsys.readouterr().out
    assert "agent pressure-gate+own on fleet" in out and "\n    1 " in out
    instant = str(root / "docs" / "examples" / "fleet.toml")
    line = fails(["run", "--fleet", instant, "--agent", "pressure-gate+own"], 2)
    assert "the '+own' site rule needs a fleet with timing = 'rounds'" in line
