"""Tests of :mod:`diloco_gym.rl.config`: parsing a training configuration file."""

from __future__ import annotations

import pytest

pytest.importorskip("sb3_contrib")

from rl_helpers import (  # noqa: E402
    TINY_CONFIG,
    write_config,
)

from diloco_gym.rl.config import ConfigError, load_config_file, parse_config  # noqa: E402


def test_parse_config_units_and_env_fields(tmp_path) -> None:
    data, source = load_config_file(write_config(tmp_path, TINY_CONFIG))
    cfg = parse_config(data, source["path"])
    assert cfg.budgets_per_hour == [60.0, 96.0]  # 10 and 16 per 10 min
    assert cfg.env_params == {"excess_weight": 1.0}
    v1 = parse_config({"env": {"reward_shaping": "merge-debt", "excess_weight": 0.1}}, "x.toml")
    assert v1.env_params == {"reward_shaping": "merge-debt", "excess_weight": 0.1}
    assert cfg.hyperparameters["policy_kwargs"] == {"net_arch": [16, 16]}
    with pytest.raises(ConfigError, match=r"x\.toml: \[env\] loss_clip must be a number"):
        parse_config({"env": {"loss_clip": "big"}}, "x.toml")
