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
unknown policy class, a space other than a ``Box`` / ``Discrete`` / ``MultiBinary`` (one
action per site: a model trained on a rounds fleet; PPO or MaskablePPO), a constructor argument
outside :data:`_KWARGS`, weights that are not plain tensors) is refused with an error that
names the file and what was refused. ``--trust-model-file`` (``diloco_gym.agents.learned``) switches
back to SB3's normal loader for files the user trusts.

Sizes are checked before anything of that size is read or built
(:mod:`diloco_gym.sim.limits`): the file and its members' declared uncompressed sizes
against ``MODEL_BYTES`` (members are read with a bounded reader), the policy's parameter
count (:func:`policy_parameter_count`, from ``net_arch`` and the spaces) against
``MODEL_PARAMS``, a ``meta.json`` against ``META_BYTES`` and JSON nesting against
``JSON_DEPTH``; a :class:`ModelLimitError` names the file and the field.

:func:`load_model_safely` rebuilds a training checkpoint the same way, as a model that
``diloco-gym train --resume`` continues (the hyperparameters from the JSON's plain numbers,
the optimizer state as tensors, the timestep counters).
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

from diloco_gym.sim.limits import LimitError

__all__ = [
    "UnsafeModelError",
    "ModelLimitError",
    "SafePolicyModel",
    "load_policy_safely",
    "load_model_safely",
    "read_model_archive",
    "check_model_archive",
    "read_meta_bytes",
    "policy_parameter_count",
    "KNOWN_POLICIES",
    "ALGORITHM_CLASSES",
    "algorithm_class",
]


class UnsafeModelError(ValueError):
    """A model archive that the safe loader cannot rebuild without running its pickles.
    ``path`` is the file and ``what`` the reason (``None`` when raised with a message
    only)."""

    path: Path | None = None
    what: str | None = None


