"""EnvParams: the defaults, the sizes derived from them, and the check of every field."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv
from diloco_gym.envs.params import EnvParams

#: At least one bad value per field; each must be refused with an error naming the field.
BAD_VALUES = [
    ("step_seconds", -0.1),
    ("step_seconds", 0.0),
    ("step_seconds", "fast"),
    ("step_seconds", float("nan")),
    ("step_seconds", float("inf")),
    ("h_min_steps", 100),
    ("h_min_steps", 128.0),
    ("h_max_steps", True),
    ("h_max_steps", 500),
    ("merge_seconds", 100.0),
    ("merge_seconds", -1.0),
    ("decision_interval", 0),
    ("decision_interval", 3),
    ("skip_forced", "yes"),
    ("skip_forced", 1),
    ("merge_budget", -1),
    ("merge_budget", 8.0),
    ("merge_budget", True),
    ("excess_weight", -1.0),
    ("progress_weight", -0.5),
    ("forecast_alpha", 0.0),
    ("forecast_alpha", 1.01),
    ("baseline_alpha", 1.5),
    ("baseline_alpha", float("nan")),
    ("rate_norm_rps", 0.0),
    ("loss_clip", 0.0),
    ("tokens_clip", -1.0),
    ("staleness_clip_s", 0.0),
    ("reward_rate_rps", 0.0),
    ("reward_rate_rps", float("inf")),
    ("reward_rate_rps", True),
    ("reward_mode", "bogus"),
    ("reward_mode", None),
    ("reward_shaping", "potential"),
    ("reward_shaping", None),
    ("shaping_gamma", 0.0),
    ("shaping_gamma", 1.01),
    ("shaping_gamma", float("nan")),
    ("shaping_cost", -1.0),
    ("shaping_cost", "1"),
    ("shaping_cost", float("inf")),
]


@pytest.mark.parametrize("field, value", BAD_VALUES)
def test_bad_env_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EnvParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        DiLoCoSyncEnv("bursty", **{field: value})


def test_every_field_has_a_bad_value_tested():
    assert {f.name for f in fields(EnvParams)} == {name for name, _ in BAD_VALUES}


def test_h_min_above_h_max_is_rejected():
    with pytest.raises(ValueError, match="h_min_steps.*h_max_steps"):
        EnvParams(h_min_steps=256, h_max_steps=128)


def test_good_values_of_every_kind_are_accepted():
    p = EnvParams(
        merge_budget=np.int64(8),
        skip_forced=np.bool_(False),
        reward_rate_rps=np.float64(12.5),
        reward_mode="exact",
        h_min_steps=np.int64(64),
    )
    assert p.merge_budget == 8 and p.h_min == 8
    assert EnvParams(merge_budget=0).merge_budget == 0


def test_derived_sizes_follow_the_fields():
    p = EnvParams()
    assert p.decision_seconds == p.step_seconds * p.decision_interval
    assert (p.h_min, p.h_max) == (128 // 8, 512 // 8)
    assert p.merge_steps == round(p.merge_seconds / p.step_seconds)
    assert p.n_decisions(600.0) == int(np.ceil(600.0 / p.decision_seconds))
    assert p.n_decisions(10 * p.decision_seconds) == 10  # an exact multiple: no extra one
    q = EnvParams(step_seconds=1.0, merge_seconds=0.2, decision_interval=4, h_min_steps=8)
    assert q.merge_steps == 1  # at least one step
    assert (q.h_min, q.decision_seconds) == (2, 4.0)


def test_params_are_frozen_and_compare_by_value():
    p = EnvParams()
    with pytest.raises(FrozenInstanceError):
        p.step_seconds = 1.0  # type: ignore[misc]
    assert p == EnvParams() and p != EnvParams(merge_budget=8)
