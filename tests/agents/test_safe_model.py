"""Model files are read without unpickling: a crafted zip cannot run code, the shipped
models still load and act exactly as stable-baselines3's own loader makes them act."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from diloco_gym.agents.learned import (  # noqa: E402
    REFERENCE_AGENTS,
    _model_class,
    load_learned_agent,
    reference_model_path,
)
from diloco_gym.agents.safe_model import UnsafeModelError, load_policy_safely  # noqa: E402

pytestmark = pytest.mark.slow  # loads torch and SB3 models

ROOT = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this writes ``canary``: what a malicious model file would do."""

    def __init__(self, canary: Path) -> None:
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('ran')",))


def _rewrite(src: Path, dst: Path, data=None, weights: bytes | None = None) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            raw = zin.read(name)
            if name == "data" and data is not None:
                raw = json.dumps(data).encode()
            if name == "policy.pth" and weights is not None:
                raw = weights
            zout.writestr(name, raw)


def _poisoned_data(src: Path, canary: Path) -> dict:
    """The archive's JSON with every pickled field replaced by the payload."""
    with zipfile.ZipFile(src) as zf:
        data = json.loads(zf.read("data"))
    blob = base64.b64encode(pickle.dumps(_Payload(canary))).decode()
    for v in data.values():
        if isinstance(v, dict) and ":serialized:" in v:
            v[":serialized:"] = blob
    return data


def test_a_pickle_payload_in_the_data_entry_never_runs(tmp_path):
    src = reference_model_path("reference-ppo")
    canary = tmp_path / "canary.txt"
    bad = tmp_path / "model.zip"
    _rewrite(src, bad, data=_poisoned_data(src, canary))
    agent = load_learned_agent(bad)  # rebuilt from the JSON: the pickles are never read
    assert not canary.exists()
    assert agent.name == "ppo:model"
    # The test can fail: stable-baselines3's own loader runs the payload (which then
    # leaves it without spaces, so the load fails after the code ran).
    with pytest.raises(ValueError):
        load_learned_agent(bad, trust=True)
    assert canary.read_text() == "ran"


def test_an_unknown_policy_class_is_refused_without_running_it(tmp_path):
    src = reference_model_path("reference-ppo")
    canary = tmp_path / "canary.txt"
    data = _poisoned_data(src, canary)
    data["policy_class"] = {
        ":type:": "<class 'abc.ABCMeta'>",
        ":serialized:": data["policy_class"][":serialized:"],
        "__module__": "evil.policies",
        "__init__": "<function EvilPolicy.__init__ at 0x0>",
    }
    bad = tmp_path / "model.zip"
    _rewrite(src, bad, data=data)
    with pytest.raises(
        UnsafeModelError,
        match=r"model\.zip is not a valid model .*: unknown policy class evil",
    ):
        load_learned_agent(bad)
    assert not canary.exists()


def test_a_pickle_payload_in_the_weights_is_refused_without_running_it(tmp_path):
    import torch

    src = reference_model_path("reference-ppo")
    canary = tmp_path / "canary.txt"
    buf = io.BytesIO()
    torch.save({"w": _Payload(canary)}, buf)
    bad = tmp_path / "model.zip"
    _rewrite(src, bad, weights=buf.getvalue())
    assert not canary.exists()
    with pytest.raises(UnsafeModelError, match="policy.pth holds a Python object"):
        load_learned_agent(bad)
    assert not canary.exists()


def test_other_refusals_name_the_file_and_the_reason(tmp_path):
    src = reference_model_path("reference-ppo")
    with zipfile.ZipFile(src) as zf:
        data = json.loads(zf.read("data"))
    bad = tmp_path / "kw.zip"
    _rewrite(src, bad, data={**data, "policy_kwargs": {"features_extractor_class": "x"}})
    with pytest.raises(
        UnsafeModelError,
        match=r"kw\.zip is not a valid .*: policy_kwargs\.features_",
    ):
        load_policy_safely(bad)
    bad = tmp_path / "space.zip"
    _rewrite(src, bad, data={**data, "action_space": {":type:": "<class 'x.Tuple'>"}})
    with pytest.raises(
        UnsafeModelError,
        match=r"space\.zip is not a valid .*: the action space is not",
    ):
        load_policy_safely(bad)


