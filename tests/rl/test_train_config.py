"""``diloco-gym train --config``: config files, budget-conditioned training, budget features."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from diloco_gym.agents.heuristics import BudgetPace  # noqa: E402
from diloco_gym.agents.learned import LearnedAgent, load_learned_agent  # noqa: E402
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402
from diloco_gym.rl.config import ConfigError, load_config_file, parse_config  # noqa: E402
from diloco_gym.rl.wrappers import BUDGET_FEATURES, BudgetFeatures, budget_features  # noqa: E402

TINY = """
[train]
algo = "maskable-ppo"
timesteps = 256
seed = 5
eval_episodes = 1
eval_freq = 0
checkpoint_freq = 0
bc_teacher = "online-forecast-budget"
bc_episodes = 2
bc_epochs = 1

[env]
regimes = ["bursty"]
budgets_per_10min = [10, 16]
excess_weight = 1.0

[algo]
n_steps = 128
batch_size = 64
n_epochs = 2
policy_kwargs = { net_arch = [16, 16] }
"""


def _write(tmp_path: Path, text: str, name: str = "cfg.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    return int(exc.value.code), err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("budget")
    cfg = _write(d, TINY)
    assert main(["train", "--config", str(cfg), "--out", str(d / "run"), "--no-progress"]) == 0
    return d / "run"


# ----------------------------------------------------------------------------- errors
BAD = [
    ("[bogus]\nx = 1\n", "unknown table [bogus]"),
    ("[train]\nspeed = 3\n", "[train] speed: unknown key"),
    ('[train]\ntimesteps = "many"\n', "[train] timesteps must be an integer"),
    ("[train]\ntimesteps = true\n", "[train] timesteps must be an integer"),
    ("[env]\nwarp = 1\n", "[env] warp: unknown key"),
    ("[env]\nmerge_budget = 10\n", "[env] merge_budget: give budgets_per_hour"),
    ('[env]\nregime = "bursty"\nregimes = ["bursty"]\n', "give regime or regimes, not both"),
    (
        "[env]\nbudgets_per_hour = [60]\nbudgets_per_10min = [10]\n",
        "give budgets_per_hour or budgets_per_10min",
    ),
    ("[env]\nbudgets_per_hour = [60, -1]\n", "budgets must be positive numbers"),
    ("[env]\nbudgets_per_hour = []\n", "give at least one budget"),
    ("[env]\nbudgets_per_hour = [60, 60]\n", "each budget once"),
    ('[env]\nregime = "calm"\n', "unknown regime(s) ['calm']"),
    ("[env]\nh_min_steps = 1.5\n", "[env] h_min_steps must be an integer"),
    ("[env]\nrate_scale = 2.0\n", "rate_scale applies to a trace"),
    ('[env]\nobservation = "budget"\n', "observation = 'budget' needs budgets"),
    ('[env]\nobservation = "pixels"\nbudgets_per_hour = [60]\n', "observation 'pixels'"),
    ("[env]\nbudgets_per_hour = [300]\n", "outside the feasible 8..32"),
    ("[env]\nbudgets_per_hour = [60, 61]\n", "are both 10 merges per 600 s episode"),
    (
        '[train]\nvec_env = "native"\n[env]\nbudgets_per_hour = [60]\n',
        'vec_env "native" runs one budget',
    ),
    ("[algo]\nlearning_rat = 0.1\n", "[algo] learning_rat: unknown hyperparameter of ppo"),
    ("[algo]\nseed = 1\n", "[algo] seed: set by train itself"),
    ("[algo]\npolicy_kwargs = { net_arch = [0] }\n", "net_arch must be a list of positive"),
    ("[algo]\npolicy_kwargs = { squash = true }\n", "policy_kwargs.squash: not supported"),
    ('[algo]\npolicy_kwargs = { activation_fn = "gelu" }\n', "activation_fn: 'gelu'"),
    ("[algo]\nn_steps = [1, 2]\n", "[algo] n_steps: expected a number"),
    ('[train]\nalgo = "sac"\n', "algo 'sac' is unknown"),
    (
        '[train]\nbc_teacher = "guru"\n[env]\nbudgets_per_hour = [60]\n',
        "bc_teacher 'guru' is not an agent",
    ),
    (
        '[train]\nbc_teacher = "offline-oracle"\n[env]\nbudgets_per_hour = [60]\n',
        "bc_teacher must be deployable",
    ),
    ('[train]\nbc_teacher = "fixed-budget"\n', "bc_teacher needs budgets"),
    ("[train]\nbc_epochs = 0\n", "bc_episodes and bc_epochs must be >= 1"),
    ("[train]\ntimesteps = 0\n", "timesteps must be >= 1"),
    ("this is = not toml ]\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_config_errors_are_one_line_usage_errors(text, message, tmp_path, capsys) -> None:
    cfg = _write(tmp_path, text)
    code, err = _exit(["train", "--config", str(cfg), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert message in err, err
    assert str(cfg) in err  # names the file
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_a_missing_config_file_is_a_usage_error(tmp_path, capsys) -> None:
    code, err = _exit(["train", "--config", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "nope.toml: config file not found" in err


def test_algo_keys_are_checked_against_the_chosen_algorithm(tmp_path, capsys) -> None:
    """gae_lambda is a PPO hyperparameter, not a DQN one: the flag's algo decides."""
    cfg = _write(tmp_path, "[algo]\ngae_lambda = 0.9\n")
    code, err = _exit(["train", "--config", str(cfg), "--algo", "dqn"], capsys)
    assert code == 2 and "[algo] gae_lambda: unknown hyperparameter of dqn" in err


