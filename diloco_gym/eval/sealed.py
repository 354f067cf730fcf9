"""Deployable agents sealed in their own process.

A deployable agent may use observations, action masks and the env's public parameters
only. In-process, nothing stops an agent's code from walking ``gc.get_objects()`` or the
caller's frames (``sys._getframe``) to the env, the episode's trace, its merge costs or its
seed. :class:`SealedAgent` runs the agent in a separate worker process started with the
``spawn`` method (a fresh interpreter: none of the parent's objects are copied into it)
that holds agents and nothing else of the evaluation. The parent sends it, per episode,
the public parameters (:class:`~diloco_gym.envs.core.EnvParams`), the regime's name and
the observation's feature names (a fleet's per-site table), with the episode's first
observation; and per decision one observation and the current action mask; it answers
with the action. The env, the episode, the trace, the merge costs, the seed, the step
infos and the scoring stay in the parent, and so does every non-deployable agent (the
oracle).

Each agent object is pickled into the worker as constructed (before any episode).
:func:`seal_agents` puts all the deployable agents of one call into **one** worker (one
interpreter to start instead of one per agent), and :func:`act_together` asks several of
them in one message: :func:`diloco_gym.eval.rollout.run_episodes` steps the agents of a
unit in lockstep and pays one pipe round trip per decision of the episode instead of one
per decision of every agent (measured in ``benchmarks/sealed_overhead.py``). Agents that
share a worker can see each other's objects; the runner only ever sends them observations
of one decision at a time, in decision order, so an agent asked at decision ``d`` finds in
its process nothing later than ``d`` (and never the env, the trace or the seed). The
worker serves every episode of a process (report and frontier cells reuse it).

In-process evaluation remains available as an explicit opt-out
(``--in-process-agents``); reports state which mode they ran in.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import weakref
from typing import Any

import numpy as np

__all__ = ["SealedAgent", "seal_agents", "act_together", "SEALED", "IN_PROCESS"]

#: report.json / report.md values of the agent-sealing mode.
SEALED = "sealed (deployable agents in their own process)"
IN_PROCESS = "in-process (--in-process-agents: not sealed)"


# Act messages and their answers travel as raw arrays behind a small pickled header (a
# round of a report is a few observations: pickling each array costs more than the pipe).
# Pickled messages start with the pickle protocol byte 0x80, packed ones with b"A".
_PACKED = b"A"


def _pack(header: tuple, arrays: list[np.ndarray]) -> bytes:
    head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join(
        [_PACKED, len(head).to_bytes(4, "little"), head, *(a.tobytes() for a in arrays)]
    )


def _unpack(buf: bytes) -> tuple[tuple, memoryview]:
    size = int.from_bytes(buf[1:5], "little")
    return pickle.loads(buf[5 : 5 + size]), memoryview(buf)[5 + size :]


def _pack_items(items: list[tuple]) -> bytes | None:
    """``(slot, obs, mask, start)`` items as one packed message, or None when their
    observations or masks differ in shape (or a mask is missing): then pickled."""
    obs0, mask0 = items[0][1], items[0][2]
    if mask0 is None or any(
        it[2] is None or it[1].shape != obs0.shape or it[2].shape != mask0.shape for it in items
    ):
        return None
    slots = tuple(it[0] for it in items)
    starts = tuple(it[3] for it in items)
    obs = np.stack([it[1] for it in items]).astype(np.float32, copy=False)
    masks = np.stack([it[2] for it in items]).astype(bool, copy=False)
    return _pack((slots, starts, obs0.shape, mask0.shape), [obs, masks])


def _unpack_items(buf: bytes) -> list[tuple]:
    (slots, starts, obs_shape, mask_shape), data = _unpack(buf)
    n = len(slots)
    n_obs = n * int(np.prod(obs_shape, dtype=np.int64))
    obs = np.frombuffer(data, np.float32, n_obs).reshape(n, *obs_shape).copy()
    masks = np.frombuffer(data, bool, offset=4 * n_obs).reshape(n, *mask_shape).copy()
    return [(slots[i], obs[i], masks[i], starts[i]) for i in range(n)]


def _pack_actions(actions: list[np.ndarray]) -> bytes | None:
    a0 = actions[0]
    if any(a.dtype != a0.dtype or a.shape != a0.shape for a in actions) or a0.dtype.hasobject:
        return None
    return _pack((a0.dtype.str, a0.shape, len(actions)), [np.stack(actions)])


def _unpack_actions(buf: bytes) -> list[np.ndarray]:
    (dtype, shape, n), data = _unpack(buf)
    block = np.frombuffer(data, np.dtype(dtype)).reshape(n, *shape).copy()
    return list(block)


def _attach(agents: list, ctxs: list, states: list, slot: int, msg: tuple) -> None:
    """Start an episode of the agent in ``slot``: its public context and first mask."""
    from diloco_gym.agents.base import AgentContext

    params, regime, features, mask = msg
    ctxs[slot] = ctx = AgentContext(params=params, regime=regime, features=features)
    ctx._set_mask(mask)
    states[slot] = None
    try:
        if callable(getattr(agents[slot], "attach", None)):
            agents[slot].attach(ctx)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
        raise _AgentError(slot, f"{type(exc).__name__}: {exc}") from None


def _answer(agents: list, ctxs: list, states: list, items: list) -> list:
    """The worker's actions for one message of ``(slot, obs, mask, start)`` items."""
    actions = []
    for slot, obs, mask, start in items:
        try:
            if ctxs[slot] is not None:
                ctxs[slot]._set_mask(mask)
            action, states[slot] = agents[slot].predict(
                obs, state=states[slot], episode_start=np.array([start]), deterministic=True
            )
        except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
            raise _AgentError(slot, f"{type(exc).__name__}: {exc}") from None
        actions.append(np.asarray(action).reshape(-1))
    return actions


