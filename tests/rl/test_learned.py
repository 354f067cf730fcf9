"""Learned agents: training through the CLI, save/load, determinism, errors, seeds."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from diloco_gym.agents.learned import (  # noqa: E402
    REFERENCE_MODEL,
    LearnedAgent,
    load_learned_agent,
    reference_model_path,
)
from diloco_gym.agents.registry import make_agent, make_agents  # noqa: E402
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402
from diloco_gym.rl import train as tr  # noqa: E402

TINY = [
    "--timesteps",
    "1024",
    "--n-envs",
    "2",
    "--eval-episodes",
    "2",
    "--eval-freq",
    "512",
    "--checkpoint-freq",
    "512",
    "--no-progress",
]


def _observations(n: int = 64) -> np.ndarray:
    env = DiLoCoSyncEnv("bursty")
    rng = np.random.default_rng(0)
    obs = []
    for seed in (3, 4):
        o, _ = env.reset(seed=seed)
        while len(obs) < n * seed // 4:
            obs.append(o)
            o, _, _, truncated, _ = env.step(int(rng.integers(2)))
            if truncated:
                break
    obs = np.array(obs, dtype=np.float32)
    # plus random points of the observation space, to compare policies off-trajectory
    space = env.observation_space
    space.seed(0)
    return np.concatenate([obs, np.array([space.sample() for _ in range(16)])])


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ppo")
    assert main(["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY]) == 0
    return out


def test_cli_train_writes_model_meta_logs_checkpoints(ppo_run: Path) -> None:
    assert (ppo_run / "model.zip").is_file()
    assert (ppo_run / "best_model.zip").is_file()
    assert any((ppo_run / "tb").rglob("events.out.tfevents*"))
    assert tr.latest_checkpoint(ppo_run).name == "rl_model_1024_steps.zip"
    meta = json.loads((ppo_run / "meta.json").read_text())
    assert meta["algo"] == "ppo" and meta["regime"] == "bursty" and meta["seed"] == 3
    assert meta["timesteps"] >= 1024
    assert meta["env_params"]["h_max_steps"] == 512
    assert "stable_baselines3" in meta["versions"] and "torch" in meta["versions"]
    assert meta["final_validation"]["merges"] >= 1


def test_save_load_round_trip_same_actions(ppo_run: Path, tmp_path: Path) -> None:
    agent = load_learned_agent(ppo_run / "model.zip")
    assert agent.name == "ppo:model" and agent.meta["regime"] == "bursty"
    obs = _observations()
    a1 = agent.predict(obs)[0]
    trusted = load_learned_agent(ppo_run / "model.zip", trust=True)  # SB3's own loader
    np.testing.assert_array_equal(a1, trusted.predict(obs)[0])
    trusted.model.save(tmp_path / "copy.zip")
    again = load_learned_agent(tmp_path / "copy.zip")  # no meta.json: algo from the zip
    assert again.name == "ppo:copy"
    np.testing.assert_array_equal(a1, again.predict(obs)[0])
    # single observations agree with the batch
    assert [int(agent.predict(o)[0]) for o in obs[:8]] == list(a1[:8])


def test_same_seed_same_model(ppo_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    assert main(["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY]) == 0
    obs = _observations()
    a = load_learned_agent(ppo_run / "model.zip")
    b = load_learned_agent(out / "model.zip")
    np.testing.assert_array_equal(a.predict(obs)[0], b.predict(obs)[0])
    pa = a.model.policy.state_dict()
    pb = b.model.policy.state_dict()
    for k in pa:
        np.testing.assert_array_equal(pa[k].numpy(), pb[k].numpy())


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


@pytest.mark.parametrize("algo", ["maskable-ppo", "dqn"])
def test_other_algorithms_train_and_load(algo: str, tmp_path: Path) -> None:
    pytest.importorskip("sb3_contrib")
    assert main(["train", "--algo", algo, "--seed", "0", "--out", str(tmp_path), *TINY]) == 0
    agent = make_agent(str(tmp_path / "model.zip"))
    assert isinstance(agent, LearnedAgent) and agent.meta["algo"] == algo
    r = run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)
    assert r["merges"] >= 1


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.zip"
    with pytest.raises(FileNotFoundError, match="nope.zip"):
        load_learned_agent(missing)
    with pytest.raises(SystemExit, match="not found"):
        main(["run", "--agent", str(missing), "--seeds", "2"])


def test_corrupt_model_is_a_clear_error(ppo_run: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match=r"junk\.zip is not a valid model"):
        load_learned_agent(junk)
    truncated = tmp_path / "truncated.zip"
    data = (ppo_run / "model.zip").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"truncated\.zip is not a valid model"):
        load_learned_agent(truncated)
    empty_zip = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty_zip, "w") as zf:
        zf.writestr("hello.txt", "not a model")
    with pytest.raises(ValueError, match=r"empty\.zip is not a valid model"):
        load_learned_agent(empty_zip)


def test_unsafe_weights_error_gives_no_unsafe_advice(tmp_path: Path) -> None:
    """Weights that hold a pickled Python object: PyTorch's safe loader refuses them and
    advises retrying with weights_only=False; that advice (code execution from a file of
    unknown origin) must not reach the user."""
    import argparse
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": argparse.Namespace(a=1)}, buf)
    bad = tmp_path / "pickled.zip"
    with zipfile.ZipFile(REFERENCE_MODEL) as zin, zipfile.ZipFile(bad, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, buf.getvalue() if name == "policy.pth" else zin.read(name))
    with pytest.raises(ValueError) as err:
        load_learned_agent(bad)
    msg = str(err.value)
    assert "pickled.zip is not a valid model" in msg
    assert "argparse.Namespace" in msg and "tensors only" in msg
    for unsafe in ("weights_only", "add_safe_globals", "safe_globals", "trusted source"):
        assert unsafe not in msg
    assert "\n" not in msg and "\x1b" not in msg


def test_train_and_eval_seeds_are_disjoint() -> None:
    env = tr.TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=0)
    for s in [0, 1, 19, 5, None, None, None]:
        _, info = env.reset(seed=s)
        assert tr.TRAIN_SEED_LOW <= info["episode_seed"] < tr.TRAIN_SEED_HIGH
    assert env.episode_seeds and min(env.episode_seeds) >= tr.HELD_OUT_SEED_HIGH
    # the report's default seeds and the validation seeds are held out
    assert 0 + 20 <= tr.VALIDATION_SEED0 < tr.HELD_OUT_SEED_HIGH
    with pytest.raises(ValueError, match="held out"):
        tr.HeldOutEvalCallback(DiLoCoSyncEnv("bursty"), [tr.TRAIN_SEED_LOW], 1, None)


def test_train_seed_wrapper_is_reproducible() -> None:
    a = tr.TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=7)
    b = tr.TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=None)
    for env in (a, b):
        env.reset(seed=7)
        env.reset()
    assert a.episode_seeds == b.episode_seeds


def test_reference_agent_loads_and_runs() -> None:
    if not REFERENCE_MODEL.is_file():
        pytest.skip("reference model not shipped")
    assert REFERENCE_MODEL.stat().st_size < 1_000_000
    agent = load_learned_agent(REFERENCE_MODEL)
    assert agent.name == "ppo:model" and agent.deployable
    meta = json.loads(REFERENCE_MODEL.with_name("meta.json").read_text())
    assert meta["regime"] == "bursty"
    r = run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)
    assert r["merges"] >= 1 and np.isfinite(r["sync_excess_pct"])
    assert make_agent(str(REFERENCE_MODEL)).name == agent.name
    ref = make_agent("reference-ppo")
    assert ref.name == "reference-ppo" and ref.path == REFERENCE_MODEL.resolve()
    assert run_episode(DiLoCoSyncEnv("bursty"), ref, seed=0) == r


def _copy_model(dst: Path) -> Path:
    dst.mkdir(parents=True)
    (dst / "model.zip").write_bytes(REFERENCE_MODEL.read_bytes())
    return dst / "model.zip"


def test_learned_agents_get_unique_names(tmp_path: Path, monkeypatch) -> None:
    """Two models of the same algorithm and regime used to share a name (one vanished from
    the summary); now each is named from its path, parents added only when needed."""
    a = _copy_model(tmp_path / "runs" / "ppo")
    b = _copy_model(tmp_path / "other" / "ppo")
    monkeypatch.chdir(tmp_path)
    agents = make_agents([str(REFERENCE_MODEL), "runs/ppo/model.zip", "wa-diloco"])
    assert [x.name for x in agents] == ["ppo:reference/model", "ppo:ppo/model", "wa-diloco"]
    assert [x.name for x in make_agents(["runs/ppo/model.zip"])] == ["ppo:model"]
    names = [x.name for x in make_agents([str(a), str(b), "reference-ppo"])]
    assert names == ["ppo:runs/ppo/model", "ppo:other/ppo/model", "reference-ppo"]
    assert len({x.name for x in make_agents(["runs/ppo", str(b)])}) == 2  # a directory


def test_the_same_agent_twice_is_refused(tmp_path: Path, monkeypatch) -> None:
    _copy_model(tmp_path / "runs" / "ppo")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'wa-diloco' is given twice"):
        make_agents(["wa-diloco", "fixed-256", "wa-diloco"])
    with pytest.raises(ValueError, match="given twice \\(the same model as 'runs/ppo'\\)"):
        make_agents(["runs/ppo", "runs/ppo/model.zip"])
    with pytest.raises(ValueError, match="the same model as 'reference-ppo'"):
        make_agents(["reference-ppo", str(REFERENCE_MODEL)])
    with pytest.raises(SystemExit, match="given twice"):
        main(
            [
                "report",
                "--regimes",
                "bursty",
                "--agents",
                "fixed-256",
                "--agent",
                "runs/ppo/model.zip",
                "--agent",
                "./runs/ppo/model.zip",
                "--seeds",
                "2",
                "--out",
                str(tmp_path / "rep"),
                "--no-progress",
            ]
        )
    assert not (tmp_path / "rep").exists()


@pytest.mark.slow
def test_reference_agent_works_from_any_directory(tmp_path: Path) -> None:
    """The registry name loads the package data, whatever the working directory."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "from diloco_gym.agents.registry import make_agent\n"
        "from diloco_gym.envs.env import DiLoCoSyncEnv\n"
        "from diloco_gym.eval.rollout import run_episode\n"
        "a = make_agent('reference-ppo')\n"
        "r = run_episode(DiLoCoSyncEnv('bursty'), a, 0)\n"
        "print(a.name, a.path, r['merges'])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    name, path, merges = out.stdout.split()
    assert name == "reference-ppo" and Path(path) == reference_model_path().resolve()
    assert int(merges) >= 1
    # The relative path only works from the repository root: a clear error elsewhere.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diloco_gym.cli",
            "run",
            "--agent",
            "agents/reference/model.zip",
            "--seeds",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "model file not found" in out.stderr


