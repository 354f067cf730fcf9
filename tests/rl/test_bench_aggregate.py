"""The benchmark's results (:mod:`diloco_gym.rl.bench`): the aggregate is rl/aggregate's on a
hand case, matched random scores 0 and the oracle 1, the output files follow their schema,
and a submission is validated by replay: an honest one passes, a tampered score or a bad
file fails with one line naming the file and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.eval.bench import (
    BenchError,
    BenchTask,
    Entrant,
    mode_for,
    suite_hash,
    suite_tasks,
)
from diloco_gym.rl import bench as rb
from diloco_gym.rl.aggregate import iqm, probability_of_improvement, stratified_bootstrap_ci

ROOT = Path(__file__).resolve().parents[2]


def _tasks(names):
    return [BenchTask(n, n.split("@")[0], "regime", float(n.split("@")[1][:-2])) for n in names]


def test_aggregate_equals_rl_aggregate_on_a_hand_case():
    tasks = _tasks(["bursty@48/h", "bursty@72/h", "sync-heavy@72/h", "non-periodic@96/h"])
    x = {
        "bursty@48/h": [0.1, 0.3, 0.2],
        "bursty@72/h": [0.6, 0.7, 0.5],
        "sync-heavy@72/h": [0.0, -0.1, 0.05],
        "non-periodic@96/h": [0.9, 0.8, 1.0],
    }
    base = {t: [v] for t, v in zip(x, [0.25, 0.55, 0.0, 0.85], strict=True)}
    got = rb.aggregate({"x": x, "base": base}, tasks, "base", reps=500, seed=7)
    mx = np.array([x[t.name] for t in tasks]).T  # 3 runs x 4 tasks
    mb = np.array([base[t.name] for t in tasks]).T
    # by hand: 12 scores, a quarter (3) cut at each end -> the mean of the middle six
    middle = sorted(mx.ravel())[3:9]
    assert got["x"]["iqm"] == pytest.approx(np.mean(middle)) == pytest.approx(iqm(mx))
    # P(x > base): task 1: 0.3 > 0.25 (1 of 3); task 2: 0.6, 0.7 (2 of 3); task 3: 0.05
    # (1 of 3) and 0.0 ties (a half); task 4: 0.9, 1.0 (2 of 3)
    hand = np.mean([1 / 3, 2 / 3, 1.5 / 3, 2 / 3])
    assert got["x"]["probability_of_improvement"] == pytest.approx(hand)
    assert hand == pytest.approx(probability_of_improvement(mx, mb))
    # the intervals are rl/aggregate's, with the same generator in the same order
    rng = np.random.default_rng(7)
    ci = stratified_bootstrap_ci(iqm, mx, reps=500, rng=rng)
    poi = stratified_bootstrap_ci(probability_of_improvement, mx, mb, reps=500, rng=rng)
    assert got["x"]["iqm_ci"] == [ci[1], ci[2]] and ci[1] < ci[0] < ci[2]
    assert got["x"]["probability_of_improvement_ci"] == [poi[1], poi[2]]
    assert got["x"]["runs"] == 3 and got["x"]["tasks"] == 4
    assert got["x"]["by_setting"]["bursty"] == pytest.approx(iqm(mx[:, :2]))
    # the baseline: one run, a point interval, no probability against itself
    assert got["base"]["iqm_ci"] == [got["base"]["iqm"]] * 2
    assert got["base"]["probability_of_improvement"] is None


def test_aggregate_leaves_out_a_task_without_a_score_for_every_run():
    tasks = _tasks(["bursty@48/h", "bursty@72/h"])
    got = rb.aggregate(
        {"x": {"bursty@48/h": [0.2, None], "bursty@72/h": [0.4, 0.6]}}, tasks, "x", reps=50
    )
    assert got["x"]["tasks"] == 1 and got["x"]["iqm"] == pytest.approx(0.5)
    with pytest.raises(BenchError, match="baseline 'y' is not an entrant; entrants: x"):
        rb.aggregate({"x": {}}, tasks, "y")


def test_the_gap_of_matched_random_is_0_and_of_the_oracle_1():
    for random, oracle in [(13.4, 3.78), (0.937, 0.0), (25.8, 9.63), (1e-3, 0.0)]:
        assert rb.gap(random, random, oracle) == 0.0
        assert rb.gap(oracle, random, oracle) == 1.0
    assert rb.gap(1.0, 2.0, 2.0) is None  # the oracle no better: undefined


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny bench run (two entrants, one a group of two runs; two tasks) and its files."""
    doc = rb.run_bench(
        [
            Entrant("ofb", ("online-forecast-budget",), "the budget-aware forecaster"),
            Entrant("pair", ("wa-diloco", "pressure-gate")),
        ],
        tasks=["bursty@72/h", "sync-heavy@96/h"],
        mode=mode_for("quick", seeds=2, draws=10),
        in_process=True,
        progress=False,
    )
    out = tmp_path_factory.mktemp("bench") / "out"
    rb.write_bench(doc, out, command="test")
    return doc, out


