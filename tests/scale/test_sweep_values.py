"""Values a sweep (or tune) file used to accept silently: a NaN ``saturation_pct`` turned
the saturation gate off, ``draws`` had no limit, and a ``name`` with ``../`` put the
default output directory outside the working directory. Each is now one line naming the
file and the key."""

from __future__ import annotations

import math

import pytest

from diloco_gym.cli import main
from diloco_gym.eval.report import ReportConfig
from diloco_gym.scale.sweep import SweepFileError, load_sweep

BASE = """
name = "t"
agents = ["fixed-512"]
seeds = 2
draws = 10
regime = "bursty"
"""


def _sweep(tmp_path, extra: str):
    path = tmp_path / "s.toml"
    path.write_text(BASE.replace('name = "t"\n', "") + extra)
    return path


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "100.5", "1e308"])
def test_saturation_pct_must_be_a_percentage(tmp_path, value):
    path = _sweep(tmp_path, f"saturation_pct = {value}\n")
    with pytest.raises(SweepFileError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    assert "saturation_pct must be a percentage in [0, 100]" in msg


@pytest.mark.parametrize("value", [0.0, 50.0, 99.0, 100])
def test_a_percentage_is_accepted(tmp_path, value):
    spec = load_sweep(_sweep(tmp_path, f"saturation_pct = {value}\n"))
    assert spec.points[0].config.saturation_pct == value


def test_report_config_refuses_a_nan_saturation_pct():
    """NaN compares false with every threshold: a 99 % saturated replay was labelled
    inconclusive instead of saturated."""
    with pytest.raises(ValueError, match="saturation_pct"):
        ReportConfig(saturation_pct=math.nan)


def test_draws_have_a_limit_in_a_sweep_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DILOCO_GYM_MAX_DRAWS", raising=False)
    path = _sweep(tmp_path, "").read_text().replace("draws = 10", "draws = 1000000")
    (tmp_path / "s.toml").write_text(path)
    with pytest.raises(SweepFileError) as exc:
        load_sweep(tmp_path / "s.toml")
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 's.toml'}: ") and "\n" not in msg
    assert "draws (--draws): 1,000,000 is above the limit of 100,000" in msg
    assert "DILOCO_GYM_MAX_DRAWS" in msg
    monkeypatch.setenv("DILOCO_GYM_MAX_DRAWS", "2000000")
    assert load_sweep(tmp_path / "s.toml").points[0].config.draws == 1_000_000


def test_report_draws_limit_is_a_one_line_usage_error(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("DILOCO_GYM_MAX_DRAWS", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["report", "--draws", "100000000", "--regimes", "bursty", "--seeds", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DILOCO_GYM_MAX_DRAWS" in err[0]
    assert list(tmp_path.iterdir()) == []  # refused before any output


def test_a_fleet_report_config_has_the_draws_limit(monkeypatch):
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.sim.limits import LimitError

    monkeypatch.delenv("DILOCO_GYM_MAX_DRAWS", raising=False)
    with pytest.raises(LimitError, match="DILOCO_GYM_MAX_DRAWS"):
        FleetReportConfig(fleet="f.toml", agents=["fixed-512"], draws=10**7)


@pytest.mark.parametrize("name", ["../x", "a/../../b", "/tmp/x", "..", ".", "", "a\nb", "a\\b"])
def test_a_sweep_name_must_be_a_plain_file_name(tmp_path, name):
    path = tmp_path / "s.toml"
    path.write_text(f"name = {_toml_str(name)}\n" + BASE.replace('name = "t"\n', ""))
    with pytest.raises(SweepFileError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: name ") and "\n" not in msg


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'


def test_the_cli_writes_nothing_outside_the_working_directory(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = tmp_path / "s.toml"
    path.write_text('name = "x/../../escaped"\n' + BASE.replace('name = "t"\n', ""))
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(path), "--no-progress"])
    assert exc.value.code == 2
    assert "name 'x/../../escaped' is not a plain file name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml", "work"]
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("name", ["plain", "sweep.v2", "budgets_2024-01"])
def test_plain_names_are_accepted(tmp_path, name):
    path = tmp_path / "s.toml"
    path.write_text(f"name = {_toml_str(name)}\n" + BASE.replace('name = "t"\n', ""))
    assert load_sweep(path).name == name


def test_a_tune_name_must_be_a_plain_file_name(tmp_path):
    pytest.importorskip("stable_baselines3")
    from diloco_gym.scale.tune import TuneFileError, load_tune

    path = tmp_path / "t.toml"
    path.write_text('name = "../up"\nalgo = "ppo"\nregime = "bursty"\n[space]\ngamma = 0.9\n')
    with pytest.raises(TuneFileError, match=r"name '\.\./up' is not a plain file name"):
        load_tune(path)


def test_a_huge_seed0_is_refused_in_a_short_line(tmp_path):
    path = _sweep(tmp_path, "seed0 = " + "1" + "0" * 400 + "\n")
    with pytest.raises(SweepFileError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and "(401 digits)" in msg and len(msg) < 600


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("gamma = 2.0", "[space]: gamma must be a finite number in (0, 1], got 2.0"),
        ("batch_size = 0", "[space]: batch_size must be an integer in [1, "),
        ('learning_rate = "fast"', "[space]: learning_rate must be a finite number"),
        ("gamma = { uniform = [0.9, 1.5] }", "[space]: gamma must be a finite number in (0, 1]"),
        ("learning_rate = { loguniform = [1e-5, inf] }", "learning_rate must be a finite"),
        ("batch_size = [32, 0]", "[space]: batch_size must be an integer in [1, "),
        ("n_steps = { randint = [0, 8] }", "[space]: n_steps must be an integer in [1, "),
    ],
)
def test_a_tune_space_value_obeys_trains_rules(tmp_path, space, message):
    """A value of the search space reached SB3 as it was (``gamma = 2.0`` trained)."""
    pytest.importorskip("stable_baselines3")
    from diloco_gym.scale.tune import TuneFileError, load_tune

    path = tmp_path / "t.toml"
    path.write_text(f'algo = "ppo"\nregime = "bursty"\n[space]\n{space}\n')
    with pytest.raises(TuneFileError) as exc:
        load_tune(path)
    assert str(exc.value).startswith(f"{path}: ") and message in str(exc.value)


def test_a_valid_tune_space_is_accepted(tmp_path):
    pytest.importorskip("stable_baselines3")
    from diloco_gym.scale.tune import load_tune

    path = tmp_path / "t.toml"
    path.write_text(
        'algo = "ppo"\nregime = "bursty"\n[space]\ngamma = { uniform = [0.9, 0.999] }\n'
        "n_steps = { randint = [64, 513] }\nbatch_size = [32, 64]\nlearning_rate = 3e-4\n"
    )
    assert load_tune(path)["space"]["batch_size"] == [32, 64]
