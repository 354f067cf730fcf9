"""Deployable agents sealed in a sandboxed process of their own.

A deployable agent may use observations, action masks and the env's public parameters
only. In-process, nothing stops an agent's code from walking ``gc.get_objects()`` or the
caller's frames to the env, the episode's trace, its merge costs or its seed; and a
separate process alone still lets it read the evaluator's command line, environment and
memory through ``/proc``, open the trace file, or answer with a pickle that runs code in
the evaluator. :class:`SealedAgent` closes all of these:

* **A fresh interpreter** (``subprocess``, not a fork: none of the parent's objects are
  copied), started with a scrubbed environment (no variable of the parent's but the few
  an interpreter needs), a private empty working directory and no file descriptor but
  its one socket to the parent. It needs no ``if __name__ == "__main__":`` guard in the
  calling script.
* **The kernel's sandbox** (:mod:`diloco_gym.eval.sandbox`: Landlock, namespaces, no
  privileges), entered *before* any agent code runs: the agents travel to it as bytes
  (``cloudpickle``: an agent whose module lies outside the installed packages, a user's
  script or ``--agent file.py:Name``, travels with its code) and are loaded inside it.
* **A fixed answer format.** The parent reads from a worker only bounded binary frames
  (an action as 64-bit integers; an error as at most 2,000 bytes of text) and never
  deserialises anything else; a frame of any other shape or size ends the worker and the
  run with an error naming the agent. The parent's own messages to the worker (public
  parameters, observations, masks) are pickled or packed: the worker trusts its parent.

The env, the episode, the trace, the merge costs, the seed, the step infos and the
scoring stay in the parent, and so does every non-deployable agent (the oracle).

:func:`seal_agents` puts the deployable agents of one call into one worker by default
(``workers=``: more), and :class:`Exchange` asks several agents of a worker in one message
and several workers at once: :func:`diloco_gym.eval.rollout.run_episodes` steps the
agents of a unit in lockstep, so a report pays one socket round trip per decision of the
episode at which any agent is asked. Agents that share a worker can see each other's
objects; the runner asks them in decision order, one decision per message, so an agent
asked at decision ``d`` finds in its process no observation later than ``d``. A worker
serves every episode of a process (report and frontier cells reuse it). Each answer must
come within ``DILOCO_GYM_MAX_AGENT_SECONDS`` (default 600 s), or the worker is stopped.

:func:`sandbox_status` says which sealing level this machine gives (``full``, ``partial``
or ``process``, with the mechanisms); reports record it, and :func:`require_sandbox`
(``--require-sandbox``) makes every worker that gets less than ``full`` an error.
In-process evaluation remains available as an explicit opt-out (``--in-process-agents``);
reports state which mode they ran in.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import weakref
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from diloco_gym.eval import sandbox

__all__ = [
    "SealedAgent",
    "seal_agents",
    "act_together",
    "Exchange",
    "worker_key",
    "sandbox_status",
    "require_sandbox",
    "SandboxError",
    "SEALED",
    "IN_PROCESS",
]

#: report.json / report.md values of the agent-sealing mode.
SEALED = "sealed (deployable agents in a sandboxed process of their own)"
IN_PROCESS = "in-process (--in-process-agents: not sealed)"


class SandboxError(RuntimeError):
    """A sealed worker got less than the required sealing level (:func:`require_sandbox`)."""


# Act messages travel as raw bytes (a round of a report is one to a few observations:
# pickling each small array costs more than the socket). Parent -> worker: pickled
# messages (they start with the pickle protocol byte 0x80) or a packed act message:
# b"A", (n, observation size, mask size) as uint32, the slots (int32), the episode-start
# flags (uint8), the observations (float32), the masks (bool). Worker -> parent, the only
# frames the parent accepts (anything else ends the worker):
_PACKED = b"A"  # (parent -> worker: a packed act message; in an answer: an int64 action)
_FLOAT = b"F"  # in an answer: a float64 action
# The actions of one act message, in its order: b"B", n (uint32), n kinds (b"A" or b"F"),
# n value counts (uint16), then the values (8 bytes each, little-endian); at most
# _MAX_ACTION values in all.
_BATCH = b"B"
_ERROR = b"E"  # an agent's error: b"E" + slot (int32) + UTF-8 text (<= _MAX_TEXT bytes)
_OK = b"K"  # an attach (or the agents' load) went through
_HELLO = b"H"  # the sandbox is closed: b"H" + the mechanisms' mask (uint32)
_HEAD = struct.Struct("<III")
_MAX_ACTION = 4096
_MAX_TEXT = 2000
# the longest frame: a batch of _MAX_ACTION one-value actions (each a kind, a count, a value)
_MAX_FRAME = 1 + 4 + (1 + 2 + 8) * _MAX_ACTION
_ONE = struct.pack("<H", 1)  # a count of one value


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


# --- the worker's side --------------------------------------------------------------


class _AgentError(Exception):
    def __init__(self, slot: int, text: str) -> None:
        super().__init__(text)
        self.slot, self.text = slot, text


def _error_frame(slot: int, text: str) -> bytes:
    return _ERROR + struct.pack("<i", slot) + text.encode("utf-8", "replace")[:_MAX_TEXT]


def _action_bytes(slot: int, action: Any) -> tuple[bytes, int, bytes]:
    """An agent's action for a batch frame: ``(kind, count, values)``, integers as int64,
    floats as float64 (the env reads either as it would in-process); anything else is the
    agent's error."""
    if type(action) is np.ndarray and action.dtype == np.int64 and action.size == 1:
        return _PACKED, 1, action.astype("<i8").tobytes()
    a = np.asarray(action).reshape(-1)
    if a.size < 1 or a.size > _MAX_ACTION:
        raise _AgentError(slot, f"an action of {a.size} values (1 to {_MAX_ACTION} allowed)")
    if a.dtype.kind in "biu":
        return _PACKED, a.size, a.astype("<i8").tobytes()
    if a.dtype.kind == "f":
        return _FLOAT, a.size, a.astype("<f8").tobytes()
    raise _AgentError(slot, f"an action of dtype {a.dtype} (integers or floats expected)")


