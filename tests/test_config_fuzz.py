"""Fuzzing the config loaders: a train TOML, a sweep TOML, a fleet TOML and a learner
calibration JSON, each a valid file with one field set to an out-of-range, wrong-type,
NaN, infinite or huge value (hypothesis, derandomised so a run is reproducible). Every
refusal must be the loader's own error type (a ``ValueError`` the CLI prints as one line,
:func:`diloco_gym.cli.exit_status`), naming the file, on one line and short; never another
exception. What is accepted must stay usable: a learner calibration then predicts a finite,
plausible loss."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diloco_gym.envs.params import EnvParams

pytest.importorskip("stable_baselines3")

SETTINGS = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Values that broke a loader before (NaN, infinities, 1e308, a 400-digit integer, a
#: string for a number, a table for a number...), drawn besides hypothesis' own.
SPECIAL = [
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    5e-324,
    10**400,
    -(10**400),
    2**63,
    2**31,
    0,
    -1,
    0.0,
    "x",
    "",
    "a\nb",
    True,
    [],
    [1.0],
    [math.inf],
    {},
    {"a": 1},
]
VALUES = st.one_of(
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.text(max_size=12),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3),
)


# ------------------------------------------------------------------------- TOML writing
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string (a lone surrogate: invalid TOML)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml(doc: dict[str, Any]) -> str:
    lines = [
        f"{json.dumps(k)} = {_toml_value(v)}"
        for k, v in doc.items()
        if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))
    ]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for table in v:
                lines.append(f"[[{k}]]")
                lines += [f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in table.items()]
    return "\n".join(lines) + "\n"


def _set(doc: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    return doc


def _check_refusal(exc: BaseException, path: Path, kinds: tuple[type, ...]) -> None:
    """A refusal the CLI prints as one line naming the file."""
    from diloco_gym.cli import exit_status

    assert isinstance(exc, kinds), f"{type(exc).__name__}: {exc}"
    code, message = exit_status(exc)
    assert code in (1, 2) and "internal error" not in message, message
    assert str(path) in message, message
    assert "\n" not in message.replace(f"{path}", ""), message
    assert len(message) < 1000, message[:200]


# ------------------------------------------------------------------------------ train
TRAIN_BASE = {
    "train": {"algo": "ppo", "timesteps": 1000},
    "env": {"regimes": ["bursty"], "budgets_per_hour": [48, 60]},
    "algo": {"learning_rate": 3e-4, "gamma": 0.99, "batch_size": 64, "n_steps": 128},
}


def _train_fields() -> list[tuple]:
    from diloco_gym.rl.config import _PARAM_FIELDS, ENV_KEYS, TRAIN_KEYS

    out: list[tuple] = [("train", k) for k in TRAIN_KEYS if k not in ("algo", "vec_env")]
    out += [("env", k) for k in (*ENV_KEYS, *_PARAM_FIELDS) if k not in ("trace", "calibration")]
    out += [("env", "budgets_per_hour", 0), ("env", "regimes", 0)]
    out += [("algo", k) for k in sorted(_ppo_keys() - {"policy_kwargs"})]
    return out


def _ppo_keys() -> set[str]:
    from diloco_gym.rl.algos import algo_kwargs

    return algo_kwargs("ppo")


@SETTINGS
@given(field=st.sampled_from(_train_fields()), value=VALUES)
def test_train_config(tmp_path_factory, field, value):
    from diloco_gym.rl.command import run_layout
    from diloco_gym.rl.config import ConfigError, check_config, load_config_file, parse_config

    path = tmp_path_factory.mktemp("train") / "cfg.toml"
    doc = _set(TRAIN_BASE, field, value)
    if field[1] == "regime":
        doc["env"].pop("regimes")
    path.write_text(_toml(doc))
    try:
        data, source = load_config_file(path)
        cfg = parse_config(data, str(path))
        cfg.source = source
        check_config(cfg, str(path))
        run_layout(cfg)
    except Exception as exc:  # noqa: BLE001 - the property: which exceptions escape
        _check_refusal(exc, path, (ConfigError,))


# ------------------------------------------------------------------------------ sweep
SWEEP_BASE = {
    "name": "t",
    "agents": ["fixed-512"],
    "seeds": 2,
    "draws": 10,
    "regime": "bursty",
    "grid": {"merge_budget": [8]},
}
SWEEP_FIELDS = [
    ("name",),
    ("seeds",),
    ("seed0",),
    ("draws",),
    ("alpha",),
    ("saturation_pct",),
    ("rate_scale",),
    ("target_utilization",),
    ("window_s",),
    ("stride_s",),
    ("agents",),
    ("regime",),
    ("in_process_agents",),
    ("grid", "merge_budget"),
    ("grid", "rate_scale"),
    *(("env", f.name) for f in fields(EnvParams) if f.name != "merge_budget"),
]


@SETTINGS
@given(field=st.sampled_from(SWEEP_FIELDS), value=VALUES)
def test_sweep_file(tmp_path_factory, field, value):
    from diloco_gym.scale.sweep import SweepFileError, load_sweep

    path = tmp_path_factory.mktemp("sweep") / "s.toml"
    if field[0] == "grid":
        value = value if isinstance(value, list) else [value]
    path.write_text(_toml(_set(SWEEP_BASE, field, value)))
    try:
        spec = load_sweep(path)
    except Exception as exc:  # noqa: BLE001 - the property: which exceptions escape
        _check_refusal(exc, path, (SweepFileError,))
        return
    # accepted: a plain output name, a saturation gate that works, draws within the limit
    assert spec.name.isprintable() and "/" not in spec.name and spec.name not in ("", ".", "..")
    for point in spec.points:
        assert 0 <= point.config.saturation_pct <= 100
        assert 1 <= point.config.draws <= 100_000
        EnvParams(**point.env)


# ------------------------------------------------------------------------------ fleet
FLEET_BASE = {
    "fleet": {"bits": 8, "fragments": 2},
    "env": {"h_min_steps": 128},
    "site": [{"name": "a", "regime": "bursty"}, {"name": "b", "regime": "bursty"}],
}


def _fleet_fields() -> list[tuple]:
    from diloco_gym.sim.fleet import FleetParams, SiteConfig
    from diloco_gym.sim.sidecar import SidecarParams

    out: list[tuple] = [("fleet", f.name) for f in fields(FleetParams) if f.name != "sites"]
    paths = ("trace", "calibration", "link_trace")  # files: their own loaders' tests
    out += [("site", 1, f.name) for f in fields(SiteConfig) if f.name not in paths]
    out += [("site", 1, "sidecar", f.name) for f in fields(SidecarParams)]
    out += [("env", f.name) for f in fields(EnvParams)] + [("env", "bogus")]
    return out


@SETTINGS
@given(field=st.sampled_from(_fleet_fields()), value=VALUES)
def test_fleet_file(tmp_path_factory, field, value):
    from diloco_gym.envs.fleet import DiLoCoFleetEnv
    from diloco_gym.sim.fleet import FleetConfigError

    path = tmp_path_factory.mktemp("fleet") / "f.toml"
    path.write_text(_toml(_set(FLEET_BASE, field, value)))
    try:
        DiLoCoFleetEnv(fleet=str(path))
    except Exception as exc:  # noqa: BLE001 - the property: which exceptions escape
        _check_refusal(exc, path, (FleetConfigError,))


# ---------------------------------------------------------------- learner calibration
LEARNER_BASE = json.loads(
    resources.files("diloco_gym").joinpath("data/learner_calibration_default.json").read_text()
)
LEARNER_FIELDS = [
    *(("params", k) for k in LEARNER_BASE["params"] if k != "quant_efficiency"),
    *(("params", "quant_efficiency", b) for b in ("16", "8", "4")),
    ("params", "quant_efficiency", "2"),
    ("env_mapping", "env_steps_per_inner_step"),
    ("env_mapping", "step_seconds"),
    ("intervals", "loss_floor"),
    ("intervals", "loss_floor", 1),
    ("format",),
]


@SETTINGS
@given(field=st.sampled_from(LEARNER_FIELDS), value=VALUES)
def test_learner_calibration_file(tmp_path_factory, field, value):
    from diloco_gym.sim.learner_calibration import (
        LearnerCalibrationError,
        env_schedule_loss,
        learner_params,
        load_learner_calibration,
        quality_cost,
    )

    path = tmp_path_factory.mktemp("lc") / "lc.json"
    path.write_text(json.dumps(_set(LEARNER_BASE, field, value), allow_nan=True))
    try:
        cal = load_learner_calibration(path)
    except Exception as exc:  # noqa: BLE001 - the property: which exceptions escape
        _check_refusal(exc, path, (LearnerCalibrationError,))
        return
    # accepted: every prediction finite and plausible (a loss of at most 200)
    for times in ([10.0, 20.0, 30.0], [1.0, 500.0], [0.5]):
        loss = env_schedule_loss(times, cal)
        assert math.isfinite(loss) and 0 <= loss <= 200, (field, value, loss)
        assert math.isfinite(quality_cost(times, cal))
    p = learner_params(cal)
    assert all(math.isfinite(x) for x in (p.tokens_scale, p.drift_s, p.merge_overhead_s))