class ModelLimitError(UnsafeModelError, LimitError):
    """A model file, one of its members or its policy is above a size limit
    (:data:`diloco_gym.sim.limits.LIMITS`: ``MODEL_BYTES``, ``MODEL_PARAMS``, ``META_BYTES``,
    ``JSON_DEPTH``); the message names the file and the field."""

    def __init__(self, path: Path, field: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.what = message
        self.field = field


#: Algorithm name (as in meta.json) -> (module, class) of the SB3 algorithm.
ALGORITHM_CLASSES: dict[str, tuple[str, str]] = {
    "ppo": ("stable_baselines3", "PPO"),
    "maskable-ppo": ("sb3_contrib", "MaskablePPO"),
    "dqn": ("stable_baselines3", "DQN"),
}


def algorithm_class(algo: str) -> Any:
    """The stable-baselines3 (or sb3-contrib) class of ``algo`` (:data:`ALGORITHM_CLASSES`).

    Raises:
        ImportError: the ``rl`` extra is missing.
    """
    import importlib

    module, name = ALGORITHM_CLASSES[algo]
    return getattr(importlib.import_module(module), name)


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
    exc = UnsafeModelError(
        f"learned agent: {path} is not a valid model file for the safe loader: {what} (it "
        f"rebuilds only known SB3 policies from the archive's JSON and tensor weights; "
        f"--trust-model-file uses stable-baselines3's own loader, which runs the pickles "
        f"inside the file)"
    )
    exc.path, exc.what = path, what
    return exc


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
        n, binary = _action_size(act)
        if binary:
            act_space: Any = gym.spaces.MultiBinary(n)
        else:
            act_space = gym.spaces.Discrete(n, start=int(dict(act or {}).get("start", 0)))
    except (KeyError, ValueError, TypeError) as exc:
        what = f"the action space is not a plain Discrete or MultiBinary ({exc})"
        raise _refuse(path, what) from None
    return obs_space, act_space


def _action_size(act: Any) -> tuple[int, bool]:
    """``(n, binary)`` of a recorded action space: ``Discrete(n)``, or ``MultiBinary(n)``
    with ``n`` a plain count (one action per site)."""
    if not isinstance(act, dict):
        raise ValueError("not a Discrete or a MultiBinary")
    kind = str(act.get(":type:"))
    binary = "spaces.multi_binary.MultiBinary" in kind
    if not binary and "spaces.discrete.Discrete" not in kind:
        raise ValueError("not a Discrete or a MultiBinary")
    raw = act["n"]  # a Discrete's is written as a string ("2"), a MultiBinary's as an int
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"n = {str(raw)[:40]}")
    n = int(raw)
    if n < 1:
        raise ValueError(f"n = {n}")
    return n, binary


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
        ModelLimitError: the file, a member or the policy is above its size limit.
    """
    p = Path(path)
    members = read_model_archive(p, ("data", "policy.pth"))
    data = _data_json(p, members["data"])
    cls, algo, obs_space, act_space, kwargs = _policy_parts(p, data)
    state = _tensors(p, members["policy.pth"], "policy.pth")
    lr = float(data["learning_rate"]) if isinstance(data.get("learning_rate"), int | float) else 0.0
    try:
        policy = cls(obs_space, act_space, lambda _: lr, **kwargs)
        policy.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _refuse(p, f"the weights do not fit the recorded policy ({_first(exc)})") from None
    policy.set_training_mode(False)
    return SafePolicyModel(policy, algo)


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _limit(path: Path, name: str, value: float, field: str) -> None:
    """:func:`~diloco_gym.sim.limits.check_limit` as a :class:`ModelLimitError` naming the
    file and the field."""
    from diloco_gym.sim.limits import LimitError, check_limit

    try:
        check_limit(name, value, f"{path}: {field}")
    except LimitError as exc:
        raise ModelLimitError(path, field, str(exc)) from None


def read_model_archive(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, bytes]:
    """The ``required`` (and present ``optional``) members of a model zip, read within
    ``MODEL_BYTES`` (:mod:`diloco_gym.sim.limits`): the file's size, every member's declared
    uncompressed size and their total are checked before any member is read, and each is
    read with a reader that stops past the bytes left, so a header that understates a
    member's size cannot get past the limit either.

    Raises:
        UnsafeModelError: not a zip, a required member missing, a corrupt member.
        ModelLimitError: a size above ``MODEL_BYTES`` (naming the file and the member).
    """
    import zlib

    from diloco_gym.sim.limits import limit

    check_model_archive(path)
    left = limit("MODEL_BYTES")
    out: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}
            missing = [n for n in required if n not in infos]
            if missing:
                raise _refuse(path, f"the archive has no {' and '.join(map(repr, missing))} entry")
            for name in [*required, *(n for n in optional if n in infos)]:
                with zf.open(infos[name]) as member:
                    raw = member.read(left + 1)
                if len(raw) > left:
                    raise ModelLimitError(
                        path,
                        name,
                        f"{path}: {name} decompresses to more than its declared size, past the "
                        f"limit of {limit('MODEL_BYTES'):,} bytes of the model's members",
                    )
                left -= len(raw)
                out[name] = raw
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise _refuse(path, f"not a readable zip archive ({_first(exc)})") from None
    except OSError as exc:
        raise _refuse(path, f"cannot read it ({exc.strerror or _first(exc)})") from None
    return out


def check_model_archive(path: Path) -> None:
    """Check a model zip's size and its members' declared uncompressed sizes (each and in
    total) against ``MODEL_BYTES`` without reading any member (see
    :func:`read_model_archive`)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _refuse(path, f"cannot read it ({exc.strerror or _first(exc)})") from None
    _limit(path, "MODEL_BYTES", size, "file size in bytes")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise _refuse(path, f"not a readable zip archive ({_first(exc)})") from None
    for info in infos:
        _limit(path, "MODEL_BYTES", info.file_size, f"{info.filename[:80]} (uncompressed bytes)")
    _limit(path, "MODEL_BYTES", sum(i.file_size for i in infos), "its members (uncompressed bytes)")


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def json_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest (brackets inside strings do
    not count), found without parsing it."""
    bare = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    step = np.zeros(bare.shape, dtype=np.int64)
    step[(bare == ord("[")) | (bare == ord("{"))] = 1
    step[(bare == ord("]")) | (bare == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def check_json_depth(path: Path, raw: bytes, field: str) -> None:
    """Refuse JSON nested deeper than ``JSON_DEPTH`` before it is parsed."""
    _limit(path, "JSON_DEPTH", json_depth(raw), f"{field} (JSON nesting levels)")


def read_meta_bytes(path: Path) -> bytes:
    """A ``meta.json`` (beside a model, or of a training run) read within ``META_BYTES``
    and checked for ``JSON_DEPTH``.

    Raises:
        ModelLimitError: too large or too deeply nested (naming the file).
        OSError: it cannot be read.
    """
    from diloco_gym.sim.limits import limit

    _limit(path, "META_BYTES", path.stat().st_size, "file size in bytes")
    with open(path, "rb") as handle:
        raw = handle.read(limit("META_BYTES") + 1)  # a file growing meanwhile stops here
    _limit(path, "META_BYTES", len(raw), "file size in bytes")
    check_json_depth(path, raw, "meta.json")
    return raw


def _data_json(p: Path, raw: bytes) -> dict[str, Any]:
    """The archive's ``data`` entry as a JSON object (its pickles are never decoded)."""
    check_json_depth(p, raw, "data")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _refuse(p, f"its 'data' entry is not JSON ({_first(exc)})") from None
    if not isinstance(data, dict):
        raise _refuse(p, "its 'data' entry is not a JSON object")
    return data


