"""The learner calibration (``diloco_gym/lm/calibrate.py``): the designed schedules and
their gap helpers, the env's corridor in inner steps, the resume log, the design's runs
(with a stand-in trainer), and end to end at the tiny configuration: the file it writes
passes its schema, the env loads it, and a resumed calibration reuses the logged runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.lm.calibrate import (
    TINY,
    _corridor,
    _from_gaps,
    _logged_runs,
    _random_gaps,
    _run_design,
    agent_gaps,
    calibrate_learners,
    check_disjoint,
    covering_steps,
    design,
    episode_inner_steps,
    gap_sequence,
    mapping_plan,
)
from diloco_gym.sim.learner_calibration import load_learner_calibration


def test_random_gaps_stay_in_the_corridor_and_sum_to_the_total():
    rng = np.random.default_rng(0)
    for n, total in ((3, 12), (5, 40), (4, 64)):
        gaps = _random_gaps(rng, n, total, 4, 16)
        assert len(gaps) == n and sum(gaps) == total
        assert min(gaps) >= 4 and max(gaps) <= 16
    a = _random_gaps(np.random.default_rng(1), 6, 50, 4, 16)
    assert a == _random_gaps(np.random.default_rng(1), 6, 50, 4, 16)  # the rng decides
    with pytest.raises(ValueError, match=r"3 gaps in \[4, 16\] cannot sum to 60"):
        _random_gaps(rng, 3, 60, 4, 16)
    with pytest.raises(ValueError, match="cannot sum to 10"):
        _random_gaps(rng, 3, 10, 4, 16)


def test_from_gaps_accumulates_and_stops_at_the_total():
    assert _from_gaps([4, 4, 8], 16) == [4, 8, 16]
    assert _from_gaps([5, 9, 16, 4], 20) == [5, 14]  # 30 would pass the total
    assert _from_gaps([], 16) == []
    assert _from_gaps([20], 16) == []


def test_design_is_in_the_corridor_and_splits_fit_from_heldout():
    plan = design(160, 4, 16, agent_schedules={"a": [5, 9, 16, 4]})
    names = [p["name"] for p in plan]
    assert len(set(names)) == len(names)
    assert {p["role"] for p in plan} == {"fit", "heldout"}
    for p in plan:
        gaps = np.diff([0, *p["schedule"]])
        assert p["schedule"][-1] <= 160
        if p["name"].startswith("random"):
            assert gaps.min() >= 4 and gaps.max() <= 16 and p["schedule"][-1] == 160
    assert any(p["fragments"] > 1 for p in plan if p["role"] == "fit")
    assert {p["bits"] for p in plan if p["role"] == "fit"} == {32, 16, 8, 4}
    fixed_fit = {p["name"] for p in plan if p["role"] == "fit" and p["bits"] == 32}
    # the corridor's ends, its middle, and half the short end and twice the long one
    assert {"fixed-2", "fixed-4", "fixed-8", "fixed-16", "fixed-32"} <= fixed_fit
    assert design(160, 4, 16) == design(160, 4, 16)  # deterministic


@pytest.mark.parametrize("total", [16, 48, 64, 160, 320])
def test_no_heldout_schedule_has_the_gaps_of_a_fitted_one(total):
    plan = design(total, 4, 16, agent_schedules={"a": [5, 9, 16, 4], "b": [16] * 20})
    fitted = {gap_sequence(p["schedule"]) for p in plan if p["role"] == "fit"}
    held = [p for p in plan if p["role"] == "heldout"]
    assert held and all(gap_sequence(p["schedule"]) not in fitted for p in held)
    assert "agent-b" not in {p["name"] for p in held}  # fixed-16's gaps: left out


def test_check_disjoint_names_the_clash():
    plan = [
        {"name": "fixed-16", "role": "fit", "schedule": [16, 32, 48, 64]},
        {"name": "random-d", "role": "heldout", "schedule": [16, 32, 48, 64]},
    ]
    with pytest.raises(
        ValueError, match="'random-d' has the gap sequence of the fitted .*fixed-16"
    ):
        check_disjoint(plan)
    check_disjoint(plan[:1] + [{**plan[1], "schedule": [16, 32, 48]}])  # other gaps: fine


def test_mapping_plan_runs_the_corridor_ends_at_their_own_budget():
    plan = mapping_plan(320, 8, 32)
    assert [p["name"] for p in plan] == ["map-fixed-8", "map-fixed-32"]
    assert all(p["role"] == "mapping" and p["total_steps"] == 320 for p in plan)
    assert plan[1]["schedule"] == list(range(32, 321, 32))


def test_the_default_budget_covers_one_episode():
    assert episode_inner_steps(32.0) == pytest.approx(600 / 0.14 / 32)
    assert covering_steps(32.0) == 160  # 134 inner steps, in blocks of 2 H_max = 32
    assert covering_steps(16.0) == 320  # 268, in blocks of 64
    assert covering_steps(64.0) >= episode_inner_steps(64.0)


def test_design_refuses_a_corridor_outside_the_budget():
    for lo, hi, total in ((0, 4, 16), (4, 4, 16), (8, 4, 16), (4, 32, 16)):
        with pytest.raises(ValueError, match="corridor"):
            design(total, lo, hi)


def test_design_names_the_agents_schedules_and_skips_an_empty_one():
    plan = design(48, 4, 16, agent_schedules={"a": [5, 9, 16], "late": [60]})
    agents = {p["name"]: p for p in plan if p["name"].startswith("agent-")}
    assert set(agents) == {"agent-a"}  # a first gap past the budget gives no schedule
    assert agents["agent-a"]["schedule"] == [5, 14, 30]
    assert agents["agent-a"]["role"] == "heldout"
    fixed = {p["name"]: p["schedule"] for p in plan}
    assert fixed["fixed-4"] == list(range(4, 49, 4)) and fixed["fixed-16"] == [16, 32, 48]


def test_corridor_is_the_envs_in_inner_steps():
    lo, hi, mapping = _corridor(32.0)
    assert (lo, hi) == (4, 16)  # 128 and 512 env steps
    assert mapping["env_steps_per_inner_step"] == 32.0 and mapping["step_seconds"] > 0
    lo, hi, _ = _corridor(1000.0)
    assert lo == 1 and hi == 2  # at least one inner step, and hi above lo


@pytest.mark.slow
def test_agent_gaps_are_inner_steps_inside_the_corridor():
    gaps = agent_gaps("wa-diloco", "bursty", 0, 32.0, 4, 16)
    assert gaps and all(isinstance(g, int) and 4 <= g <= 16 for g in gaps)
    assert gaps == agent_gaps("wa-diloco", "bursty", 0, 32.0, 4, 16)


def _record(name, seed, schedule, trainer):
    return {"name": name, "seed": seed, "schedule": schedule, "x": 1, "trainer": trainer}


def test_logged_runs_reuse_only_the_same_trainer_configuration(tmp_path):
    log = tmp_path / "lc.json.runs.jsonl"
    mine, other = {"d_model": 16, "total_steps": 8}, {"d_model": 32, "total_steps": 8}
    longer = {"d_model": 16, "total_steps": 16}  # a mapping check's budget: same trainer
    lines = [
        _record("a", 0, [4, 8], mine),
        _record("b", 0, [8], other),
        _record("a", 1, [4, 8], mine),
        _record("m", 0, [8, 16], longer),
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    said: list[str] = []
    done = _logged_runs(log, mine, True, said.append)
    assert set(done) == {("a", 0, (4, 8), 8), ("a", 1, (4, 8), 8), ("m", 0, (8, 16), 16)}
    assert done[("a", 1, (4, 8), 8)]["x"] == 1
    assert said == [f"resume: 3 runs of this configuration found in {log}"]
    assert log.exists()


def test_logged_runs_without_resume_remove_the_old_log(tmp_path):
    log = tmp_path / "lc.json.runs.jsonl"
    log.write_text(json.dumps(_record("a", 0, [4], {})) + "\n")
    assert _logged_runs(log, {}, False, print) == {}
    assert not log.exists()
    assert _logged_runs(log, {}, True, print) == {}  # no log to resume from


def test_logged_runs_name_a_broken_line(tmp_path):
    log = tmp_path / "lc.json.runs.jsonl"
    log.write_text(json.dumps(_record("a", 0, [4], {})) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        _logged_runs(log, {}, True, print)


def test_run_design_trains_what_is_not_logged_and_logs_it(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from diloco_gym.lm import trainer
    from diloco_gym.lm.trainer import TrainConfig

    calls: list[tuple] = []

    def fake_run(corpus, cfg, schedule, *, fragments, bits, seed):
        calls.append((tuple(schedule), fragments, bits, seed, cfg.total_steps))
        return SimpleNamespace(
            initial_loss=5.0, merge_losses=[4.0, 3.0], final_loss=3.0, seconds=0.123
        )

    monkeypatch.setattr(trainer, "run_diloco", fake_run)
    cfg = TrainConfig(**TINY)
    plan = [
        {"name": "p", "role": "fit", "schedule": [8, 16], "fragments": 1, "bits": 32},
        {"name": "q", "role": "heldout", "schedule": [4, 16], "fragments": 2, "bits": 8},
        {
            "name": "m",
            "role": "mapping",
            "schedule": [16, 32],
            "fragments": 1,
            "bits": 32,
            "total_steps": 32,
        },
    ]
    logged = {**plan[1], "seed": 0, "initial_loss": 9.0, "merge_losses": [1.0], "seconds": 1.0}
    done = {("q", 0, (4, 16), 16): {**logged, "trainer": {"any": 1}}}
    log = tmp_path / "runs.jsonl"
    said: list[str] = []
    runs = _run_design(None, cfg, plan, 2, done, log, said.append, 0.0)
    assert calls == [
        ((8, 16), 1, 32, 0, 16),
        ((16, 32), 1, 32, 0, 32),  # the mapping check's own budget
        ((8, 16), 1, 32, 1, 16),
        ((4, 16), 2, 8, 1, 16),
        ((16, 32), 1, 32, 1, 32),
    ]
    assert [(r["name"], r["seed"]) for r in runs] == [
        ("p", 0),
        ("q", 0),
        ("m", 0),
        ("p", 1),
        ("q", 1),
        ("m", 1),
    ]
    assert runs[1] == logged  # reused as logged, without the trainer configuration
    assert runs[0]["merge_losses"] == [4.0, 3.0] and runs[0]["seconds"] == 0.12
    written = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["name"], r["seed"]) for r in written] == [
        ("p", 0),
        ("m", 0),
        ("p", 1),
        ("q", 1),
        ("m", 1),
    ]
    assert written[0]["trainer"] == asdict(cfg)
    assert written[1]["trainer"] == {**asdict(cfg), "total_steps": 32}
    assert [line.split("]")[0] for line in said] == ["[1/6", "[3/6", "[4/6", "[5/6", "[6/6"]


@pytest.mark.slow
def test_tiny_calibration_writes_a_file_the_env_loads(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "lc.json"
    lines: list[str] = []
    doc = calibrate_learners(
        out=out,
        seeds=3,
        heldout_seeds=1,
        config=TINY,
        bootstrap=10,
        agents=("wa-diloco",),
        max_bytes=200_000,
        progress=lines.append,
        mapping_check=64.0,
    )
    assert json.loads(out.read_text()) == doc
    cal = load_learner_calibration(out)
    assert cal.drift_steps > 0 and set(cal.quant_efficiency) == {16, 8, 4}
    runs = doc["runs"]
    assert {r["role"] for r in runs} == {"fit", "heldout", "mapping"}
    assert {r["seed"] for r in runs} == {0, 1, 2}  # every schedule with every seed
    assert doc["meta"]["fit_seeds"] == [0, 1] and doc["meta"]["heldout_seeds"] == [2]
    assert doc["meta"]["covers_episode"] is False  # 16 inner steps: a tiny test, not a price
    assert any(r["name"] == "agent-wa-diloco" for r in runs)
    assert all(r["merge_losses"][-1] < r["initial_loss"] for r in runs)  # every run learned
    for name, (lo, hi) in doc["intervals"].items():
        assert lo <= hi, name
    v = doc["validation"]
    assert v["schedules"] == len({r["name"] for r in runs if r["role"] == "heldout"})
    assert -1 <= v["spearman_rho"] <= 1 and 0 < v["spearman_p"] <= 1 and v["mae"] >= 0
    assert v["seeds"] == [2] and v["mae_interval"] is None  # one held-out seed: no interval
    assert v["heldout_schedules_fit_seeds"]["mae_interval"] is not None
    e = doc["effects"]
    assert e["contrast"]["name"] == "fixed-16" and e["contrast"]["n"] == 3
    assert e["power"]["verdict"].split(":")[0] in ("detected", "inconclusive")
    assert [m["env_steps_per_inner_step"] for m in e["mapping_check"]] == [32.0, 64.0]
    assert any(line.startswith("[1/") for line in lines)  # progress, run by run
    env = DiLoCoSyncEnv(regime="bursty", learner_calibration=out)
    assert env.learner_params.drift_s == pytest.approx(cal.drift_s)
    # resume: every run is in the log, none is trained again, the fit is the same
    log = tmp_path / "lc.json.runs.jsonl"
    n = len(log.read_text().splitlines())
    assert n == len(runs)
    again = calibrate_learners(
        out=out,
        seeds=3,
        heldout_seeds=1,
        config=TINY,
        bootstrap=10,
        agents=("wa-diloco",),
        max_bytes=200_000,
        resume=True,
        mapping_check=64.0,
        jobs=2,
    )
    assert len(log.read_text().splitlines()) == n
    assert again["params"] == doc["params"]
