"""Deployable agents sealed in their own process.

A deployable agent may use observations, action masks and the env's public parameters
only. In-process, nothing stops an agent's code from walking ``gc.get_objects()`` or the
caller's frames (``sys._getframe``) to the env, the episode's trace, its merge costs or its
seed. :class:`SealedAgent` runs the agent in a separate worker process started with the
``spawn`` method (a fresh interpreter: none of the parent's objects are copied into it)
that holds the agent and nothing else of the evaluation. The parent sends it, per episode,
the public parameters (:class:`~diloco_gym.envs.core.EnvParams`), the regime's name and
the observation's feature names (a fleet's per-site table),
and per decision one observation and the current action mask; it answers with the action.
The env, the episode, the trace, the merge costs, the seed, the step infos and the scoring
stay in the parent, and so does every non-deployable agent (the oracle).

The agent object is pickled into the worker as constructed (before any episode). One
worker per agent serves every episode of a process (report and frontier cells reuse it).
The cost is one pipe round trip per decision (measured in
``benchmarks/sealed_overhead.py``).

In-process evaluation remains available as an explicit opt-out
(``--in-process-agents``); reports state which mode they ran in.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import weakref
from typing import Any

import numpy as np

__all__ = ["SealedAgent", "seal_agents", "SEALED", "IN_PROCESS"]

#: report.json / report.md values of the agent-sealing mode.
SEALED = "sealed (deployable agents in their own process)"
IN_PROCESS = "in-process (--in-process-agents: not sealed)"


def _serve(conn: Any, blob: bytes) -> None:
    """The worker: build the agent, then answer attach / act requests until closed."""
    import sys

    from diloco_gym.agents.base import AgentContext

    agent = pickle.loads(blob)
    del blob
    if "torch" in sys.modules:  # one thread per worker: a policy step is tiny
        sys.modules["torch"].set_num_threads(1)
    ctx = None
    state = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        try:
            if msg[0] == "act":
                _, obs, mask, start = msg
                if ctx is not None:
                    ctx._set_mask(mask)
                action, state = agent.predict(
                    obs, state=state, episode_start=np.array([start]), deterministic=True
                )
                conn.send(("ok", np.asarray(action).reshape(-1)))
            elif msg[0] == "attach":
                _, params, regime, features, mask = msg
                ctx = AgentContext(params=params, regime=regime, features=features)
                ctx._set_mask(mask)
                state = None
                if callable(getattr(agent, "attach", None)):
                    agent.attach(ctx)
                conn.send(("ok", None))
            elif msg[0] == "close":
                return
        except (BrokenPipeError, EOFError, OSError):
            return  # the parent is gone
        except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
            try:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
            except (BrokenPipeError, OSError):
                return


def _stop(proc: Any, conn: Any) -> None:
    try:
        conn.send(("close",))
        conn.close()
    except (OSError, BrokenPipeError):
        pass
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()


class SealedAgent:
    """A deployable agent running in its own process (module docstring).

    It has the runner's agent interface (``name``, ``deployable``, ``attach(context)``,
    ``predict(obs, state, episode_start, deterministic)``) and forwards the public context
    and each observation with the current action mask to the worker.

    Raises:
        ValueError: the agent is not deployable (only deployable agents are sealed; the
            oracle needs the episode and runs in the parent).
    """

    deployable = True

    def __init__(self, agent: Any) -> None:
        if not bool(getattr(agent, "deployable", True)):
            raise ValueError(f"{getattr(agent, 'name', agent)!r} is not deployable: not sealed")
        self.name = getattr(agent, "name", type(agent).__name__)
        self.budget_aware = bool(getattr(agent, "budget_aware", False))
        self.inner_type = type(agent).__name__
        blob = pickle.dumps(agent)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, blob), daemon=True)
        self._proc.start()
        child.close()
        self._ctx: Any = None
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._conn)

    def _call(self, msg: tuple) -> Any:
        try:
            self._conn.send(msg)
            kind, value = self._conn.recv()
        except (EOFError, ConnectionError, BrokenPipeError) as exc:
            code = self._proc.exitcode
            raise RuntimeError(
                f"sealed agent {self.name}: its worker process ended "
                f"({'exit code ' + str(code) if code is not None else type(exc).__name__}). "
                "Workers start a fresh interpreter that imports the calling script as a "
                "module: a script that runs the protocol needs an "
                "`if __name__ == '__main__':` guard and must be a file (not standard input); "
                "or evaluate in-process (in_process_agents=True, --in-process-agents)"
            ) from None
        if kind == "error":
            raise RuntimeError(f"sealed agent {self.name}: {value}")
        return value

    def attach(self, context: Any) -> None:
        """Send the public parameters, the regime's name, the observation's feature names
        (a fleet's per-site table) and the mask to the worker."""
        self._ctx = context
        features = getattr(context, "features", None)
        self._call(("attach", context.params, context.regime, features, context.action_mask()))

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        """The worker's action for one observation (the context's current mask with it)."""
        obs = np.array(observation, dtype=np.float32)
        mask = None if self._ctx is None else self._ctx.action_mask()
        start = episode_start is not None and bool(np.asarray(episode_start).reshape(-1)[0])
        action = self._call(("act", obs, mask, start))
        return action, None

    def close(self) -> None:
        """Stop the worker (also done when the proxy is garbage-collected or at exit)."""
        self._finalizer()


def seal_agents(agents: list, in_process: bool = False) -> list:
    """Each deployable agent of ``agents`` wrapped in a :class:`SealedAgent` (the
    non-deployable ones, the oracle, unchanged); ``in_process=True`` returns ``agents``."""
    if in_process:
        return list(agents)
    return [SealedAgent(a) if bool(getattr(a, "deployable", True)) else a for a in agents]
