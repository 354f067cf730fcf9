"""Load a stable-baselines3 model archive without unpickling anything.

SB3's own loader (``PPO.load``) unpickles parts of the archive's ``data`` entry (the
policy class, the spaces, schedules, buffers): a crafted ``model.zip`` runs arbitrary code
the moment it is loaded. :func:`load_policy_safely` reads only

* the archive's ``data`` entry as JSON (``json.loads``; the base64 pickles it carries under
  ``:serialized:`` are never decoded), from which it takes the policy class by its module
  and name, the observation and action spaces by their plain-text fields, and the policy's
  constructor arguments;
* the policy weights ``policy.pth`` with ``torch.load(weights_only=True)`` (tensors only).

The policy is rebuilt from a short list of known classes (:data:`KNOWN_POLICIES`: the
actor-critic policy of PPO, MaskablePPO's maskable one, DQN's Q-network policy) with the
recorded constructor arguments, and its weights must match it exactly. Anything else (an
unknown policy class, a space other than a ``Box`` / ``Discrete``, a constructor argument
outside :data:`_KWARGS`, weights that are not plain tensors) is refused with an error that
names the file and what was refused. ``--trust-model-file`` (``diloco_gym.agents.learned``) switches
back to SB3's normal loader for files the user trusts.
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["UnsafeModelError", "SafePolicyModel", "load_policy_safely", "KNOWN_POLICIES"]


class UnsafeModelError(ValueError):
    """A model archive that the safe loader cannot rebuild without running its pickles."""


#: (module, class) of the policy -> (algorithm name, whether it takes ``use_sde``).
KNOWN_POLICIES: dict[tuple[str, str], tuple[str, bool]] = {
    ("stable_baselines3.common.policies", "ActorCriticPolicy"): ("ppo", True),
    ("sb3_contrib.common.maskable.policies", "MaskableActorCriticPolicy"): ("maskable-ppo", False),
    ("stable_baselines3.dqn.policies", "DQNPolicy"): ("dqn", False),
}

#: Activation functions a policy may name (``torch.nn`` classes, by their repr).
_ACTIVATIONS = ("Tanh", "ReLU", "ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid")
#: Constructor arguments taken from the archive (anything else is refused).
_KWARGS = {"net_arch", "activation_fn", "ortho_init", "share_features_extractor"}

_CLASS_REPR = re.compile(r"^<class '([\w.]+)'>$")
_INIT_REPR = re.compile(r"<function (\w+)\.__init__ at ")
_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _refuse(path: Path, what: str) -> UnsafeModelError:
    return UnsafeModelError(
        f"learned agent: {path} is not a valid model file for the safe loader: {what} (it "
        f"rebuilds only known SB3 policies from the archive's JSON and tensor weights; "
        f"--trust-model-file uses stable-baselines3's own loader, which runs the pickles "
        f"inside the file)"
    )


def _policy_class(path: Path, entry: Any) -> tuple[type, str, bool]:
    if not isinstance(entry, dict):
        raise _refuse(path, "the archive's policy_class is not a recorded class")
    module = str(entry.get("__module__"))
    names = {
        m.group(1)
        for v in entry.values()
        if isinstance(v, str)
        for m in [_INIT_REPR.search(v)]
        if m
    }
    key: tuple[str, str] | None = next(
        ((module, n) for n in names if (module, n) in KNOWN_POLICIES), None
    )
    if key is None:
        raise _refuse(path, f"unknown policy class {module}.{'/'.join(sorted(names)) or '?'}")
    import importlib

    cls = getattr(importlib.import_module(key[0]), key[1])
    algo, takes_sde = KNOWN_POLICIES[key]
    return cls, algo, takes_sde


def _floats(text: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A numpy array printed by ``str()`` (``[ 0.  1. -1.]``), parsed as numbers."""
    if isinstance(text, list | int | float):
        arr = np.asarray(text, dtype=dtype).ravel()
    elif isinstance(text, str):
        tokens = text.replace("[", " ").replace("]", " ").split()
        arr = np.array([float(t) for t in tokens], dtype=dtype)
    else:
        raise ValueError("not a printed array")
    if arr.size == 1 and int(np.prod(shape)) != 1:
        arr = np.full(shape, arr[0], dtype=dtype)
    return arr.reshape(shape)


def _spaces(path: Path, data: dict) -> tuple[Any, Any]:
    import gymnasium as gym

    obs, act = data.get("observation_space"), data.get("action_space")
    try:
        if not (isinstance(obs, dict) and "spaces.box.Box" in str(obs.get(":type:"))):
            raise ValueError("not a Box")
        raw = obs["_shape"]
        shape = tuple(int(x) for x in (json.loads(raw) if isinstance(raw, str) else raw))
        dtype = np.dtype(str(obs["dtype"]))
        low = _floats(obs["low"], shape, dtype)
        high = _floats(obs["high"], shape, dtype)
        obs_space = gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    except (KeyError, ValueError, TypeError) as exc:
        raise _refuse(path, f"the observation space is not a plain Box ({exc})") from None
    try:
        if not (isinstance(act, dict) and "spaces.discrete.Discrete" in str(act.get(":type:"))):
            raise ValueError("not a Discrete")
        act_space = gym.spaces.Discrete(int(act["n"]), start=int(act.get("start", 0)))
    except (KeyError, ValueError, TypeError) as exc:
        raise _refuse(path, f"the action space is not a plain Discrete ({exc})") from None
    return obs_space, act_space


