"""Learned agents: stable-baselines3 models behind the common :class:`Agent` interface.

A model trained with ``diloco-gym train`` is a ``model.zip``; ``meta.json`` next to it (when
present) names the algorithm and the regime. :func:`load_learned_agent` loads it, and the
registry (``agents.registry.make_agent``) calls it for any ``.zip`` path, so a learned
agent runs wherever a heuristic does: ``diloco-gym run --agent PATH`` and
``diloco-gym report --agent PATH``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Agent

__all__ = ["LearnedAgent", "load_learned_agent", "REFERENCE_MODEL"]

#: The shipped reference agent (PPO on the bursty regime), see agents/reference/README.md.
REFERENCE_MODEL = Path(__file__).resolve().parent / "reference" / "model.zip"

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

    For a ``MaskablePPO`` model the env's ``action_masks()`` is passed along when the agent
    is attached to an env and predicts a single observation (with the default
    ``skip_forced=True`` and no merge budget both actions are always feasible, and the env
    enforces the corridor for every agent anyway).

    Args:
        model: a loaded SB3 model (``PPO``, ``MaskablePPO``, ``DQN``, ...).
        name: the agent's name in tables and reports.
        meta: the training metadata (``meta.json``), if known.
    """

    deployable = True

    def __init__(self, model: Any, name: str = "learned", meta: dict | None = None) -> None:
        self.model = model
        self.name = name
        self.meta = dict(meta or {})
        self._env: Any = None
        self._maskable = type(model).__name__ == "MaskablePPO"

    def attach(self, env: Any, episode_seed: int | None = None) -> None:
        """Remember the env (only for ``action_masks()`` of maskable models)."""
        self._env = env

    def act(self, obs: np.ndarray) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if self._maskable and self._env is not None and len(obs) == 1:
            kwargs["action_masks"] = self._env.action_masks()[None]
        actions, _ = self.model.predict(np.asarray(obs, dtype=np.float32), deterministic=True,
                                        **kwargs)
        return np.asarray(actions, dtype=np.int64).reshape(len(obs))


def load_learned_agent(path: str | Path) -> LearnedAgent:
    """Load a trained model as a :class:`LearnedAgent`.

    Args:
        path: a ``model.zip`` written by ``diloco-gym train`` (or any SB3 PPO, MaskablePPO
            or DQN zip), or a directory holding ``model.zip``. ``meta.json`` beside the
            model, when present, gives the algorithm and the agent name
            (``learned:{algo}-{regime}``); otherwise the algorithm is read from the zip
            (or PPO, MaskablePPO, DQN are tried in turn) and the name is
            ``learned:{file stem}``.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a valid stable-baselines3 model.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "model.zip"
    if not p.is_file():
        raise FileNotFoundError(f"learned agent: model file not found: {p}")
    if not zipfile.is_zipfile(p):
        raise ValueError(f"learned agent: {p} is not a valid model file (not a zip archive "
                         f"written by stable-baselines3)")
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
    for a in order:
        try:
            cls = _model_class(a)
        except ImportError as exc:
            errors.append(f"{a}: {exc}")
            continue
        try:
            model = cls.load(p, device="cpu")
            break
        except Exception as exc:  # noqa: BLE001 - SB3 raises many kinds on bad files
            errors.append(f"{a}: {type(exc).__name__}: {exc}")
    if model is None:
        raise ValueError(f"learned agent: {p} is not a valid model file "
                         f"({'; '.join(errors)[:500]})")
    if meta.get("name"):
        name = str(meta["name"])
    elif p.name == "model.zip" and p.parent.name:
        name = f"learned:{p.parent.name}"
    else:
        name = f"learned:{p.stem}"
    return LearnedAgent(model, name=name, meta=meta)
