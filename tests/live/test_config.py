"""The run's configuration (:mod:`diloco_gym.live.config`): validation with one-line errors
naming the field, the defaults resolved for a built-in engine or an endpoint, and the
engine's default thread count."""

from __future__ import annotations

import pytest

from diloco_gym.live.config import (
    BUILTIN_DEFAULTS,
    ENDPOINT_DEFAULTS,
    CalibrationConfig,
    default_engine_threads,
)
from diloco_gym.live.merges import MergeConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "CalibrationConfig.timeout_s must be > 0, got 0"),
        ({"merge_seconds": float("nan")}, "CalibrationConfig.merge_seconds must be > 0"),
        ({"gap_seconds": (3.0, 1.0)}, "gap_seconds must be (lo, hi) with 0 <= lo <= hi"),
        ({"lead_seconds": -1.0}, "lead_seconds must be >= 0"),
        ({"rate_rps": 0.0}, "rate_rps must be > 0, got 0.0"),
        ({"high_pressure": 1.5}, "high_pressure must be in (0, 1]"),
        ({"warmup_requests": -1}, "warmup_requests must be an int >= 0, got -1"),
        ({"max_outstanding": True}, "max_outstanding must be an int >= 1, got True"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens must be None or an int >= 1"),
        ({"engine": "vllm"}, "engine must be one of transformers, builtin-fallback, got 'vllm'"),
        ({"target_utilization": 0}, "target_utilization must be in (0, 1], got 0"),
        ({"repeats": 0}, "repeats must be an int >= 1, got 0"),
        ({"overload_inflight": 0}, "overload_inflight must be None or an int >= 1"),
        ({"overload_timeout_fraction": 0}, "overload_timeout_fraction must be in (0, 1]"),
        ({"engine_threads": 0}, "engine_threads must be None or an int >= 1, got 0"),
        ({"merge": "big"}, "CalibrationConfig.merge must be a MergeConfig"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as info:
        CalibrationConfig(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_resolved_fills_only_the_unset_defaults():
    """``None`` fields take the built-in engine's defaults (halved outputs, capped prompts)
    or the endpoint's (the trace as it is); a set field is kept."""
    built_in = CalibrationConfig(max_prompt_tokens=100).resolved(builtin=True)
    assert built_in.max_prompt_tokens == 100
    assert built_in.output_scale == BUILTIN_DEFAULTS["output_scale"] == 0.5
    assert built_in.max_output_tokens == BUILTIN_DEFAULTS["max_output_tokens"]
    endpoint = CalibrationConfig().resolved(builtin=False)
    assert (endpoint.output_scale, endpoint.max_prompt_tokens, endpoint.max_output_tokens) == (
        ENDPOINT_DEFAULTS["output_scale"],
        ENDPOINT_DEFAULTS["max_prompt_tokens"],
        ENDPOINT_DEFAULTS["max_output_tokens"],
    )
    assert endpoint.rate_rps is None  # the probe or the trace sets it


def test_engine_threads_are_the_cores_the_merge_workers_leave():
    assert default_engine_threads(MergeConfig(workers=2), cpus=2) == 1
    assert default_engine_threads(MergeConfig(workers=2), cpus=16) == 14
    assert default_engine_threads(MergeConfig(workers=3, torch_threads=2), cpus=16) == 10
    assert default_engine_threads(MergeConfig(workers=4), cpus=2) == 1
    assert default_engine_threads(MergeConfig(workers=1)) >= 1  # this host's CPUs


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ((0.5,), "must include 1"),
        ((1.0, 0.0), r"must lie in \(0, 1\], got 0.0"),
        ((1.0, 1.2), r"must lie in \(0, 1\], got 1.2"),
        ((1.0, 0.5, 0.5), "has a share twice"),
        ((), "non-empty tuple"),
        ([1.0, 0.5], "non-empty tuple"),
    ],
)
def test_bad_link_shares_are_refused(shares, message):
    with pytest.raises(ValueError, match=message):
        CalibrationConfig(link_shares=shares)


def test_the_shares_below_one_come_largest_first():
    assert CalibrationConfig(link_shares=(0.25, 1.0, 0.5)).shares_below_one == (0.5, 0.25)
    assert CalibrationConfig().shares_below_one == ()
