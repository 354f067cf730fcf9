"""Learned agents: stable-baselines3 models behind the common :class:`Agent` interface.

A model trained with ``diloco-gym train`` is a ``model.zip``; ``meta.json`` next to it (when
present) names the algorithm and the regime. :func:`load_learned_agent` loads it, and the
registry (``diloco_gym.agents.registry.make_agent``) calls it for any ``.zip`` path, so a learned
agent runs wherever a heuristic does: ``diloco-gym run --agent PATH`` and
``diloco-gym report --agent PATH``. The shipped reference agent is package data, loaded by
the registry name ``reference-ppo`` from any directory (:func:`reference_model_path`).

A learned agent is deployable: its policy maps observations to actions (a MaskablePPO
model also reads the action mask of its :class:`~diloco_gym.agents.base.AgentContext`).

Model files are loaded without unpickling anything (:mod:`diloco_gym.agents.safe_model`: the
archive's JSON and tensor-only weights, a policy rebuilt from known classes); a file that
needs more is refused. Only with ``trust=True``, or inside :func:`trusting_model_files`
(which the CLI's ``--trust-model-file`` opens around the command, and which the process
and Ray backends of :mod:`diloco_gym.backends` reopen in their workers, told by an
argument: :func:`~diloco_gym.backends.register_worker_setting`), does
stable-baselines3's own loader run, which unpickles parts of the zip's ``data`` entry: use it
only for files you trust. Each such load warns (:class:`TrustedModelFileWarning`), naming
the file. No environment variable switches it on.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.agents.safe_model import ALGORITHM_CLASSES, algorithm_class
from diloco_gym.backends import register_worker_setting
from diloco_gym.envs.budget_features import augment_observation, augmented_size

__all__ = [
    "LearnedAgent",
    "load_learned_agent",
    "REFERENCE_MODEL",
    "REFERENCE_AGENTS",
    "LearnerMismatchWarning",
    "trained_learners",
    "reference_model_path",
    "reference_meta",
    "load_reference_agent",
    "TrustedModelFileWarning",
    "trusting_model_files",
    "model_files_trusted",
]


class TrustedModelFileWarning(UserWarning):
    """A model file was loaded with stable-baselines3's own loader, which unpickles (runs
    code from) the file: issued for every such load, naming the file."""


_trusted = False  # set only inside trusting_model_files()


@contextlib.contextmanager
def trusting_model_files(trust: bool = True) -> Iterator[None]:
    """Within the block, :func:`load_learned_agent` (and so the registry) loads model files
    with stable-baselines3's own, unpickling loader when ``trust`` (the CLI's
    ``--trust-model-file``); the previous setting is restored after it. It is this process's
    setting only: worker processes are told it explicitly (:mod:`diloco_gym.backends`)."""
    global _trusted
    before = _trusted
    _trusted = bool(trust)
    try:
        yield
    finally:
        _trusted = before


def model_files_trusted() -> bool:
    """Whether this process is inside :func:`trusting_model_files` (``--trust-model-file``)."""
    return _trusted


# The process and Ray backends pass the setting to their workers as an argument.
register_worker_setting(model_files_trusted, trusting_model_files)


def warn_trusted_load(path: Path | str) -> None:
    """Warn, every time, that ``path`` is being loaded by an unpickling loader."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", TrustedModelFileWarning)
        warnings.warn(
            f"--trust-model-file: loading {path} with stable-baselines3's own loader, which "
            f"unpickles it (runs any code the file holds)",
            TrustedModelFileWarning,
            stacklevel=3,
        )


#: The shipped reference agent (PPO on the bursty regime), see agents/reference/README.md.
#: In a source checkout and a regular install this is the file itself; prefer
#: :func:`reference_model_path`, which also works from a zipped install.
REFERENCE_MODEL = Path(__file__).resolve().parent / "reference" / "model.zip"

_stack = contextlib.ExitStack()  # keeps an extracted copy alive for zipped installs


