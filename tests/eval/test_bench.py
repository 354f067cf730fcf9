"""The benchmark suite's task list (:mod:`diloco_gym.eval.bench`): fixed and pinned to its
version name, seeds disjoint from training and validation, inputs checked by hash, and the
replay of a tiny task equal to the frontier's own numbers."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.eval import bench
from diloco_gym.eval.seed_ranges import TRAIN_SEED_LOW, VALIDATION_SEED0

ROOT = Path(__file__).resolve().parents[2]

#: The pinned task list of diloco-bench-v1: a change to the tasks, seeds, draws or inputs
#: must come with a new version name (and a new pinned hash here).
V1_HASH = "d740fab3e5ad488075689cd2543b8c668fee1b39cee36498bc29254248eb5cfc"


def test_the_task_list_is_pinned_to_its_version_name():
    assert bench.SUITE_NAME == "diloco-bench-v1"
    assert bench.suite_hash() == V1_HASH == bench.SUITE_HASHES[bench.SUITE_NAME]
    names = [t.name for t in bench.suite_tasks()]
    assert len(names) == 23 == len(set(names))
    assert names[:5] == [f"bursty@{b}/h" for b in (48, 60, 72, 96, 144)]
    assert names[-3:] == ["fleet@48/ep", "fleet@64/ep", "fleet@96/ep"]
    record = bench.suite_record()
    assert record["suite"] == "diloco-bench-v1" and record["tasks"] == names


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.setattr(bench, "BUDGETS_PER_HOUR", (48.0, 60.0, 72.0, 96.0)),
        lambda m: m.setattr(bench, "TEST_SEED0", 5001),
        lambda m: m.setitem(bench.SETTINGS[0], "regime", "ordinary"),
        lambda m: m.setitem(
            bench.MODES, "quick", dataclasses.replace(bench.MODES["quick"], draws=99)
        ),
    ],
    ids=["budgets", "seeds", "regime", "draws"],
)
def test_a_changed_task_list_needs_a_new_version_name(monkeypatch, change):
    change(monkeypatch)
    assert bench.suite_hash() != V1_HASH
    with pytest.raises(RuntimeError, match="changed .*give the suite a new version name"):
        bench.suite_record()


def test_the_grid_is_the_frontiers_and_the_seeds_are_test_seeds():
    from diloco_gym.eval.frontier import DEFAULT_BUDGETS_PER_HOUR

    assert bench.BUDGETS_PER_HOUR == DEFAULT_BUDGETS_PER_HOUR
    for mode in bench.MODES.values():
        last = bench.TEST_SEED0 + max(mode.seeds, mode.fleet_seeds, 11) - 1  # 11 windows
        assert 0 <= bench.TEST_SEED0 and last < VALIDATION_SEED0 < TRAIN_SEED_LOW
    # the blocks the docs report (0-99, 2000-2099, 3000-3099) are not reused
    assert bench.TEST_SEED0 >= 3100


def test_select_tasks_by_name_or_setting():
    got = bench.select_tasks(["fleet", "bursty@72/h"])
    assert [t.name for t in got] == ["bursty@72/h", "fleet@48/ep", "fleet@64/ep", "fleet@96/ep"]
    assert bench.select_tasks(None) == bench.suite_tasks()
    with pytest.raises(bench.BenchError, match=r"^unknown task 'bursty@70/h'; valid: a setting"):
        bench.select_tasks(["bursty@70/h"])


def test_modes():
    assert bench.mode_for("quick") is bench.MODES["quick"]
    custom = bench.mode_for("full", seeds=2, draws=10)
    assert (custom.name, custom.seeds, custom.draws, custom.fleet_seeds) == ("custom", 2, 10, 2)
    with pytest.raises(bench.BenchError, match="seeds >= 2"):
        bench.mode_for("full", seeds=1)


def test_inputs_are_checked_by_their_hash(tmp_path, monkeypatch):
    trace = next(s for s in bench.SETTINGS if s["kind"] == "trace")
    assert bench.fleet_file() == ROOT / "docs" / "examples" / "fleet.toml"
    # missing: skipped with the reason
    monkeypatch.delenv("DILOCO_GYM_REAL_TRACES", raising=False)
    monkeypatch.setattr(bench, "_checkout", lambda: tmp_path / "checkout")
    path, why = bench.real_trace_path(trace, str(tmp_path))
    assert path is None and "AzureLLMInferenceTrace_code.csv not found" in why
    # another file under the same name is refused, naming it
    (tmp_path / trace["file"]).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(bench.BenchError, match=r"AzureLLMInferenceTrace_code.csv: SHA-256 .* is "):
        bench.real_trace_path(trace, str(tmp_path))
    # the fleet file: a changed copy is refused
    fake = tmp_path / "checkout" / "docs" / "examples"
    fake.mkdir(parents=True)
    shutil.copyfile(ROOT / "docs" / "examples" / "fleet.toml", fake / "fleet.toml")
    with open(fake / "fleet.toml", "a") as f:
        f.write("# changed\n")
    with pytest.raises(bench.BenchError, match="fleet.toml: SHA-256 .*the fleet task's file was"):
        bench.fleet_file()
    # a run is refused before any episode (the regime task first in the list)
    monkeypatch.setattr(bench, "_single_host", lambda *a: pytest.fail("ran an episode"))
    with pytest.raises(bench.BenchError, match="the fleet task's file was changed"):
        bench.run_tasks(
            [bench.Entrant("w", ("wa-diloco",))],
            bench.select_tasks(["bursty@72/h", "fleet@64/ep"]),
            bench.MODES["quick"],
            progress=False,
        )


def test_which_tasks_an_agent_runs_on():
    both = {"regime", "trace", "fleet"}
    assert bench.entrant_kinds("wa-diloco") == both
    assert bench.entrant_kinds("online-forecast-budget") == both
    # the planner reads one host's observation: it would fail on a fleet's
    assert bench.entrant_kinds("causal-planner") == {"regime", "trace"}
    assert bench.entrant_kinds("reference-budget-bursty") == {"regime", "trace"}
    fleet_model = str(ROOT / "agents" / "reference" / "fleet-budget")
    assert bench.entrant_kinds(fleet_model) == {"fleet"}
    assert bench.entrant_kinds(str(ROOT / "agents" / "reference" / "budget-mixed")) == {
        "regime",
        "trace",
    }


@pytest.mark.slow
def test_a_task_scores_the_frontiers_gap_captured():
    """A task's score is the frontier's gap captured at that budget on the task's seeds, and
    its references are the frontier's matched random, oracle and rate-clairvoyant means."""
    from diloco_gym.eval.frontier import FrontierConfig, run_frontier

    mode = bench.mode_for("quick", seeds=2, draws=10)
    agents = ("online-forecast-budget", "wa-diloco")
    res = bench.run_tasks(
        [bench.Entrant("a", agents)],
        bench.select_tasks(["bursty@72/h"]),
        mode,
        in_process=True,
        progress=False,
    )
    direct = run_frontier(
        FrontierConfig(
            regimes=["bursty"],
            budgets_per_hour=[72.0],
            budget_agents=list(agents),
            free_agents=["fixed-512"],
            seeds=2,
            seed0=bench.TEST_SEED0,
            draws=10,
            in_process_agents=True,
        ),
        progress=False,
    )["budgets"]
    for agent in agents:
        row = direct[direct["agent"] == agent].iloc[0]
        got = res["scores"]["bursty@72/h"][agent]
        assert got["gap_captured"] == row["gap_captured"]
        assert got["sync_excess_pct"] == row["sync_excess_pct"]
    ref = res["references"]["bursty@72/h"]
    assert ref["matched_random_pct"] == direct["matched_random_pct"].iloc[0]
    assert ref["oracle_pct"] == direct["oracle_pct"].iloc[0]
    span = ref["matched_random_pct"] - ref["oracle_pct"]
    reach = (ref["matched_random_pct"] - direct["rate_clairvoyant_pct"].iloc[0]) / span
    assert ref["reachable"] == pytest.approx(reach) and 0 < reach < 1
    assert ref["units"] == 2 and res["not_run"] == {} and res["skipped"] == {}
    assert np.isfinite(res["elapsed_s"])