def test_parse_config_units_and_env_fields(tmp_path) -> None:
    data, source = load_config_file(_write(tmp_path, TINY))
    cfg = parse_config(data, source["path"])
    assert cfg.budgets_per_hour == [60.0, 96.0]  # 10 and 16 per 10 min
    assert cfg.env_params == {"excess_weight": 1.0}
    assert cfg.hyperparameters["policy_kwargs"] == {"net_arch": [16, 16]}
    with pytest.raises(ConfigError, match=r"x\.toml: \[env\] loss_clip must be a number"):
        parse_config({"env": {"loss_clip": "big"}}, "x.toml")


# ----------------------------------------------------------------------------- metadata
def test_meta_records_the_resolved_config_and_the_file(tiny_run: Path, tmp_path) -> None:
    meta = json.loads((tiny_run / "meta.json").read_text())
    cfg = meta["config"]
    assert cfg["file"]["text"] == TINY
    assert len(cfg["file"]["sha256"]) == 64
    assert cfg["budgets_per_hour"] == [60.0, 96.0]
    assert cfg["n_envs"] == 2 and cfg["vec_env"] == "dummy"
    assert meta["algo"] == "maskable-ppo" and meta["seed"] == 5
    assert [s["merge_budget"] for s in meta["env_specs"]] == [10, 16]
    assert meta["observation"] == {"transform": "budget", "features": list(BUDGET_FEATURES)}
    assert meta["hyperparameters"]["n_steps"] == 128
    bc = meta["behaviour_cloning"]
    assert bc["teacher"] == "online-forecast-budget" and bc["episodes_per_env"] == 2
    assert bc["samples"] > 100 and 0 < bc["merge_share"] < 0.5
    assert meta["evaluations"][0]["timesteps"] == 0  # the cloned policy, before RL
    assert meta["hyperparameters"]["policy_kwargs"] == {"net_arch": [16, 16]}
    # the validation curve per env kind, with matched random and the oracle
    per_env = meta["final_validation"]["per_env"]
    assert set(per_env) == {"bursty@10", "bursty@16"}
    for row in per_env.values():
        assert row["oracle_pct"] < row["matched_random_pct"]


def test_flags_override_the_file(tmp_path) -> None:
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "run"
    argv = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    argv += ["--seed", "9", "--timesteps", "128", "--budgets", "48", "72", "--eval-episodes", "0"]
    assert main(argv) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["seed"] == 9 and meta["timesteps_requested"] == 128
    assert [s["merge_budget"] for s in meta["env_specs"]] == [8, 12]
    assert meta["config"]["budgets_per_hour"] == [48.0, 72.0]
    assert meta["config"]["file"]["text"] == TINY  # the file is still recorded


def _policy_bytes(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read("policy.pth")


def test_retraining_with_the_same_seed_gives_the_same_policy(tiny_run: Path, tmp_path) -> None:
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "again"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert _policy_bytes(out / "model.zip") == _policy_bytes(tiny_run / "model.zip")


# ----------------------------------------------------------------------------- features
def test_budget_features_match_the_episode_state_at_every_decision() -> None:
    m = 12
    env = DiLoCoSyncEnv("bursty", merge_budget=m)
    p = env.params
    obs, _ = env.reset(seed=2)
    ep = env.episode
    assert ep is not None
    n = ep.n_decisions
    rng = np.random.default_rng(0)
    done = False
    while not done:
        f = budget_features(obs, p)
        s = BudgetPace(p).read(obs)
        d, gap, m_left = env.decision, s["gap"], s["m_left"]
        assert s["n"] == n and s["d"] == d
        assert f[0] == pytest.approx(m * p.h_min / n, abs=1e-6)
        assert f[1] == pytest.approx(min(1.0, m_left * p.h_min / max(n - d, 1)), abs=1e-6)
        due = max((n - (d - gap)) / (m_left + 1), 1.0)
        want = min(1.0, gap / due / 2) if m_left > 0 else 0.0
        assert f[2] == pytest.approx(want, abs=1e-6)
        obs, _, _, done, _ = env.step(int(rng.random() < 0.1))


def test_budget_features_need_a_budget() -> None:
    with pytest.raises(ValueError, match="merge budget"):
        BudgetFeatures(DiLoCoSyncEnv("bursty"))


def test_the_loaded_agent_sees_what_the_training_wrapper_saw(tiny_run: Path) -> None:
    """The agent rebuilds the wrapper's features from meta.json: same inputs, same actions."""
    agent = load_learned_agent(tiny_run / "model.zip")
    assert agent.obs_transform == "budget" and agent.budget_aware
    env = BudgetFeatures(DiLoCoSyncEnv("bursty", merge_budget=10))
    res = run_episode(DiLoCoSyncEnv("bursty", merge_budget=10), agent, seed=7)
    obs, _ = env.reset(seed=7)
    actions, done = [], False
    while not done:
        a, _ = agent.model.predict(obs, deterministic=True, action_masks=env.action_masks())
        actions.append(int(a))
        obs, _, _, done, info = env.step(int(a))
    assert list(info["episode_summary"]["merge_decisions"]) == list(res["merge_decisions"])
    assert res["merges"] == 10


def test_a_budget_conditioned_agent_refuses_to_run_without_a_budget(tiny_run: Path) -> None:
    agent = load_learned_agent(tiny_run / "model.zip")
    with pytest.raises(ValueError, match="budget-conditioned"):
        run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)


