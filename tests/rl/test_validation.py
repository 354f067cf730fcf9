"""Tests of :mod:`diloco_gym.rl.validation`: the validation curve a run writes, the
comparison ``train`` prints, validation seeds held out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from diloco_gym.agents.registry import make_agent  # noqa: E402
from diloco_gym.eval.seed_ranges import VALIDATION_SEED0  # noqa: E402
from diloco_gym.rl import validation  # noqa: E402


def test_the_run_writes_its_validation_curve(tiny_run: Path) -> None:
    import csv

    rows = list(csv.DictReader((tiny_run / "validation.csv").open()))
    assert (tiny_run / "validation.png").stat().st_size > 1000
    meta = json.loads((tiny_run / "meta.json").read_text())
    assert len(rows) == 3 * len(meta["evaluations"])  # "all" + two budgets per evaluation
    for r in rows:
        if r["env"] == "all":
            continue
        mr, orc, agent = (
            float(r[k]) for k in ("matched_random_pct", "oracle_pct", "sync_excess_pct")
        )
        assert float(r["gap_captured"]) == pytest.approx((mr - agent) / (mr - orc))


def test_validation_figure_with_one_evaluation_says_so(tmp_path, monkeypatch):
    import json

    from matplotlib.axes import Axes

    from diloco_gym.rl.validation import write_validation_curve

    said: list[str] = []
    real_text = Axes.text
    monkeypatch.setattr(
        Axes,
        "text",
        lambda self, x, y, s, *a, **k: said.append(s) or real_text(self, x, y, s, *a, **k),
    )
    ev = {"timesteps": 2048, "sync_excess_pct": 1.5, "merges": 9}
    for n in (1, 2):
        said.clear()
        meta = {"algo": "ppo", "regime": "bursty", "seed": 0, "evaluations": [ev] * n}
        (tmp_path / "meta.json").write_text(json.dumps(meta))
        _, png = write_validation_curve(tmp_path)
        assert png.stat().st_size > 0
        assert any("one evaluation only (at 2048 timesteps)" in s for s in said) == (n == 1)


class _Never:
    name = "never"

    def predict(self, obs, **kwargs):
        return np.array([0]), None


def test_a_policy_that_never_merges_is_flagged() -> None:

    seeds = [VALIDATION_SEED0, VALIDATION_SEED0 + 1]
    never = validation.validation_comparison(_Never(), "bursty", seeds, draws=20)
    assert never["chosen_merges"] == 0
    assert never["agent"]["merges_per_hour"] > 0  # the forced merges
    assert never["same_schedules_as_fixed_512"] == 2
    assert never["agent"]["sync_excess_pct"] == pytest.approx(never["fixed-512"]["sync_excess_pct"])
    _, warnings = validation.format_comparison(never)
    assert len(warnings) == 1 and "never chose to merge" in warnings[0]
    busy = validation.validation_comparison(make_agent("fixed-256"), "bursty", seeds, draws=20)
    assert busy["chosen_merges"] > 0 and busy["same_schedules_as_fixed_512"] == 0
    assert validation.format_comparison(busy)[1] == []


def test_the_reference_follows_the_agents_merges_and_is_the_reports_scoring() -> None:
    """Matched random and the oracle beside a validation run are those of the agent's own
    number of merges: kept while it holds, computed again when it changes (a run without a
    budget changes it as it learns). On a fleet they are the fleet report's numbers for the
    same schedule."""
    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.envs.fleet import DiLoCoFleetEnv
    from diloco_gym.eval import fleet, protocol
    from diloco_gym.eval.rollout import run_episode

    env = DiLoCoFleetEnv(fleet="docs/examples/fleet-v1.toml")
    seeds = [VALIDATION_SEED0, VALIDATION_SEED0 + 1]
    cb = validation.HeldOutEvalCallback(env, seeds, eval_freq=0, best_path=None, draws=30)
    rows = [run_episode(env, fleet_agent(make_agent("online-forecast")), s) for s in seeds]
    first = cb._reference("fleet", env, rows)
    assert cb._reference("fleet", env, [dict(r) for r in rows]) is first  # same merges: kept
    fewer = [dict(r, merge_decisions=r["merge_decisions"][:-1]) for r in rows]
    again = cb._reference("fleet", env, fewer)
    assert again is not first and again["key"] != first["key"]
    # the report's scoring of the first schedule (same draws, same generator)
    s = seeds[0]
    sched = rows[0]["merge_decisions"]
    ep = env.build_episode(s)
    counts = protocol.counts_for(ep.n_decisions, env.params, len(sched))
    sc, _ = fleet.score_schedule(
        env,
        fleet.FleetScorer(ep, env.params, env.setup.sidecars),
        sched,
        30,
        np.random.default_rng([s, len(sched), 7]),
        counts,
    )
    assert cb._score(env, s, rows[0])["matched_random_mean"] == sc["matched_random_mean"]


@pytest.mark.slow
def test_a_rounds_agent_is_scored_anew_at_every_evaluation() -> None:
    """On a rounds fleet with a budget (every evaluation has the same rounds, so matched
    random and the oracle are kept), the agent's own sync-excess is still its exact replay
    at each evaluation: a changed policy gets its own number."""
    import torch
    from sb3_contrib import MaskablePPO

    from diloco_gym.agents.learned import LearnedAgent
    from diloco_gym.envs.fleet_rounds import make_fleet_env
    from diloco_gym.eval.fleet_rounds import agent_exact_pct
    from diloco_gym.eval.rollout import run_episode

    env = make_fleet_env(fleet="docs/examples/fleet-rounds.toml", merge_budget=10)
    seeds = [VALIDATION_SEED0, VALIDATION_SEED0 + 1]
    model = MaskablePPO("MlpPolicy", env, seed=0, policy_kwargs={"net_arch": [8]}, device="cpu")
    cb = validation.HeldOutEvalCallback(env, seeds, eval_freq=0, best_path=None, draws=20)
    cb.init_callback(model)

    def replayed() -> float:
        agent = LearnedAgent(model, meta={"observation": {"base_size": 48}})
        rows = [run_episode(env, agent, s) for s in seeds]
        return float(np.mean([agent_exact_pct(env, env.build_episode(s), r)
                              for s, r in zip(seeds, rows, strict=True)]))  # fmt: skip

    (first,) = cb.evaluate()["per_env"].values()
    assert first["sync_excess_pct"] == pytest.approx(replayed())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    (second,) = cb.evaluate()["per_env"].values()
    now = replayed()
    assert second["sync_excess_pct"] == pytest.approx(now)
    assert now != pytest.approx(first["sync_excess_pct"])
    assert len(cb.references) == 1  # matched random and the oracle were kept


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["vs_random", "sync_excess"])
def test_best_model_is_the_evaluation_with_the_lowest_value_of_its_rule(rule, tmp_path) -> None:
    """``best_model.zip`` is the policy of the evaluation with the lowest selection value:
    sync-excess minus matched random at its own merges (``vs_random``, computed for a
    free single-host run too) or sync-excess alone."""
    import io
    import zipfile

    import torch
    from stable_baselines3 import PPO

    from diloco_gym.envs.env import DiLoCoSyncEnv

    env = DiLoCoSyncEnv(regime="bursty")
    seeds = [VALIDATION_SEED0, VALIDATION_SEED0 + 1]
    model = PPO("MlpPolicy", env, seed=0, policy_kwargs={"net_arch": [8]}, device="cpu")
    best = tmp_path / "best.zip"
    cb = validation.HeldOutEvalCallback(
        env, seeds, eval_freq=0, best_path=best, draws=20, select_by=rule
    )
    cb.init_callback(model)
    policies = []
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        with torch.no_grad():
            for p in model.policy.parameters():
                p.add_(2.0 * torch.randn(p.shape, generator=gen))
        policies.append({k: v.clone() for k, v in model.policy.state_dict().items()})
        cb.evaluate()
    key = "vs_random_pp" if rule == "vs_random" else "sync_excess_pct"
    values = [h[key] for h in cb.history]
    i = int(np.argmin(values))
    assert cb.best == {"select_by": rule, "value": values[i], "timesteps": 0}
    if rule == "vs_random":  # each row's value: sync-excess minus its matched random
        for h in cb.history:
            (r,) = h["per_env"].values()
            assert h["vs_random_pp"] == r["sync_excess_pct"] - r["matched_random_pct"]
    with zipfile.ZipFile(best) as z:
        saved = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True)
    for name, tensor in policies[i].items():
        assert torch.equal(saved[name], tensor)
    with pytest.raises(ValueError, match="select_by must be one of"):
        validation.HeldOutEvalCallback(env, seeds, eval_freq=0, best_path=None, select_by="x")
