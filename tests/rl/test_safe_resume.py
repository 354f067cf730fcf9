"""``diloco-gym train --resume`` rebuilds its checkpoint without unpickling
(:func:`diloco_gym.agents.safe_model.load_model_safely`): a crafted checkpoint's pickles
never run, one the safe loader cannot rebuild is refused naming the file and
``--trust-model-file``, and a genuine one is restored as stable-baselines3's own loader
restores it."""

from __future__ import annotations

import base64
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from rl_helpers import TINY, cli_exit_one_line, copy_run  # noqa: E402

from diloco_gym.cli import main  # noqa: E402
from diloco_gym.rl import run_dir  # noqa: E402


class _Payload:
    """Unpickling this writes ``canary``: what a malicious checkpoint would do."""

    def __init__(self, canary: Path) -> None:
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('ran')",))


def _poison(ckpt: Path, canary: Path, evil_policy: bool = False) -> None:
    """Replace every pickle in the checkpoint's ``data`` with the payload (and, with
    ``evil_policy``, name a policy class the safe loader does not know)."""
    with zipfile.ZipFile(ckpt) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    data = json.loads(members["data"])
    blob = base64.b64encode(pickle.dumps(_Payload(canary))).decode()
    for value in data.values():
        if isinstance(value, dict) and ":serialized:" in value:
            value[":serialized:"] = blob
    if evil_policy:
        data["policy_class"]["__module__"] = "evil.policies"
    members["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(ckpt, "w") as zf:
        for name, raw in members.items():
            zf.writestr(name, raw)


def _args(out: Path, timesteps: str = "1280") -> list[str]:
    args = ["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY, "--resume"]
    args[args.index("1024")] = timesteps
    return args


def test_resume_never_runs_the_pickles_of_a_checkpoint(ppo_run: Path, tmp_path: Path) -> None:
    """Pickles replaced by a payload, the JSON left as it was: the run resumes from the
    JSON and the tensors, and the payload never runs (stable-baselines3's loader ran it)."""
    out = copy_run(ppo_run, tmp_path / "run")
    canary = tmp_path / "canary.txt"
    _poison(out / "checkpoints" / "rl_model_1024_steps.zip", canary)
    assert main(_args(out)) == 0
    assert not canary.exists()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["resumed_from"].endswith("rl_model_1024_steps.zip")
    assert meta["timesteps"] >= 1280 and meta["status"] == "complete"


def test_resume_refuses_a_checkpoint_it_cannot_rebuild(ppo_run: Path, tmp_path: Path, capsys):
    out = copy_run(ppo_run, tmp_path / "run")
    canary = tmp_path / "canary.txt"
    ckpt = out / "checkpoints" / "rl_model_1024_steps.zip"
    _poison(ckpt, canary, evil_policy=True)
    capsys.readouterr()
    code, err = cli_exit_one_line(_args(out), capsys)
    assert code == 1 and not canary.exists()
    assert f"--resume: {ckpt} cannot be restored without unpickling: unknown policy class" in err
    assert "pass --trust-model-file" in err
    assert not (out / "checkpoints" / "rl_model_1280_steps.zip").exists()
    # The test can fail: with the flag, stable-baselines3's loader runs the payload, and a
    # warning names the file it trusted.
    with pytest.raises(BaseException):  # noqa: B017 - whatever the payload left behind
        main([*_args(out), "--trust-model-file"])
    assert canary.read_text() == "ran"
    assert f"--trust-model-file: loading {ckpt} with" in capsys.readouterr().err


def _fresh(algo: str, seed: int):
    from diloco_gym.agents.learned import _model_class
    from diloco_gym.rl.sb3 import SB3VecEnv

    venv = SB3VecEnv(num_envs=2, regime="bursty")
    venv.seed(seed)
    extra = (
        {"learning_starts": 32, "buffer_size": 2_000, "train_freq": 4, "batch_size": 16}
        if algo == "dqn"
        else {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "clip_range": 0.15}
    )
    hp = {**extra, "learning_rate": 1e-3, "gamma": 0.99, "policy_kwargs": {"net_arch": [16, 8]}}
    model = _model_class(algo)("MlpPolicy", venv, seed=seed, device="cpu", **hp)
    return model, venv, hp


def _state(model) -> dict[str, np.ndarray]:
    out = {k: v.detach().numpy().copy() for k, v in model.policy.state_dict().items()}
    opt = model.policy.optimizer.state_dict()
    for i, st in opt["state"].items():
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = np.asarray(v)
    return out


@pytest.mark.parametrize("algo", ["ppo", "maskable-ppo", "dqn"])
def test_the_safe_rebuild_resumes_as_sb3s_loader_does(algo: str, tmp_path: Path) -> None:
    """Weights, optimizer state, counters and hyperparameters as SB3's loader restores
    them, and training continued from both gives the same weights."""
    from diloco_gym.agents.learned import _model_class
    from diloco_gym.agents.safe_model import load_model_safely

    model, venv, hp = _fresh(algo, 5)
    model.learn(192)
    path = tmp_path / "ckpt.zip"
    model.save(path)
    trusted = _model_class(algo).load(path, env=venv, device="cpu")
    safe = load_model_safely(path, algo, venv, hp, seed=5)
    a, b = _state(trusted), _state(safe)
    assert a.keys() == b.keys() and any(k.startswith("opt.") for k in a)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for name in ("num_timesteps", "_n_updates", "_episode_num", "learning_rate", "gamma"):
        assert getattr(safe, name) == getattr(trusted, name) == getattr(model, name), name
    assert safe.num_timesteps >= 192
    if algo == "dqn":
        for name in ("learning_starts", "buffer_size", "_n_calls", "exploration_rate"):
            assert getattr(safe, name) == getattr(trusted, name), name
        assert safe.train_freq == trusted.train_freq
    else:
        assert safe.n_steps == trusted.n_steps == 64
        assert safe.clip_range(1.0) == trusted.clip_range(1.0) == 0.15
    for m in (trusted, safe):
        m.set_random_seed(11)
        venv.seed(11)
        m.learn(128, reset_num_timesteps=False)
    a, b = _state(trusted), _state(safe)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert not all(np.array_equal(a[k], v) for k, v in _state(model).items())  # it trained


def test_the_safe_rebuild_refuses_what_does_not_fit_the_run(tmp_path: Path) -> None:
    from diloco_gym.agents.safe_model import UnsafeModelError, load_model_safely

    model, venv, hp = _fresh("ppo", 1)
    path = tmp_path / "ckpt.zip"
    model.save(path)
    with pytest.raises(UnsafeModelError, match=r"it holds a ppo policy, not a dqn one"):
        load_model_safely(path, "dqn", venv, hp, seed=1)
    with pytest.raises(UnsafeModelError, match=r"n_steps 64 is not the run's 128"):
        load_model_safely(path, "ppo", venv, {**hp, "n_steps": 128}, seed=1)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        for name, raw in members.items():
            zf.writestr(name, members["policy.pth"] if name == "policy.optimizer.pth" else raw)
    with pytest.raises(UnsafeModelError, match=r"bad\.zip .*policy\.optimizer\.pth"):
        load_model_safely(bad, "ppo", venv, hp, seed=1)
    assert run_dir.model_file_problem(path) is None


def test_a_dqn_replay_buffer_is_read_only_with_the_flag(tmp_path: Path, capsys) -> None:
    """A replay buffer file is a pickle: ``--resume`` leaves it unread (saying so) and the
    run continues with an empty buffer; its payload never runs."""
    from rl_helpers import SMALL

    out = tmp_path / "run"
    assert main(["train", "--algo", "dqn", "--out", str(out), *SMALL]) == 0
    buffer = out / "checkpoints" / "rl_model_replay_buffer_256_steps.pkl"
    assert buffer.is_file()
    canary = tmp_path / "canary.txt"
    buffer.write_bytes(pickle.dumps(_Payload(canary)))
    capsys.readouterr()
    args = ["train", "--algo", "dqn", "--out", str(out), *SMALL, "--resume"]
    args[args.index("256")] = "384"
    assert main(args) == 0
    assert not canary.exists()
    assert f"{buffer} is not loaded (a replay buffer file is a pickle" in capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timesteps"] >= 384
