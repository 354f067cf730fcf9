"""Training config values that used to be accepted, or to end in an error of SB3's or an
``OverflowError`` with no key named: each is now a one-line usage error naming the file
and the key, before anything is trained or written."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("stable_baselines3")

from rl_helpers import cli_exit, write_config  # noqa: E402

from diloco_gym.envs import params  # noqa: E402
from diloco_gym.envs.params import EnvParams  # noqa: E402

BIG = "1" + "0" * 400  # a 400-digit integer: TOML reads it exactly

BAD = [
    # [algo]: SB3 trains with gamma 2 and asserts on batch_size 0 or a string rate
    ("[algo]\ngamma = 2.0\n", "[algo] gamma must be a finite number in (0, 1], got 2.0"),
    ("[algo]\ngamma = 0.0\n", "[algo] gamma must be a finite number in (0, 1]"),
    ("[algo]\ngamma = nan\n", "[algo] gamma must be a finite number"),
    ("[algo]\nbatch_size = 0\n", "[algo] batch_size must be an integer in [1, "),
    ("[algo]\nbatch_size = 1.5\n", "[algo] batch_size must be an integer"),
    ('[algo]\nlearning_rate = "fast"\n', "[algo] learning_rate must be a finite number"),
    ("[algo]\nlearning_rate = inf\n", "[algo] learning_rate must be a finite number"),
    ("[algo]\nlearning_rate = -1e-3\n", "[algo] learning_rate must be a finite number"),
    ("[algo]\nn_steps = 0\n", "[algo] n_steps must be an integer in [1, "),
    ("[algo]\ngae_lambda = 1.5\n", "[algo] gae_lambda must be a finite number in [0, 1]"),
    ("[algo]\nclip_range = -0.2\n", "[algo] clip_range must be a finite number"),
    ('[algo]\nnormalize_advantage = "yes"\n', "[algo] normalize_advantage must be true or"),
    ('[algo]\nrollout_buffer_class = "x"\n', "[algo] rollout_buffer_class cannot be set"),
    # [env]: EnvParams' ranges (excess_weight 1e308 gave -inf returns)
    ("[env]\nexcess_weight = 1e308\n", "EnvParams.excess_weight must be in [0, 1e+06]"),
    ("[env]\nmerge_seconds = 1e308\n", "EnvParams.merge_seconds must be in (0, 86400]"),
    (f"[env]\nh_max_steps = {BIG}\n", "EnvParams.h_max_steps must be at most 2,147,483,647"),
    (f"[env]\nstep_seconds = {BIG}\n", "[env] step_seconds must be a number, got 1000"),
    # [env] budgets and spans: an OverflowError before
    ("[env]\nbudgets_per_hour = [inf]\n", "[env] budgets_per_hour: budgets must be positive"),
    ("[env]\nbudgets_per_hour = [1e308]\n", "budgets must be positive numbers (finite, at most"),
    (f"[env]\nbudgets_per_10min = [{BIG}]\n", "budgets must be positive numbers (finite, at"),
    (f'[env]\ntrace = "t.csv"\ntrace_span_s = [0, {BIG}]\n', "[env] trace_span_s must be"),
    ("[env]\nwindow_s = inf\n", "window_s must be a finite positive number"),
    ('[env]\ntrace_format = "azure"\n', "trace_format applies to a trace"),
    # a step too long for the regime's window: failed at the first reset, no file named
    ("[env]\nstep_seconds = 5.0\n", "[env] an episode with these EnvParams"),
    ("[env]\nforecast_alpha = 1e-300\n", "EnvParams.forecast_alpha must be in [1e-06, 1]"),
    # [train]
    ("[train]\nseed = -1\n", "seed must be in [0, 4294967295], got -1"),
    (f"[train]\nseed = {BIG}\n", "seed must be in [0, 4294967295], got 1000"),
    (f"[train]\ntimesteps = {BIG}\n", "timesteps must be at most 2**62"),
    ("[train]\nn_envs = 100000\n", "n_envs: 100,000 is above the limit of 65,536"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_a_bad_value_is_a_one_line_usage_error(text, message, tmp_path, capsys) -> None:
    cfg = write_config(tmp_path, text)
    code, err = cli_exit(["train", "--config", str(cfg), "--out", str(tmp_path / "o")], capsys)
    assert code == 2, err
    assert message in err, err
    assert err.startswith(f"diloco-gym: {cfg}: ")  # names the file
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert len(err) < 400  # a 400-digit value is quoted short
    assert not (tmp_path / "o").exists()  # nothing written


@pytest.mark.parametrize("value", ["inf", "1e308"])
def test_budget_flags_must_be_finite(value, tmp_path, capsys) -> None:
    argv = ["train", "--budgets", "60", value, "--out", str(tmp_path / "o")]
    code, err = cli_exit(argv, capsys)
    assert code == 2 and "budgets must be finite numbers" in err, err
    assert err.startswith("diloco-gym: command line:") and "Traceback" not in err


ENV_NUMBERS = [
    "step_seconds",
    "merge_seconds",
    "excess_weight",
    "progress_weight",
    "rate_norm_rps",
    "loss_clip",
    "tokens_clip",
    "staleness_clip_s",
    "reward_rate_rps",
    "forecast_alpha",
    "baseline_alpha",
    "shaping_gamma",
    "shaping_cost",
]


def test_the_ranges_cover_every_number_field() -> None:
    assert sorted(params.RANGES) == sorted(ENV_NUMBERS)


@pytest.mark.parametrize("name", ENV_NUMBERS)
def test_every_env_number_has_an_upper_bound(name) -> None:
    hi = getattr(params, "RANGES", {}).get(name, (0, 1e6, True))[1]
    with pytest.raises(ValueError, match=rf"EnvParams\.{name} must be in "):
        EnvParams(**{name: hi * 10})
    if name in ("forecast_alpha", "baseline_alpha", "step_seconds"):
        # a tiny EWMA weight divided by zero in the episode build; a tiny step overflowed
        with pytest.raises(ValueError, match=rf"EnvParams\.{name} must be in "):
            EnvParams(**{name: 1e-300})
    with pytest.raises(ValueError, match=rf"EnvParams\.{name} "):
        EnvParams(**{name: math.inf})


def test_a_step_count_fits_32_bits() -> None:
    with pytest.raises(ValueError, match="EnvParams.decision_interval must be at most"):
        EnvParams(decision_interval=2**31)


def test_the_defaults_and_the_paper_settings_are_inside_the_ranges() -> None:
    EnvParams()
    EnvParams(excess_weight=1e6, progress_weight=0.0, merge_seconds=8.0, step_seconds=0.14)