@pytest.mark.slow
def test_a_tiny_run_writes_its_files_with_the_references(tiny):
    doc, out = tiny
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "bench.json",
        "bench.md",
        "bench.png",
        "submission.json",
    ]
    on_disk = json.loads((out / "bench.json").read_text())
    assert on_disk["suite_hash"] == suite_hash() and on_disk["mode"] == "custom"
    by = {e["name"]: e for e in on_disk["entrants"]}
    assert by[rb.RANDOM]["scores"] == {"bursty@72/h": [0.0], "sync-heavy@96/h": [0.0]}
    assert by[rb.ORACLE]["scores"] == {"bursty@72/h": [1.0], "sync-heavy@96/h": [1.0]}
    ref = on_disk["references"]["bursty@72/h"]
    assert by[rb.REACHABLE]["scores"]["bursty@72/h"] == [pytest.approx(ref["reachable"])]
    # an entrant's score is the gap of its sync-excess against the task's references
    for run in by["pair"]["details"]["bursty@72/h"]:
        assert run["gap_captured"] == pytest.approx(
            rb.gap(run["sync_excess_pct"], ref["matched_random_pct"], ref["oracle_pct"])
        )
    assert by["pair"]["aggregate"]["runs"] == 2 and on_disk["baseline"] == "ofb"
    md = (out / "bench.md").read_text()
    assert "## Aggregate" in md and "### bursty@72/h" in md and "reachable (rate-clairvoyant)" in md
    assert on_disk["agent_sandbox"]["level"] == "none" and "(--in-process-agents), not sealed" in md
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_an_honest_submission_validates_and_a_tampered_score_fails(tiny):
    _, out = tiny
    honest = out / "submission.json"
    res = rb.validate_submission(honest, in_process=True, progress=False)
    assert res["checked"] == 6 and res["tasks"] == ["bursty@72/h", "sync-heavy@96/h"]
    sub = json.loads(honest.read_text())
    claimed = sub["entrants"][1]["scores"]["sync-heavy@96/h"][1]
    sub["entrants"][1]["scores"]["sync-heavy@96/h"][1] = claimed + 0.05
    tampered = out.parent / "tampered.json"
    tampered.write_text(json.dumps(sub))
    with pytest.raises(BenchError) as info:
        rb.validate_submission(tampered, in_process=True, progress=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == (
        f"{tampered}: entrant pair, task sync-heavy@96/h, run 1 (pressure-gate): claimed gap "
        f"captured {claimed + 0.05:.4f}, the replay gives {claimed:.4f} (tolerance 0.005)"
    )
    # a subset of the tasks replays only those: the tampered task is not among them
    assert rb.validate_submission(tampered, tasks=["bursty@72/h"], in_process=True)["checked"] == 3


def _sub(**change):
    sub = {
        "suite": "diloco-bench-v1",
        "suite_hash": suite_hash(),
        "mode": "quick",
        "entrants": [{"name": "x", "agents": ["wa-diloco"], "scores": {"bursty@72/h": [0.5]}}],
    }
    sub.update(change)
    return sub


def _entrant(**change):
    e = copy.deepcopy(_sub()["entrants"][0])
    e.update(change)
    return _sub(entrants=[e])


@pytest.mark.parametrize(
    ("doc", "wanted"),
    [
        ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1)"),
        (_sub(suite="diloco-bench-v0"), "field 'suite': 'diloco-bench-v0' is not this package's"),
        (_sub(suite_hash="0" * 64), "field 'suite_hash': 000000000000... is not diloco-bench-v1"),
        (_sub(suite_hash="abc"), "field 'suite_hash'"),
        (_sub(mode="fast"), "field 'mode': \"fast\" is not one of full, quick, custom"),
        (_sub(mode="custom"), "field 'custom': give the seeds and draws exactly when mode"),
        ({"suite": "diloco-bench-v1"}, "field 'suite_hash': required field is missing"),
        (_sub(extra=1), "the file has unknown field 'extra'"),
        (
            _entrant(agents=[]),
            "field 'entrants[0].agents': must have 1 to any number of items, got 0",
        ),
        (
            _entrant(scores={"bursty@70/h": [0.5]}),
            "field 'entrants[0].scores.bursty@70/h': unknown",
        ),
        (_entrant(scores={"bursty@72/h": [0.5, 0.6]}), "2 score(s) for 1 agent(s)"),
        (_entrant(scores={"bursty@72/h": ["0.5"]}), "'entrants[0].scores.bursty@72/h[0]'"),
        (_entrant(agents=["runs/nope-s0"]), "field 'entrants[0].agents[0]': "),
        (_entrant(agents=["mine.py:Agent"]), "mine.py does not exist"),
        (_entrant(agents=["python-object:f-1"]), "an object of one Python process; submit"),
        (_sub(entrants=[_sub()["entrants"][0]] * 2), "field 'entrants[1].name': 'x' is taken"),
    ],
    ids=lambda v: None if isinstance(v, str) else "doc",
)
def test_a_bad_submission_is_one_line_naming_the_file_and_the_field(tmp_path, doc, wanted):
    path = tmp_path / "sub.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(BenchError) as info:
        rb.read_submission(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ") and wanted in msg, msg


def test_a_submission_past_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_sub(padding="x" * 5000)))
    monkeypatch.setenv("DILOCO_GYM_MAX_SETTINGS_BYTES", "1000")
    with pytest.raises(BenchError) as info:
        rb.read_submission(path)
    assert str(info.value).startswith(f"{path}: file size in bytes: 5,")
    assert "DILOCO_GYM_MAX_SETTINGS_BYTES" in str(info.value)
    path.write_bytes(b"\xff\xfe{}")
    monkeypatch.delenv("DILOCO_GYM_MAX_SETTINGS_BYTES")
    with pytest.raises(BenchError, match=r"big.json: not UTF-8 text$"):
        rb.read_submission(path)


