"""The ``report`` command (:mod:`diloco_gym.commands.report`): its option checks fail with one
line and their exit status before any episode runs, and write nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco_gym.cli import build_parser
from diloco_gym.commands import report
from diloco_gym.errors import DataError, UsageError

ROOT = Path(__file__).resolve().parents[2]
FLEET_EXAMPLE = ROOT / "docs" / "examples" / "fleet.toml"
QUICK = ["--seeds", "2", "--regimes", "bursty", "--agents", "fixed-512", "--no-progress"]


@pytest.fixture
def out(tmp_path):
    """The report directory of a refused report: it must not exist afterwards."""
    path = tmp_path / "r"
    yield ["--out", str(path)]
    assert not path.exists()


def _args(argv: list[str]):
    return build_parser("report").parse_args(["report", *argv])


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--seeds", "1"], "argument --seeds: must be >= 2, got 1"),
        (["--draws", "0"], "argument --draws: must be >= 1, got 0"),
        (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
        (["--jobs", "0"], "argument --jobs: must be >= 1, got 0"),
    ],
)
def test_bad_option_values_are_argparse_usage_errors(extra, wanted, out, fails):
    line = fails(["report", *out, *extra], 2)
    assert line.startswith("diloco-gym report: error: ") and wanted in line


def test_names_are_checked(out, fails):
    assert "unknown regime 'nope'" in fails(["report", *out, "--regimes", "nope"], 2)
    assert "unknown agent 'nope'" in fails(["report", *out, "--agents", "nope"], 2)
    line = fails(["report", *out, "--agents", "fixed-512", "wa-diloco", "fixed-512"], 2)
    assert "'fixed-512' given more than once; give each agent once" in line
    line = fails(["report", *out, "--agents", "fixed-512", "--agent", "fixed-512"], 2)
    assert "'fixed-512' given more than once" in line


@pytest.mark.parametrize(
    "extra", [["--agents", "online-forecast-budget"], ["--agent", "reference-budget-mixed"]]
)
def test_budget_aware_agents_are_refused(extra, out, fails):
    """report gives no merge budget: a budget-aware agent is a usage error naming the
    frontier."""
    line = fails(["report", *out, *extra], 2)
    assert "runs only with one" in line and "diloco-gym frontier" in line


def test_option_values_the_config_refuses(out, fails):
    assert fails(["report", *out, "--ray-address", "x"], 2) == (
        "diloco-gym: --ray-address needs --backend ray (got --backend serial)"
    )
    assert fails(["report", *out, "--window-s", "-1"], 2) == (
        "diloco-gym: window_s must be a positive number of seconds, got -1.0"
    )


def test_a_window_in_which_no_agent_can_choose_is_refused(out, fails):
    """traces/bursty.csv in 60 s windows: shorter than H_max (71.7 s) plus the margin, so
    no merge is ever required and fixed-512, the oracle and matched random all never merge."""
    trace = str(ROOT / "traces" / "bursty.csv")
    argv = ["report", *out, "--trace", trace, "--format", "native", "--window-s", "60"]
    line = fails(argv, 2)
    assert "no agent has a choice" in line and "at least 92.8 s" in line


def test_bad_calibration_files_are_data_errors(tmp_path, out, fails):
    bad = tmp_path / "cal.json"
    bad.write_text("{not json")
    assert "cal.json: not valid JSON" in fails(
        ["report", *out, "--calibration", str(bad), *QUICK], 1
    )
    assert "cal.json: not valid JSON" in fails(
        ["report", *out, "--learner-calibration", str(bad), *QUICK], 1
    )
    with pytest.raises(DataError, match="cal.json"):
        report._check_calibration(str(bad))


def test_an_output_directory_it_may_not_replace(fails):
    line = fails(["report", "--out", "/", "--force", *QUICK], 2)
    assert "refusing to write the report to /: it is a filesystem root" in line


def test_fleet_mode_checks(tmp_path, out, fails):
    fleet = ["report", *out, "--fleet"]
    line = fails([*fleet, str(FLEET_EXAMPLE), "--regimes", "bursty"], 2)
    assert line == "diloco-gym: --fleet replaces --regimes and --trace (the sites are in FILE)"
    assert "--stride-s not used with --fleet" in fails(
        [*fleet, str(FLEET_EXAMPLE), "--stride-s", "60"], 2
    )
    learners = [*fleet, str(FLEET_EXAMPLE), "--learner-calibration", "shipped"]
    assert "--learner-calibration not used with --fleet" in fails(learners, 2)
    assert "fleet configuration file not found" in fails([*fleet, str(tmp_path / "no.toml")], 1)


def test_the_agents_default_to_every_heuristic_then_each_agent():
    from diloco_gym.agents.registry import HEURISTICS

    assert report._report_agents(_args([])) == list(HEURISTICS)
    got = report._report_agents(_args(["--agents", "fixed-512", "--agent", "wa-diloco"]))
    assert got == ["fixed-512", "wa-diloco"]
    with pytest.raises(UsageError, match="given more than once"):
        report._report_agents(_args(["--agents", "fixed-512", "--agent", "fixed-512"]))


def test_a_fleet_with_a_merge_budget_runs_budget_aware_agents(tmp_path, fails):
    """``report --fleet FILE`` refuses a budget-aware agent, naming the file and the key
    that would let it run, unless FILE's ``[env]`` sets ``merge_budget``: then every
    episode has that budget and the agent runs, as on the frontier's grid."""
    text = FLEET_EXAMPLE.read_text()
    assert "\nh_max_steps = 512\n" in text
    budgeted = tmp_path / "fleet_budget.toml"
    budgeted.write_text(
        text.replace("\nh_max_steps = 512\n", "\nh_max_steps = 512\nmerge_budget = 40\n")
    )
    agents = ["--agents", "online-forecast-budget", "online-forecast"]
    refused = tmp_path / "refused"
    line = fails(["report", "--out", str(refused), "--fleet", str(FLEET_EXAMPLE), *agents], 2)
    assert "online-forecast-budget steers by a merge budget" in line
    assert f"or set merge_budget in the [env] table of {FLEET_EXAMPLE}" in line
    assert not refused.exists()
    assert report._report_agents(_args(["--fleet", str(budgeted), *agents])) == [
        "online-forecast-budget",
        "online-forecast",
    ]
    from diloco_gym.cli import main

    done = tmp_path / "done"
    argv = ["report", "--out", str(done), "--fleet", str(budgeted), *agents]
    assert main([*argv, "--seeds", "2", "--draws", "10", "--no-progress"]) == 0
    import pandas as pd

    rows = pd.read_csv(done / "results.csv")
    assert set(rows["agent"]) == {"online-forecast-budget", "online-forecast"}
    assert (rows["syncs"] == 40).all()


