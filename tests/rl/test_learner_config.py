"""``[env] learner_calibration`` of a training config: checked before training, given to
every training and validation env (each vector env kind), recorded in meta.json."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")

from learner_cals import SHORT_DRIFT_OVERHEAD  # noqa: E402
from rl_helpers import cli_exit_one_line, write_config  # noqa: E402

from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.rl.command import add_train_arguments, resolve_config, run_layout  # noqa: E402
from diloco_gym.rl.config import ENV_KEYS, TRAIN_KEYS  # noqa: E402
from diloco_gym.rl.train_envs import make_vec_env, regime_spec  # noqa: E402
from diloco_gym.rl.validation import eval_envs  # noqa: E402
from diloco_gym.sim.learner_calibration import learner_params  # noqa: E402
from diloco_gym.sim.learners import LearnerParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAL = SHORT_DRIFT_OVERHEAD
CALIBRATED = learner_params(CAL)


def _cal_doc(**params) -> dict:
    return {
        "format": "diloco-gym-learner-calibration/1",
        "params": {**CAL.to_dict(), **params},
        "env_mapping": {"env_steps_per_inner_step": 32, "step_seconds": 0.14},
    }


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """``tmp_path`` as the working directory, holding ``lc.json`` (the calibration)."""
    (tmp_path / "lc.json").write_text(json.dumps(_cal_doc()), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _resolve(config: Path):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return resolve_config(parser.parse_args(["--config", str(config)]))


def _env_learners(vec) -> list[LearnerParams]:
    """The learner model of every env of a vector env from :func:`make_vec_env`."""
    native = getattr(getattr(vec, "venv", None), "venv", None)
    if native is not None and hasattr(native, "learner_params"):
        return [native.learner_params] * vec.num_envs
    return list(vec.get_attr("learner_params"))  # from each env (a subprocess's too)


def test_the_calibration_differs_from_the_default_learners():
    # the checks below could not tell the two apart otherwise
    assert CALIBRATED.drift_s != LearnerParams().drift_s
    assert CALIBRATED.loss_floor != LearnerParams().loss_floor


@pytest.mark.parametrize(
    ("train", "env", "kind"),
    [
        ("", "", "native"),  # one plain regime: the batched native vector env
        ("", "budgets_per_hour = [60, 96]\n", "dummy"),  # env kinds with budgets
        ('vec_env = "subproc"\nn_envs = 1\n', "", "subproc"),  # an env in another process
    ],
)
def test_every_training_and_validation_env_uses_the_learner_calibration(in_tmp, train, env, kind):
    text = f'[train]\n{train}[env]\nlearner_calibration = "lc.json"\n{env}'
    config = write_config(in_tmp, text)
    cfg = _resolve(config)
    # relative to the working directory, as calibration and trace are
    assert cfg.learner_calibration == "lc.json"
    assert cfg.env_kwargs()["learner_calibration"] == str(in_tmp / "lc.json")
    assert "learner_calibration" not in cfg.env_params  # the EnvParams overrides only
    specs, vec_env, n_envs = run_layout(cfg)
    assert vec_env == kind
    kinds = specs if specs is not None else [regime_spec(cfg.regimes[0])]
    vec = make_vec_env(vec_env, kinds, 0, n_envs, cfg.env_kwargs(), cfg.observation)
    try:
        assert _env_learners(vec) == [CALIBRATED] * n_envs
    finally:
        vec.close()
    val = eval_envs(specs, cfg.regimes[0], cfg.env_kwargs())
    for e in val.values() if isinstance(val, dict) else [val]:
        assert e.learner_params == CALIBRATED


def test_without_the_key_the_envs_keep_the_default_learners(in_tmp):
    cfg = _resolve(write_config(in_tmp, '[env]\nregime = "bursty"\n'))
    assert "learner_calibration" not in cfg.env_kwargs()
    assert run_layout(cfg)[:2] == (None, "native")
    vec = make_vec_env("native", [regime_spec("bursty")], 0, 2, cfg.env_kwargs())
    try:
        assert _env_learners(vec) == [LearnerParams()] * 2
    finally:
        vec.close()


def test_native_vector_env_with_a_calibration_matches_the_single_env(in_tmp):
    """The batched native env (the compiled kernels) follows the calibrated learner model
    exactly as the single env does: observations and the progress reward, step by step."""
    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    kw = {"regime": "bursty", "learner_calibration": "lc.json", "progress_weight": 0.5}
    venv = DiLoCoSyncVectorEnv(2, **kw)
    singles = [DiLoCoSyncEnv(**kw) for _ in range(2)]
    vobs, _ = venv.reset(seed=7)
    for i, e in enumerate(singles):
        assert e.reset(seed=7 + i)[0].tolist() == vobs[i].tolist()
    progress = 0.0
    for t in range(60):
        a = [(t + i) % 3 == 0 for i in range(2)]
        vobs, vrew, _, vtrunc, vinfo = venv.step([int(x) for x in a])
        for i, e in enumerate(singles):
            o, r, _, trunc, info = e.step(int(a[i]))
            assert vrew[i] == r and vobs[i].tolist() == o.tolist(), (t, i)
            progress += info["reward_terms"]["progress"]
            assert not trunc
    assert progress > 0  # the calibrated loss curve did pay a progress reward
    venv.close()


def test_a_tiny_run_records_the_learner_calibration_in_meta(in_tmp, capsys):
    config = write_config(
        in_tmp,
        "[train]\ntimesteps = 64\nn_envs = 1\neval_episodes = 1\neval_freq = 0\n"
        'checkpoint_freq = 0\n[env]\nlearner_calibration = "lc.json"\n'
        "[algo]\nn_steps = 64\nbatch_size = 32\nn_epochs = 1\n",
    )
    out = in_tmp / "run"
    assert main(["train", "--config", str(config), "--out", str(out), "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    path = str(in_tmp / "lc.json")
    assert meta["env_kwargs"]["learner_calibration"] == path
    assert meta["config"]["learner_calibration"] == "lc.json"
    sha = hashlib.sha256((in_tmp / "lc.json").read_bytes()).hexdigest()
    assert meta["config"]["learner_calibration_file"] == {"path": path, "sha256": sha}
    assert meta["learner_params"]["drift_s"] == pytest.approx(CAL.drift_s)
    assert LearnerParams(**meta["learner_params"]) == CALIBRATED
    # the recorded settings rebuild the same env
    rebuilt = DiLoCoSyncEnv(regime=meta["regime"], **meta["env_kwargs"])
    assert rebuilt.learner_params == CALIBRATED
    # --resume goes on only with the same learners
    plain = write_config(
        in_tmp,
        "[train]\ntimesteps = 64\nn_envs = 1\neval_episodes = 1\neval_freq = 0\n"
        "checkpoint_freq = 0\n[algo]\nn_steps = 64\nbatch_size = 32\nn_epochs = 1\n",
        name="plain.toml",
    )
    capsys.readouterr()  # the first run's output
    code, err = cli_exit_one_line(
        ["train", "--config", str(plain), "--out", str(out), "--resume", "--no-progress"],
        capsys,
    )
    assert code == 2
    assert f"--resume: {out} was trained with the learner calibration with sha256 {sha[:12]}" in err
    assert "cannot continue with the default learners" in err


def test_resume_checks_the_learners_the_run_recorded(tmp_path):
    from diloco_gym.rl.run_dir import check_run_dir

    out = tmp_path / "run"
    out.mkdir()
    meta = {"algo": "ppo", "regime": "bursty", "status": "training"}
    (out / "meta.json").write_text(json.dumps(meta))
    # an older run records no learner calibration: the default learners
    assert check_run_dir(out, "ppo", "bursty", resume=True, learners="") is None
    with pytest.raises(ValueError, match="trained with the default learners; it cannot"):
        check_run_dir(out, "ppo", "bursty", resume=True, learners="ab" * 32)
    meta["config"] = {"learner_calibration_file": {"path": "x", "sha256": "ab" * 32}}
    (out / "meta.json").write_text(json.dumps(meta))
    assert check_run_dir(out, "ppo", "bursty", resume=True, learners="ab" * 32) is None
    assert check_run_dir(out, "ppo", "bursty", resume=True) is None  # not checked
    with pytest.raises(ValueError, match="continue with the default learners"):
        check_run_dir(out, "ppo", "bursty", resume=True, learners="")


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (None, "missing.json: cannot read"),
        (json.dumps(_cal_doc(drift_steps=-1.0)), "field params.drift_steps"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_bad_learner_calibration_is_one_line_naming_the_config_and_key(
    tmp_path, capsys, write, message
):
    lc = tmp_path / ("missing.json" if write is None else "lc.json")
    if write is not None:
        lc.write_text(write, encoding="utf-8")
    config = write_config(tmp_path, f'[env]\nlearner_calibration = "{lc}"\n')
    out = tmp_path / "o"
    code, err = cli_exit_one_line(["train", "--config", str(config), "--out", str(out)], capsys)
    assert code == 2
    assert f"{config}: [env] learner_calibration: {lc}" in err, err
    assert message in err, err
    assert not out.exists()  # refused before anything is written


def test_an_empty_learner_calibration_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, '[env]\nlearner_calibration = ""\n')
    code, err = cli_exit_one_line(["train", "--config", str(config)], capsys)
    assert code == 2 and f"{config}: [env] learner_calibration must name a file" in err


def test_training_md_lists_every_config_key():
    text = (ROOT / "docs" / "training.md").read_text()
    rows = dict(re.findall(r"^\| `\[(\w+)\]` \| (.*) \|$", text, flags=re.M))
    for table, keys in (("train", TRAIN_KEYS), ("env", ENV_KEYS)):
        missing = [k for k in keys if f"`{k}`" not in rows[table]]
        assert not missing, f"docs/training.md's [{table}] row misses {missing}"
    from diloco_gym.rl import config

    assert "learner_calibration" in (config.__doc__ or "")
