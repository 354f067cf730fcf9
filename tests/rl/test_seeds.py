"""Tests of :mod:`diloco_gym.rl.seeds`: the training-seed study on a tiny configuration,
end to end (train, evaluate, summarize), and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from rl_helpers import TINY_CONFIG, write_config  # noqa: E402

from diloco_gym.rl import seeds  # noqa: E402
from diloco_gym.rl.aggregate import iqm, probability_of_improvement  # noqa: E402


@pytest.mark.slow
def test_a_tiny_study_trains_judges_and_aggregates(tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path, TINY_CONFIG)
    runs = tmp_path / "runs"
    argv = ["train", "--name", "tiny", "--seeds", "0", "1", "--out", str(runs)]
    assert seeds.main([*argv, "--", "--config", str(cfg)]) == 0
    metas = [json.loads((runs / f"tiny-s{s}" / "meta.json").read_text()) for s in (0, 1)]
    assert [m["seed"] for m in metas] == [0, 1]
    assert metas[0]["command"].startswith("diloco-gym train --config")
    # a complete run is kept, not retrained
    before = (runs / "tiny-s0" / "model.zip").stat().st_mtime_ns
    assert seeds.main([*argv, "--", "--config", str(cfg)]) == 0
    assert (runs / "tiny-s0" / "model.zip").stat().st_mtime_ns == before
    assert "complete, kept" in capsys.readouterr().out

    ev = tmp_path / "eval"
    assert seeds.main([
        "evaluate", "--runs", str(runs), "--names", "tiny", "--seeds", "0", "1",
        "--out", str(ev), "--regimes", "bursty", "--heuristics", "online-forecast-budget",
        "fixed-budget", "--test-seeds", "3", "--seed0", "2000", "--draws", "20",
        "--budgets", "60", "96",
    ]) == 0  # fmt: skip
    record = json.loads((ev / "agents.json").read_text())
    assert [r["seed"] for r in record["learned"]] == [0, 1]
    assert record["test_seeds"] == [2000, 2002]
    assert record["learner_calibration"] is None

    # judged with DiLoCoSync-v2's learners: recorded, and each schedule carries its quality
    ev2 = tmp_path / "eval-v2"
    assert seeds.main([
        "evaluate", "--runs", str(runs), "--names", "tiny", "--seeds", "0",
        "--out", str(ev2), "--regimes", "bursty", "--heuristics", "fixed-budget",
        "--test-seeds", "2", "--draws", "10", "--budgets", "60", "--learner-calibration",
        "shipped",
    ]) == 0  # fmt: skip
    from diloco_gym.sim.learner_calibration import shipped_path

    v2 = json.loads((ev2 / "agents.json").read_text())
    assert v2["learner_calibration"] == str(Path(shipped_path()).resolve())
    import pandas as pd

    assert "pred_loss" in pd.read_csv(ev2 / "budgets.csv").columns
    assert "pred_loss" not in pd.read_csv(ev / "budgets.csv").columns
    out = tmp_path / "summary"
    assert seeds.main([
        "summarize", "--evals", str(ev), "--runs", str(runs), "--curves", "tiny",
        "--seeds", "0", "1", "--out", str(out),
    ]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert res["config"] == "tiny" and [t["task"] for t in res["tasks"]] == [
        "bursty@60/h",
        "bursty@96/h",
    ]
    # the aggregates are those of the evaluation's table
    import pandas as pd

    df = pd.read_csv(ev / "budgets.csv")
    names = [r["agent"] for r in record["learned"]]
    gap = np.array(
        [[df[(df.agent == n) & (df.budget_per_hour == b)].gap_captured.item() for b in (60, 96)]
         for n in names]
    )  # fmt: skip
    assert res["gap_iqm"] == pytest.approx(iqm(gap))
    heur = df[df.agent.isin(["online-forecast-budget", "fixed-budget"])]
    best = np.array([[heur[heur.budget_per_hour == b].gap_captured.max() for b in (60, 96)]])
    assert res["probability_of_improvement"] == pytest.approx(probability_of_improvement(gap, best))
    lo, hi = res["gap_iqm_ci"]
    assert lo <= res["gap_iqm"] <= hi
    assert (out / "learning_curves.png").stat().st_size > 1000
    assert "| tiny | bursty | 2000-2002 | 2 |" in (out / "summary.md").read_text()

    # a family's comparison equals a frontier run of that family on the same seeds
    assert seeds.main(["claims", "--eval", str(ev), "--runs", "tiny-s1",
                       "--out", str(tmp_path / "claims.md")]) == 0  # fmt: skip
    table = seeds.family_claims(ev, ["tiny-s1"])
    from diloco_gym.eval.frontier import FrontierConfig, run_frontier

    alone = run_frontier(
        FrontierConfig(
            regimes=["bursty"], budgets_per_hour=[60, 96],
            budget_agents=[record["learned"][1]["path"], "online-forecast-budget", "fixed-budget"],
            free_agents=["fixed-512"], seeds=3, seed0=2000, draws=20, in_process_agents=True,
        ),
        progress=False,
    )  # fmt: skip
    agent = alone["budgets"]["agent"].iloc[0]
    for _, r in table.iterrows():
        at = alone["budgets"][alone["budgets"].budget_per_hour == r["budget_per_hour"]]
        mine = at[at.agent == agent].iloc[0]
        assert r["vs_random_holm"] == pytest.approx(mine["p_holm"])
        assert r["sync_excess_pct"] == pytest.approx(mine["sync_excess_pct"])
        pw = alone["pairwise"]
        pw = pw[(pw.budget_per_hour == r["budget_per_hour"])
                & pw.agent_a.isin([agent, r["best_heuristic"]])
                & pw.agent_b.isin([agent, r["best_heuristic"]])]  # fmt: skip
        assert r["vs_best_holm"] == pytest.approx(pw["p_holm"].item())
        assert abs(r["vs_best_pp"]) == pytest.approx(abs(pw["diff_pp"].item()))
    assert "| bursty | 60 | tiny-s1 |" in (tmp_path / "claims.md").read_text()


def test_the_study_sets_seed_and_out_itself(tmp_path: Path, capsys) -> None:
    argv = ["train", "--name", "x", "--seeds", "0", "--out", str(tmp_path), "--", "--seed", "3"]
    assert seeds.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "python -m diloco_gym.rl.seeds: train arguments: --seed are set per seed by the study"
    )


def test_a_run_without_a_model_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "x-s0").mkdir()
    code = seeds.main([
        "evaluate", "--runs", str(tmp_path), "--names", "x", "--seeds", "0", "--out",
        str(tmp_path / "ev"), "--regimes", "bursty", "--heuristics", "fixed-budget",
    ])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x-s0: no model to evaluate (no best_model.zip or model.zip)" in err[0]


def test_a_deeply_nested_meta_json_is_not_a_complete_run(tmp_path):
    """A run's ``meta.json`` of 100,000 nested brackets is read within the nesting limit: the
    run is not complete (it was a ``RecursionError``)."""
    from diloco_gym.rl.seeds import _complete

    (tmp_path / "model.zip").write_bytes(b"")
    (tmp_path / "meta.json").write_text('{"status": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert _complete(tmp_path) is False
    (tmp_path / "meta.json").write_text('{"status": "complete"}')
    assert _complete(tmp_path) is True
