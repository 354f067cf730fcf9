"""Tests of :mod:`diloco_gym.rl.command`: ``diloco-gym train`` end to end (options, config
files and flags, the run directory rules as the command reports them, the printed
validation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from rl_helpers import (  # noqa: E402
    SMALL,
    TINY,
    TINY_CONFIG,
    cli_exit,
    cli_exit_one_line,
    copy_run,
    write_config,
)

from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.budget_features import BUDGET_FEATURES  # noqa: E402
from diloco_gym.eval.seed_ranges import VALIDATION_SEED0  # noqa: E402
from diloco_gym.rl import run_dir, validation  # noqa: E402


def test_cli_train_writes_model_meta_logs_checkpoints(ppo_run: Path) -> None:
    assert (ppo_run / "model.zip").is_file()
    assert (ppo_run / "best_model.zip").is_file()
    assert any((ppo_run / "tb").rglob("events.out.tfevents*"))
    assert run_dir.latest_checkpoint(ppo_run).name == "rl_model_1024_steps.zip"
    meta = json.loads((ppo_run / "meta.json").read_text())
    assert meta["algo"] == "ppo" and meta["regime"] == "bursty" and meta["seed"] == 3
    assert meta["timesteps"] >= 1024
    assert meta["env_params"]["h_max_steps"] == 512
    assert "stable_baselines3" in meta["versions"] and "torch" in meta["versions"]
    assert meta["final_validation"]["merges"] >= 1


def test_resume_continues_from_latest_checkpoint(ppo_run: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "resume"
    shutil.copytree(ppo_run, out)
    args = ["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY]
    args[args.index("1024")] = "2048"
    assert main([*args, "--resume"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["resumed_from"].endswith("rl_model_1024_steps.zip")
    assert meta["timesteps"] >= 2048


def test_train_refuses_an_existing_run(ppo_run: Path, tmp_path: Path, capsys) -> None:
    out = copy_run(ppo_run, tmp_path / "run")
    before = (out / "model.zip").read_bytes()
    code, err = cli_exit_one_line(["train", "--algo", "dqn", "--out", str(out), *SMALL], capsys)
    assert code == 2 and "--resume" in err and "--force" in err
    assert (out / "model.zip").read_bytes() == before
    assert json.loads((out / "meta.json").read_text())["algo"] == "ppo"


def test_resume_checks_the_algorithm_and_needs_a_run(ppo_run: Path, tmp_path: Path, capsys) -> None:
    out = copy_run(ppo_run, tmp_path / "run")
    code, err = cli_exit_one_line(
        ["train", "--algo", "dqn", "--resume", "--out", str(out), *SMALL], capsys
    )
    assert code == 2 and "is a ppo run" in err and "AttributeError" not in err
    code, err = cli_exit_one_line(
        ["train", "--algo", "ppo", "--regime", "sync-heavy", "--resume", "--out", str(out), *SMALL],
        capsys,
    )
    assert code == 2 and "--regime" in err
    code, err = cli_exit_one_line(
        ["train", "--resume", "--out", str(tmp_path / "none"), *SMALL], capsys
    )
    assert code == 2 and "no training run" in err
    assert not (tmp_path / "none").exists()
    code, err = cli_exit_one_line(
        ["train", "--resume", "--force", "--out", str(out), *SMALL], capsys
    )
    assert code == 2


def test_train_never_writes_into_a_directory_of_other_files(tmp_path: Path, capsys) -> None:
    (tmp_path / "model.zip").write_text("someone else's")
    code, err = cli_exit_one_line(["train", "--force", "--out", str(tmp_path), *SMALL], capsys)
    assert code == 2 and "not a diloco-gym training run" in err
    assert (tmp_path / "model.zip").read_text() == "someone else's"


def test_force_replaces_the_run_files_only_and_prints_the_comparison(
    ppo_run: Path, tmp_path: Path, capsys
) -> None:
    out = copy_run(ppo_run, tmp_path / "run")
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--algo", "dqn", "--force", "--out", str(out), *SMALL]) == 0
    captured = capsys.readouterr()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["algo"] == "dqn" and meta["status"] == "complete"
    assert (out / "notes.txt").read_text() == "mine"
    assert run_dir.latest_checkpoint(out).name == "rl_model_256_steps.zip"  # old ones removed
    assert not (out / "checkpoints" / "rl_model_1024_steps.zip").exists()
    # validation next to fixed-512 and matched random, in merges/h
    lines = captured.out.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.startswith("validation")) :]
    assert "merges/h" in table[1]
    for label in ("dqn:model", "fixed-512", "matched random"):
        row = next(ln for ln in table if ln.strip().startswith(label))
        assert float(row.split()[-1]) > 0 and float(row.split()[-2]) >= 0
    cmp = meta["validation_comparison"]
    assert cmp["seeds"] == [VALIDATION_SEED0]
    assert cmp["agent"]["merges_per_hour"] == cmp["matched random"]["merges_per_hour"]
    if cmp["chosen_merges"] == 0:
        assert "never chose to merge" in captured.err


def test_meta_is_written_at_start_so_a_killed_run_can_resume(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    out = tmp_path / "run"

    def killed(self):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(validation.HeldOutEvalCallback, "evaluate", killed)
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "train",
                    "--out",
                    str(out),
                    "--timesteps",
                    "512",
                    "--n-envs",
                    "1",
                    "--eval-episodes",
                    "1",
                    "--eval-freq",
                    "384",
                    "--checkpoint-freq",
                    "128",
                    "--no-progress",
                ]
            )
    assert exc.value.code == 130
    meta = json.loads((out / "meta.json").read_text())
    assert meta["algo"] == "ppo" and meta["status"] == "training"
    assert not (out / "model.zip").exists()
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", *SMALL[:1], "512", *SMALL[2:]]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["resumed_from"].endswith("_steps.zip")


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
    ('[train]\nselect_by = "reward"\n', "select_by 'reward' is unknown; valid: vs_random"),
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
    cfg = write_config(tmp_path, text)
    code, err = cli_exit(["train", "--config", str(cfg), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert message in err, err
    assert str(cfg) in err  # names the file
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_a_missing_config_file_is_a_usage_error(tmp_path, capsys) -> None:
    code, err = cli_exit(["train", "--config", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "nope.toml: config file not found" in err


def test_algo_keys_are_checked_against_the_chosen_algorithm(tmp_path, capsys) -> None:
    """gae_lambda is a PPO hyperparameter, not a DQN one: the flag's algo decides."""
    cfg = write_config(tmp_path, "[algo]\ngae_lambda = 0.9\n")
    code, err = cli_exit(["train", "--config", str(cfg), "--algo", "dqn"], capsys)
    assert code == 2 and "[algo] gae_lambda: unknown hyperparameter of dqn" in err


