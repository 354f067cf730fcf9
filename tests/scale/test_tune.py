"""diloco_gym/scale/tune.py: tune files (what a valid one parses to, one clear error per kind of
mistake, the file and the key named), the search space, and how the best trial is chosen. The
end-to-end search on Ray: tests/scale/test_scale.py. Needs stable-baselines3 (the algorithms'
hyperparameters), not Ray (except the search-space test)."""

from __future__ import annotations

import pytest

pytest.importorskip("stable_baselines3")

from diloco_gym.scale.tune import TuneFileError, load_tune  # noqa: E402

VALID = """
name = "search"
algo = "dqn"
regime = "ordinary"
timesteps = 5000
eval_every = 1000
grace_timesteps = 2000
reduction_factor = 2
num_samples = 3
train_seeds = 1
validation_episodes = 4
n_envs = 2
vec_env = "dummy"
seed = 7
[env]
decision_interval = 8
[space]
learning_rate = { loguniform = [1e-5, 1e-3] }
gamma = { uniform = [0.9, 0.99] }
batch_size = { choice = [32, 64] }
train_freq = { randint = [1, 8] }
exploration_fraction = [0.1, 0.2]
buffer_size = 10000
"""


def test_valid_tune_file(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(VALID)
    spec = load_tune(path)
    assert dict(spec) == {
        "name": "search",
        "algo": "dqn",
        "regime": "ordinary",
        "timesteps": 5000,
        "eval_every": 1000,
        "grace_timesteps": 2000,
        "reduction_factor": 2,
        "num_samples": 3,
        "train_seeds": 1,
        "validation_episodes": 4,
        "n_envs": 2,
        "vec_env": "dummy",
        "seed": 7,
        "env": {"decision_interval": 8},
        "space": {
            "learning_rate": {"loguniform": [1e-5, 1e-3]},
            "gamma": {"uniform": [0.9, 0.99]},
            "batch_size": {"choice": [32, 64]},
            "train_freq": {"randint": [1, 8]},
            "exploration_fraction": [0.1, 0.2],
            "buffer_size": 10000,
        },
        "path": str(path),
    }


def test_defaults_of_a_minimal_tune_file(tmp_path):
    path = tmp_path / "minimal.toml"
    path.write_text("[space]\ngamma = 0.99\n")
    spec = load_tune(path)
    assert spec["name"] == "minimal" and spec["algo"] == "ppo" and spec["regime"] == "bursty"
    assert (spec["timesteps"], spec["eval_every"], spec["grace_timesteps"]) == (
        100_000,
        10_000,
        20_000,
    )
    assert (spec["reduction_factor"], spec["num_samples"], spec["train_seeds"]) == (3, 8, 2)
    assert (spec["validation_episodes"], spec["n_envs"], spec["vec_env"], spec["seed"]) == (
        10,
        4,
        "native",
        0,
    )
    assert spec["env"] == {} and spec["space"] == {"gamma": 0.99}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[space]\n", "[space] must be a table of at least one hyperparameter"),
        ("env = 3\n[space]\ngamma = 0.99\n", "[env] must be a table"),
        ("timesteps = 'many'\n[space]\ngamma = 0.99\n", "timesteps must be int, got 'many'"),
        ("seed = true\n[space]\ngamma = 0.99\n", "seed must be int, got True"),
        ("algo = 'a2c'\n[space]\ngamma = 0.99\n", "unknown algo 'a2c'; valid: "),
        ("vec_env = 'gpu'\n[space]\ngamma = 0.99\n", "unknown vec_env 'gpu'; valid: "),
        ("n_envs = 0\n[space]\ngamma = 0.99\n", "n_envs must be >= 1, got 0"),
        ("reduction_factor = 1\n[space]\ngamma = 0.99\n", "reduction_factor must be >= 2, got 1"),
        ("[env]\nbogus = 1\n[space]\ngamma = 0.99\n", "[env]: "),
        ("[space]\ngamma = []\n", "[space]: gamma is an empty choice"),
        ("[space]\ngamma = { uniform = [1, 1] }\n", "gamma = {uniform = [1, 1]}: give [low, high]"),
        ("[space]\ngamma = { choice = [] }\n", "gamma = {choice = []}: give [low, high]"),
        ("[space]\ngamma = { uniform = 1 }\n", "gamma = {uniform = 1}: give [low, high]"),
        (
            '[space]\ngamma = { uniform = [0, "a"] }\n',
            "gamma = {uniform = [0, 'a']}: give [low, high]",
        ),
        (
            "[space]\ngamma = { uniform = [0, 1], choice = [1] }\n",
            "[space]: gamma must be one of {uniform | loguniform | choice | randint = [...]}",
        ),
        ("[space]\nseed = [1, 2]\n", "[space]: 'seed' is not a ppo hyperparameter; valid: "),
    ],
)
def test_bad_tune_file_messages(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TuneFileError) as info:
        load_tune(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_and_malformed_tune_files(tmp_path):
    with pytest.raises(TuneFileError, match=r"no such tune file"):
        load_tune(tmp_path / "absent.toml")
    path = tmp_path / "broken.toml"
    path.write_text("[space\n")
    with pytest.raises(TuneFileError, match=r"broken.toml: not valid TOML"):
        load_tune(path)


@pytest.mark.parametrize(
    "text, match",
    [
        ("algo = 'ppo'\n", r"\[space\] must be a table"),
        ("bogus = 1\n[space]\ngamma = 0.99\n", "unknown key 'bogus'"),
        ("[space]\nnot_a_param = [1, 2]\n", "'not_a_param' is not a ppo hyperparameter"),
        ("[space]\ngamma = { normal = [0, 1] }\n", "gamma must be one of"),
        ("[space]\nlearning_rate = { loguniform = [0, 1] }\n", "0 < low < high"),
        ("timesteps = 0\n[space]\ngamma = 0.99\n", "timesteps must be >= 1"),
        ("regime = 'nope'\n[space]\ngamma = 0.99\n", "unknown regime 'nope'"),
    ],
)
def test_bad_tune_file(tmp_path, text, match):
    pytest.importorskip("stable_baselines3")
    from diloco_gym.scale.tune import TuneFileError, load_tune

    cfg = tmp_path / "t.toml"
    cfg.write_text(text)
    with pytest.raises(TuneFileError, match=match) as exc:
        load_tune(cfg)
    assert str(cfg) in str(exc.value)


# --------------------------------------------------------------------------- results


def _result(metric: float | None, timesteps: int | None, error: str | None = None):
    from types import SimpleNamespace

    from diloco_gym.scale.tune import METRIC

    metrics = {} if metric is None else {METRIC: metric, "timesteps": timesteps}
    return SimpleNamespace(metrics=metrics, error=error)


def test_best_trial_is_the_best_of_the_furthest_rung():
    """A trial stopped early with a better metric does not win; errored ones are counted."""
    from diloco_gym.scale.tune import _best_result

    grid = [_result(1.0, 100), _result(5.0, 300), _result(3.0, 300), _result(None, None, "boom")]
    best, errored = _best_result(grid)
    assert best is grid[2] and errored == 1


def test_every_trial_failed_names_the_first_error():
    from diloco_gym.scale.tune import _best_result

    grid = [_result(None, None, "Traceback\n  ValueError: bad\n lr"), _result(None, None, "x")]
    with pytest.raises(RuntimeError) as info:
        _best_result(grid)
    assert str(info.value) == "every tune trial failed (2 errored): Traceback ValueError: bad lr"


def test_trials_that_all_score_the_same_are_reported_as_tied(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from diloco_gym.cli import main
    from diloco_gym.scale import tune

    def trial(score, error=None):
        return SimpleNamespace(error=error, metrics={} if error else {tune.METRIC: score})

    assert tune._all_tied([trial(9.72337), trial(9.72337)])
    assert tune._all_tied([trial(9.72337), trial(9.72337), trial(0, error="boom")])
    assert not tune._all_tied([trial(9.72337), trial(9.7)])
    assert not tune._all_tied([trial(9.72337)])  # one trial: nothing to tell apart

    cfg = tmp_path / "t.toml"
    cfg.write_text(
        '[train]\nregime = "bursty"\ntimesteps = 1000\n[search]\nlearning_rate = [1e-3, 3e-4]\n'
    )
    res = {"trials": 2, "errored": 0, "metric": 9.72337, "config": {}, "best_dir": tmp_path}
    for tied in (True, False):
        monkeypatch.setattr(tune, "run_tune", lambda *a, tied=tied, **k: {**res, "all_tied": tied})
        monkeypatch.setattr(tune, "load_tune", lambda path: {"name": "t"})
        assert main(["tune", str(cfg), "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert ("all 2 finished trials scored the same (9.72337 %)" in out) is tied
        assert "tune t: 2 trials, 0 errored" in out


# --------------------------------------------------------------------------- search space


@pytest.mark.parametrize(
    "dist",
    [
        "{ uniform = [true, 2] }",  # a bool is not a bound
        "{ loguniform = [-1e-3, 1e-2] }",
        "{ randint = [3, 3] }",
        "{ uniform = [2, 1] }",
        "{ uniform = [0, 1, 2] }",
    ],
)
def test_bad_distribution_arguments_name_the_hyperparameter(tmp_path, dist):
    path = tmp_path / "bad.toml"
    path.write_text(f"[space]\nlearning_rate = {dist}\n")
    with pytest.raises(TuneFileError) as info:
        load_tune(path)
    assert str(info.value).startswith(f"{path}: [space]: learning_rate = {{")
    assert "give [low, high]" in str(info.value)


def test_search_space_maps_each_entry_to_its_tune_domain():
    pytest.importorskip("ray.tune")
    from ray.tune.search import sample

    from diloco_gym.scale.tune import _search_space

    out = _search_space(
        {
            "lr": {"loguniform": [1e-5, 1e-3]},
            "gamma": {"uniform": [0.9, 0.99]},
            "batch": {"choice": [32, 64]},
            "freq": {"randint": [1, 8]},
            "frac": [0.1, 0.2],
            "buffer": 10000,
        }
    )
    assert isinstance(out["lr"], sample.Float) and (out["lr"].lower, out["lr"].upper) == (
        1e-5,
        1e-3,
    )
    assert isinstance(out["lr"].get_sampler(), sample.LogUniform)
    assert isinstance(out["gamma"].get_sampler(), sample.Uniform)
    assert (out["gamma"].lower, out["gamma"].upper) == (0.9, 0.99)
    assert isinstance(out["batch"], sample.Categorical) and out["batch"].categories == [32, 64]
    assert isinstance(out["freq"], sample.Integer) and (out["freq"].lower, out["freq"].upper) == (
        1,
        8,
    )
    assert isinstance(out["frac"], sample.Categorical) and out["frac"].categories == [0.1, 0.2]
    assert out["buffer"] == 10000  # a scalar stays fixed