@pytest.mark.parametrize("name", sorted(REFERENCE_AGENTS))
def test_shipped_models_act_exactly_as_with_sb3s_loader(name):
    path = reference_model_path(name)
    safe = load_policy_safely(path)
    algo = "maskable-ppo" if safe.maskable else "ppo"
    ref = _model_class(algo).load(path, device="cpu")
    space = ref.observation_space
    assert safe.observation_space == space and safe.action_space == ref.action_space
    x = np.random.default_rng(0).uniform(space.low, space.high, (4000, *space.shape))
    x = x.astype(np.float32)
    a_safe, _ = safe.predict(x, deterministic=True)
    a_ref, _ = ref.predict(x, deterministic=True)
    assert np.array_equal(a_safe, a_ref)
    assert 0 < a_ref.mean() < 1  # both actions occur: the comparison is not vacuous


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_fresh_model_with_a_named_activation_loads_safely(tmp_path, algo):
    import torch

    from diloco_gym import DiLoCoSyncEnv

    cls = _model_class(algo)
    model = cls(
        "MlpPolicy",
        DiLoCoSyncEnv(),
        policy_kwargs={"net_arch": [16, 16], "activation_fn": torch.nn.ReLU},
        seed=3,
        device="cpu",
    )
    path = tmp_path / "model.zip"
    model.save(path)
    safe = load_policy_safely(path)
    x = np.random.default_rng(1).uniform(0, 1, (2000, *model.observation_space.shape))
    x = x.astype(np.float32)
    assert np.array_equal(safe.predict(x)[0], model.predict(x, deterministic=True)[0])


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diloco_gym.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_environment_variable_does_not_switch_trust_on(tmp_path):
    """``DILOCO_GYM_TRUST_MODEL_FILES=1`` without ``--trust-model-file``: a crafted model
    that the safe loader refuses is refused, and its payload never runs."""
    src = reference_model_path("reference-ppo")
    canary = tmp_path / "canary.txt"
    data = _poisoned_data(src, canary)
    data["policy_class"]["__module__"] = "evil.policies"  # the safe loader refuses it
    bad = tmp_path / "model.zip"
    _rewrite(src, bad, data=data)
    env = dict(os.environ, PYTHONPATH=str(ROOT), DILOCO_GYM_TRUST_MODEL_FILES="1")
    args = ["run", "--agent", str(bad), "--seeds", "1", "--in-process-agents"]
    res = _cli(args, env, tmp_path)
    assert res.returncode == 1 and not canary.exists(), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "unknown policy class evil" in res.stderr
    # The test can fail: the flag runs the payload, and says which file it trusted.
    res = _cli([*args, "--trust-model-file"], env, tmp_path)
    assert canary.read_text() == "ran"
    assert f"diloco-gym: warning: --trust-model-file: loading {bad} with" in res.stderr


# A child process under a memory limit loads a model file and prints one line: the
# exception's type and message, or "loaded".
_LOAD_UNDER_LIMIT = """
import resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from diloco_gym.agents.learned import load_learned_agent
try:
    load_learned_agent(sys.argv[1])
    print("loaded")
except BaseException as exc:
    print(type(exc).__name__ + ": " + " | ".join(str(exc).splitlines()))
"""

_AS_LIMIT = 1_500 * 2**20  # 1.5 GB of address space: torch and SB3 take about 0.8 GB


