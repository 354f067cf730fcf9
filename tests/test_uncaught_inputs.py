"""Inputs that used to end in an internal error with no option or field named: Gymnasium's
``AttributeError`` for a ``render_mode`` that is not a string, ``OverflowError`` for a
budget of 1e308 merges/h, numpy's "Maximum allowed dimension exceeded" (or an out of
memory) for a huge ``--rate-scale``, "cannot convert float NaN to integer" from a live
calibration's ``--merge-mb 1e308``, and an ``AttributeError`` for a fleet whose ``sites``
is not a list of sites. Each is now a ``ValueError`` (a one-line usage error) naming it."""

from __future__ import annotations

import gymnasium as gym
import pytest

import diloco_gym  # noqa: F401 - registers the env ids
from diloco_gym.cli import main


@pytest.mark.parametrize("mode", [1.5, [1], b"ansi"])
def test_gym_make_refuses_a_render_mode_that_is_not_a_string(mode):
    with pytest.raises(ValueError, match=r"render_mode must be one of \['ansi', 'rgb_array'\]"):
        gym.make("DiLoCoSync-v2", render_mode=mode)


def test_gym_make_keeps_gymnasiums_render_wrappers():
    env = gym.make("DiLoCoSync-v2", render_mode="rgb_array_list")
    assert env.unwrapped.render_mode == "rgb_array"
    assert gym.make("DiLoCoSync-v2", render_mode="ansi").unwrapped.render_mode == "ansi"
    with pytest.raises(ValueError, match="render_mode must be one of"):
        gym.make("DiLoCoSync-v2", render_mode="nonsense")


def test_a_fleet_with_sites_that_are_not_sites_is_refused():
    from diloco_gym.sim.fleet import FleetConfigError

    with pytest.raises(FleetConfigError, match="sites must be a tuple of SiteConfig"):
        gym.make("DiLoCoFleet-v0", sites="x")


@pytest.mark.parametrize("value", [1e308, 1e300])
def test_a_huge_budget_is_refused_by_the_budget_conversion(value):
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.eval.units import episode_budget

    with pytest.raises(ValueError, match="is not a finite number of merges"):
        episode_budget(value, 600.0, 536, EnvParams())


def test_frontier_budgets_1e308_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["frontier", "--budgets", "1e308", "--regimes", "bursty", "--seeds", "2"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--draws", "10", "--out", "o", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.count("\n") == 0
    assert "budget 1e+308 merges/h is not a finite number of merges" in err
    assert "internal error" not in err


@pytest.mark.parametrize("scale", ["1e300", "1e6"])
def test_a_huge_rate_scale_is_refused_before_any_episode(scale, capsys, monkeypatch):
    """1e300 reached numpy as an array size ("Maximum allowed dimension exceeded"), 1e6
    ran out of memory: both are now the REQUESTS size limit, naming --rate-scale."""
    monkeypatch.delenv("DILOCO_GYM_MAX_REQUESTS", raising=False)
    argv = ["run", "--regime", "bursty", "--rate-scale", scale, "--agent", "fixed-512"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--seeds", "2"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code in (1, 2) and err.count("\n") == 0, err
    assert err.startswith("diloco-gym: requests per episode") and "internal error" not in err
    assert "requests per episode" in err and "--rate-scale" in err
    assert "DILOCO_GYM_MAX_REQUESTS" in err


def test_the_requests_limit_leaves_room_for_a_hundred_times_the_load():
    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.sim.regimes import REGIMES

    regime = REGIMES["bursty"].with_load(rate_scale=100.0)
    DiLoCoSyncEnv(regime=regime)  # 1.02 million requests per episode: accepted


@pytest.mark.parametrize("mb", [1e308, float("inf"), 2.0**17])
def test_merge_mb_has_a_size_limit(mb, monkeypatch):
    from diloco_gym.live.merges import MergeConfig
    from diloco_gym.sim.limits import LimitError

    monkeypatch.delenv("DILOCO_GYM_MAX_MERGE_MB", raising=False)
    with pytest.raises(LimitError, match=r"MergeConfig\.merge_mb \(--merge-mb\).*MERGE_MB"):
        MergeConfig(merge_mb=mb)
    MergeConfig(merge_mb=64.0)
