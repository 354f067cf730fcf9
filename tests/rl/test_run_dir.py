"""Tests of :mod:`diloco_gym.rl.run_dir`: a run killed at any point can be resumed or
replaced, torn model files are found, checkpoints are written atomically."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from rl_helpers import (  # noqa: E402
    SMALL,
)

from diloco_gym import cli  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.rl import run_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _started_run(out: Path) -> None:
    """What a run killed before its first checkpoint leaves: the start meta.json (and tb/)."""
    out.mkdir(parents=True)
    run_dir.write_start_meta(out, "ppo", "bursty", 0, "diloco-gym train")
    (out / "tb").mkdir()


def _model_file(path: Path) -> Path:
    from stable_baselines3 import PPO

    PPO("MlpPolicy", DiLoCoSyncEnv("bursty"), n_steps=64, device="cpu").save(path)
    return path


def test_a_run_killed_before_its_first_checkpoint(tmp_path):
    out = tmp_path / "run"
    _started_run(out)
    with pytest.raises(FileExistsError) as err:
        run_dir.check_run_dir(out, "ppo", "bursty")
    msg = str(err.value)
    assert "stopped before its first checkpoint" in msg and "--force is safe" in msg
    assert "--resume starts it afresh" in msg
    assert run_dir.check_run_dir(out, "ppo", "bursty", resume=True) is None  # a fresh start
    # a run that completed but lost its files is not silently restarted
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(dict(meta, status="complete")))
    with pytest.raises(FileNotFoundError, match="--force replaces the run"):
        run_dir.check_run_dir(out, "ppo", "bursty", resume=True)


def test_model_file_problem_finds_torn_files(tmp_path):
    good = _model_file(tmp_path / "good.zip")
    assert run_dir.model_file_problem(good) is None
    data = good.read_bytes()
    torn = tmp_path / "torn.zip"
    torn.write_bytes(data[: len(data) // 2])
    assert run_dir.model_file_problem(torn) is not None  # detected, whichever way it is torn
    assert run_dir.model_file_problem(tmp_path / "missing.zip") is not None


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    out = tmp_path / "run"
    _started_run(out)
    ckpts = out / "checkpoints"
    ckpts.mkdir()
    older = _model_file(ckpts / "rl_model_128_steps.zip")
    data = older.read_bytes()
    latest = ckpts / "rl_model_256_steps.zip"
    latest.write_bytes(data[:1000])  # truncated by a kill while it was written
    assert run_dir.check_run_dir(out, "ppo", "bursty", resume=True) == older
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rl_model_256_steps.zip is damaged" in err[0]
    assert "continuing from rl_model_128_steps.zip" in err[0]
    older.write_bytes(data[:1000])
    with pytest.raises(FileNotFoundError, match="no intact checkpoint"):
        run_dir.check_run_dir(out, "ppo", "bursty", resume=True)


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    """The checkpoint is written to a hidden partial file and renamed: a save that dies
    half-way leaves no file under the checkpoint's name."""
    path = tmp_path / "rl_model_128_steps.zip"

    def dies(p: str) -> None:
        Path(p).write_bytes(b"PK half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_dir.save_atomic(dies, path)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    run_dir.save_atomic(lambda p: Path(p).write_bytes(b"complete"), path)
    assert path.read_bytes() == b"complete" and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.slow
def test_resume_after_a_kill_before_the_first_checkpoint(tmp_path, capsys):
    """``train`` killed by SIGKILL before it saved anything: a rerun with ``--resume``
    trains from scratch (it refused, and only ``--force`` recovered)."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "diloco_gym.cli", "train", "--out", str(out), *SMALL]
        + ["--timesteps", "100000", "--checkpoint-freq", "100000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out / "meta.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "meta.json").is_file() and not run_dir._has_saved_model(out)
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--out", str(out), *SMALL])
    assert exc.value.code == 2 and "--force is safe" in capsys.readouterr().err
    assert cli.main(["train", "--out", str(out), "--resume", *SMALL]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timesteps"] >= 256
    assert run_dir.model_file_problem(out / "model.zip") is None


def test_a_runs_meta_json_is_bounded_in_size_and_depth(tmp_path):
    out = tmp_path / "run"
    _started_run(out)
    meta = out / "meta.json"
    meta.write_text(json.dumps({"algo": "ppo", "regime": "bursty", "x": "y" * (17 * 2**20)}))
    with pytest.raises(ValueError, match=r"meta\.json: .*SETTINGS_BYTES"):
        run_dir.check_run_dir(out, "ppo", "bursty", resume=True)
    meta.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ValueError, match=r"meta\.json: .*nesting"):
        run_dir.read_meta(meta)


def test_a_checkpoint_whose_members_declare_too_many_bytes_is_damaged(tmp_path, monkeypatch):
    good = _model_file(tmp_path / "good.zip")
    assert run_dir.model_file_problem(good) is None
    monkeypatch.setenv("DILOCO_GYM_MAX_MODEL_BYTES", "4096")
    problem = run_dir.model_file_problem(good)
    assert problem is not None and "above the limit of 4,096" in problem
