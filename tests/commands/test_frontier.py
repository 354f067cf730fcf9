"""The ``frontier`` command (:mod:`diloco_gym.commands.frontier`): its option checks fail with
one line and their exit status before any episode runs; the agent lists and a fleet's budgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco_gym.cli import build_parser
from diloco_gym.commands import frontier

FLEET_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"


@pytest.fixture
def out(tmp_path):
    """The output directory of a refused frontier: it must not exist afterwards."""
    path = tmp_path / "f"
    yield ["--out", str(path)]
    assert not path.exists()


def _args(argv: list[str]):
    return build_parser("frontier").parse_args(["frontier", *argv])


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--seeds", "1"], "argument --seeds: must be >= 2, got 1"),
        (["--draws", "0"], "argument --draws: must be >= 1, got 0"),
        (["--budgets", "many"], "argument --budgets: invalid float value: 'many'"),
    ],
)
def test_bad_option_values_are_argparse_usage_errors(extra, wanted, out, fails):
    line = fails(["frontier", *out, *extra], 2)
    assert line.startswith("diloco-gym frontier: error: ") and wanted in line


def test_single_host_checks(out, fails):
    assert "unknown regime 'nope'" in fails(["frontier", *out, "--regimes", "nope"], 2)
    assert "unknown agent 'nope'" in fails(["frontier", *out, "--budget-agents", "nope"], 2)
    assert "unknown agent 'nope'" in fails(["frontier", *out, "--free-agents", "nope"], 2)
    assert fails(["frontier", *out, "--stride-s", "10"], 2) == (
        "diloco-gym: frontier replays disjoint windows only (independent units): drop "
        "--stride-s or set it to --window-s"
    )
    assert "--ray-address needs --backend ray" in fails(["frontier", *out, "--ray-address", "x"], 2)
    assert fails(["frontier", *out, "--budgets", "-5"], 2) == (
        "diloco-gym: budgets must be positive numbers of merges per hour, got -5.0"
    )


def test_agent_lists():
    """``--agent`` joins both lists (once), a budget-aware one the budget grid only."""
    from diloco_gym.agents.registry import HEURISTICS
    from diloco_gym.eval.frontier import DEFAULT_BUDGET_AGENTS

    budget, free = frontier._frontier_agents(_args([]))
    assert budget == list(DEFAULT_BUDGET_AGENTS) and free == list(HEURISTICS)
    argv = ["--budget-agents", "fixed-budget", "--free-agents", "fixed-512"]
    budget, free = frontier._frontier_agents(
        _args([*argv, "--agent", "pressure-gate", "--agent", "online-forecast-budget"])
    )
    assert budget == ["fixed-budget", "pressure-gate", "online-forecast-budget"]
    assert free == ["fixed-512", "pressure-gate"]
    budget, free = frontier._frontier_agents(_args([*argv, "--agent", "fixed-512"]))
    assert free == ["fixed-512"]


@pytest.mark.slow
def test_fleet_default_budgets_lie_in_the_fleets_range():
    """Without --budgets a fleet frontier spreads five budgets over the fleet episode's own
    feasible range (the single-host grid does not fit a fleet's episode)."""
    args = _args(["--fleet", str(FLEET_EXAMPLE)])
    assert args.budgets is None
    assert frontier.fleet_budgets(args) == [48, 65, 81, 97, 114]  # linspace(32, 130, 7)[1:-1]
    explicit = _args(["--fleet", str(FLEET_EXAMPLE), "--budgets", "300", "600"])
    assert frontier.fleet_budgets(explicit) == [50, 100]


def test_fleet_mode_checks(tmp_path, out, fails):
    base = ["frontier", *out, "--fleet", str(FLEET_EXAMPLE)]
    assert "--fleet replaces --regimes" in fails([*base, "--regimes", "bursty"], 2)
    assert "--learner-calibration is not used with --fleet" in fails(
        [*base, "--learner-calibration", "x.json"], 2
    )
    assert "need a merge budget" in fails([*base, "--free-agents", "fixed-budget"], 2)
    assert "unknown agent 'nope'" in fails([*base, "--free-agents", "nope"], 2)
    assert "--window-s not used with --fleet" in fails([*base, "--window-s", "300"], 2)
    assert "unknown agent 'nope'" in fails([*base, "--budget-agents", "nope"], 2)
    line = fails([*base, "--budgets", "1", "300"], 2)  # the default grid is too low
    assert "--budgets 1/h (0 syncs) outside" in line and "32..130 syncs per episode" in line
    assert "300/h" not in line
    missing = ["frontier", *out, "--fleet", str(tmp_path / "no.toml")]
    assert "fleet configuration file not found" in fails(missing, 1)
    prec = tmp_path / "prec.toml"
    prec.write_text('[fleet]\nbits_options = [4, 32]\n[[site]]\nname = "bursty"\n')
    line = fails(["frontier", *out, "--fleet", str(prec)], 1)
    assert "frontier --fleet scores fixed-precision fleets only" in line


ROUNDS_EXAMPLE = FLEET_EXAMPLE.with_name("fleet-rounds.toml")


def test_a_rounds_fleets_budgets_count_rounds_in_its_range(out, fails):
    """A per-site timing fleet's budgets come from its rounds env (the one-instant env
    refuses it): its corridor [32, 64] over 518 decisions holds 8..16 rounds, which the
    rounds env keeps exactly at both ends (tests/eval/test_fleet_frontier.py)."""
    args = _args(["--fleet", str(ROUNDS_EXAMPLE)])
    assert frontier.fleet_budgets(args) == [9, 11, 12, 13, 15]  # linspace(8, 16, 7)[1:-1]
    explicit = _args(["--fleet", str(ROUNDS_EXAMPLE), "--budgets", "48", "90"])
    assert frontier.fleet_budgets(explicit) == [8, 15]
    line = fails(["frontier", *out, "--fleet", str(ROUNDS_EXAMPLE), "--budgets", "42"], 2)
    assert "--budgets 42/h (7 syncs) outside" in line and "8..16 syncs per episode" in line


def test_a_rounds_fleet_frontier_runs_the_own_rule_and_records_its_timing(tmp_path, fails, capsys):
    """``frontier --fleet`` on a rounds fleet: a budget-aware ``X+own`` agent at every
    budget, exactly that many rounds; frontier.json says the timing; ``+own`` on a
    one-instant fleet is a one-line error."""
    import json

    from diloco_gym.cli import main

    done = tmp_path / "done"
    argv = ["frontier", "--out", str(done), "--fleet", str(ROUNDS_EXAMPLE), "--budgets", "54"]
    argv += ["72", "--budget-agents", "fixed-budget+own", "--seeds", "2", "--draws", "10"]
    assert main([*argv, "--no-progress", "--in-process-agents"]) == 0
    assert "| oracle (upper bound) pp |" in capsys.readouterr().out
    saved = json.loads((done / "frontier.json").read_text())
    assert saved["fleet"]["timing"] == "rounds" and saved["config"]["budgets"] == [9, 12]
    assert [r["agent"] for r in saved["frontier"]] == ["fixed-budget+own"] * 2
    assert [r["syncs_per_hour"] for r in saved["frontier"]] == [54.0, 72.0]
    line = fails(["frontier", "--out", str(tmp_path / "x"), "--fleet", str(FLEET_EXAMPLE),
                  "--budgets", "300", "--budget-agents", "fixed-budget+own"], 1)  # fmt: skip
    assert "the '+own' site rule needs a fleet with timing = 'rounds'" in line