#: Shipped learned agents: registry name -> model file under ``agents/reference`` (see
#: agents/reference/README.md). The ``reference-budget-*`` agents are budget-conditioned
#: MaskablePPO policies (they need a merge budget; ``diloco-gym frontier`` gives one). The
#: ``-v1`` agents were trained from scratch on ``DiLoCoSync-v1``'s reward.
REFERENCE_AGENTS: dict[str, tuple[str, ...]] = {
    "reference-ppo": ("model.zip",),
    "reference-budget-bursty": ("budget-bursty", "model.zip"),
    "reference-budget-non-periodic": ("budget-non-periodic", "model.zip"),
    "reference-budget-mixed": ("budget-mixed", "model.zip"),
    "reference-ppo-v1": ("ppo-v1", "model.zip"),
    "reference-ppo-v2": ("ppo-v2", "model.zip"),
    "reference-budget-bursty-v1": ("budget-bursty-v1", "model.zip"),
}


def reference_model_path(name: str = "reference-ppo") -> Path:
    """A shipped model as a file path, located with ``importlib.resources`` (package data
    of ``agents``), so it does not depend on the working directory.

    Args:
        name: a key of :data:`REFERENCE_AGENTS`.

    Raises:
        FileNotFoundError: the package was installed without its data files.
    """
    parts = REFERENCE_AGENTS[name]
    res = importlib.resources.files("diloco_gym.agents").joinpath("reference")
    for part in parts:
        res = res.joinpath(part)
    if not res.is_file():
        raise FileNotFoundError(
            f"{name}: agents/reference/{'/'.join(parts)} is missing from the "
            f"installed package (package data not shipped)"
        )
    return Path(_stack.enter_context(importlib.resources.as_file(res)))


def reference_meta(name: str) -> dict | None:
    """The ``meta.json`` beside a shipped model (read as package data, so it is found
    from a zipped install too), or ``None``."""
    parts = REFERENCE_AGENTS[name]
    res = importlib.resources.files("diloco_gym.agents").joinpath("reference")
    for part in parts[:-1]:
        res = res.joinpath(part)
    meta = res.joinpath("meta.json")
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except ValueError as exc:
        raise ValueError(f"{name}: agents/reference meta.json is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else None


class LearnerMismatchWarning(UserWarning):
    """A learned agent is judged with other learners than it was trained with (its
    learner observations differ from training's)."""


def trained_learners(spec: str) -> str | None:
    """The learners a learned agent was trained with, as its ``meta.json`` records them:
    the SHA-256 of its learner calibration file, ``""`` for the env's default learners
    (no file), or ``None`` when ``spec`` is not a learned model with metadata."""
    if spec in REFERENCE_AGENTS:
        meta = reference_meta(spec) or {}
    else:
        p = Path(spec)
        if p.is_dir():
            p = p / "model.zip"
        if p.suffix != ".zip" or not p.is_file():
            return None
        meta = _meta_for(p, None)
    if not meta:
        return None
    recorded = (meta.get("config") or {}).get("learner_calibration_file")
    if isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str):
        return recorded["sha256"]
    return ""


def load_reference_agent(name: str) -> LearnedAgent:
    """A shipped agent of :data:`REFERENCE_AGENTS`, with its training metadata (and so its
    observation transform)."""
    return load_learned_agent(reference_model_path(name), meta=reference_meta(name))


#: Algorithm name (as in meta.json) -> (module, class).
_CLASSES = ALGORITHM_CLASSES


