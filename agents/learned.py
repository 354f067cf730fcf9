"""Learned agents: stable-baselines3 models behind the common :class:`Agent` interface.

A model trained with ``diloco-gym train`` is a ``model.zip``; ``meta.json`` next to it (when
present) names the algorithm and the regime. :func:`load_learned_agent` loads it, and the
registry (``agents.registry.make_agent``) calls it for any ``.zip`` path, so a learned
agent runs wherever a heuristic does: ``diloco-gym run --agent PATH`` and
``diloco-gym report --agent PATH``. The shipped reference agent is package data, loaded by
the registry name ``reference-ppo`` from any directory (:func:`reference_model_path`).

A learned agent is deployable: its policy maps observations to actions (a MaskablePPO
model also reads the action mask of its :class:`~agents.base.AgentContext`).

Load only model files you trust: besides the weights (which are read with PyTorch's safe
``weights_only`` loader), stable-baselines3 unpickles parts of a model zip's ``data`` entry.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Agent, AgentContext

__all__ = ["LearnedAgent", "load_learned_agent", "REFERENCE_MODEL", "reference_model_path"]

#: The shipped reference agent (PPO on the bursty regime), see agents/reference/README.md.
#: In a source checkout and a regular install this is the file itself; prefer
#: :func:`reference_model_path`, which also works from a zipped install.
REFERENCE_MODEL = Path(__file__).resolve().parent / "reference" / "model.zip"

_stack = contextlib.ExitStack()  # keeps an extracted copy alive for zipped installs


def reference_model_path() -> Path:
    """The reference model as a file path, located with ``importlib.resources`` (package
    data of ``agents``), so it does not depend on the working directory.

    Raises:
        FileNotFoundError: the package was installed without its data files.
    """
    res = importlib.resources.files("agents").joinpath("reference").joinpath("model.zip")
    if not res.is_file():
        raise FileNotFoundError(
            "reference-ppo: agents/reference/model.zip is missing from the "
            "installed package (package data not shipped)"
        )
    return Path(_stack.enter_context(importlib.resources.as_file(res)))


#: Algorithm name (as in meta.json) -> (module, class).
_CLASSES = {
    "ppo": ("stable_baselines3", "PPO"),
    "maskable-ppo": ("sb3_contrib", "MaskablePPO"),
    "dqn": ("stable_baselines3", "DQN"),
}


def _model_class(algo: str):
    import importlib

    module, name = _CLASSES[algo]
    return getattr(importlib.import_module(module), name)


def _sniff_algo(path: Path) -> str | None:
    """Guess the algorithm from the policy class recorded in the zip's ``data`` entry."""
    try:
        with zipfile.ZipFile(path) as zf:
            data = json.loads(zf.read("data").decode("utf-8"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    policy = data.get("policy_class", {})
    text = " ".join(str(v) for v in policy.values()) if isinstance(policy, dict) else str(policy)
    if "maskable" in text.lower():
        return "maskable-ppo"
    if "dqn" in text.lower():
        return "dqn"
    if "ActorCritic" in text or "policies" in text:
        return "ppo"
    return None


class LearnedAgent(Agent):
    """A stable-baselines3 model as an agent: ``model.predict(obs, deterministic=True)``.

    For a ``MaskablePPO`` model the context's action mask is passed along when the agent
    is attached and predicts a single observation (with the default ``skip_forced=True``
    and no merge budget both actions are always feasible, and the env enforces the
    corridor for every agent anyway).

    Args:
        model: a loaded SB3 model (``PPO``, ``MaskablePPO``, ``DQN``, ...).
        name: the agent's name in tables and reports.
        meta: the training metadata (``meta.json``), if known.
        path: the model file it was loaded from, if any (names and duplicate checks).
    """

    deployable = True

    def __init__(
        self, model: Any, name: str = "learned", meta: dict | None = None, path: Path | None = None
    ) -> None:
        self.model = model
        self.name = name
        self.meta = dict(meta or {})
        self.path = None if path is None else Path(path).resolve()
        self._context: AgentContext | None = None
        self._maskable = type(model).__name__ == "MaskablePPO"

    def attach(self, context: AgentContext) -> None:
        """Remember the context (only for the action mask of maskable models)."""
        self._context = context

    def act(self, obs: np.ndarray) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if self._maskable and self._context is not None and len(obs) == 1:
            kwargs["action_masks"] = self._context.action_mask()[None]
        actions, _ = self.model.predict(
            np.asarray(obs, dtype=np.float32), deterministic=True, **kwargs
        )
        return np.asarray(actions, dtype=np.int64).reshape(len(obs))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _load_error(exc: BaseException) -> str:
    """One line for a failed load, without PyTorch's advice to retry with
    ``weights_only=False`` (or to allowlist globals): both would run code from a file of
    unknown origin."""
    text = _ANSI.sub("", str(exc))
    if "weights_only" in text or "Weights only load failed" in text:
        m = _UNSAFE_GLOBAL.search(text)
        what = f" ({m.group(1)})" if m else ""
        return (
            f"{type(exc).__name__}: the weights hold a Python object{what} that the safe "
            f"loader refuses; a model file should hold tensors only"
        )
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"


def learned_name(algo: str, path: Path, parts: int = 1) -> str:
    """``{algo}:{path}`` with the last ``parts`` components of the path, without ``.zip``
    (``ppo:model``, ``ppo:reference/model``)."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix == ".zip" else p
    if parts >= len(stem.parts):
        return f"{algo}:{stem.as_posix()}"
    return f"{algo}:{'/'.join(stem.parts[-parts:])}"


def load_learned_agent(path: str | Path) -> LearnedAgent:
    """Load a trained model as a :class:`LearnedAgent`.

    Args:
        path: a ``model.zip`` written by ``diloco-gym train`` (or any SB3 PPO, MaskablePPO
            or DQN zip), or a directory holding ``model.zip``. ``meta.json`` beside the
            model, when present, gives the algorithm; otherwise it is read from the zip (or
            PPO, MaskablePPO, DQN are tried in turn). The agent is named
            ``{algo}:{file stem}`` (``ppo:model``); ``agents.registry.make_agents`` adds
            parent folders when two agents of a run would share a name.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a valid stable-baselines3 model (the message names
            the file and the loader's first complaint).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "model.zip"
    if not p.is_file():
        raise FileNotFoundError(f"learned agent: model file not found: {p}")
    if not zipfile.is_zipfile(p):
        raise ValueError(
            f"learned agent: {p} is not a valid model file (not a zip archive "
            f"written by stable-baselines3)"
        )
    meta: dict = {}
    meta_path = p.with_name("meta.json")
    if p.name == "model.zip" and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta = {}
    algo = meta.get("algo") if meta.get("algo") in _CLASSES else _sniff_algo(p)
    order = [algo] if algo else []
    order += [a for a in _CLASSES if a not in order]
    errors = []
    model = None
    loaded = "learned"
    for a in order:
        try:
            cls = _model_class(a)
        except ImportError as exc:
            errors.append(f"{a}: {exc}")
            continue
        try:
            model = cls.load(p, device="cpu")
            loaded = a
            break
        except Exception as exc:  # noqa: BLE001 - SB3 raises many kinds on bad files
            errors.append(f"{a}: {_load_error(exc)}")
    if model is None:
        raise ValueError(
            f"learned agent: {p} is not a valid model file ({'; '.join(errors)[:500]})"
        )
    return LearnedAgent(model, name=learned_name(loaded, p), meta=meta, path=p)
