"""Agents by name, for the CLI and the protocol.

An agent argument is a registry name (:data:`AGENTS`), the path of a trained model
(``.zip``, or a directory holding ``model.zip``), or your own scheduler's code,
``module:attr`` or ``path/to/file.py:attr`` (:mod:`diloco_gym.agents.user`).
:func:`make_agents` builds the agents of one run and gives each a unique name; the same
agent given twice is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from diloco_gym.agents.base import Agent
from diloco_gym.agents.fleet_cap import CapAwareForecast
from diloco_gym.agents.fleet_links import LinkAwareForecast, LinkAwareForecastBudget
from diloco_gym.agents.heuristics import (
    CalibratedWA,
    FixedBudget,
    FixedInterval,
    NoSync,
    OfflineCalibratedOracle,
    OnlineForecastBudget,
    OnlineForecastWA,
    PressureGate,
    RandomDeferral,
    WADiLoCo,
)
from diloco_gym.agents.planner import CausalPlanner

__all__ = [
    "AGENTS",
    "SINGLE_HOST_ONLY",
    "FLEET_ONLY",
    "FLEET_NEEDS",
    "HEURISTICS",
    "LEARNED",
    "BUDGETED",
    "make_agent",
    "make_agents",
    "agent_names",
    "is_budget_aware",
    "is_budget_aware_spec",
    "shipped_spec",
]


def _reference(name: str) -> Callable[[], Agent]:
    def load() -> Agent:
        from diloco_gym.agents.learned import load_reference_agent

        return load_reference_agent(name)

    return load


#: The heuristic agents (no optional dependency).
_HEURISTIC_AGENTS: dict[str, Callable[[], Agent]] = {
    "no-sync": NoSync,
    "fixed-256": lambda: FixedInterval(256),
    "fixed-512": lambda: FixedInterval(512),
    "pressure-gate": PressureGate,
    "random-deferral": RandomDeferral,
    "wa-diloco": WADiLoCo,
    "calibrated-wa": CalibratedWA,
    "online-forecast": OnlineForecastWA,
    "offline-oracle": OfflineCalibratedOracle,
}

#: Shipped learned agents (need the ``rl`` extra), package data loaded by name from any
#: working directory: the free-budget reference PPO, and the budget-conditioned MaskablePPO
#: agents (budget-aware: they need a merge budget, so they run on the frontier's grid).
LEARNED: dict[str, Callable[[], Agent]] = {
    name: _reference(name)
    for name in (
        "reference-ppo",
        "reference-budget-bursty",
        "reference-budget-non-periodic",
        "reference-budget-mixed",
        "reference-ppo-v1",
        "reference-ppo-v2",
        "reference-budget-bursty-v1",
    )
}

#: Budget-aware heuristics: they read ``budget_left`` and need the env's exact merge budget
#: (``merge_budget=M``), so they run in ``diloco-gym frontier`` (at every budget of its
#: grid), not in a free-budget report.
BUDGETED: dict[str, Callable[[], Agent]] = {
    "online-forecast-budget": OnlineForecastBudget,
    "fixed-budget": FixedBudget,
    "causal-planner": CausalPlanner,
}

#: Heuristics that need a fleet with an option the bench's fleet task does not set, so they
#: are not in a report's default agents and run in no bench task: ``cap-aware-forecast``
#: plans the per-site serving cap (``site_cap_pp``) from the ``<site>.cap_used`` features
#: (:mod:`diloco_gym.agents.fleet_cap`); ``link-aware-forecast`` reads changing links
#: (``link_levels``) from the ``<site>.link_rate`` features
#: (:mod:`diloco_gym.agents.fleet_links`). Each refuses a fleet without its option, and a
#: single host.
_FLEET_AGENTS: dict[str, Callable[[], Agent]] = {
    "cap-aware-forecast": CapAwareForecast,
    "link-aware-forecast": LinkAwareForecast,
    "link-aware-forecast-budget": LinkAwareForecastBudget,
}
FLEET_ONLY = frozenset(_FLEET_AGENTS)
#: What each of ``FLEET_ONLY`` needs of a fleet (its ``[fleet]`` key), for errors.
FLEET_NEEDS: dict[str, str] = {
    name: f"{cls.needs} ({cls.option})"  # type: ignore[attr-defined]
    for name, cls in _FLEET_AGENTS.items()
}

AGENTS: dict[str, Callable[[], Agent]] = {
    **_HEURISTIC_AGENTS,
    **BUDGETED,
    **_FLEET_AGENTS,
    **LEARNED,
}

#: The agents a report runs by default (no-sync is the load match, not a contender; the
#: learned agents need the optional RL stack).
HEURISTICS = [n for n in _HEURISTIC_AGENTS if n != "no-sync"]

#: Heuristics that read only the single host's observation (17 features), so they cannot
#: schedule a fleet, whose observation has a block per site: ``causal-planner`` fits its
#: burst model to one host's arrivals.
SINGLE_HOST_ONLY = frozenset({"causal-planner"})


def agent_names() -> list[str]:
    return list(AGENTS)


def is_budget_aware(agent: object) -> bool:
    """Whether ``agent`` steers by its merge budget (reads ``budget_left``): such agents
    declare ``budget_aware = True``. Any other agent run with ``merge_budget=M`` is only
    held to the budget by the env's action mask."""
    return bool(getattr(agent, "budget_aware", False))


