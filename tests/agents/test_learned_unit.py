"""agents/learned.py without a trained model: the refusals for a missing or corrupt model
file, the metadata beside a model, the algorithm sniffed from a zip, agent names, the
one-line load errors, the trust switch, and :class:`LearnedAgent` around a stand-in model
(observation size, transforms, budget, action masks). Loading and running real models:
tests/rl/test_learned.py and tests/agents/test_safe_model.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from diloco_gym.agents import learned
from diloco_gym.agents.base import AgentContext
from diloco_gym.agents.learned import (
    REFERENCE_AGENTS,
    LearnedAgent,
    TrustedModelFileWarning,
    learned_name,
    load_learned_agent,
    reference_meta,
    reference_model_path,
    trusting_model_files,
)
from diloco_gym.envs.budget_features import BUDGET_FEATURES
from diloco_gym.envs.observation import OBS_DIM, OBS_INDEX
from diloco_gym.envs.params import EnvParams


class _Model:
    """A stand-in SB3 model: merges when ``gap >= 0.5``; records its calls."""

    def __init__(self, size: int = OBS_DIM, maskable: bool = False) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        self.maskable = maskable
        self.calls: list[tuple[np.ndarray, dict]] = []

    def predict(self, x, deterministic=True, **kwargs):
        self.calls.append((np.array(x), kwargs))
        return (x[:, OBS_INDEX["gap"]] >= 0.5).astype(np.int32), None


def _zip(path: Path, entries: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in entries.items():
            zf.writestr(name, text)
    return path


def _obs(n: int, gap: float = 0.0) -> np.ndarray:
    o = np.zeros((n, OBS_DIM), dtype=np.float32)
    o[:, OBS_INDEX["gap"]] = gap
    return o


def test_a_missing_model_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model file not found: .*nope\.zip"):
        load_learned_agent(tmp_path / "nope.zip")
    # a directory names the model.zip it looked for
    with pytest.raises(FileNotFoundError, match=r"not found: .*run/model\.zip"):
        load_learned_agent(tmp_path.joinpath("run").mkdir() or tmp_path / "run")


def test_a_file_that_is_not_a_zip_is_refused_before_any_loader(tmp_path, monkeypatch):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    monkeypatch.setattr(learned, "_model_class", lambda algo: pytest.fail("loader ran"))
    for trust in (False, True):
        with pytest.raises(ValueError) as err:
            load_learned_agent(junk, trust=trust)
        assert str(err.value) == (
            f"learned agent: {junk} is not a valid model file (not a zip archive "
            f"written by stable-baselines3)"
        )


def test_a_zip_without_a_model_is_refused(tmp_path):
    pytest.importorskip("stable_baselines3")
    bad = _zip(tmp_path / "empty.zip", {"hello.txt": "not a model"})
    with pytest.raises(ValueError, match=r"empty\.zip is not a valid model"):
        load_learned_agent(bad)


def test_trusted_loading_names_every_algorithm_that_failed(tmp_path, monkeypatch):
    bad = _zip(tmp_path / "model.zip", {"data": "{}"})

    class _Refuses:
        @staticmethod
        def load(path, device):
            raise RuntimeError("bad archive\nsecond line")

    monkeypatch.setattr(learned, "_model_class", lambda algo: _Refuses)
    with pytest.raises(ValueError) as err:
        load_learned_agent(bad, trust=True)
    msg = str(err.value)
    assert msg.startswith(f"learned agent: {bad} is not a valid model file (")
    for algo in ("ppo", "maskable-ppo", "dqn"):
        assert f"{algo}: RuntimeError: bad archive" in msg
    assert "second line" not in msg and "\n" not in msg


def test_trusted_loading_without_the_rl_extra_names_the_extra(tmp_path, monkeypatch):
    bad = _zip(tmp_path / "model.zip", {"data": "{}"})

    def missing(algo):
        raise ImportError(f"No module named {algo!r}")

    monkeypatch.setattr(learned, "_model_class", missing)
    with pytest.raises(
        ValueError, match=r"needs the 'rl' extra \(pip install 'diloco-gym\[rl\]'\)"
    ):
        load_learned_agent(bad, trust=True)


def test_trusted_loading_tries_the_recorded_algorithm_first(tmp_path, monkeypatch):
    path = _zip(tmp_path / "model.zip", {"data": "{}"})
    (tmp_path / "meta.json").write_text(json.dumps({"algo": "dqn", "regime": "bursty"}))
    tried = []

    class _Loads:
        @staticmethod
        def load(p, device):
            assert device == "cpu"
            return _Model()

    def cls(algo):
        tried.append(algo)
        return _Loads

    monkeypatch.setattr(learned, "_model_class", cls)
    agent = load_learned_agent(tmp_path, trust=True)
    assert tried == ["dqn"] and agent.name == "dqn:model" and agent.path == path.resolve()
    assert agent.meta == {"algo": "dqn", "regime": "bursty"}


def test_metadata_beside_a_model(tmp_path):
    model = tmp_path / "model.zip"
    assert learned._meta_for(model, None) == {}
    (tmp_path / "meta.json").write_text('{"algo": "ppo"}')
    assert learned._meta_for(model, None) == {"algo": "ppo"}
    given = {"algo": "dqn"}
    out = learned._meta_for(model, given)
    assert out == given and out is not given
    assert learned._meta_for(tmp_path / "other.zip", None) == {}  # only beside model.zip
    (tmp_path / "meta.json").write_text("{not json")
    assert learned._meta_for(model, None) == {}
    (tmp_path / "meta.json").write_text("[1, 2]")
    assert learned._meta_for(model, None) == {}


@pytest.mark.parametrize(
    ("data", "algo"),
    [
        ({"policy_class": {"__module__": "sb3_contrib.common.maskable.policies"}}, "maskable-ppo"),
        ({"policy_class": {"__module__": "stable_baselines3.dqn.policies"}}, "dqn"),
        ({"policy_class": "ActorCriticPolicy"}, "ppo"),
        ({"policy_class": {"x": "something.else"}}, None),
        ({}, None),
    ],
)
def test_the_algorithm_is_sniffed_from_the_policy_class(tmp_path, data, algo):
    path = _zip(tmp_path / "m.zip", {"data": json.dumps(data)})
    assert learned._sniff_algo(path) == algo


def test_sniffing_an_unreadable_zip_gives_none(tmp_path):
    assert learned._sniff_algo(_zip(tmp_path / "a.zip", {"other": "x"})) is None
    assert learned._sniff_algo(_zip(tmp_path / "b.zip", {"data": "{oops"})) is None
    assert learned._sniff_algo(tmp_path / "missing.zip") is None


@pytest.mark.parametrize(
    ("path", "parts", "name"),
    [
        ("runs/a/model.zip", 1, "ppo:model"),
        ("runs/a/model.zip", 2, "ppo:a/model"),
        ("runs/a/model.zip", 9, "ppo:runs/a/model"),
        ("runs/a/model.bin", 1, "ppo:model.bin"),
    ],
)
def test_learned_names(path, parts, name):
    assert learned_name("ppo", Path(path), parts) == name


def test_load_errors_are_one_line_without_unsafe_advice():
    exc = RuntimeError(
        "\x1b[31mWeights only load failed\x1b[0m. Re-running with weights_only=False ...\n"
        "Unsupported global: GLOBAL argparse.Namespace was not an allowed global"
    )
    msg = learned._load_error(exc)
    assert msg == (
        "RuntimeError: the weights hold a Python object (argparse.Namespace) that the safe "
        "loader refuses; a model file should hold tensors only"
    )
    assert learned._load_error(ValueError("\x1b[1mfirst\x1b[0m\nsecond")) == "ValueError: first"
    assert learned._load_error(KeyError()) == "KeyError: "


def test_trust_comes_from_the_flag_or_the_argument_never_the_environment(tmp_path, monkeypatch):
    """``DILOCO_GYM_TRUST_MODEL_FILES=1`` once switched the unpickling loader on by itself;
    now only ``trust=True`` or :func:`trusting_model_files` (``--trust-model-file``) do,
    and every such load warns, naming the file."""
    path = _zip(tmp_path / "model.zip", {"data": "{}"})
    used: list[str] = []

    class _Loads:
        @staticmethod
        def load(p, device):
            used.append(str(p))
            return _Model()

    monkeypatch.setattr(learned, "_model_class", lambda algo: _Loads)
    monkeypatch.setenv("DILOCO_GYM_TRUST_MODEL_FILES", "1")
    with pytest.raises(ValueError, match="not a valid model file for the safe loader"):
        load_learned_agent(path)
    assert used == [] and not learned.model_files_trusted()
    for _ in range(2):  # every load warns, not only the first
        with pytest.warns(TrustedModelFileWarning, match=f"loading {path} with stable"):
            load_learned_agent(path, trust=True)
    with trusting_model_files():
        assert learned.model_files_trusted()
        with pytest.warns(TrustedModelFileWarning, match=str(path)):
            load_learned_agent(path)
        with trusting_model_files(False), pytest.raises(ValueError, match="safe loader"):
            load_learned_agent(path)
    assert not learned.model_files_trusted() and used == [str(path)] * 3


def test_reference_models_are_package_files_with_their_metadata():
    for name, parts in REFERENCE_AGENTS.items():
        path = reference_model_path(name)
        assert path.is_file() and path.parts[-len(parts) :] == parts
        assert zipfile.is_zipfile(path)
    ppo = reference_meta("reference-ppo")
    assert ppo is not None and ppo["algo"] == "ppo" and ppo["regime"] == "bursty"
    meta = reference_meta("reference-budget-bursty")
    assert isinstance(meta, dict) and meta["observation"]["transform"] == "budget"
    with pytest.raises(KeyError):
        reference_model_path("reference-nope")


def test_a_learned_agent_predicts_like_any_agent():
    model = _Model()
    agent = LearnedAgent(model, name="ppo:x")
    assert agent.deployable and not agent.budget_aware and agent.obs_size is None
    actions, _ = agent.predict(np.concatenate([_obs(2, 0.9), _obs(1, 0.1)]))
    assert actions.dtype == np.int64 and actions.tolist() == [1, 1, 0]
    one, _ = agent.predict(_obs(1, 0.7)[0])
    assert one.shape == () and int(one) == 1
    assert model.calls[0][1] == {}  # not maskable: no action masks


def test_a_maskable_model_gets_the_contexts_mask_for_one_observation():
    model = _Model(maskable=True)
    agent = LearnedAgent(model)
    ctx = AgentContext(params=EnvParams(), regime="bursty")
    ctx._set_mask(np.array([True, False]))
    agent.attach(ctx)
    agent.predict(_obs(1)[0])
    assert model.calls[-1][1]["action_masks"].tolist() == [[True, False]]
    agent.predict(_obs(3))
    assert model.calls[-1][1] == {}  # a batch has no single mask


def test_a_model_of_the_wrong_observation_size_is_refused():
    with pytest.raises(ValueError, match=r"the model takes observations of shape \(20,\)"):
        LearnedAgent(_Model(size=OBS_DIM + 3), name="x")
    with pytest.raises(ValueError, match="unknown observation transform 'nope'"):
        LearnedAgent(_Model(), obs_transform="nope")


def test_a_budget_model_needs_a_merge_budget_and_gets_the_budget_features():
    size = OBS_DIM + len(BUDGET_FEATURES)
    model = _Model(size=size)
    agent = LearnedAgent(model, name="b", meta={"observation": {"transform": "budget"}})
    assert agent.budget_aware and agent.obs_transform == "budget"
    with pytest.raises(RuntimeError, match="b computes budget features .* attach it first"):
        agent.predict(_obs(1)[0])
    with pytest.raises(ValueError, match="b is budget-conditioned: run it with a merge budget"):
        agent.attach(AgentContext(params=EnvParams(), regime="bursty"))
    params = EnvParams(merge_budget=4)
    agent.attach(AgentContext(params=params, regime="bursty"))
    agent.predict(_obs(2, 0.6))
    x = model.calls[-1][0]
    assert x.shape == (2, size) and np.array_equal(x[:, :OBS_DIM], _obs(2, 0.6))


def test_a_fleet_model_records_its_wider_observation():
    meta = {"observation": {"transform": None, "base_size": OBS_DIM + 14}}
    agent = LearnedAgent(_Model(size=OBS_DIM + 14), meta=meta)
    assert agent.obs_size == OBS_DIM + 14
    wide = np.zeros((2, OBS_DIM + 14), dtype=np.float32)
    wide[0, OBS_INDEX["gap"]] = 1.0
    assert agent.predict(wide)[0].tolist() == [1, 0]
    with pytest.raises(ValueError, match=f"expected observations with {OBS_DIM + 14} features"):
        agent.predict(_obs(1))