def test_reference_agent_is_package_data() -> None:
    """pyproject ships every layer of the package, and the agents package with the reference
    model and its metadata."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    setuptools = pytest.importorskip("setuptools")
    found = set(
        setuptools.find_namespace_packages(
            where=str(root), include=conf["packages"]["find"]["include"]
        )
    )
    layers = {f"diloco_gym.{layer}" for layer in ("sim", "envs", "eval", "rl", "live", "scale")}
    assert {"diloco_gym", "diloco_gym.agents", "diloco_gym.agents.reference"} | layers <= found
    shipped = {
        f
        for pattern in conf["package-data"]["diloco_gym.agents"]
        for f in (root / "agents").glob(pattern)
    }
    for name in ("model.zip", "meta.json", "README.md"):
        assert root / "agents" / "reference" / name in shipped


@pytest.mark.slow
def test_only_the_train_and_calibrate_commands_import_torch() -> None:
    """``report``, ``run`` and ``--help`` build their parsers without the RL stack (it costs
    seconds to import); ``train`` still gets all its options."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom diloco_gym.cli import build_parser\n"
        "p = build_parser({cmd!r})\n{parse}\n"
        "print('stable_baselines3' in sys.modules, 'torch' in sys.modules)"
    )
    for cmd, parse, want in [
        ("report", "p.parse_args(['report', '--seeds', '2'])", "False False"),
        ("", "", "False False"),
        (
            "train",
            "a = p.parse_args(['train', '--algo', 'dqn', '--timesteps', '5'])\n"
            "assert a.algo == 'dqn' and a.timesteps == 5",
            "True True",
        ),
    ]:
        out = subprocess.run(
            [sys.executable, "-c", probe.format(cmd=cmd, parse=parse)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("\n")[-2] == want, (cmd, out.stdout)


# ----------------------------------------------------------------- run directories, summary
SMALL = [
    "--timesteps",
    "256",
    "--n-envs",
    "1",
    "--eval-episodes",
    "1",
    "--eval-freq",
    "0",
    "--checkpoint-freq",
    "128",
    "--no-progress",
]


def _exit_code(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return int(exc.value.code), err


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_train_refuses_an_existing_run(ppo_run: Path, tmp_path: Path, capsys) -> None:
    out = _copy_run(ppo_run, tmp_path / "run")
    before = (out / "model.zip").read_bytes()
    code, err = _exit_code(["train", "--algo", "dqn", "--out", str(out), *SMALL], capsys)
    assert code == 2 and "--resume" in err and "--force" in err
    assert (out / "model.zip").read_bytes() == before
    assert json.loads((out / "meta.json").read_text())["algo"] == "ppo"


def test_resume_checks_the_algorithm_and_needs_a_run(ppo_run: Path, tmp_path: Path, capsys) -> None:
    out = _copy_run(ppo_run, tmp_path / "run")
    code, err = _exit_code(
        ["train", "--algo", "dqn", "--resume", "--out", str(out), *SMALL], capsys
    )
    assert code == 2 and "is a ppo run" in err and "AttributeError" not in err
    code, err = _exit_code(
        ["train", "--algo", "ppo", "--regime", "sync-heavy", "--resume", "--out", str(out), *SMALL],
        capsys,
    )
    assert code == 2 and "--regime" in err
    code, err = _exit_code(["train", "--resume", "--out", str(tmp_path / "none"), *SMALL], capsys)
    assert code == 2 and "no training run" in err
    assert not (tmp_path / "none").exists()
    code, err = _exit_code(["train", "--resume", "--force", "--out", str(out), *SMALL], capsys)
    assert code == 2


def test_train_never_writes_into_a_directory_of_other_files(tmp_path: Path, capsys) -> None:
    (tmp_path / "model.zip").write_text("someone else's")
    code, err = _exit_code(["train", "--force", "--out", str(tmp_path), *SMALL], capsys)
    assert code == 2 and "not a diloco-gym training run" in err
    assert (tmp_path / "model.zip").read_text() == "someone else's"


def test_force_replaces_the_run_files_only_and_prints_the_comparison(
    ppo_run: Path, tmp_path: Path, capsys
) -> None:
    out = _copy_run(ppo_run, tmp_path / "run")
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--algo", "dqn", "--force", "--out", str(out), *SMALL]) == 0
    captured = capsys.readouterr()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["algo"] == "dqn" and meta["status"] == "complete"
    assert (out / "notes.txt").read_text() == "mine"
    assert tr.latest_checkpoint(out).name == "rl_model_256_steps.zip"  # old ones removed
    assert not (out / "checkpoints" / "rl_model_1024_steps.zip").exists()
    # validation next to fixed-512 and matched random, in merges/h
    lines = captured.out.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.startswith("validation")) :]
    assert "merges/h" in table[1]
    for label in ("dqn:model", "fixed-512", "matched random"):
        row = next(ln for ln in table if ln.strip().startswith(label))
        assert float(row.split()[-1]) > 0 and float(row.split()[-2]) >= 0
    cmp = meta["validation_comparison"]
    assert cmp["seeds"] == [tr.VALIDATION_SEED0]
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
        m.setattr(tr.HeldOutEvalCallback, "evaluate", killed)
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


class _Never:
    name = "never"

    def predict(self, obs, **kwargs):
        return np.array([0]), None


def test_a_policy_that_never_merges_is_flagged() -> None:
    from diloco_gym.agents.registry import make_agent

    seeds = [tr.VALIDATION_SEED0, tr.VALIDATION_SEED0 + 1]
    never = tr.validation_comparison(_Never(), "bursty", seeds, draws=20)
    assert never["chosen_merges"] == 0
    assert never["agent"]["merges_per_hour"] > 0  # the forced merges
    assert never["same_schedules_as_fixed_512"] == 2
    assert never["agent"]["sync_excess_pct"] == pytest.approx(never["fixed-512"]["sync_excess_pct"])
    _, warnings = tr.format_comparison(never)
    assert len(warnings) == 1 and "never chose to merge" in warnings[0]
    busy = tr.validation_comparison(make_agent("fixed-256"), "bursty", seeds, draws=20)
    assert busy["chosen_merges"] > 0 and busy["same_schedules_as_fixed_512"] == 0
    assert tr.format_comparison(busy)[1] == []


BUDGET_REFERENCES = [
    ("reference-budget-bursty", "budget-bursty"),
    ("reference-budget-non-periodic", "budget-non-periodic"),
    ("reference-budget-mixed", "budget-mixed"),
]


@pytest.mark.parametrize(("name", "folder"), BUDGET_REFERENCES)
def test_budget_reference_agents_ship_with_config_command_and_curve(name, folder) -> None:
    """Each shipped budget-conditioned agent: package data (model, meta, config, README,
    validation curve), trained from the config file in its folder, and loaded by name as a
    budget-aware agent that holds every budget of the frontier's grid."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    ref = root / "agents" / "reference"
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = {f for p in conf["package-data"]["diloco_gym.agents"] for f in ref.parent.glob(p)}
    files = ("model.zip", "meta.json", "config.toml", "validation.csv", "validation.png")
    for f in files:
        assert ref / folder / f in shipped, f
    meta = json.loads((ref / folder / "meta.json").read_text())
    assert meta["config"]["file"]["text"] == (ref / folder / "config.toml").read_text()
    assert meta["command"].startswith(f"diloco-gym train --config agents/reference/{folder}/")
    assert meta["status"] == "complete" and meta["algo"] == "maskable-ppo"
    assert f"`{name}`" in (ref / "README.md").read_text()
    from diloco_gym.agents.registry import is_budget_aware_spec

    assert is_budget_aware_spec(name)  # frontier --agent runs it on the grid only
    agent = make_agent(name)
    assert agent.name == name and agent.budget_aware
    for m in (8, 12, 24):
        res = run_episode(DiLoCoSyncEnv("bursty", merge_budget=m), agent, seed=1)
        assert res["merges"] == m
    again = run_episode(DiLoCoSyncEnv("bursty", merge_budget=24), make_agent(name), seed=1)
    assert again == res  # deterministic


def test_a_missing_rl_extra_is_named_not_blamed_on_the_file(monkeypatch) -> None:
    """Without stable-baselines3 (no 'rl' extra) the shipped model is a valid file: the
    error names the missing extra, not the model."""
    import diloco_gym.agents.learned as learned

    def no_rl(algo: str):
        raise ImportError(f"No module named 'stable_baselines3' ({algo})")

    monkeypatch.setattr(learned, "_model_class", no_rl)
    # The safe loader imports the policy classes itself: hide them too.
    for mod in ("stable_baselines3.common.policies", "sb3_contrib.common.maskable.policies"):
        monkeypatch.setitem(sys.modules, mod, None)
    for trust in (False, True):
        with pytest.raises(
            ValueError, match=r"needs the 'rl' extra \(pip install 'diloco-gym\[rl\]'\)"
        ):
            learned.load_learned_agent(str(learned.reference_model_path()), trust=trust)