def is_budget_aware_spec(spec: str) -> bool:
    """Whether the agent an argument names is budget-aware, without loading a model: the
    budget-aware heuristics (:data:`BUDGETED`), and learned models whose training metadata
    (``meta.json`` beside ``model.zip``) records the budget observation transform."""
    import json

    if spec in BUDGETED:
        return True
    if spec in _FLEET_AGENTS:
        return bool(getattr(_FLEET_AGENTS[spec], "budget_aware", False))
    if spec in _HEURISTIC_AGENTS:
        return False
    if _is_user(spec):  # your own code: its object says (loading it, as the run will)
        from diloco_gym.agents.user import load_user_agent

        return is_budget_aware(load_user_agent(spec))
    meta: object = None
    if spec in LEARNED:
        from diloco_gym.agents.learned import reference_meta

        meta = reference_meta(spec)
    else:
        p = Path(spec)
        p = p / "model.zip" if p.is_dir() else p
        meta_path = p.with_name("meta.json")
        if p.name == "model.zip" and meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                meta = None
    obs = meta.get("observation") if isinstance(meta, dict) else None
    return isinstance(obs, dict) and obs.get("transform") == "budget"


def _is_user(spec: str) -> bool:
    """Whether an agent argument names your own code (``module:attr``, ``file.py:attr``)
    rather than a registry name or an existing model path."""
    from diloco_gym.agents.user import is_user_spec

    return spec not in AGENTS and is_user_spec(spec) and not Path(spec).exists()


def shipped_spec(spec: str, base: Path | None = None) -> str:
    """An agent argument as a process in another working directory reads it: registry
    names and ``module:attr`` unchanged, model and agent-file paths absolute (a relative
    one taken relative to ``base``, default the current directory)."""
    if spec in AGENTS:
        return spec
    if _is_user(spec):
        from diloco_gym.agents.user import shipped_user_spec

        return shipped_user_spec(spec, base)
    p = Path(spec).expanduser()
    return str((p if base is None or p.is_absolute() else base / p).resolve())


def _model_file(spec: str) -> Path | None:
    """The model file an agent argument stands for (resolved), or ``None`` for a heuristic
    or your own code."""
    if spec in LEARNED:
        from diloco_gym.agents.learned import reference_model_path

        return reference_model_path(spec).resolve()
    if spec in AGENTS or _is_user(spec):
        return None
    p = Path(spec)
    return (p / "model.zip" if p.is_dir() else p).resolve()


def make_agent(name: str) -> Agent:
    """The agent called ``name``, a learned agent loaded from a model file path, or your
    own scheduler named by ``module:attr`` or ``path/to/file.py:attr``
    (:func:`diloco_gym.agents.user.load_user_agent`).

    Raises:
        ValueError: for an unknown name (listing the valid ones); an
            :class:`~diloco_gym.agents.user.AgentSpecError` for code that cannot be made
            an agent.
        FileNotFoundError: a model path that does not exist.
    """
    if name in AGENTS:
        agent = AGENTS[name]()
        agent.name = name
        return agent
    if _is_user(name):
        from diloco_gym.agents.user import load_user_agent

        return cast(Agent, load_user_agent(name))
    if name.endswith(".zip") or Path(name).exists():
        from diloco_gym.agents.learned import load_learned_agent

        return load_learned_agent(name)
    raise ValueError(
        f"unknown agent {name!r}; valid agents: {', '.join(AGENTS)} "
        f"(or a path to a trained model .zip, or your own code as module:attr or "
        f"path/to/file.py:attr)"
    )


def make_agents(specs: list[str]) -> list[Agent]:
    """The agents of one run, each with a unique name.

    Learned agents loaded from paths are named ``{algo}:{file stem}`` (``ppo:model``);
    when two would share a name, parent folders are added until they differ
    (``ppo:reference/model``, ``ppo:ppo/model``).

    Raises:
        ValueError: the same agent given twice (the same name, or two arguments naming the
            same model file, such as ``reference-ppo`` and ``agents/reference/model.zip``);
            or an unknown name.
        FileNotFoundError: a model path that does not exist.
    """
    seen: dict[object, str] = {}
    for spec in specs:
        path = _model_file(spec)
        key = ("file", path) if path is not None else ("name", shipped_spec(spec))
        if key in seen:
            same = "" if seen[key] == spec else f" (the same model as {seen[key]!r})"
            raise ValueError(f"agent {spec!r} is given twice{same}; give each agent once")
        seen[key] = spec
    agents = [make_agent(spec) for spec in specs]
    from_path = [i for i, spec in enumerate(specs) if spec not in AGENTS and not _is_user(spec)]
    if from_path:
        from diloco_gym.agents.learned import learned_name

        parts = dict.fromkeys(from_path, 1)
        # Every spec in from_path (not a heuristic) has a model file.
        while True:
            names = [a.name for a in agents]
            grow = [
                i
                for i in from_path
                if names.count(names[i]) > 1
                and parts[i] < len(cast(Path, _model_file(specs[i])).parts)
            ]
            if not grow:
                break
            for i in grow:
                parts[i] += 1
                algo = agents[i].name.split(":", 1)[0]
                agents[i].name = learned_name(algo, cast(Path, _model_file(specs[i])), parts[i])
    names = [a.name for a in agents]
    dup = [s for s, n in zip(specs, names, strict=True) if names.count(n) > 1]
    if dup:  # e.g. a model file whose name reads like another agent's
        raise ValueError(
            f"agents {', '.join(map(repr, dup))} would share a name in the "
            f"report; rename one of the model files"
        )
    return agents
