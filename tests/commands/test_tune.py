"""The ``tune`` command (:mod:`diloco_gym.commands.tune`): bad option values fail with one
line and status 2; ``run`` checks the backend, loads the tune file and passes its options
to :func:`diloco_gym.scale.tune.run_tune` (replaced here: no trial runs), then prints the
best trial, the all-tied note and Ctrl-C's line."""

from __future__ import annotations

import pytest

from diloco_gym.cli import main

TUNE = """
name = "tiny"
timesteps = 256
eval_every = 128
grace_timesteps = 128
reduction_factor = 2
num_samples = 2
train_seeds = 2
validation_episodes = 2
n_envs = 2
seed = 1
[space]
learning_rate = { loguniform = [1e-4, 1e-3] }
n_steps = [64]
batch_size = 64
"""


@pytest.fixture
def tune_file(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(TUNE)
    return path


@pytest.fixture
def fake_tune(monkeypatch):
    """Replace run_tune (needs ray and SB3 to import): record the call, return ``result``."""
    pytest.importorskip("ray")
    pytest.importorskip("stable_baselines3")
    from diloco_gym.scale import tune as scale_tune

    state = {"result": None, "raises": None, "calls": []}

    def fake(spec, out, **kw):
        state["calls"].append((spec, out, kw))
        if state["raises"] is not None:
            raise state["raises"]
        return state["result"]

    monkeypatch.setattr(scale_tune, "run_tune", fake)
    return state


def _result(**kw):
    res = {"trials": 4, "errored": 1, "metric": 1.23456, "config": {"learning_rate": 0.001}}
    return {**res, "best_dir": "out/best", **kw}


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--jobs", "0"], "argument --jobs: must be >= 1, got 0"),
        (["--jobs", "-1"], "argument --jobs: must be >= 1, got -1"),
        (["--jobs", "one"], "argument --jobs: not an integer: 'one'"),
        (["--backend", "serial"], "argument --backend: invalid choice: 'serial'"),
    ],
)
def test_bad_option_values_are_argparse_usage_errors(extra, wanted, tune_file, fails):
    line = fails(["tune", str(tune_file), *extra], 2)
    assert line.startswith("diloco-gym tune: error: ") and wanted in line
    assert line.endswith("(see: diloco-gym tune --help)")


def test_a_missing_or_bad_tune_file_is_a_usage_error(tmp_path, fake_tune, fails):
    missing = tmp_path / "none.toml"
    assert fails(["tune", str(missing)], 2) == f"diloco-gym: {missing}: no such tune file"
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n')
    assert fails(["tune", str(bad)], 2) == (
        f"diloco-gym: {bad}: [space] must be a table of at least one hyperparameter"
    )
    assert fake_tune["calls"] == []


def test_run_passes_the_options_and_prints_the_best_trial(tune_file, fake_tune, capsys):
    fake_tune["result"] = _result()
    argv = ["tune", str(tune_file), "--out", "o", "--jobs", "1", "--no-progress"]
    assert main([*argv, "--ray-address", "auto"]) == 0
    ((spec, out, kw),) = fake_tune["calls"]
    assert spec["name"] == "tiny" and out == "o"
    assert kw == {"jobs": 1, "ray_address": "auto", "progress": False}
    assert capsys.readouterr().out.splitlines() == [
        "tune tiny: 4 trials, 1 errored; best validation sync-excess 1.235 % with "
        "{'learning_rate': 0.001}",
        "best model: out/best/ (use: diloco-gym report --agent out/best)",
    ]


def test_all_tied_trials_get_a_note_and_the_default_out(tune_file, fake_tune, capsys):
    fake_tune["result"] = _result(all_tied=True)
    assert main(["tune", str(tune_file)]) == 0
    assert fake_tune["calls"][0][1] == "tune-tiny"
    assert fake_tune["calls"][0][2]["progress"] is True
    out = capsys.readouterr().out
    assert "note: all 3 finished trials scored the same (1.23456 %)" in out


def test_ctrl_c_says_no_model_was_saved(tune_file, fake_tune, fails):
    fake_tune["raises"] = KeyboardInterrupt()
    assert fails(["tune", str(tune_file)], 130) == "diloco-gym: interrupted; no best model saved"