def _load_under_limit(path: Path, limit: int = _AS_LIMIT) -> str:
    res = subprocess.run(
        [sys.executable, "-c", _LOAD_UNDER_LIMIT, str(path), str(limit)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    return lines[0]


def test_the_memory_limit_harness_loads_the_shipped_model():
    """The limit leaves room for a genuine model, so the refusals below are not the
    limit's doing."""
    assert _load_under_limit(reference_model_path("reference-ppo")) == "loaded"


def test_a_zip_bomb_is_refused_by_its_declared_size_before_it_is_read(tmp_path):
    """A 1 GB ``data`` entry (JSON padded with spaces) in a 2-4 MB zip: refused from the
    header, not read (it was read whole: a MemoryError under the limit)."""
    src = reference_model_path("reference-ppo")
    bomb = tmp_path / "model.zip"
    chunk = b" " * 2**20
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, 1) as zout:
        for name in zin.namelist():
            if name != "data":
                zout.writestr(name, zin.read(name))
        with zout.open("data", "w", force_zip64=True) as member:
            member.write(zin.read("data"))
            for _ in range(1024):
                member.write(chunk)
    assert bomb.stat().st_size < 8 * 2**20
    line = _load_under_limit(bomb)
    assert line.startswith("ModelLimitError: ") and str(bomb) in line, line
    assert "data (uncompressed bytes)" in line and "DILOCO_GYM_MAX_MODEL_BYTES" in line


def test_a_huge_net_arch_is_refused_before_the_policy_is_built(tmp_path):
    """A small file declaring ``net_arch [20000, 20000]`` (800 million parameters, 3.2 GB):
    refused from its JSON (it built the policy first)."""
    src = reference_model_path("reference-ppo")
    with zipfile.ZipFile(src) as zf:
        data = json.loads(zf.read("data"))
    bad = tmp_path / "model.zip"
    _rewrite(src, bad, data={**data, "policy_kwargs": {"net_arch": [20000, 20000]}})
    line = _load_under_limit(bad)
    assert line.startswith("ModelLimitError: ") and str(bad) in line, line
    # 17 x 20000 + 20000 x 20000 weights and the biases, twice (policy and value nets)
    assert re.search(r"net_arch \[20000, 20000\] \(parameters\): 800,\d{3},\d{3} is above", line)
    assert "DILOCO_GYM_MAX_MODEL_PARAMS" in line


@pytest.mark.parametrize("name", sorted(REFERENCE_AGENTS))
def test_the_parameter_count_is_the_policys(name):
    from diloco_gym.agents.safe_model import policy_parameter_count

    safe = load_policy_safely(reference_model_path(name))
    arch = getattr(safe.policy, "net_arch", None)
    count = policy_parameter_count(safe.algo, safe.observation_space.shape[0], 2, arch)
    assert count == sum(p.numel() for p in safe.policy.parameters())


@pytest.mark.parametrize(
    ("algo", "arch"), [("ppo", {"pi": [8], "vf": [16, 4]}), ("ppo", []), ("dqn", [32, 8])]
)
def test_the_parameter_count_of_other_architectures(algo, arch):
    from diloco_gym import DiLoCoSyncEnv
    from diloco_gym.agents.safe_model import policy_parameter_count

    model = _model_class(algo)("MlpPolicy", DiLoCoSyncEnv(), policy_kwargs={"net_arch": arch})
    size = model.observation_space.shape[0]
    count = policy_parameter_count(algo, size, 2, arch)
    assert count == sum(p.numel() for p in model.policy.parameters())


def test_meta_json_beside_a_model_is_bounded_in_size_and_depth(tmp_path):
    """A ``meta.json`` of 17 MB, or nested 100,000 levels deep, beside a genuine model:
    refused in one line naming it (the first was read whole, the second crashed the JSON
    parser with a RecursionError)."""
    import shutil

    model = tmp_path / "model.zip"
    shutil.copy(reference_model_path("reference-ppo"), model)
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"algo": "ppo", "notes": "x" * (17 * 2**20)}))
    line = _load_under_limit(model)
    assert line.startswith("ModelLimitError: ") and str(meta) in line, line
    assert "DILOCO_GYM_MAX_META_BYTES" in line
    meta.write_text("[" * 100_000 + "]" * 100_000)
    line = _load_under_limit(model)
    assert line.startswith("ModelLimitError: ") and str(meta) in line, line
    assert "meta.json (JSON nesting levels): 100,000 is above" in line


@pytest.mark.parametrize("algo", ["ppo", "maskable-ppo"])
def test_a_per_site_model_of_a_rounds_fleet_loads_safely(tmp_path, algo):
    """A model trained on a rounds fleet (``MultiBinary(N)``, one action per site) is
    rebuilt from JSON and tensors, acts as SB3's loader does, and its parameter count is
    the policy's (one logit per site for PPO, two for MaskablePPO)."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401
    from diloco_gym.agents.safe_model import policy_parameter_count

    env = gym.make("DiLoCoFleet-v1", fleet="docs/examples/fleet-rounds.toml").unwrapped
    model = _model_class(algo)("MlpPolicy", env, policy_kwargs={"net_arch": [16]}, seed=2)
    path = tmp_path / "model.zip"
    model.save(path)
    safe = load_policy_safely(path)
    assert safe.action_space == gym.spaces.MultiBinary(4)
    x = np.random.default_rng(1).uniform(0, 1, (500, *model.observation_space.shape))
    x = x.astype(np.float32)
    got, want = safe.predict(x)[0], model.predict(x, deterministic=True)[0]
    assert got.shape == (500, 4) and np.array_equal(got, want)
    assert 0 < want.mean() < 1  # both actions occur: the comparison is not vacuous
    heads = 8 if algo == "maskable-ppo" else 4
    count = policy_parameter_count(algo, model.observation_space.shape[0], heads, [16])
    assert count == sum(p.numel() for p in model.policy.parameters())


def test_a_multibinary_action_space_with_a_bad_size_is_refused(tmp_path):
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    env = gym.make("DiLoCoFleet-v1", fleet="docs/examples/fleet-rounds.toml").unwrapped
    src = tmp_path / "model.zip"
    _model_class("ppo")("MlpPolicy", env, policy_kwargs={"net_arch": [8]}).save(src)
    with zipfile.ZipFile(src) as z:
        data = json.loads(z.read("data"))
    bad = tmp_path / "bad.zip"
    act = {**data["action_space"], "n": [2, 2]}
    _rewrite(src, bad, data={**data, "action_space": act})
    with pytest.raises(UnsafeModelError, match="not a plain Discrete or MultiBinary"):
        load_policy_safely(bad)