def test_a_submission_names_agents_relative_to_its_folder_and_loads_nothing(tmp_path):
    """Paths are taken relative to the submission's folder; reading it checks they exist and
    loads nothing (a model file is never opened here, so never unpickled)."""
    run = tmp_path / "runs" / "mine-s0"
    run.mkdir(parents=True)
    (run / "model.zip").write_bytes(b"not a zip: never opened by read_submission")
    (tmp_path / "mine.py").write_text("raise SystemExit('imported')\n")
    path = tmp_path / "sub.json"
    doc = _entrant(agents=["runs/mine-s0", "mine.py:Agent"], scores={"bursty@72/h": [0.1, 0.2]})
    path.write_text(json.dumps(doc))
    sub = rb.read_submission(path)
    assert sub["entrants"][0]["agents"] == [str(run), f"{tmp_path / 'mine.py'}:Agent"]


def test_baselines_are_every_registered_agent_but_no_sync(monkeypatch):
    from diloco_gym.agents import registry
    from diloco_gym.agents.registry import BUDGETED, HEURISTICS, LEARNED

    names = [e.name for e in rb.baseline_entrants()]
    assert names[: len(BUDGETED)] == list(BUDGETED) and set(HEURISTICS) <= set(names)
    assert "no-sync" not in names and len(names) == len(set(names))
    # an agent added to the registry joins by name
    monkeypatch.setitem(registry.AGENTS, "my-planner", registry.AGENTS["wa-diloco"])
    assert "my-planner" in [e.name for e in rb.baseline_entrants()]
    pytest.importorskip("sb3_contrib")
    assert set(LEARNED) <= set(names)


@pytest.mark.slow
def test_the_validate_commands_of_docs_benchmark_md_run(tiny, tmp_path, monkeypatch, capsys):
    """The ``--validate`` block of docs/benchmark.md, run on the tiny run's submission (the
    agents sealed, as the command runs them)."""
    import re

    from diloco_gym.cli import main

    page = (ROOT / "docs" / "benchmark.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", page, flags=re.S | re.M)
    block = next(b for b in blocks if "--validate" in b)
    _, out = tiny
    (tmp_path / "submission.json").write_text((out / "submission.json").read_text())
    monkeypatch.chdir(tmp_path)
    commands = [ln for ln in block.splitlines() if ln.strip()]
    assert len(commands) == 2
    for command in commands:
        argv = command.split()
        assert argv[:2] == ["diloco-gym", "bench"]
        assert main([*argv[1:], "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "valid: 6 claimed score(s) on 2 task(s)" in printed
    assert "valid: 3 claimed score(s) on 1 task(s) match the replay within 0.01" in printed


def test_the_baseline_table_of_docs_benchmark_md_is_the_committed_result():
    """docs/benchmark.md's aggregate table is bench.md's, rendered from the committed
    docs/bench_baselines.json (a full run of ``diloco-gym bench --baselines``), and that
    file is a valid result of this suite."""
    doc = json.loads((ROOT / "docs" / "bench_baselines.json").read_text())
    rb._check_result(doc, "docs/bench_baselines.json")
    assert doc["suite_hash"] == suite_hash() and doc["mode"] == "full" and not doc["skipped"]
    table = rb.render_markdown(doc).split("## Aggregate")[1].split("## Tasks")[0].strip()
    assert table in (ROOT / "docs" / "benchmark.md").read_text()
    by = {e["name"]: e for e in doc["entrants"]}
    assert set(by[rb.RANDOM]["scores"]) == {t.name for t in suite_tasks()}
    assert all(v == [0.0] for v in by[rb.RANDOM]["scores"].values())
    assert all(v == [1.0] for v in by[rb.ORACLE]["scores"].values())
