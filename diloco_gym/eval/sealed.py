"""Deployable agents sealed in their own process.

A deployable agent may use observations, action masks and the env's public parameters
only. In-process, nothing stops an agent's code from walking ``gc.get_objects()`` or the
caller's frames (``sys._getframe``) to the env, the episode's trace, its merge costs or its
seed. :class:`SealedAgent` runs the agent in a separate worker process started with the
``spawn`` method (a fresh interpreter: none of the parent's objects are copied into it)
that holds agents and nothing else of the evaluation. The parent sends it, per episode,
the public parameters (:class:`~diloco_gym.envs.params.EnvParams`), the regime's name and
the observation's feature names (a fleet's per-site table), and per decision one
observation and the current action mask; it answers with the action. The env, the
episode, the trace, the merge costs, the seed, the step infos and the scoring stay in the
parent, and so does every non-deployable agent (the oracle).

Each agent object is pickled into the worker as constructed (before any episode).
:func:`seal_agents` puts the deployable agents of one call into one worker by default
(``workers=``: more), and :class:`Exchange` asks several agents of a worker in one message
and several workers at once: :func:`diloco_gym.eval.rollout.run_episodes` steps the
agents of a unit in lockstep, so a report pays one pipe round trip per decision of the
episode at which any agent is asked, instead of one per decision of every agent
(``benchmarks/sealed_overhead.py``). Agents that share a worker can see each other's
objects; the runner asks them in decision order, one decision per message, so an agent
asked at decision ``d`` finds in its process no observation later than ``d`` (and never
the env, the trace or the seed). A worker serves every episode of a process (report and
frontier cells reuse it).

In-process evaluation remains available as an explicit opt-out
(``--in-process-agents``); reports state which mode they ran in.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import select
import struct
import time
import weakref
from typing import Any

import numpy as np

__all__ = [
    "SealedAgent",
    "seal_agents",
    "act_together",
    "Exchange",
    "worker_key",
    "SEALED",
    "IN_PROCESS",
]

#: report.json / report.md values of the agent-sealing mode.
SEALED = "sealed (deployable agents in their own process)"
IN_PROCESS = "in-process (--in-process-agents: not sealed)"


# Act messages and their answers travel as raw bytes (a round of a report is one to a few
# observations: pickling each small array costs more than the pipe). Pickled messages
# start with the pickle protocol byte 0x80, packed ones with b"A". An act message:
# b"A", (n, observation size, mask size) as uint32, the slots (int32), the episode-start
# flags (uint8), the observations (float32), the masks (bool); an answer: b"A", then the
# n actions as int64. Anything else (other shapes or dtypes, no mask) is pickled.
_PACKED = b"A"
_HEAD = struct.Struct("<III")


def _pack_items(items: list[tuple]) -> bytes | None:
    """``(slot, obs, mask, start)`` items as one packed message, or None (then pickled)."""
    obs0, mask0 = items[0][1], items[0][2]
    if mask0 is None or obs0.ndim != 1 or mask0.ndim != 1:
        return None
    for _, obs, mask, _ in items:
        if (
            mask is None
            or obs.dtype != np.float32
            or mask.dtype != np.bool_
            or obs.shape != obs0.shape
            or mask.shape != mask0.shape
        ):
            return None
    n = len(items)
    return b"".join(
        [
            _PACKED,
            _HEAD.pack(n, obs0.size, mask0.size),
            struct.pack(f"<{n}i", *(it[0] for it in items)),
            bytes(bool(it[3]) for it in items),
            *(it[1].tobytes() for it in items),
            *(it[2].tobytes() for it in items),
        ]
    )


def _unpack_items(buf: bytes) -> list[tuple]:
    n, n_obs, n_mask = _HEAD.unpack_from(buf, 1)
    at = 1 + _HEAD.size
    slots = struct.unpack_from(f"<{n}i", buf, at)
    at += 4 * n
    starts = buf[at : at + n]
    at += n
    obs = np.frombuffer(buf, np.float32, n * n_obs, at).reshape(n, n_obs).copy()
    at += 4 * n * n_obs
    masks = np.frombuffer(buf, np.bool_, n * n_mask, at).reshape(n, n_mask).copy()
    return [(slots[i], obs[i], masks[i], bool(starts[i])) for i in range(n)]


def _pack_actions(actions: list[np.ndarray]) -> bytes | None:
    if any(a.dtype != np.int64 or a.shape != (1,) for a in actions):
        return None
    return _PACKED + b"".join(a.tobytes() for a in actions)


def _unpack_actions(buf: bytes) -> list[np.ndarray]:
    block = np.frombuffer(buf, np.int64, offset=1).copy()
    return [block[i : i + 1] for i in range(block.size)]


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


def _answer(conn: Any, agents: list, ctxs: list, states: list, items: list) -> None:
    """The worker's actions for one message of ``(slot, obs, mask, start)`` items, each
    sent as soon as it is decided (the parent steps that env while the next is decided);
    an agent's error is sent instead of its action and ends the message."""
    for slot, obs, mask, start in items:
        try:
            if ctxs[slot] is not None:
                ctxs[slot]._set_mask(mask)
            action, states[slot] = agents[slot].predict(
                obs, state=states[slot], episode_start=np.array([start]), deterministic=True
            )
        except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
            raise _AgentError(slot, f"{type(exc).__name__}: {exc}") from None
        answer = [np.asarray(action).reshape(-1)]
        packed = _pack_actions(answer)
        if packed is None:
            conn.send(("ok", answer))
        else:
            conn.send_bytes(packed)