def _policy_kwargs(path: Path, entry: Any) -> dict[str, Any]:
    """The recorded constructor arguments: plain JSON, or (when SB3 had to pickle the dict
    because it held a class) the printed values beside the pickle."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise _refuse(path, "policy_kwargs is not a mapping")
    out: dict[str, Any] = {}
    for k, v in entry.items():
        if k in (":type:", ":serialized:"):
            continue
        if k not in _KWARGS:
            raise _refuse(path, f"policy_kwargs.{k} is not a supported constructor argument")
        if k == "activation_fn":
            m = _CLASS_REPR.match(str(v))
            name = m.group(1).rsplit(".", 1)[-1] if m else ""
            if not (m and m.group(1).startswith("torch.nn.") and name in _ACTIVATIONS):
                raise _refuse(path, f"policy_kwargs.activation_fn {v!r} is not a known activation")
            import torch

            out[k] = getattr(torch.nn, name)
            continue
        try:
            val = ast.literal_eval(v) if isinstance(v, str) else v
        except (ValueError, SyntaxError):
            raise _refuse(path, f"policy_kwargs.{k} {v!r} is not a plain value") from None
        if k == "net_arch":
            ok = isinstance(val, list) and all(isinstance(x, int) for x in val)
            ok = ok or (
                isinstance(val, dict)
                and set(val) <= {"pi", "vf", "qf"}
                and all(
                    isinstance(x, list) and all(isinstance(y, int) for y in x) for x in val.values()
                )
            )
        else:
            ok = isinstance(val, bool)
        if not ok:
            raise _refuse(path, f"policy_kwargs.{k} {v!r} is not a plain value")
        out[k] = val
    return out


class SafePolicyModel:
    """A rebuilt SB3 policy with the ``predict`` / ``observation_space`` that
    :class:`diloco_gym.agents.learned.LearnedAgent` uses (the same call SB3's ``PPO.predict``,
    ``MaskablePPO.predict`` and deterministic ``DQN.predict`` make on their policy)."""

    def __init__(self, policy: Any, algo: str) -> None:
        self.policy = policy
        self.algo = algo
        self.maskable = algo == "maskable-ppo"
        self.observation_space = policy.observation_space
        self.action_space = policy.action_space

    def predict(self, observation: np.ndarray, deterministic: bool = True, **kwargs: Any):
        return self.policy.predict(observation, deterministic=deterministic, **kwargs)


def load_policy_safely(path: str | Path) -> SafePolicyModel:
    """Rebuild the policy of an SB3 model archive without unpickling (module docstring).

    Raises:
        UnsafeModelError: the archive holds something the safe loader will not rebuild
            (the message names the file and what).
    """
    p = Path(path)
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise _refuse(p, "the archive has no 'data' and 'policy.pth' entries")
            raw_data = zf.read("data")
            raw_weights = zf.read("policy.pth")
    except zipfile.BadZipFile as exc:
        raise _refuse(p, f"not a zip archive ({exc})") from None
    try:
        data = json.loads(raw_data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _refuse(p, f"its 'data' entry is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _refuse(p, "its 'data' entry is not a JSON object")
    cls, algo, takes_sde = _policy_class(p, data.get("policy_class"))
    obs_space, act_space = _spaces(p, data)
    kwargs = _policy_kwargs(p, data.get("policy_kwargs"))
    if takes_sde:
        if data.get("use_sde", False) is not False:
            raise _refuse(p, "state-dependent exploration (use_sde) is not supported")
        kwargs["use_sde"] = False
    import torch

    try:
        state = torch.load(io.BytesIO(raw_weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the safe unpickler raises several kinds
        m = _UNSAFE_GLOBAL.search(str(exc))
        what = f" ({m.group(1)})" if m else ""
        raise _refuse(
            p,
            f"policy.pth holds a Python object{what} that the safe loader refuses; a model "
            f"file should hold tensors only",
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise _refuse(p, "policy.pth is not a mapping of parameter names to tensors")
    lr = float(data["learning_rate"]) if isinstance(data.get("learning_rate"), int | float) else 0.0
    try:
        policy = cls(obs_space, act_space, lambda _: lr, **kwargs)
        policy.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _refuse(p, f"the weights do not fit the recorded policy ({first[:200]})") from None
    policy.set_training_mode(False)
    return SafePolicyModel(policy, algo)
