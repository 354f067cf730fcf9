"""diloco_gym/eval/cells.py: the report's cells. cell_config makes every path absolute (and
keeps registry names), regime_plan builds a regime's units (an env override rebuilt once and
shared), the per-process cache builds once per key, is bounded, and release_cached closes
what it holds; a unit cell's rows depend only on the cell (the same rows on a second run,
after the cache is emptied)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.eval import cells
from diloco_gym.eval.cells import ReportCell, cell_config, regime_plan, run_report_cell
from diloco_gym.eval.report import ReportConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def empty_cache():
    cells.release_cached()
    yield
    cells.release_cached()


def test_a_cell_is_frozen_and_has_no_env_override_by_default():
    cell = ReportCell(ReportConfig(), "bursty", None)
    assert cell.env == () and cell.unit is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.unit = 1  # type: ignore[misc]


def test_cell_config_makes_paths_absolute_and_keeps_registry_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ReportConfig(
        trace="data/t.csv",
        calibration="cal.json",
        agents=["fixed-512", "runs/ppo", "wa-diloco"],
    )
    out = cell_config(config)
    assert out.trace == str(tmp_path / "data" / "t.csv")
    assert out.calibration == str(tmp_path / "cal.json")
    assert out.agents == ["fixed-512", str(tmp_path / "runs" / "ppo"), "wa-diloco"]
    assert config.trace == "data/t.csv" and config.agents[1] == "runs/ppo"  # a new config
    assert dataclasses.replace(out, trace=None, calibration=None) == dataclasses.replace(
        config,
        trace=None,
        calibration=None,
        agents=out.agents,
    )  # nothing else changes


@dataclasses.dataclass
class _WithLearnerCalibration:
    trace: str | None
    calibration: str | None
    agents: list
    learner_calibration: str | None


def test_cell_config_makes_the_learner_calibration_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cell_config(_WithLearnerCalibration(None, None, ["fixed-512"], "lc.json"))
    assert out.learner_calibration == str(tmp_path / "lc.json") and out.trace is None


def test_cell_config_leaves_unset_paths_unset():
    out = cell_config(ReportConfig(agents=["fixed-512"]))
    assert out.trace is None and out.calibration is None and out.learner_calibration is None


def test_quality_columns_need_a_learner_calibration():
    assert cells.quality_columns(None, {"merge_times_s": [1.0]}) == {}


# --------------------------------------------------------------------------- regime_plan
def test_regime_plan_of_a_synthetic_regime():
    config = ReportConfig(regimes=["sync-heavy"], seeds=3, seed0=4, agents=["fixed-512"])
    units, load, measured, fitted = regime_plan(config, "sync-heavy")
    assert [u.seed for u in units] == [4, 5, 6] and measured == "sync-heavy"
    assert load["rate_scale"] == pytest.approx(1.0)


def test_regime_plan_env_override_is_rebuilt_once_and_shared():
    config = ReportConfig(regimes=["bursty"], seeds=3, agents=["fixed-512"])
    plain, *_ = regime_plan(config, "bursty")
    units, *_ = regime_plan(config, "bursty", env={"merge_budget": 6})
    assert len({id(u.env) for u in units}) == 1
    assert units[0].env.params.merge_budget == 6 and plain[0].env.params.merge_budget is None
    assert units[0].env.generator is not None and units[0].env is not plain[0].env


def test_regime_plan_of_a_trace_uses_its_sidecar_regime():
    config = ReportConfig(trace=str(ROOT / "traces" / "bursty.csv"), window_s=300.0)
    units, load, measured, _ = regime_plan(config, "replay:bursty")
    assert measured == config.trace_sidecar and len(units) == load["windows"] == 2


# --------------------------------------------------------------------------- cache
def test_cache_builds_once_per_key():
    config = ReportConfig(agents=["fixed-512"])
    built = []

    def build():
        built.append(1)
        return len(built)

    assert cells.cached("x", config, "bursty", build) == 1
    assert cells.cached("x", config, "bursty", build) == 1  # cached
    assert cells.cached("x", config, "ordinary", build) == 2  # another regime
    assert cells.cached("x", config, "bursty", build, (("merge_budget", 4),)) == 3
    other = dataclasses.replace(config, seeds=3)
    assert cells.cached("x", other, "bursty", build) == 4  # another configuration
    assert len(built) == 4


def test_cache_is_bounded_and_evicts_the_oldest():
    config = ReportConfig(agents=["fixed-512"])
    for i in range(cells._CACHE_MAX + 2):
        cells.cached("k", config, str(i), lambda i=i: i)
    assert len(cells._CACHE) == cells._CACHE_MAX
    rebuilt = []
    cells.cached("k", config, "0", lambda: rebuilt.append(0))  # evicted: built again
    assert rebuilt == [0]


def test_release_cached_closes_the_sealed_agents_it_holds(monkeypatch):
    from diloco_gym.eval import sealed

    closed = []

    class FakeSealed:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    monkeypatch.setattr(sealed, "SealedAgent", FakeSealed)
    config = ReportConfig(agents=["fixed-512"])
    cells.cached("agents", config, None, lambda: [FakeSealed("a"), "plain", (FakeSealed("b"),)])
    cells.cached("units", config, "bursty", lambda: FakeSealed("c"))
    cells.release_cached()
    assert sorted(closed) == ["a", "b", "c"] and cells._CACHE == {}


# --------------------------------------------------------------------------- run_report_cell
SMALL = {"seeds": 2, "draws": 10, "agents": ["fixed-512", "wa-diloco"], "in_process_agents": True}


def _rows_json(result) -> str:
    return json.dumps(result["rows"], sort_keys=True, default=str)


def test_a_unit_cell_depends_only_on_the_cell():
    config = cell_config(ReportConfig(regimes=["sync-heavy"], **SMALL))
    cell = ReportCell(config, "sync-heavy", 1)
    first = run_report_cell(cell)
    cells.release_cached()  # a fresh worker: everything rebuilt
    again = run_report_cell(cell)
    assert _rows_json(first) == _rows_json(again)
    assert [r["agent"] for r in first["rows"]] == ["fixed-512", "wa-diloco"]
    assert {r["seed"] for r in first["rows"]} == {1} and first["timeline"] is None
    for r in first["rows"]:
        assert r["regime"] == "sync-heavy" and r["unit"] == "seed" and r["verdict_unit"]
        assert r["merges_per_hour"] == pytest.approx(r["merges"] * 3600.0 / r["duration_s"])
        assert np.isfinite(r["sync_excess_pct"])


def test_the_first_bursty_unit_carries_the_timeline():
    config = cell_config(ReportConfig(regimes=["bursty"], **SMALL))
    res = run_report_cell(ReportCell(config, "bursty", 0))
    timeline = res["timeline"]
    assert timeline["seed"] == 0 and list(timeline["schedules"]) == ["fixed-512", "wa-diloco"]
    for row in res["rows"]:
        schedule = np.asarray(timeline["schedules"][row["agent"]])  # decision indices
        assert schedule.size == row["merges"] and np.all(np.diff(schedule) > 0)
    assert run_report_cell(ReportCell(config, "bursty", 1))["timeline"] is None


def test_a_calibration_cell_gives_the_simulated_effect_sizes():
    config = cell_config(ReportConfig(regimes=["sync-heavy"], **SMALL))
    res = run_report_cell(ReportCell(config, "sync-heavy", None))
    assert set(res) == {"sim", "trace_sim", "u_cal"}
    assert all(np.isnan(v) for v in res["trace_sim"].values())  # no trace: nothing replayed
    assert set(res["sim"]) >= set(res["trace_sim"])  # every calibration metric simulated
    assert all(np.isfinite(v) for v in res["sim"].values())


def test_agents_with_equal_merges_share_one_matched_control(monkeypatch):
    """A unit's agents with the same number of merges share one matched-random control
    (drawn and scored once), and the rows are those of each agent drawing its own."""
    from diloco_gym.eval import protocol

    agents = ["fixed-512", "wa-diloco", "calibrated-wa"]  # 8, 9 and 8 merges in this unit
    config = cell_config(ReportConfig(regimes=["sync-heavy"], **{**SMALL, "agents": agents}))
    cell = ReportCell(config, "sync-heavy", 1)
    calls: list[int] = []
    real_control, real_score = protocol.matched_control, protocol.score_episode

    def counted(scorer, merges, *args, **kwargs):
        calls.append(merges)
        return real_control(scorer, merges, *args, **kwargs)

    monkeypatch.setattr(protocol, "matched_control", counted)
    shared = run_report_cell(cell)
    merges = [r["merges"] for r in shared["rows"]]
    assert len(set(merges)) < len(merges)  # the case at hand
    assert sorted(calls) == sorted(set(merges))
    monkeypatch.setattr(
        protocol, "score_episode", lambda *a, control=None, **k: real_score(*a, **k)
    )
    cells.release_cached()
    own = run_report_cell(cell)
    assert _rows_json(shared) == _rows_json(own)


@pytest.mark.slow
def test_units_run_together_give_each_units_own_results_in_fewer_messages(monkeypatch):
    """The serial backend runs a synthetic regime's units in groups (one message per
    decision time for the whole group): every row equals the one-unit-at-a-time run's, and
    the sealed agents are asked in several times fewer messages."""
    import pandas as pd

    from diloco_gym.eval import sealed
    from diloco_gym.eval.report import ReportConfig, run_protocol

    posts = {"n": 0}
    original = sealed.Exchange.post

    def counted(self, requests, tags):
        posts["n"] += 1
        return original(self, requests, tags)

    monkeypatch.setattr(sealed.Exchange, "post", counted)
    agents = ["fixed-512", "random-deferral", "online-forecast", "wa-diloco", "offline-oracle"]
    config = ReportConfig(regimes=["bursty", "sync-heavy"], agents=agents, seeds=12, draws=50)
    together = run_protocol(config, progress=False)["rows"]
    grouped, posts["n"] = posts["n"], 0
    monkeypatch.setattr(cells, "UNIT_BATCH", 1)
    alone = run_protocol(config, progress=False)["rows"]
    pd.testing.assert_frame_equal(together, alone)
    assert grouped * 4 < posts["n"], (grouped, posts["n"])
