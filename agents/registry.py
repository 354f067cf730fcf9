"""Agents by name, for the CLI and the protocol."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agents.base import Agent
from agents.heuristics import (
    CalibratedWA,
    FixedInterval,
    NoSync,
    OfflineCalibratedOracle,
    OnlineForecastWA,
    PressureGate,
    RandomDeferral,
    WADiLoCo,
)

__all__ = ["AGENTS", "HEURISTICS", "make_agent", "agent_names"]

AGENTS: dict[str, Callable[[], Agent]] = {
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

#: The agents a report runs by default (no-sync is the load match, not a contender).
HEURISTICS = [n for n in AGENTS if n != "no-sync"]


def agent_names() -> list[str]:
    return list(AGENTS)


def make_agent(name: str) -> Agent:
    """The agent called ``name``, or a learned agent loaded from a model file path.

    Raises:
        ValueError: for an unknown name (listing the valid ones).
    """
    if name in AGENTS:
        agent = AGENTS[name]()
        agent.name = name
        return agent
    if name.endswith(".zip") or Path(name).exists():
        from agents.learned import load_learned_agent

        return load_learned_agent(name)
    raise ValueError(f"unknown agent {name!r}; valid agents: {', '.join(AGENTS)} "
                     f"(or a path to a trained model .zip)")