class _AgentError(Exception):
    def __init__(self, slot: int, text: str) -> None:
        super().__init__(text)
        self.slot, self.text = slot, text


def _serve(conn: Any, blobs: list[bytes]) -> None:
    """The worker: build the agents, then answer act requests until closed."""
    import sys

    agents = [pickle.loads(b) for b in blobs]
    del blobs
    if "torch" in sys.modules:  # one thread per worker: a policy step is tiny
        sys.modules["torch"].set_num_threads(1)
    ctxs: list = [None] * len(agents)
    states: list = [None] * len(agents)
    while True:
        try:
            buf = conn.recv_bytes()
        except EOFError:
            return
        try:
            if buf[:1] == _PACKED:
                actions = _answer(agents, ctxs, states, _unpack_items(buf))
                packed = _pack_actions(actions)
                if packed is None:
                    conn.send(("ok", actions))
                else:
                    conn.send_bytes(packed)
                continue
            msg = pickle.loads(buf)
            if msg[0] == "act":
                conn.send(("ok", _answer(agents, ctxs, states, msg[1])))
            elif msg[0] == "attach":
                _attach(agents, ctxs, states, msg[1], msg[2:])
                conn.send(("ok", None))
            elif msg[0] == "close":
                return
        except (BrokenPipeError, EOFError, OSError):
            return  # the parent is gone
        except _AgentError as exc:
            try:
                conn.send(("error", (exc.slot, exc.text)))
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


class _Worker:
    """One spawn worker process holding the agents pickled in ``blobs`` (slot = index)."""

    def __init__(self, blobs: list[bytes], names: list[str]) -> None:
        self.names = names
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, blobs), daemon=True)
        self.proc.start()
        child.close()
        self.finalizer = weakref.finalize(self, _stop, self.proc, self.conn)

    def call(self, msg: tuple, slot: int) -> Any:
        """Send one message about the agent in ``slot`` and return the answer."""
        self.send(msg, [slot])
        return self.receive([slot])

    def send(self, msg: tuple, slots: list[int]) -> None:
        packed = _pack_items(msg[1]) if msg[0] == "act" else None
        try:
            if packed is None:
                self.conn.send(msg)
            else:
                self.conn.send_bytes(packed)
        except (EOFError, ConnectionError, BrokenPipeError) as exc:
            raise self._ended(slots, exc) from None

    def receive(self, slots: list[int]) -> Any:
        try:
            buf = self.conn.recv_bytes()
        except (EOFError, ConnectionError, BrokenPipeError) as exc:
            raise self._ended(slots, exc) from None
        if buf[:1] == _PACKED:
            return _unpack_actions(buf)
        kind, value = pickle.loads(buf)
        if kind == "error":
            slot, text = value
            raise RuntimeError(f"sealed agent {self.names[slot]}: {text}")
        return value

    def _ended(self, slots: list[int], exc: BaseException) -> RuntimeError:
        code = self.proc.exitcode
        who = ", ".join(dict.fromkeys(self.names[i] for i in slots))
        return RuntimeError(
            f"sealed agent {who}: its worker process ended "
            f"({'exit code ' + str(code) if code is not None else type(exc).__name__}). "
            "Workers start a fresh interpreter that imports the calling script as a "
            "module: a script that runs the protocol needs an "
            "`if __name__ == '__main__':` guard and must be a file (not standard input); "
            "or evaluate in-process (in_process_agents=True, --in-process-agents)"
        )


