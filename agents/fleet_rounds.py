"""Fleet agents on a fleet with per-site timing (``timing = "rounds"``): when to open a
round comes from a fleet agent; when each site contributes, from a per-site rule.

:class:`RoundsView` wraps a fleet agent (a heuristic through its
:class:`~diloco_gym.agents.fleet.FleetView`, or any agent that reads the fleet
observation) and turns its launch decision into the env's ``MultiBinary(N)`` action. The
rules (:data:`SITE_RULES`):

* ``together``: every site contributes as soon as it is ready (the one-instant sync where
  the rules allow it; stragglers join when ready);
* ``own-forecast``: each site contributes when its own traffic forecast is at or below its
  own slow baseline (``<site>.rate_forecast <= <site>.rate_baseline``, the WA rule of one
  site), else it waits, at the latest until the window's end, when the env forces the
  sites the quorum needs. The round opens with the sites quiet now, or, when none is, the
  one whose forecast is lowest against its baseline.

Both read only the observation (each site's pressure block and the round features), so
they are deployable. A name ``X+own`` in a report's agent list runs agent ``X`` with the
``own-forecast`` rule; ``X`` alone runs it with ``together``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.envs.observation import EXO_SLICE, OBS_DIM, OBS_INDEX

__all__ = [
    "RoundsView",
    "RoundsOracleView",
    "rounds_agent",
    "SITE_RULES",
    "OWN_SUFFIX",
    "split_rule",
    "check_site_rules",
    "check_per_site",
]

SITE_RULES = ("together", "own-forecast")
#: The suffix of an agent name that asks for the ``own-forecast`` rule.
OWN_SUFFIX = "+own"
_N_EXO = EXO_SLICE.stop - EXO_SLICE.start
_FORECAST = OBS_INDEX["rate_forecast"] - EXO_SLICE.start
_BASELINE = OBS_INDEX["rate_baseline"] - EXO_SLICE.start


def check_site_rules(names: list[str], rounds: bool) -> None:
    """``X+own`` names need a rounds fleet: a one-line ``ValueError`` naming them."""
    own = [n for n in names if n.endswith(OWN_SUFFIX)]
    if own and not rounds:
        raise ValueError(
            f"agent(s) {own}: the '+own' site rule needs a fleet with timing = 'rounds'"
        )


def check_per_site(agents: list[Any], rounds: bool) -> None:
    """An agent that chooses each site's contribution itself (``per_site``: a model trained
    on a rounds fleet) needs a rounds fleet: a one-line ``ValueError`` naming it."""
    per_site = [a.name for a in agents if getattr(a, "per_site", False)]
    if per_site and not rounds:
        raise ValueError(
            f"agent(s) {per_site} were trained on a fleet with timing = 'rounds' (one action "
            f"per site): run them on such a fleet"
        )


def split_rule(name: str) -> tuple[str, str]:
    """``(agent name, site rule)`` of a report's agent name (``X+own`` -> own-forecast)."""
    if name.endswith(OWN_SUFFIX):
        return name[: -len(OWN_SUFFIX)], "own-forecast"
    return name, "together"


class RoundsView(Agent):
    """A fleet agent on a rounds fleet (module docstring).

    Args:
        agent: the fleet agent that decides when a round opens (its action ``1``).
        rule: one of :data:`SITE_RULES`.
    """

    def __init__(self, agent: Any, rule: str = "together") -> None:
        if rule not in SITE_RULES:
            raise ValueError(f"site rule must be one of {SITE_RULES}, got {rule!r}")
        self.agent = agent
        self.rule = rule
        base = str(getattr(agent, "name", type(agent).__name__))
        self.name = base + (OWN_SUFFIX if rule == "own-forecast" else "")
        self.deployable = bool(getattr(agent, "deployable", True))
        self.budget_aware = bool(getattr(agent, "budget_aware", False))
        self._open = -1
        self._n_sites = 0
        self.obs_size: int | None = None

    def attach(self, context: AgentContext) -> None:
        names = list(context.features or ())
        if "round_open" not in names:
            raise ValueError(
                f"{self.name}: a rounds agent needs a fleet with timing = 'rounds' (its "
                f"observation has the round features)"
            )
        self._open = names.index("round_open")
        self.obs_size = len(names)  # Agent.predict checks the observation's width
        self._n_sites = sum(1 for n in names if n.endswith(".network"))
        attach = getattr(self.agent, "attach", None)
        if callable(attach):
            attach(context)

    def _quiet(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per site: whether its forecast is at or below its baseline, and by how much it
        is above it (forecast minus baseline, on the squashed scale of the features)."""
        n = self._n_sites
        rest = obs[OBS_DIM : OBS_DIM + _N_EXO * (n - 1)].reshape(n - 1, _N_EXO)
        blocks = np.concatenate([obs[EXO_SLICE][None], rest])
        f = blocks[:, _FORECAST].astype(np.float64)
        b = blocks[:, _BASELINE].astype(np.float64)
        return f <= b, f - b

    def _act_one(self, obs: np.ndarray) -> np.ndarray:
        n = self._n_sites
        if n == 0:
            raise RuntimeError(f"{self.name}: attach it to a rounds fleet first")
        in_round = obs[self._open] >= 0.5
        launch = int(np.asarray(self.agent.act(obs[None])).reshape(-1)[0])  # asked every time
        if not in_round and not launch:
            return np.zeros(n, dtype=np.int64)
        if self.rule == "together":
            return np.ones(n, dtype=np.int64)
        quiet, margin = self._quiet(obs)
        a = quiet.astype(np.int64)
        if not in_round and not a.any():
            a[int(np.argmin(margin))] = 1  # open the round with the quietest site
        return a

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim == 1:
            return self._act_one(obs)
        return np.stack([self._act_one(o) for o in obs])


class RoundsOracleView(RoundsView):
    """A non-deployable fleet agent (the offline oracle's fleet view) on a rounds fleet: it
    gets the episode as its wrapped agent does."""

    def attach_episode(self, env: Any, episode_seed: int) -> None:
        self.agent.attach_episode(env, episode_seed)


def rounds_agent(agent: Any, rule: str = "together") -> Any:
    """``agent`` (a fleet agent) on a rounds fleet with the site ``rule``. An agent that
    chooses each site's contribution itself (``per_site``: a model trained on a rounds
    fleet) runs as it is, and a site rule other than ``together`` is refused for it."""
    if getattr(agent, "per_site", False):
        if rule != "together":
            raise ValueError(
                f"{agent.name} chooses each site's contribution itself: the '+own' site "
                f"rule does not apply to it"
            )
        return agent
    if getattr(agent, "deployable", True):
        return RoundsView(agent, rule)
    return RoundsOracleView(agent, rule)