def _model_class(algo: str):
    return algorithm_class(algo)


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

    A model trained with an observation transform (``meta.json``'s ``observation``, e.g.
    the budget features of :mod:`diloco_gym.envs.budget_features`) gets the same features here,
    computed from the observation and the context's public parameters; such a
    ``"budget"`` model is **budget-aware**: it needs the
    env's ``merge_budget``, as the budget-aware heuristics do, and ``diloco-gym frontier``
    runs it at every budget.

    Args:
        model: a loaded SB3 model (``PPO``, ``MaskablePPO``, ``DQN``, ...).
        name: the agent's name in tables and reports.
        meta: the training metadata (``meta.json``), if known.
        path: the model file it was loaded from, if any (names and duplicate checks).
        obs_transform: the observation transform (default: the one ``meta`` records).
    """

    deployable = True

    def __init__(
        self,
        model: Any,
        name: str = "learned",
        meta: dict | None = None,
        path: Path | None = None,
        obs_transform: str | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.meta = dict(meta or {})
        self.path = None if path is None else Path(path).resolve()
        self._context: AgentContext | None = None
        self._maskable = bool(getattr(model, "maskable", type(model).__name__ == "MaskablePPO"))
        obs_meta = self.meta.get("observation") or {}
        if obs_transform is None:
            obs_transform = obs_meta.get("transform") if isinstance(obs_meta, dict) else None
        # a fleet model records its (wider) observation's size
        base = obs_meta.get("base_size") if isinstance(obs_meta, dict) else None
        want = augmented_size(obs_transform, base)  # raises for an unknown transform
        #: the env observation's length (predict() checks it): 17, or a fleet's
        self.obs_size = int(base) if base else None
        space = getattr(model, "observation_space", None)
        shape = getattr(space, "shape", None)
        if shape is not None and tuple(shape) != (want,):
            raise ValueError(
                f"learned agent {name}: the model takes observations of shape {tuple(shape)}, "
                f"but its observation transform {obs_transform!r} gives ({want},)"
            )
        self.obs_transform = obs_transform
        #: a budget-conditioned model steers by its merge budget (frontier: "budget-aware").
        self.budget_aware = obs_transform is not None
        #: a model trained on a rounds fleet: one action per site (``MultiBinary``)
        self.per_site = type(getattr(model, "action_space", None)).__name__ == "MultiBinary"

    def attach(self, context: AgentContext) -> None:
        """Remember the context (the action mask of maskable models; the public merge
        budget of budget-conditioned models)."""
        if self.budget_aware and (
            context.params.merge_budget is None or context.params.merge_budget < 1
        ):
            raise ValueError(
                f"{self.name} is budget-conditioned: run it with a merge budget "
                f"(merge_budget=M; `diloco-gym frontier` gives one at every budget)"
            )
        if self.per_site and "round_open" not in (context.features or ()):
            raise ValueError(
                f"{self.name} was trained on a fleet with timing = 'rounds' (one action per "
                f"site): run it on such a fleet"
            )
        self._context = context

    def act(self, obs: np.ndarray) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if self._maskable and self._context is not None and len(obs) == 1:
            kwargs["action_masks"] = self._context.action_mask()[None]
        x = np.asarray(obs, dtype=np.float32)
        if self.obs_transform is not None:
            if self._context is None:
                raise RuntimeError(
                    f"{self.name} computes budget features from the env's public merge "
                    f"budget: attach it first (diloco_gym.eval.rollout.run_episode does)"
                )
            x = augment_observation(x, self._context.params, self.obs_transform)
        actions, _ = self.model.predict(x, deterministic=True, **kwargs)
        if self.per_site:  # one row of site actions per observation
            return np.asarray(actions, dtype=np.int64).reshape(len(obs), -1)
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


def load_learned_agent(
    path: str | Path, meta: dict | None = None, trust: bool | None = None
) -> LearnedAgent:
    """Load a trained model as a :class:`LearnedAgent`.

    Args:
        path: a ``model.zip`` written by ``diloco-gym train`` (or any SB3 PPO, MaskablePPO
            or DQN zip), or a directory holding ``model.zip``. ``meta.json`` beside the
            model, when present, gives the algorithm; otherwise it is read from the zip (or
            PPO, MaskablePPO, DQN are tried in turn). The agent is named
            ``{algo}:{file stem}`` (``ppo:model``); ``diloco_gym.agents.registry.make_agents`` adds
            parent folders when two agents of a run would share a name.
        meta: the training metadata to use instead of the ``meta.json`` beside the model.
        trust: load with stable-baselines3's own loader, which unpickles parts of the file,
            with a :class:`TrustedModelFileWarning` naming it (``None``: only inside
            :func:`trusting_model_files`, the CLI's ``--trust-model-file``). Otherwise the
            file is read without unpickling
            (:func:`diloco_gym.agents.safe_model.load_policy_safely`) and refused when that
            cannot rebuild it.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a valid stable-baselines3 model (the message names
            the file and the loader's first complaint).
    """
    p = _model_file(Path(path))
    meta = _meta_for(p, meta)
    if not (model_files_trusted() if trust is None else trust):
        from diloco_gym.agents.safe_model import load_policy_safely

        try:
            safe = load_policy_safely(p)
        except ImportError as exc:
            raise ValueError(
                f"learned agent {p}: loading a trained model needs the 'rl' extra "
                f"(pip install 'diloco-gym[rl]'): {exc}"
            ) from None
        return _as_agent(safe, safe.algo, p, meta)
    model, loaded = _load_trusted(p, meta)
    return _as_agent(model, loaded, p, meta)


def _model_file(p: Path) -> Path:
    """The model file ``p`` names (``model.zip`` in a directory), checked to be a zip."""
    if p.is_dir():
        p = p / "model.zip"
    if not p.is_file():
        raise FileNotFoundError(f"learned agent: model file not found: {p}")
    if not zipfile.is_zipfile(p):
        raise ValueError(
            f"learned agent: {p} is not a valid model file (not a zip archive "
            f"written by stable-baselines3)"
        )
    return p


def _meta_for(p: Path, meta: dict | None) -> dict:
    """``meta`` as given (when not empty), else the ``meta.json`` beside a ``model.zip`` or
    a ``best_model.zip`` (a training run's two models share it; ``{}``: none or unreadable;
    the metadata names the algorithm and the observation transform)."""
    if meta:
        return dict(meta)
    meta_path = p.with_name("meta.json")
    if p.name in ("model.zip", "best_model.zip") and meta_path.is_file():
        from diloco_gym.agents.safe_model import ModelLimitError, read_meta_bytes

        try:
            # within META_BYTES and JSON_DEPTH (a ModelLimitError names the file)
            data = json.loads(read_meta_bytes(meta_path).decode("utf-8-sig"))
        except ModelLimitError:
            raise
        except (OSError, ValueError):  # unreadable or not JSON: no metadata
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def _load_trusted(p: Path, meta: dict) -> tuple[Any, str]:
    """``(model, algo)`` by stable-baselines3's own (unpickling) loader: the algorithm of
    ``meta`` or the zip first, then the others."""
    from diloco_gym.agents.safe_model import preflight_trusted

    preflight_trusted(p)  # the size limits hold for a trusted file too
    warn_trusted_load(p)
    algo = meta.get("algo") if meta.get("algo") in _CLASSES else _sniff_algo(p)
    order = [algo] if algo else []
    order += [a for a in _CLASSES if a not in order]
    errors = []
    missing = []
    for a in order:
        try:
            cls = _model_class(a)
        except ImportError as exc:
            missing.append(f"{a}: {exc}")
            continue
        try:
            return cls.load(p, device="cpu"), a
        except Exception as exc:  # noqa: BLE001 - SB3 raises many kinds on bad files
            errors.append(f"{a}: {_load_error(exc)}")
    if not errors:  # no RL library could even be imported
        raise ValueError(
            f"learned agent {p}: loading a trained model needs the 'rl' extra "
            f"(pip install 'diloco-gym[rl]'): {'; '.join(missing)[:300]}"
        )
    raise ValueError(
        f"learned agent: {p} is not a valid model file ({'; '.join(errors + missing)[:500]})"
    )


def _as_agent(model: Any, algo: str, p: Path, meta: dict) -> LearnedAgent:
    """The agent of a loaded model, with the observation transform ``meta`` records."""
    obs = meta.get("observation")
    transform = obs.get("transform") if isinstance(obs, dict) else None
    try:
        return LearnedAgent(
            model, name=learned_name(algo, p), meta=meta, path=p, obs_transform=transform
        )
    except ValueError as exc:
        raise ValueError(f"learned agent: {p}: {exc}") from None