def _batch_frame(answers: list[tuple[bytes, int, bytes]], slot: int) -> bytes:
    n = len(answers)
    if sum(c for _, c, _ in answers) > _MAX_ACTION:
        raise _AgentError(slot, f"actions of more than {_MAX_ACTION} values in one round")
    return b"".join(
        [
            _BATCH,
            struct.pack("<I", n),
            b"".join(k for k, _, _ in answers),
            struct.pack(f"<{n}H", *(c for _, c, _ in answers)),
            *(v for _, _, v in answers),
        ]
    )


def _parse_batch(body: bytes, n: int) -> list[np.ndarray] | None:
    """The ``n`` actions of a batch frame's body, or None when it is malformed."""
    if len(body) < 4 or struct.unpack_from("<I", body)[0] != n or n < 1:
        return None
    ints = len(body) == 4 + 11 * n and body[4 : 4 + n] == _PACKED * n
    if ints and body[4 + n : 4 + 3 * n] == _ONE * n:  # the common case: n int64 actions
        block = np.frombuffer(body, "<i8", n, 4 + 3 * n).astype(np.int64)
        return [block[i : i + 1] for i in range(n)]
    kinds, at = body[4 : 4 + n], 4 + n
    if len(kinds) != n or any(k not in b"AF" for k in kinds) or len(body) < at + 2 * n:
        return None
    counts = struct.unpack_from(f"<{n}H", body, at)
    at += 2 * n
    if min(counts) < 1 or sum(counts) > _MAX_ACTION or len(body) != at + 8 * sum(counts):
        return None
    out = []
    for k, c in zip(kinds, counts, strict=True):
        wire, native = ("<i8", np.int64) if k == _PACKED[0] else ("<f8", np.float64)
        out.append(np.frombuffer(body, wire, c, at).astype(native))
        at += 8 * c
    return out


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
    """The worker's actions for one message of ``(slot, obs, mask, start)`` items, sent
    together in one frame once all are decided (one wake-up of the parent per round); an
    agent's error is sent instead and ends the message."""
    answers = []
    for slot, obs, mask, start in items:
        try:
            if ctxs[slot] is not None:
                ctxs[slot]._set_mask(mask)
            action, states[slot] = agents[slot].predict(
                obs, state=states[slot], episode_start=np.array([start]), deterministic=True
            )
        except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
            raise _AgentError(slot, f"{type(exc).__name__}: {exc}") from None
        answers.append(_action_bytes(slot, action))
    conn.send_bytes(_batch_frame(answers, items[-1][0]))