def _tensors(p: Path, raw: bytes, member: str) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a weights member: a mapping of names to tensors
    (an optimizer's state also holds numbers and lists)."""
    import torch

    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the safe unpickler raises several kinds
        m = _UNSAFE_GLOBAL.search(str(exc))
        what = f" ({m.group(1)})" if m else ""
        raise _refuse(
            p,
            f"{member} holds a Python object{what} that the safe loader refuses; a model "
            f"file should hold tensors only",
        ) from None
    if member == "policy.pth" and not (
        isinstance(state, dict)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise _refuse(p, "policy.pth is not a mapping of parameter names to tensors")
    if not isinstance(state, dict):
        raise _refuse(p, f"{member} is not a mapping")
    return state


def _policy_parts(p: Path, data: dict[str, Any]) -> tuple[type, str, Any, Any, dict[str, Any]]:
    """``(policy class, algorithm, observation space, action space, constructor
    arguments)`` of the archive's JSON, its parameter count checked against
    ``MODEL_PARAMS`` before any space or layer is built."""
    cls, algo, takes_sde = _policy_class(p, data.get("policy_class"))
    kwargs = _policy_kwargs(p, data.get("policy_kwargs"))
    obs_shape, n_actions, binary = _space_sizes(p, data)
    if binary and algo == "dqn":
        raise _refuse(p, "a MultiBinary action space is rebuilt for ppo and maskable-ppo only")
    # the action head: one logit per site (PPO's Bernoulli), two (MaskablePPO's categorical)
    heads = 2 * n_actions if binary and algo == "maskable-ppo" else n_actions
    count = policy_parameter_count(algo, int(np.prod(obs_shape)), heads, kwargs.get("net_arch"))
    arch = kwargs.get("net_arch")
    _limit(p, "MODEL_PARAMS", count, f"policy_kwargs.net_arch {arch} (parameters)")
    obs_space, act_space = _spaces(p, data)
    if takes_sde:
        if data.get("use_sde", False) is not False:
            raise _refuse(p, "state-dependent exploration (use_sde) is not supported")
        kwargs["use_sde"] = False
    return cls, algo, obs_space, act_space, kwargs


def _space_sizes(p: Path, data: dict[str, Any]) -> tuple[tuple[int, ...], int, bool]:
    """The observation shape, the number of actions (of sites for a ``MultiBinary``) and
    whether the action space is a ``MultiBinary``, read as plain numbers (nothing of their
    size is allocated)."""
    obs, act = data.get("observation_space"), data.get("action_space")
    try:
        if not (isinstance(obs, dict) and "spaces.box.Box" in str(obs.get(":type:"))):
            raise ValueError("not a Box")
        raw = obs["_shape"]
        shape = tuple(int(x) for x in (json.loads(raw) if isinstance(raw, str) else raw))
        if not 1 <= len(shape) <= 8 or min(shape) < 1:
            raise ValueError(f"_shape {shape}")
    except (KeyError, ValueError, TypeError) as exc:
        raise _refuse(p, f"the observation space is not a plain Box ({exc})") from None
    try:
        n, binary = _action_size(act)
    except (KeyError, ValueError, TypeError) as exc:
        what = f"the action space is not a plain Discrete or MultiBinary ({exc})"
        raise _refuse(p, what) from None
    _limit(p, "MODEL_PARAMS", float(np.prod([float(x) for x in shape])), "observation_space._shape")
    _limit(p, "MODEL_PARAMS", n, "action_space.n")
    return shape, n, binary


def _mlp(size: int, arch: list[int]) -> tuple[int, int]:
    """``(parameters, output size)`` of SB3's MLP of linear layers ``arch`` on ``size``."""
    count = 0
    for width in arch:
        count += size * width + width
        size = width
    return count, size


def policy_parameter_count(algo: str, obs_size: int, n_actions: int, net_arch: Any) -> int:
    """The parameters (weights and biases) of the SB3 policy :data:`KNOWN_POLICIES` builds
    for ``algo`` on a flat observation of ``obs_size`` and ``n_actions`` discrete actions,
    from ``net_arch`` alone (``None``: SB3's default 64 x 64), so that a huge policy is
    refused before it is built.

    Actor-critic (``ppo``, ``maskable-ppo``): the policy and value MLPs (a list is both; a
    dict gives ``pi`` and ``vf``), the action head and the value head. ``dqn``: the
    Q-network (MLP and a head of ``n_actions``) and its target copy.
    """
    if algo == "dqn":
        arch = net_arch if isinstance(net_arch, list) else [64, 64]
        body, last = _mlp(obs_size, arch)
        return 2 * (body + last * n_actions + n_actions)
    if net_arch is None:
        pi, vf = [64, 64], [64, 64]
    elif isinstance(net_arch, dict):
        pi, vf = list(net_arch.get("pi", [])), list(net_arch.get("vf", []))
    else:
        pi, vf = list(net_arch), list(net_arch)
    pi_count, pi_last = _mlp(obs_size, pi)
    vf_count, vf_last = _mlp(obs_size, vf)
    return pi_count + pi_last * n_actions + n_actions + vf_count + vf_last + 1


def preflight_trusted(path: Path) -> None:
    """The size checks of the safe loader for a file about to be loaded by
    stable-baselines3's own loader (``--trust-model-file``): the archive's sizes
    (:func:`check_model_archive`) and, where the JSON records them plainly, the policy's
    parameter count; what only the pickles hold is left to that loader.

    Raises:
        ModelLimitError: a size above its limit.
    """
    try:
        members = read_model_archive(path, ("data",))
        data = _data_json(path, members["data"])
        _policy_parts(path, data)
    except ModelLimitError:
        raise
    except (UnsafeModelError, ImportError):  # that loader's own error will tell
        return


#: Algorithm arguments the caller sets itself, never taken from a checkpoint.
_OWN_ARGS = frozenset(
    {"policy", "env", "device", "seed", "verbose", "tensorboard_log", "policy_kwargs"}
    | {"_init_setup_model", "stats_window_size"}
)
#: Arguments that size memory or the work per update: a checkpoint must agree with the run.
_SIZING_ARGS = ("n_steps", "batch_size", "n_epochs", "buffer_size", "gradient_steps")
#: Modules of the default buffer classes (recorded as pickles; the default is rebuilt).
_BUFFER_MODULES = ("stable_baselines3.common.buffers", "sb3_contrib.common.maskable.buffers")
#: Training counters restored from plain integers.
_COUNTERS = ("num_timesteps", "_n_updates", "_episode_num", "_n_calls")
_CONSTANT_SCHEDULE = re.compile(r"^ConstantSchedule\(val=([-+0-9.eE]+)\)$")


def _serialized(value: Any) -> bool:
    return isinstance(value, dict) and ":serialized:" in value


def _constant(p: Path, name: str, value: Any) -> float | None:
    """A clipping range recorded as SB3's constant schedule (its printed form)."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    text = str(value.get("value_schedule", "")) if isinstance(value, dict) else ""
    m = _CONSTANT_SCHEDULE.match(text)
    if m is None:
        raise _refuse(p, f"{name} is not a constant the safe loader can read")
    return float(m.group(1))


def _algo_kwargs(
    p: Path, cls: type, data: dict[str, Any], run_hp: dict[str, Any]
) -> dict[str, Any]:
    """The algorithm's constructor arguments recorded in the checkpoint's JSON as plain
    numbers (what stable-baselines3's loader restores), less those the caller sets; the
    arguments that size memory or work must equal the run's (``run_hp``, else the class's
    default). ``train_freq``, recorded only as a pickle, is the run's."""
    import inspect

    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    out: dict[str, Any] = {}
    for name, param in params.items():
        if name == "self" or name in _OWN_ARGS or name not in data:
            continue
        value = data[name]
        if name in ("rollout_buffer_class", "replay_buffer_class"):
            if value is None or (
                isinstance(value, dict) and value.get("__module__") in _BUFFER_MODULES
            ):
                continue  # the default class, which the algorithm builds itself
            raise _refuse(p, f"{name} is not the default buffer class")
        if name in ("rollout_buffer_kwargs", "replay_buffer_kwargs"):
            if value in (None, {}):
                continue
            raise _refuse(p, f"{name} is not empty")
        if name == "train_freq":
            if "train_freq" in run_hp:
                out[name] = run_hp["train_freq"]
            continue
        if name in ("clip_range", "clip_range_vf"):
            value = _constant(p, name, value)
        elif _serialized(value):
            raise _refuse(p, f"{name} is recorded only as a pickle")
        elif not (value is None or isinstance(value, bool | int | float)):
            raise _refuse(p, f"{name} {str(value)[:60]!r} is not a plain number")
        if name in _SIZING_ARGS:
            want = run_hp.get(name, param.default)
            if value != want:
                raise _refuse(
                    p,
                    f"{name} {value} is not the run's {want} (a run resumes with its own settings)",
                )
        out[name] = value
    return out


def load_model_safely(
    path: str | Path,
    algo: str,
    env: Any,
    hyperparameters: dict[str, Any],
    *,
    seed: int,
    tensorboard_log: str | None = None,
    verbose: int = 0,
) -> Any:
    """Rebuild a checkpoint of ``diloco-gym train`` (an SB3 ``PPO``, ``MaskablePPO`` or
    ``DQN`` zip) as a model that training can continue, without unpickling anything.

    From the archive it reads, within the size limits of :func:`read_model_archive` and
    ``MODEL_PARAMS``: the policy class (one of :data:`KNOWN_POLICIES`, which must be
    ``algo``'s), the spaces (which must be ``env``'s) and the policy's constructor
    arguments from the ``data`` JSON; the algorithm's hyperparameters from the JSON's
    plain numbers (the clipping ranges from their printed constant schedules;
    ``train_freq``, recorded only as a pickle, from ``hyperparameters``; the arguments that
    size memory or work, such as ``n_steps`` and ``buffer_size``, must equal
    ``hyperparameters``); the policy weights ``policy.pth`` and the optimizer state
    ``policy.optimizer.pth`` with ``torch.load(weights_only=True)``; and the training
    counters (``num_timesteps``, updates, episodes) from plain integers. The new model is
    seeded with ``seed``; its observation buffers and episode statistics start empty (the
    env is reset when training continues), as after SB3's own load with a new env.

    Raises:
        UnsafeModelError: something cannot be restored from JSON and tensors (the message
            names the file and what, and says to pass ``--trust-model-file``).
        ModelLimitError: the file, a member or the policy is above its size limit.
    """
    p = Path(path)
    try:
        return _load_model(p, algo, env, hyperparameters, seed, tensorboard_log, verbose)
    except ModelLimitError:
        raise
    except UnsafeModelError as exc:
        raise UnsafeModelError(
            f"--resume: {p} cannot be restored without unpickling: {exc.what}; pass "
            f"--trust-model-file to load it with stable-baselines3's own loader, which runs "
            f"any code the file holds, if you trust it"
        ) from None


def _load_model(
    p: Path,
    algo: str,
    env: Any,
    run_hp: dict[str, Any],
    seed: int,
    tensorboard_log: str | None,
    verbose: int,
) -> Any:
    members = read_model_archive(
        p, ("data", "policy.pth", "policy.optimizer.pth"), ("pytorch_variables.pth",)
    )
    data = _data_json(p, members["data"])
    policy_cls, policy_algo, obs_space, act_space, policy_kwargs = _policy_parts(p, data)
    if policy_algo != algo:
        raise _refuse(p, f"it holds a {policy_algo} policy, not a {algo} one")
    if obs_space != env.observation_space or act_space != env.action_space:
        raise _refuse(p, "its observation and action spaces are not the run's env's")
    cls = algorithm_class(algo)
    if cls.policy_aliases.get("MlpPolicy") is not policy_cls:
        raise _refuse(p, f"its policy is not {algo}'s MlpPolicy")
    policy_kwargs.pop("use_sde", None)  # the algorithm's own argument (checked False)
    kwargs = _algo_kwargs(p, cls, data, run_hp)
    state = _tensors(p, members["policy.pth"], "policy.pth")
    optimizer = _tensors(p, members["policy.optimizer.pth"], "policy.optimizer.pth")
    if "pytorch_variables.pth" in members and _tensors(
        p, members["pytorch_variables.pth"], "pytorch_variables.pth"
    ):
        raise _refuse(p, "pytorch_variables.pth holds variables the safe loader does not restore")
    counters: dict[str, int] = {}
    for name in _COUNTERS:
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
            raise _refuse(p, f"{name} {str(value)[:40]!r} is not a count")
        counters[name] = value
    try:
        model = cls(
            "MlpPolicy",
            env,
            seed=seed,
            device="cpu",
            verbose=verbose,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            **kwargs,
        )
    except (AssertionError, TypeError, ValueError) as exc:
        raise _refuse(p, f"its hyperparameters do not build a model ({_first(exc)})") from None
    try:
        model.policy.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _refuse(p, f"the weights do not fit the recorded policy ({_first(exc)})") from None
    try:
        model.policy.optimizer.load_state_dict(optimizer)
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as exc:
        raise _refuse(
            p, f"policy.optimizer.pth does not fit the policy's optimizer ({_first(exc)})"
        ) from None
    _check_optimizer(p, model.policy.optimizer)
    for name, value in counters.items():
        if hasattr(model, name):
            setattr(model, name, value)
    rate = data.get("exploration_rate")  # DQN's epsilon, until its next step recomputes it
    if hasattr(model, "exploration_rate") and isinstance(rate, int | float) and 0 <= rate <= 1:
        model.exploration_rate = float(rate)
    return model


def _check_optimizer(p: Path, optimizer: Any) -> None:
    """The loaded optimizer state fits its parameters: per-parameter tensors of their
    shapes, and settings that are plain numbers."""
    import torch

    for group in optimizer.param_groups:
        for key, value in group.items():
            if key == "params":
                continue
            values = value if isinstance(value, tuple | list) else (value,)
            if not all(v is None or isinstance(v, bool | int | float | str) for v in values):
                raise _refuse(p, f"policy.optimizer.pth's {key} is not a plain setting")
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    if value.shape != param.shape:
                        raise _refuse(
                            p, f"policy.optimizer.pth's {key} does not fit the policy's weights"
                        )