@pytest.mark.slow
def test_a_fleet_task_scores_the_fleet_frontiers_gap_and_its_interval():
    """A fleet task's score is the fleet frontier's gap captured at that budget with its
    bootstrap interval (no longer left empty)."""
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig
    from diloco_gym.eval.frontier import run_frontier

    mode = bench.mode_for("quick", seeds=3, draws=10)
    agent = "online-forecast-budget"
    res = bench.run_tasks(
        [bench.Entrant("a", (agent,))],
        bench.select_tasks(["fleet@64/ep"]),
        mode,
        in_process=True,
        progress=False,
    )
    report = FleetReportConfig(
        fleet=str(bench.fleet_file()),
        agents=[agent],
        seeds=mode.fleet_seeds,
        seed0=bench.TEST_SEED0,
        draws=mode.fleet_draws,
        in_process_agents=True,
    )
    table = run_frontier(FleetFrontierConfig(report=report, budgets=[64]), False)["frontier"]
    row = table[(table["budget"] == 64) & (table["agent"] == agent)].iloc[0]
    got = res["scores"]["fleet@64/ep"][agent]
    assert got["gap_captured"] == row["gap_captured"]
    lo, hi = got["gap_ci"]
    assert (lo, hi) == (row["gap_ci_low"], row["gap_ci_high"])
    assert lo is not None and hi is not None and lo <= got["gap_captured"] <= hi


def test_an_entrant_that_runs_on_no_selected_task_is_refused():
    fleet_model = str(ROOT / "agents" / "reference" / "fleet-budget")
    with pytest.raises(bench.BenchError, match="entrant fb: runs on none of the selected tasks"):
        bench.run_tasks(
            [bench.Entrant("fb", (fleet_model,))],
            bench.select_tasks(["bursty@72/h"]),
            bench.MODES["quick"],
            progress=False,
        )