class SealedAgent:
    """A deployable agent running in a worker process (module docstring).

    It has the runner's agent interface (``name``, ``deployable``, ``attach(context)``,
    ``predict(obs, state, episode_start, deterministic)``) and forwards the public context
    and each observation with the current action mask to the worker. ``SealedAgent(a)``
    starts a worker of its own; :func:`seal_agents` starts one for several agents.

    Raises:
        ValueError: the agent is not deployable (only deployable agents are sealed; the
            oracle needs the episode and runs in the parent).
    """

    deployable = True

    def __init__(self, agent: Any) -> None:
        _check_deployable(agent)
        self._bind(agent, _Worker([pickle.dumps(agent)], [_name(agent)]), 0)

    @classmethod
    def _in(cls, agent: Any, worker: _Worker, slot: int) -> SealedAgent:
        self = cls.__new__(cls)
        self._bind(agent, worker, slot)
        return self

    def _bind(self, agent: Any, worker: _Worker, slot: int) -> None:
        self.name = _name(agent)
        self.budget_aware = bool(getattr(agent, "budget_aware", False))
        self.inner_type = type(agent).__name__
        self._worker, self._slot = worker, slot
        self._ctx: Any = None

    def attach(self, context: Any) -> None:
        """Send the public parameters, the regime's name, the observation's feature names
        (a fleet's per-site table) and the mask to the worker."""
        self._ctx = context
        features = getattr(context, "features", None)
        msg = ("attach", self._slot, context.params, context.regime, features)
        self._worker.call((*msg, context.action_mask()), self._slot)

    def _item(self, observation: Any, episode_start: Any) -> tuple:
        obs = np.array(observation, dtype=np.float32)
        mask = None if self._ctx is None else self._ctx.action_mask()
        start = episode_start is not None and bool(np.asarray(episode_start).reshape(-1)[0])
        return (self._slot, obs, mask, start)

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        """The worker's action for one observation (the context's current mask with it)."""
        return act_together([(self, observation, episode_start)])[0], None

    def close(self) -> None:
        """Stop the worker (also done when it is garbage-collected or at exit); agents
        sealed together by :func:`seal_agents` share it and all stop."""
        self._worker.finalizer()


def act_together(requests: list[tuple[SealedAgent, Any, Any]]) -> list[np.ndarray]:
    """The actions of several sealed agents, ``(agent, observation, episode_start)`` each,
    in request order: one message per worker, all sent before any answer is read.

    Raises:
        ValueError: an agent is asked twice (it follows one episode at a time).
    """
    by_worker: dict[int, tuple[_Worker, list, list]] = {}
    for i, (agent, obs, start) in enumerate(requests):
        w = agent._worker
        entry = by_worker.setdefault(id(w), (w, [], []))
        item = agent._item(obs, start)
        if any(it[0] == item[0] for it in entry[1]):
            raise ValueError(f"sealed agent {agent.name} asked twice in one act_together call")
        entry[1].append(item)
        entry[2].append(i)
    for w, items, _ in by_worker.values():
        w.send(("act", items), [it[0] for it in items])
    out: list[Any] = [None] * len(requests)
    failed: RuntimeError | None = None
    for w, items, where in by_worker.values():  # every answer read, even after an error
        try:
            for i, action in zip(where, w.receive([it[0] for it in items]), strict=True):
                out[i] = action
        except RuntimeError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return out


def _name(agent: Any) -> str:
    return getattr(agent, "name", type(agent).__name__)


def _check_deployable(agent: Any) -> None:
    if not bool(getattr(agent, "deployable", True)):
        raise ValueError(f"{_name(agent)!r} is not deployable: not sealed")


def seal_agents(agents: list, in_process: bool = False) -> list:
    """Each deployable agent of ``agents`` wrapped in a :class:`SealedAgent`, all of them in
    one worker process (the non-deployable ones, the oracle, unchanged);
    ``in_process=True`` returns ``agents``."""
    if in_process:
        return list(agents)
    deployable = [a for a in agents if bool(getattr(a, "deployable", True))]
    if not deployable:
        return list(agents)
    worker = _Worker([pickle.dumps(a) for a in deployable], [_name(a) for a in deployable])
    slots = {id(a): i for i, a in enumerate(deployable)}
    return [SealedAgent._in(a, worker, slots[id(a)]) if id(a) in slots else a for a in agents]