class _AgentError(Exception):
    def __init__(self, slot: int, text: str) -> None:
        super().__init__(text)
        self.slot, self.text = slot, text


#: Longest busy wait (seconds) for the other side's next message before sleeping on it.
SPIN_S = 5e-4


class _Spin:
    """Busy-wait briefly for a message before sleeping on it: waking a sleeping process
    costs tens of microseconds here, about a lockstep round's work. The window adapts:
    doubled (up to ``cap``, and to at least twice the wait caught) after a wait it caught,
    halved after one it missed, so that on a loaded machine, where the other side is often
    not running, it falls to (almost) nothing; every 64th wait tries the whole window
    again, and a catch there restores it."""

    def __init__(self, cap: float) -> None:
        self.cap = self.window = max(0.0, cap)
        self.n = 0

    def wait(self, ready: Any) -> None:
        """Return once ``ready()`` is true or the window has passed."""
        self.n += 1
        window = self.cap if self.n % 64 == 0 else self.window
        if window <= 0.0:
            return
        start = time.perf_counter()
        end = start + window
        while (now := time.perf_counter()) < end:
            if ready():
                # at least twice the wait just caught: a collapsed window that catches the
                # every-64th full try is back at once (doubling from nothing never was)
                self.window = min(self.cap, max(self.window * 2, 2 * (now - start)))
                return
        self.window /= 2


def _serve(conn: Any, blobs: list[bytes], spin_s: float = 0.0) -> None:
    """The worker: build the agents, then answer act requests until closed."""
    import sys

    agents = [pickle.loads(b) for b in blobs]
    del blobs
    if "torch" in sys.modules:  # one thread per worker: a policy step is tiny
        sys.modules["torch"].set_num_threads(1)
    ctxs: list = [None] * len(agents)
    states: list = [None] * len(agents)
    spin = _Spin(spin_s)
    ready = select.poll()  # one poll object: conn.poll(0) builds a selector at every call
    ready.register(conn.fileno(), select.POLLIN)
    while True:
        try:
            spin.wait(lambda: bool(ready.poll(0)))
            buf = conn.recv_bytes()
        except EOFError:
            return
        try:
            if buf[:1] == _PACKED:
                _answer(conn, agents, ctxs, states, _unpack_items(buf))
                continue
            msg = pickle.loads(buf)
            if msg[0] == "act":
                _answer(conn, agents, ctxs, states, msg[1])
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
        self.proc = ctx.Process(target=_serve, args=(child, blobs, SPIN_S), daemon=True)
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
        obs = np.asarray(observation, dtype=np.float32)  # sent at once: bytes, no copy kept
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


def worker_key(agent: Any) -> int | None:
    """The worker that answers for ``agent`` (agents with one key share a process and an
    :class:`Exchange` message); ``None`` for an agent that is not sealed."""
    return id(agent._worker) if isinstance(agent, SealedAgent) else None