def _load_agents(blob: bytes) -> list:
    """The agents from their bytes, inside the sandbox (their code may run while loading).
    One pickle holds them all, so that agents of one module share its globals, as they
    would in one process."""
    try:
        agents = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, one line
        raise _AgentError(-1, f"could not be loaded: {type(exc).__name__}: {exc}") from None
    return list(agents)


def _worker_main(fd: int) -> None:
    """A sealed worker: confine itself as the parent's plan says, report what took effect,
    load the agents, then answer until the parent closes the socket."""
    conn = Connection(fd)
    try:
        the_plan = pickle.loads(conn.recv_bytes())
        conn.send_bytes(_HELLO + struct.pack("<I", sandbox.enter(the_plan)))
        try:
            agents = _load_agents(conn.recv_bytes())
        except _AgentError as exc:
            conn.send_bytes(_error_frame(exc.slot, exc.text))
            return
        if "torch" in sys.modules:  # pragma: no cover - one thread: a policy step is tiny
            sys.modules["torch"].set_num_threads(1)
        conn.send_bytes(_OK)
        _serve(conn, agents)
    except (EOFError, BrokenPipeError, ConnectionError, OSError):
        return  # the parent is gone


def _serve(conn: Any, agents: list) -> None:
    """Answer act and attach messages until closed."""
    ctxs: list = [None] * len(agents)
    states: list = [None] * len(agents)
    while True:
        buf = conn.recv_bytes()
        try:
            if buf[:1] == _PACKED:
                _answer(conn, agents, ctxs, states, _unpack_items(buf))
                continue
            msg = pickle.loads(buf)
            if msg[0] == "act":
                _answer(conn, agents, ctxs, states, msg[1])
            elif msg[0] == "attach":
                _attach(agents, ctxs, states, msg[1], msg[2:])
                conn.send_bytes(_OK)
            elif msg[0] == "close":
                return
        except _AgentError as exc:
            conn.send_bytes(_error_frame(exc.slot, exc.text))


# --- the parent's side --------------------------------------------------------------


_REQUIRED = False
_UNDUMPABLE: bool | None = None
_STATUS: dict[str, Any] | None = None


def require_sandbox(required: bool = True) -> None:
    """Make a sealed worker that gets less than the ``full`` sealing level an error
    (:class:`SandboxError`) in this process (``--require-sandbox``)."""
    global _REQUIRED
    _REQUIRED = bool(required)


def _evaluator_undumpable() -> bool:
    global _UNDUMPABLE
    if _UNDUMPABLE is None:
        _UNDUMPABLE = sandbox.make_evaluator_undumpable()
    return _UNDUMPABLE


def sandbox_status() -> dict[str, Any]:
    """This machine's sealing level, as a worker reports it: the first worker this process
    started, or a probe worker when none has started yet (cached either way):
    ``{"level": "full" | "partial" | "process", "mechanisms": [...], "missing": [...],
    "platform": ...}``."""
    global _STATUS
    if _STATUS is None:
        w = _Worker([], [])
        _STATUS = dict(w.status)
        w.finalizer()
    return dict(_STATUS)


