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
    assert "--free-agents and --learner-calibration are not used with --fleet" in fails(
        [*base, "--free-agents", "pressure-gate"], 2
    )
    assert "--backend not used with --fleet" in fails([*base, "--backend", "processes"], 2)
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