class Exchange:
    """Act messages in flight to several workers at once: :meth:`post` one message per
    worker (the agents of one worker, each at most once), :meth:`collect` the actions as
    they arrive (a worker answers each agent of a message as soon as it has decided), each
    with its tag from :meth:`post`."""

    def __init__(self) -> None:
        # by file descriptor: the worker, the message's slots and tags, actions read
        self._out: dict[int, list[Any]] = {}
        self._poll = select.poll()
        self._spin = _Spin(SPIN_S)

    def post(self, requests: list[tuple[SealedAgent, Any, Any]], tags: list) -> None:
        """Send ``(agent, observation, episode_start)`` requests, all of one worker.

        Raises:
            ValueError: the agents have different workers, one is asked twice, or their
                worker has not answered the previous message yet.
        """
        w = requests[0][0]._worker
        items = [agent._item(obs, start) for agent, obs, start in requests]
        slots = [it[0] for it in items]
        if any(agent._worker is not w for agent, _, _ in requests):
            raise ValueError("one Exchange.post is for the agents of one worker")
        if len(set(slots)) != len(slots):
            name = next(a.name for a, _, _ in requests if slots.count(a._slot) > 1)
            raise ValueError(f"sealed agent {name} asked twice in one message")
        if self.busy(requests[0][0]):
            raise ValueError(f"sealed agent {requests[0][0].name}: its worker is still busy")
        w.send(("act", items), slots)
        fd = w.conn.fileno()
        self._out[fd] = [w, slots, list(tags), 0]
        self._poll.register(fd, select.POLLIN)

    def busy(self, agent: SealedAgent) -> bool:
        """Whether ``agent``'s worker has not answered all of its last message yet."""
        return agent._worker.conn.fileno() in self._out

    def pending(self) -> bool:
        """Whether a posted message is still not wholly answered."""
        return bool(self._out)

    def collect(self, timeout: float | None = None) -> list[tuple[Any, np.ndarray]]:
        """The actions that arrived within ``timeout`` seconds (``None``: wait for one),
        ``(tag, action)`` each. After a worker's error every other answer is read (the
        workers stay usable) before it is raised."""
        if not self._out:
            return []
        events = self._poll.poll(0)
        if not events and timeout != 0:
            if timeout is None:
                self._spin.wait(lambda: bool(self._poll.poll(0)))
            events = self._poll.poll(None if timeout is None else int(timeout * 1000))
        out = []
        for fd, _event in events:  # an answer, or a closed pipe (read: the error names it)
            try:
                out.append(self._read(fd))
            except RuntimeError:
                self._drain()
                raise
        return out

    def _read(self, fd: int) -> tuple[Any, np.ndarray]:
        entry = self._out[fd]
        w, slots, tags, got = entry
        try:
            (action,) = w.receive(slots[got : got + 1])
        except RuntimeError:
            self._done(fd)
            raise
        entry[3] = got + 1
        if got + 1 == len(slots):
            self._done(fd)
        return tags[got], action

    def _done(self, fd: int) -> None:
        self._poll.unregister(fd)
        del self._out[fd]

    def _drain(self) -> None:
        for fd in list(self._out):
            while fd in self._out:
                try:
                    self._read(fd)
                except RuntimeError:
                    pass


def act_together(requests: list[tuple[SealedAgent, Any, Any]]) -> list[np.ndarray]:
    """The actions of several sealed agents, ``(agent, observation, episode_start)`` each,
    in request order: one message per worker, all sent before any answer is read.

    Raises:
        ValueError: an agent is asked twice (it follows one episode at a time).
    """
    by_worker: dict[int, list[int]] = {}
    for i, (agent, _, _) in enumerate(requests):
        by_worker.setdefault(id(agent._worker), []).append(i)
    ex = Exchange()
    for where in by_worker.values():
        ex.post([requests[i] for i in where], where)
    out: list[Any] = [None] * len(requests)
    while ex.pending():
        for i, action in ex.collect():
            out[i] = action
    return out


def _name(agent: Any) -> str:
    return getattr(agent, "name", type(agent).__name__)


def _check_deployable(agent: Any) -> None:
    if not bool(getattr(agent, "deployable", True)):
        raise ValueError(f"{_name(agent)!r} is not deployable: not sealed")


def seal_agents(agents: list, in_process: bool = False, workers: int | None = 1) -> list:
    """Each deployable agent of ``agents`` wrapped in a :class:`SealedAgent` (the
    non-deployable ones, the oracle, unchanged); ``in_process=True`` returns ``agents``.

    ``workers``: how many worker processes share the deployable agents (in turn: agent
    ``i`` in worker ``i % workers``); ``None``: one per agent. One (the default) was the
    fastest on a shared 2-core machine: every message wakes a process, and one worker
    answers all the agents asked at a decision in one message."""
    if in_process:
        return list(agents)
    deployable = [a for a in agents if bool(getattr(a, "deployable", True))]
    n = len(deployable) if workers is None else max(1, min(int(workers), len(deployable)))
    slots: dict[int, tuple[int, int]] = {}
    groups: list[list[Any]] = [[] for _ in range(n)]
    for i, a in enumerate(deployable):
        slots[id(a)] = (i % n, len(groups[i % n]))
        groups[i % n].append(a)
    procs = [_Worker([pickle.dumps(a) for a in g], [_name(a) for a in g]) for g in groups if g]
    return [
        SealedAgent._in(a, procs[slots[id(a)][0]], slots[id(a)][1]) if id(a) in slots else a
        for a in agents
    ]