def test_a_rounds_fleet_report_runs_the_own_rule_and_says_its_timing(tmp_path, fails, capsys):
    """``report --fleet`` on a per-site timing fleet: ``X+own`` names run agent X with the
    own-forecast site rule; report.md has the rounds section and report.json the timing;
    ``+own`` on a one-instant fleet and an unknown base agent are one-line errors."""
    from diloco_gym.cli import main

    rounds = ROOT / "docs" / "examples" / "fleet-rounds.toml"
    done = tmp_path / "done"
    argv = ["report", "--out", str(done), "--fleet", str(rounds), "--agents"]
    argv += ["pressure-gate", "pressure-gate+own", "--seeds", "2", "--draws", "10"]
    assert main([*argv, "--no-progress", "--in-process-agents"]) == 0
    capsys.readouterr()
    md = (done / "report.md").read_text()
    assert "## Rounds" in md and "grace window 9 s (8 decisions), quorum 4 of 4" in md
    assert "stragglers: d up to 4.5 s" in md
    import json

    rec = json.loads((done / "report.json").read_text())["fleet"]
    assert rec["timing"] == "rounds" and rec["quorum"] == 4
    line = fails(["report", "--out", str(tmp_path / "x"), "--fleet", str(FLEET_EXAMPLE),
                  "--agents", "pressure-gate+own", "--seeds", "2"], 1)  # fmt: skip
    assert "the '+own' site rule needs a fleet with timing = 'rounds'" in line
    line = fails(["report", "--out", str(tmp_path / "y"), "--fleet", str(rounds),
                  "--agents", "nobody+own"], 2)  # fmt: skip
    assert "unknown agent 'nobody'" in line
