"""The one trainer on a fleet: ``diloco-gym train --fleet FILE`` (or ``fleet`` in a config's
``[env]``), the model it writes, and the protocol judging that model (the fleet report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")

from rl_helpers import cli_exit_one_line, write_config  # noqa: E402

from diloco_gym.agents.fleet import fleet_agent  # noqa: E402
from diloco_gym.agents.registry import make_agents  # noqa: E402
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.fleet import DiLoCoFleetEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402
from diloco_gym.sim.fleet import FleetParams, SiteConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: A two-site fleet with two fragments (26 observation features).
TWO_SITES = '[fleet]\nfragments = 2\n[[site]]\nname = "a"\n[[site]]\nname = "b"\n'
#: A tiny fleet run: imitation warm start, two budgets, one validation episode.
TINY_FLEET = """
[train]
algo = "maskable-ppo"
timesteps = 256
seed = 2
eval_episodes = 2
eval_freq = 0
checkpoint_freq = 0
bc_teacher = "online-forecast-budget"
bc_episodes = 1
bc_epochs = 1

[env]
fleet = "{fleet}"
budgets_per_10min = [24, 32]
excess_weight = 0.05

[algo]
n_steps = 128
batch_size = 64
n_epochs = 2
policy_kwargs = {{ net_arch = [16, 16] }}
"""


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fleet-train")
    fleet = d / "f.toml"
    fleet.write_text(TWO_SITES)
    cfg = write_config(d, TINY_FLEET.format(fleet=fleet))
    out = d / "run"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_train_on_a_fleet_writes_a_fleet_model(fleet_run: Path) -> None:
    meta = json.loads((fleet_run / "meta.json").read_text())
    assert meta["regime"] == "fleet:f" and meta["fleet"].endswith("f.toml")
    assert [s["merge_budget"] for s in meta["env_specs"]] == [24, 32]
    assert meta["observation"]["transform"] == "budget"
    env = DiLoCoFleetEnv(fleet=meta["fleet"])
    assert meta["observation"]["base_size"] == env.observation_space.shape[0] == 26
    assert meta["observation"]["base_features"][:2] == ["gap", "corridor_open"]
    assert meta["behaviour_cloning"]["samples"] > 0  # the teacher played through its fleet view
    # validation beside the fleet report's matched random and oracle, per budget
    per_env = meta["final_validation"]["per_env"]
    assert set(per_env) == {"fleet:f@24", "fleet:f@32"}
    for r in per_env.values():
        assert r["oracle_pct"] <= r["matched_random_pct"]
    assert (fleet_run / "validation.csv").is_file()


@pytest.mark.slow
def test_a_fleet_model_loads_keeps_its_budget_and_is_judged_by_the_fleet_report(
    fleet_run: Path,
) -> None:
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol

    fleet = str(fleet_run.parent / "f.toml")
    (agent,) = make_agents([str(fleet_run / "model.zip")])
    assert agent.budget_aware and fleet_agent(agent) is agent
    (best,) = make_agents([str(fleet_run / "best_model.zip")])  # the run's meta.json too
    assert best.budget_aware and best.obs_size == agent.obs_size == 26
    res = run_episode(DiLoCoFleetEnv(fleet=fleet, merge_budget=32), agent, 3)
    assert res["merges"] == 32  # the budget is kept exactly (the mask)
    config = FleetReportConfig(
        fleet=fleet,
        agents=[str(fleet_run / "model.zip"), "online-forecast-budget"],
        seeds=2,
        draws=20,
        env={"merge_budget": 24},
        in_process_agents=True,
    )
    summary = run_protocol(config)["summary"]
    assert len(summary) == 2 and set(summary["syncs_per_hour"]) == {24 * 6.0}


def test_train_refuses_a_regime_and_a_fleet_together(tmp_path, capsys) -> None:
    fleet = write_config(tmp_path, TWO_SITES, "f.toml")
    argv = ["train", "--fleet", str(fleet), "--regime", "bursty", "--out", str(tmp_path / "o")]
    code, err = cli_exit_one_line(argv, capsys)
    assert code == 2 and "--regime or --fleet" in err


#: A tiny run on the example rounds fleet: MaskablePPO on MultiBinary(4), warm-started by
#: the own-forecast site rule.
TINY_ROUNDS = TINY_FLEET.replace("budgets_per_10min = [24, 32]\n", "").replace(
    '"online-forecast-budget"', '"online-forecast+own"'
)


@pytest.fixture(scope="module")
def rounds_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rounds-train")
    cfg = write_config(
        d, TINY_ROUNDS.format(fleet=ROOT / "docs" / "examples" / "fleet-rounds.toml")
    )
    out = d / "run"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_train_on_a_rounds_fleet_learns_one_action_per_site(rounds_run: Path) -> None:
    meta = json.loads((rounds_run / "meta.json").read_text())
    assert meta["regime"] == "fleet:fleet-rounds" and meta["observation"]["transform"] is None
    assert meta["observation"]["base_features"][-2:] == ["d.ready", "d.sent"]
    assert meta["behaviour_cloning"]["teacher"] == "online-forecast+own"
    assert meta["behaviour_cloning"]["samples"] > 0
    (ref,) = meta["final_validation"]["per_env"].values()  # beside the rounds protocol's
    assert ref["oracle_pct"] < ref["matched_random_pct"]
    (agent,) = make_agents([str(rounds_run / "model.zip")])
    assert agent.per_site and not agent.budget_aware


@pytest.mark.slow
def test_a_per_site_model_is_judged_on_a_rounds_fleet_and_refused_elsewhere(
    rounds_run: Path,
) -> None:
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol

    model = str(rounds_run / "model.zip")
    rounds = str(ROOT / "docs" / "examples" / "fleet-rounds.toml")
    config = FleetReportConfig(
        fleet=rounds,
        agents=[model, "online-forecast+own"],
        seeds=2,
        draws=20,
        in_process_agents=True,
    )
    res = run_protocol(config)
    assert len(res["summary"]) == 2 and (res["rows"]["site_d_syncs"] > 0).all()
    one_instant = str(ROOT / "docs" / "examples" / "fleet-v1.toml")
    with pytest.raises(ValueError, match="trained on a fleet with timing = 'rounds'"):
        run_protocol(FleetReportConfig(fleet=one_instant, agents=[model], seeds=2))
    with pytest.raises(ValueError, match="'\\+own' site rule does not apply"):
        run_protocol(FleetReportConfig(fleet=rounds, agents=[model + "+own"], seeds=2))


def test_train_refuses_dqn_and_site_rules_where_they_do_not_apply(tmp_path, capsys) -> None:
    rounds = ROOT / "docs" / "examples" / "fleet-rounds.toml"
    out = str(tmp_path / "o")
    code, err = cli_exit_one_line(
        ["train", "--fleet", str(rounds), "--algo", "dqn", "--out", out], capsys
    )
    assert code == 2 and "dqn does not take" in err
    plain = write_config(tmp_path, TWO_SITES, "f.toml")
    own = write_config(tmp_path, '[train]\nbc_teacher = "online-forecast+own"\n', "own.toml")
    for extra in (["--fleet", str(plain)], ["--regime", "bursty"]):
        argv = ["train", "--config", str(own), *extra, "--out", out]
        code, err = cli_exit_one_line(argv, capsys)
        assert code == 2 and "needs a fleet with timing = 'rounds'" in err
    assert not Path(out).exists()


@pytest.mark.slow
def test_the_shipped_v1_fleet_agent_is_its_config_run_bit_for_bit(tmp_path) -> None:
    """``diloco-gym train --config agents/reference/fleet-budget-v1/config.toml`` gives the
    shipped policy's weights exactly, with the library versions its meta.json records and
    torch's kernels on the instruction set it records (``torch_cpu``: on another one the
    kernels round differently, and the weights drift apart over training; the shipped
    meta.json predates that key, so the check waits for a model that records it)."""
    import io
    import zipfile

    import torch

    from diloco_gym.rl.algos import library_versions

    ref = ROOT / "agents" / "reference" / "fleet-budget-v1"
    meta = json.loads((ref / "meta.json").read_text())
    now = library_versions()
    keys = ("torch", "stable_baselines3", "sb3_contrib", "numpy", "gymnasium", "torch_cpu")
    if any(meta["versions"].get(k) != now.get(k) for k in keys):
        pytest.skip(
            "other library versions or torch CPU kernels than the shipped model's "
            "(meta.json versions): no bit-for-bit check"
        )
    text = (ref / "config.toml").read_text().replace("eval_episodes = 10", "eval_episodes = 0")
    cfg = write_config(tmp_path, text.replace('"docs/', f'"{ROOT}/docs/'))
    out = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0

    def weights(path: Path) -> dict:
        with zipfile.ZipFile(path) as z:
            return torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True)

    got, shipped = weights(out / "model.zip"), weights(ref / "model.zip")
    assert got.keys() == shipped.keys()
    assert all(torch.equal(got[k], shipped[k]) for k in got)


@pytest.mark.slow
def test_the_shipped_v1_fleet_config_trains_the_same_weights_twice(tmp_path) -> None:
    """What the shipped check rests on, on every machine: the shipped config (shortened)
    run twice gives the same weights bit for bit, imitation warm start included."""
    import io
    import zipfile

    import torch

    ref = ROOT / "agents" / "reference" / "fleet-budget-v1"
    text = (ref / "config.toml").read_text().replace("eval_episodes = 10", "eval_episodes = 0")
    text = text.replace("timesteps = 40960", "timesteps = 2048").replace(
        "bc_episodes = 6", "bc_episodes = 1"
    )
    cfg = write_config(tmp_path, text.replace('"docs/', f'"{ROOT}/docs/'))

    def weights(run: str) -> dict:
        out = tmp_path / run
        assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
        with zipfile.ZipFile(out / "model.zip") as z:
            return torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True)

    a, b = weights("a"), weights("b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_shipped_fleet_agent_loads_and_keeps_its_budget():
    model = ROOT / "agents" / "reference" / "fleet-budget" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped fleet agent in this checkout")
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(fleet=str(ROOT / "docs" / "examples" / "fleet.toml"), merge_budget=64)
    res = run_episode(env, agent, 0)
    assert res["merges"] == 64


def test_fleet_model_refused_on_a_narrower_env():
    model = ROOT / "agents" / "reference" / "fleet-budget" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped fleet agent in this checkout")
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(
        fleet=FleetParams(sites=(SiteConfig(name="x"),), merge_seconds=8.0), merge_budget=8
    )
    with pytest.raises(ValueError):
        run_episode(env, agent, 0)


def test_shipped_v1_fleet_agent_loads_on_model_v1_and_keeps_its_budget():
    model = ROOT / "agents" / "reference" / "fleet-budget-v1" / "model.zip"
    if not model.is_file():
        pytest.skip("no shipped v1 fleet agent in this checkout")
    meta = json.loads((model.parent / "meta.json").read_text())
    assert meta["fleet"] == "docs/examples/fleet-v1.toml"
    (agent,) = make_agents([str(model.parent)])
    env = DiLoCoFleetEnv(fleet=str(ROOT / "docs" / "examples" / "fleet-v1.toml"), merge_budget=48)
    assert env.fleet.model_version == 1
    res = run_episode(env, agent, 0)
    assert res["merges"] == 48 and res["model_version"] == 1


def test_the_shipped_rounds_agent_chooses_each_site_on_its_rounds_fleet_only() -> None:
    from diloco_gym.envs.fleet_rounds import make_fleet_env

    ref = ROOT / "agents" / "reference" / "fleet-rounds-own"
    meta = json.loads((ref / "meta.json").read_text())
    assert meta["fleet"] == "docs/examples/fleet-rounds.toml"
    assert meta["config"]["file"]["text"] == (ref / "config.toml").read_text()
    (agent,) = make_agents([str(ref)])
    assert agent.per_site and not agent.budget_aware
    env = make_fleet_env(fleet=str(ROOT / meta["fleet"]))
    res = run_episode(env, agent, 0)
    assert res["timing"] == "rounds" and 8 <= len(res["round_sites"]) <= 16
    assert all(n > 0 for n in res["site_sync_counts"].values())  # every site contributes
    with pytest.raises(ValueError, match="trained on a fleet with timing = 'rounds'"):
        run_episode(
            DiLoCoFleetEnv(fleet=str(ROOT / "docs" / "examples" / "fleet-v1.toml")), agent, 0
        )


@pytest.mark.slow
def test_the_seed_study_judges_fleet_models_on_the_fleet_frontier(
    fleet_run: Path, tmp_path
) -> None:
    """``python -m diloco_gym.rl.seeds evaluate-fleet`` judges the runs by the one frontier
    (``run_frontier`` of the fleet at each budget): budgets.csv is that frontier's table
    under the single-host names, with the budget per hour of the fleet's episodes, and the
    study's summary reads it as it reads a single host's."""
    import shutil

    import pandas as pd

    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.fleet_frontier import FleetFrontierConfig
    from diloco_gym.eval.frontier import run_frontier
    from diloco_gym.rl import seeds

    fleet = str(fleet_run.parent / "f.toml")
    runs = tmp_path / "runs"
    shutil.copytree(fleet_run, runs / "tiny-fleet-s0")
    ev = tmp_path / "eval"
    assert seeds.main([
        "evaluate-fleet", "--runs", str(runs), "--name", "tiny-fleet", "--seeds", "0",
        "--out", str(ev), "--fleet", fleet, "--budgets", "32", "24", "--heuristics",
        "online-forecast-budget", "--test-seeds", "2", "--draws", "20",
    ]) == 0  # fmt: skip
    table = pd.read_csv(ev / "budgets.csv")
    record = json.loads((ev / "agents.json").read_text())
    (learned,) = record["learned"]
    config = FleetFrontierConfig(
        FleetReportConfig(fleet=fleet, agents=[learned["path"], "online-forecast-budget"],
                          seeds=2, draws=20, in_process_agents=True),
        [24, 32],
    )  # fmt: skip
    frontier = run_frontier(config, progress=False)["frontier"]
    assert list(table["regime"].unique()) == ["fleet"]
    assert list(table["budget_per_hour"]) == [144.0, 144.0, 192.0, 192.0]  # 600 s episodes
    assert list(table["agent"]) == list(frontier["agent"])
    for mine, theirs in (("sync_excess_pct", "sync_excess_pct"),
                         ("matched_random_pct", "matched_random_mean"),
                         ("oracle_pct", "oracle_same_budget_pct"),
                         ("gap_captured", "gap_captured"), ("p_holm", "p_holm")):  # fmt: skip
        pd.testing.assert_series_equal(
            table[mine], frontier[theirs], check_names=False, check_dtype=False
        )
    assert (ev / "pairwise.csv").is_file()
    _, per_config = seeds._score_tables(ev)
    assert per_config["tiny-fleet"]["tasks"] == ["fleet@144/h", "fleet@192/h"]