def test_flags_override_the_file(tmp_path) -> None:
    cfg = write_config(tmp_path, TINY_CONFIG)
    out = tmp_path / "run"
    argv = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    argv += ["--seed", "9", "--timesteps", "128", "--budgets", "48", "72", "--eval-episodes", "0"]
    assert main(argv) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["seed"] == 9 and meta["timesteps_requested"] == 128
    assert [s["merge_budget"] for s in meta["env_specs"]] == [8, 12]
    assert meta["config"]["budgets_per_hour"] == [48.0, 72.0]
    assert meta["config"]["file"]["text"] == TINY_CONFIG  # the file is still recorded


@pytest.mark.parametrize(
    ("budgets", "message"),
    [(["60", "60"], "are both 10 merges"), (["-6"], "outside the feasible 8..32")],
)
def test_budget_flags_are_checked_like_the_file(budgets, message, tmp_path, capsys) -> None:
    argv = ["train", "--algo", "maskable-ppo", "--budgets", *budgets, "--out", str(tmp_path / "o")]
    code, err = cli_exit(argv, capsys)
    assert code == 2 and message in err and err.startswith("diloco-gym: command line:")
    assert not (tmp_path / "o").exists()


def test_meta_records_the_resolved_config_and_the_file(tiny_run: Path, tmp_path) -> None:
    meta = json.loads((tiny_run / "meta.json").read_text())
    cfg = meta["config"]
    assert cfg["file"]["text"] == TINY_CONFIG
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


def test_resume_after_a_kill_after_the_last_checkpoint_writes_every_output(
    ppo_run: Path, tmp_path: Path, capsys
) -> None:
    """A run killed after it saved its last checkpoint (at the target) but before
    model.zip and the final meta.json: ``--resume`` finishes it without training."""
    out = copy_run(ppo_run, tmp_path / "run")
    for name in ("model.zip", "best_model.zip", "validation.csv", "validation.png"):
        (out / name).unlink(missing_ok=True)
    run_dir.write_start_meta(out, "ppo", "bursty", 3, "diloco-gym train")
    capsys.readouterr()
    args = ["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY, "--resume"]
    assert main(args) == 0
    assert run_dir.model_file_problem(out / "model.zip") is None
    assert (out / "validation.csv").is_file()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timesteps"] == 1024
    assert meta["resumed_from"].endswith("rl_model_1024_steps.zip")
    assert meta["final_validation"]["merges"] >= 1


def test_resume_of_a_complete_run_says_so_and_keeps_its_files(
    ppo_run: Path, tmp_path: Path, capsys
) -> None:
    out = copy_run(ppo_run, tmp_path / "run")
    model = (out / "model.zip").read_bytes()
    capsys.readouterr()
    args = ["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY, "--resume"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "complete run of 1024 timesteps" in printed and "nothing to train" in printed
    assert (out / "model.zip").read_bytes() == model
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["resumed_from"] is None