#: The parent's environment variables a worker keeps (locale; numerical libraries'
#: settings, which can change results on some processors).
_KEEP_ENV = (
    *("LANG", "LC_ALL", "LC_CTYPE"),
    *("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "NUMBA_CACHE_DIR"),
)
#: The worker's program: import this module, then serve on the socket named by argv[1].
_BOOT = "import sys; from diloco_gym.eval import sealed; sealed._worker_main(int(sys.argv[1]))"


def _worker_env(private: str) -> dict[str, str]:
    """The worker's environment: none of the parent's variables but those an interpreter
    needs to find its code and run as the parent does (numerical libraries' settings)."""
    keep = (
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "NUMBA_CACHE_DIR",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    main_dir = os.path.dirname(os.path.abspath(getattr(sys.modules["__main__"], "__file__", "")))
    cwd = os.getcwd()
    path = [p for p in sys.path if p and os.path.isabs(p) and p not in (cwd, main_dir)]
    env.update(
        PATH=os.defpath,
        PYTHONPATH=os.pathsep.join(path),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=private,
        HOME=private,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    return env


def _outside_roots(roots: list[str]) -> list[Any]:
    """The loaded modules whose files lie outside ``roots`` (the paths a worker may read):
    their code must travel with the agents, by value."""
    out = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f or name == "__main__" or name.startswith("diloco_gym"):
            continue
        real = os.path.realpath(f)
        if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            out.append(mod)
    return out


def _dumps(agents: list, roots: list[str]) -> bytes:
    """The agents as bytes the worker loads inside its sandbox: ``cloudpickle``, with the
    code of modules the worker cannot read (a user's script or file) by value."""
    import cloudpickle

    mods = _outside_roots(roots)
    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return cloudpickle.dumps(list(agents), protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def _clean(text: str) -> str:
    """A worker's error text as one printable line."""
    return "".join(c if c.isprintable() else " " for c in text)[:_MAX_TEXT]


def _drain(pipe: Any, tail: deque) -> None:
    """Copy a worker's output to this process's standard error, keeping its last lines
    (for the error when the worker ends)."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace")
        tail.append(line.rstrip("\n")[:500])
        try:
            sys.stderr.write(line)
        except (OSError, ValueError):
            pass


def _stop(proc: Any, conn: Any, private: str) -> None:
    try:
        conn.send(("close",))
    except (OSError, ValueError):
        pass
    try:
        conn.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(private, ignore_errors=True)


class _Worker:
    """One sandboxed worker process holding the agents ``agents`` (slot = index)."""

    def __init__(self, agents: list, names: list[str]) -> None:
        self.names = names
        undumpable = _evaluator_undumpable()
        private = tempfile.mkdtemp(prefix="diloco-gym-agent-")
        os.chmod(private, 0o777)  # a root worker may drop to nobody
        the_plan = sandbox.plan(private)
        blob = _dumps(agents, the_plan["read"])
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        self.fd = self.conn.fileno()
        self.limit_s = _answer_limit()  # read once: a worker's answers share one limit
        self._poller = select.poll()  # one poll object (conn.poll builds a selector a call)
        self._poller.register(self.fd, select.POLLIN)
        fd = theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-B", "-c", _BOOT, str(fd)],
            pass_fds=(fd,),
            env=_worker_env(private),
            cwd=private,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        theirs.close()
        self.finalizer = weakref.finalize(self, _stop, self.proc, self.conn, private)
        self.tail: deque = deque(maxlen=20)
        threading.Thread(target=_drain, args=(self.proc.stdout, self.tail), daemon=True).start()
        self.conn.send_bytes(pickle.dumps(the_plan))
        kind, mask = self._frame(list(range(len(names))), expect=_HELLO)
        mask |= sandbox.Mechanism.EVALUATOR_UNDUMPABLE if undumpable else 0
        self.status = sandbox.describe(mask)
        global _STATUS
        if _STATUS is None:  # the machine's level, as sandbox_status() reports it
            _STATUS = dict(self.status)
        if _REQUIRED and self.status["level"] != sandbox.FULL:
            self.finalizer()
            raise SandboxError(
                f"sealed agents: this machine gives the {self.status['level']} sealing level "
                f"(missing: {', '.join(self.status['missing'])}), and --require-sandbox asks "
                "for full (Linux with Landlock, user and network namespaces)"
            )
        self.conn.send_bytes(blob)
        self._frame(list(range(len(names))), expect=_OK)

    def _frame(
        self, slots: list[int], expect: bytes | None = None, ready: bool = False
    ) -> tuple[bytes, Any]:
        """The next frame from the worker, checked: ``(kind, value)``; an agent's error
        frame raises it; anything malformed stops the worker and raises. ``ready``: the
        caller's poll saw the socket readable (no wait, no time limit to apply)."""
        try:
            if not ready and not self._poller.poll(int(self.limit_s * 1000)):
                raise self._fail(slots, _late(self.limit_s))
            buf = self.conn.recv_bytes(_MAX_FRAME)
        except (EOFError, ConnectionError, BrokenPipeError) as exc:
            raise self._ended(slots, exc) from None
        except OSError as exc:  # a length header above _MAX_FRAME ("bad message length")
            raise self._fail(slots, f"an answer over {_MAX_FRAME} bytes ({exc})") from None
        kind, body = buf[:1], buf[1:]
        if kind == _ERROR and len(body) >= 4:
            slot = struct.unpack_from("<i", body)[0]
            if -1 <= slot < len(self.names):
                text = _clean(body[4:].decode("utf-8", "replace"))
                who = self.names[slot] if slot >= 0 else ", ".join(self.names) or "worker"
                raise RuntimeError(f"sealed agent {who}: {text}")
        elif kind == _BATCH and expect is None:
            actions = _parse_batch(body, len(slots))
            if actions is not None:
                return _BATCH, actions
        elif kind == _OK and not body and expect in (None, _OK):
            return kind, None
        elif kind == _HELLO and len(body) == 4 and expect == _HELLO:
            return kind, struct.unpack("<I", body)[0]
        raise self._fail(slots, f"a malformed answer ({len(buf)} bytes starting {buf[:8]!r})")

    def _fail(self, slots: list[int], what: str) -> RuntimeError:
        """Stop a worker that broke the answer format or took too long."""
        self.finalizer()
        who = ", ".join(dict.fromkeys(self.names[i] for i in slots)) or "worker"
        return RuntimeError(f"sealed agent {who}: {what}; its worker was stopped")

    def call(self, msg: tuple, slot: int) -> Any:
        """Send one message about the agent in ``slot`` and return the answer."""
        self.send(msg, [slot])
        return self.receive([slot])

    def send(self, msg: tuple, slots: list[int]) -> None:
        packed = _pack_items(msg[1]) if msg[0] == "act" else None
        try:
            if packed is None:
                self.conn.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))
            else:
                self.conn.send_bytes(packed)
        except (EOFError, ConnectionError, BrokenPipeError, OSError) as exc:
            raise self._ended(slots, exc) from None

    def receive(self, slots: list[int], ready: bool = False) -> Any:
        """The answer to the message about ``slots``: their actions (an act message), or
        None (an attach)."""
        return self._frame(slots, ready=ready)[1]

    def _ended(self, slots: list[int], exc: BaseException) -> RuntimeError:
        code = self.proc.poll()
        who = ", ".join(dict.fromkeys(self.names[i] for i in slots)) or "worker"
        last = " | ".join(line for line in self.tail if line.strip())[-600:]
        return RuntimeError(
            f"sealed agent {who}: its worker process ended "
            f"({'exit code ' + str(code) if code is not None else type(exc).__name__})"
            + (f"; its last output: {last}" if last else "")
        )


def _late(wait: float) -> str:
    return f"no answer within {wait:.0f} s (set DILOCO_GYM_MAX_AGENT_SECONDS to wait longer)"


def _answer_limit() -> float:
    from diloco_gym.sim.limits import limit

    return float(limit("AGENT_SECONDS"))


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
        self._bind(agent, _Worker([agent], [_name(agent)]), 0)

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
    they arrive (a worker answers all the agents of a message in one frame), each with its
    tag from :meth:`post`."""

    def __init__(self) -> None:
        # by file descriptor: the worker, the message's slots and tags, actions read
        self._out: dict[int, list[Any]] = {}
        self._poll = select.poll()
        self._limit_s = _answer_limit()

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
        fd = w.fd
        self._out[fd] = [w, slots, list(tags), 0]
        self._poll.register(fd, select.POLLIN)

    def busy(self, agent: SealedAgent) -> bool:
        """Whether ``agent``'s worker has not answered all of its last message yet."""
        return agent._worker.fd in self._out

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
            wait = self._limit_s if timeout is None else timeout
            events = self._poll.poll(int(wait * 1000))
            if not events and timeout is None:  # every worker silent past the limit
                entries = list(self._out.values())
                for fd in list(self._out):
                    self._done(fd)
                for other in entries[1:]:
                    other[0].finalizer()
                w, slots = entries[0][:2]
                raise w._fail(slots, _late(wait))
        out = []
        for fd, _event in events:  # an answer, or a closed pipe (read: the error names it)
            try:
                out.extend(self._read(fd))
            except RuntimeError:
                self._drain()
                raise
        return out

    def _read(self, fd: int, ready: bool = True) -> list[tuple[Any, np.ndarray]]:
        w, slots, tags, _ = self._out[fd]
        try:
            actions = w.receive(slots, ready=ready)
        finally:
            self._done(fd)
        return list(zip(tags, actions, strict=True))

    def _done(self, fd: int) -> None:
        self._poll.unregister(fd)
        del self._out[fd]

    def _drain(self) -> None:
        for fd in list(self._out):
            while fd in self._out:
                try:
                    self._read(fd, ready=False)
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
    procs = [_Worker(g, [_name(a) for a in g]) for g in groups if g]
    return [
        SealedAgent._in(a, procs[slots[id(a)][0]], slots[id(a)][1]) if id(a) in slots else a
        for a in agents
    ]