def test_a_model_and_a_wrong_transform_are_refused(tiny_run: Path) -> None:
    agent = load_learned_agent(tiny_run / "model.zip")
    with pytest.raises(ValueError, match=r"shape \(20,\)"):
        LearnedAgent(agent.model, obs_transform=None)


def test_frontier_runs_a_budget_conditioned_agent_on_the_grid_only(tiny_run, tmp_path) -> None:
    """``--agent`` adds to both lists; a budget-conditioned model runs on the grid only,
    marked budget-aware, with exactly the budget's merges."""
    import pandas as pd

    from diloco_gym.agents.registry import is_budget_aware_spec

    model = str(tiny_run / "model.zip")
    assert is_budget_aware_spec(model) and is_budget_aware_spec(str(tiny_run))
    assert is_budget_aware_spec("fixed-budget") and not is_budget_aware_spec("wa-diloco")
    out = tmp_path / "fr"
    argv = ["frontier", "--regimes", "bursty", "--budgets", "60", "96", "--seeds", "2"]
    argv += ["--draws", "20", "--budget-agents", "fixed-budget", "--free-agents", "fixed-512"]
    assert main([*argv, "--agent", model, "--out", str(out), "--no-progress"]) == 0
    rows = pd.read_csv(out / "frontier.csv")
    mine = rows[rows["agent"] == "maskable-ppo:model"]
    assert set(mine["mode"]) == {"budget"} and set(mine["held"]) == {"budget-aware"}
    assert (mine["merges"] == mine["budget"]).all()
    assert sorted(set(mine["budget"])) == [10, 16]


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


def test_the_docs_config_example_parses_and_trains(tmp_path, monkeypatch) -> None:
    """docs/training.md's "Train your own agent" config, from the repository root."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "training.md").read_text()
    section = text.split("## Train your own agent", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    cfg = _write(tmp_path, example, "mine.toml")
    monkeypatch.chdir(root)
    out = tmp_path / "mine"
    argv = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    assert main([*argv, "--timesteps", "300", "--eval-episodes", "1", "--eval-freq", "0"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["regime"] == "replay:bursty"
    assert [s["merge_budget"] for s in meta["env_specs"]] == [2, 3]  # 120 s episodes
    assert meta["config"]["calibration"].endswith("calibration_reference.json")
    assert meta["timesteps"] >= 300


@pytest.mark.slow
def test_behaviour_cloning_imitates_the_teacher() -> None:
    """Enough cloning makes the policy act as the teacher on most decisions of its own
    training episodes (a fit that cannot pass by chance: merges are rare)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from diloco_gym.rl.config import EnvSpec
    from diloco_gym.rl.train import behaviour_clone

    spec = EnvSpec("bursty", "bursty", None, 12, 72.0)
    venv = DummyVecEnv([lambda: BudgetFeatures(spec.make())])
    model = MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=64, batch_size=64)
    rec = behaviour_clone(model, [spec], "online-forecast-budget", 8, 80, 0, None, "budget")
    assert rec["train_accuracy"] > 0.9 and rec["merge_recall"] > 0.5
    assert rec["train_accuracy"] > 1 - rec["merge_share"]  # better than "never merge"


@pytest.mark.parametrize(
    ("budgets", "message"),
    [(["60", "60"], "are both 10 merges"), (["-6"], "outside the feasible 8..32")],
)
def test_budget_flags_are_checked_like_the_file(budgets, message, tmp_path, capsys) -> None:
    argv = ["train", "--algo", "maskable-ppo", "--budgets", *budgets, "--out", str(tmp_path / "o")]
    code, err = _exit(argv, capsys)
    assert code == 2 and message in err and err.startswith("diloco-gym: command line:")
    assert not (tmp_path / "o").exists()


def test_validation_figure_with_one_evaluation_says_so(tmp_path, monkeypatch):
    import json

    from matplotlib.axes import Axes

    from diloco_gym.rl.train import write_validation_curve

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
