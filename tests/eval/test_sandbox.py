"""Sealed agents against the operating system: an agent that tries every channel out of
its worker (the evaluator's /proc entries and memory, files, the network, signals, a
pickle sent back to the evaluator) finds each one closed, scores as the deployable policy
it falls back to, and leaves no canary. Each attack is also run where it is open (in the
evaluating process, or by loading its payload directly), so that the tests can fail.

The sandbox tests skip, naming what is missing, where the kernel lacks a mechanism of the
full level (Landlock, user and network namespaces)."""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv
from diloco_gym.agents.base import Agent
from diloco_gym.eval import sealed
from diloco_gym.eval.rollout import run_episode
from diloco_gym.eval.sealed import SandboxError, SealedAgent, sandbox_status

pytestmark = pytest.mark.slow  # starts worker processes

SENTINEL = "DILOCO_GYM_TEST_SENTINEL"


def _full() -> None:
    status = sandbox_status()
    if status["level"] != "full":
        pytest.skip(
            f"the kernel sandbox is at level {status['level']} here (missing: "
            f"{', '.join(status['missing'])}; {status['platform']})"
        )


# --- the channel spy ------------------------------------------------------------------


def _try(fn) -> str:
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - a hostile agent tolerates any failure
        return f"closed ({type(exc).__name__})"
    return "open" if out not in (None, b"", "", [], False) else "closed (empty)"


def _read_parent_memory(ppid: int) -> bytes:
    with open(f"/proc/{ppid}/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            if perms.startswith("rw"):
                lo = int(span.split("-")[0], 16)
                with open(f"/proc/{ppid}/mem", "rb") as mem:
                    mem.seek(lo)
                    return mem.read(64)
    return b""


def _connect(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True


def _write(path: str) -> bool:
    Path(path).write_text("canary")
    return True


def probe_channels(secret: str, folder: str, port: int) -> dict[str, str]:
    """Every channel out of an agent's process, each "open" or "closed (why)"."""
    ppid = os.getppid()
    return {
        "parent cmdline": _try(lambda: Path(f"/proc/{ppid}/cmdline").read_bytes()),
        "parent environ": _try(lambda: Path(f"/proc/{ppid}/environ").read_bytes()),
        "parent memory": _try(lambda: _read_parent_memory(ppid)),
        "parent cwd": _try(lambda: os.listdir(f"/proc/{ppid}/cwd")),
        "parent fds": _try(lambda: os.listdir(f"/proc/{ppid}/fd")),
        "init environ": _try(lambda: Path("/proc/1/environ").read_bytes()),
        "secret file": _try(lambda: Path(secret).read_text()),
        "data folder": _try(lambda: os.listdir(folder)),
        "write canary": _try(lambda: _write(os.path.join(folder, "canary-write"))),
        "shared memory": _try(lambda: _write("/dev/shm/diloco-canary")),
        "environment": _try(lambda: os.environ.get(SENTINEL)),
        "tcp loopback": _try(lambda: _connect(port)),
        "signal parent": _try(lambda: os.kill(ppid, 0) or True),
        "home": _try(lambda: os.listdir(os.path.expanduser("~root"))),
    }


class ChannelSpy(Agent):
    """Tries every channel at its first decision and reports by raising."""

    name = "channel-spy"

    def __init__(self, secret: str, folder: str, port: int) -> None:
        self.where = (secret, folder, port)

    def act(self, obs: np.ndarray) -> np.ndarray:
        raise LookupError("spy-report " + json.dumps(probe_channels(*self.where)))


@pytest.fixture
def bait(tmp_path, monkeypatch):
    """A secret file and folder, a sentinel variable and a listening loopback socket."""
    folder = tmp_path / "data"
    folder.mkdir()
    secret = folder / "future.csv"
    secret.write_text("arrival_s\n1.0\n")
    monkeypatch.setenv(SENTINEL, "the-future")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    yield str(secret), str(folder), srv.getsockname()[1]
    srv.close()


def _report(exc: BaseException) -> dict[str, str]:
    text = str(exc)
    assert "spy-report " in text, text
    return json.loads(text.split("spy-report ", 1)[1])


def test_every_channel_out_of_a_sealed_worker_is_closed(bait):
    _full()
    secret, folder, port = bait
    agent = SealedAgent(ChannelSpy(secret, folder, port))
    try:
        with pytest.raises(RuntimeError, match="sealed agent channel-spy: LookupError") as got:
            run_episode(DiLoCoSyncEnv("bursty"), agent, 0)
    finally:
        agent.close()
    seen = _report(got.value)
    assert all(v.startswith("closed") for v in seen.values()), seen
    assert os.listdir(folder) == ["future.csv"]  # no canary
    # The same probe in the evaluating process finds the channels open: the probe works.
    here = probe_channels(secret, folder, port)
    for channel in ("parent cmdline", "secret file", "data folder", "write canary"):
        assert here[channel] == "open", (channel, here)
    assert here["environment"] == "open" and here["tcp loopback"] == "open"


# --- the cheater, through a whole report ----------------------------------------------


class Cheater(Agent):
    """Plays fixed-512 unless it can read anything the evaluator holds (its command line,
    environment or memory, or the data file), in which case it merges at every decision
    it may: its report row shows whether a channel opened."""

    name = "cheater"

    def __init__(self, secret: str, folder: str, port: int) -> None:
        from diloco_gym.agents.registry import make_agent

        self.where = (secret, folder, port)
        self.honest = make_agent("fixed-512")
        self.cheat: bool | None = None

    def attach(self, context) -> None:
        self.honest.attach(context)
        if self.cheat is None:
            seen = probe_channels(*self.where)
            self.cheat = any(v == "open" for v in seen.values())

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        if self.cheat:
            return np.ones(1, dtype=np.int64), None
        return self.honest.predict(observation, state, episode_start, deterministic)


def _rows(config) -> tuple[dict[str, list], dict]:
    """Each agent's episodes as (seed, merges, sync-excess %, excess requests, return)."""
    from diloco_gym.eval.report import run_protocol

    result = run_protocol(config, progress=False)
    keep = ["seed", "merges", "sync_excess_pct", "excess_requests", "return"]
    rows: dict[str, list] = {}
    for r in result["rows"].to_dict(orient="records"):
        rows.setdefault(r["agent"], []).append(tuple(r[k] for k in keep))
    return rows, result


def test_a_cheater_scores_as_its_deployable_fallback_when_sealed(bait, monkeypatch):
    _full()
    from diloco_gym.agents import registry
    from diloco_gym.eval.report import ReportConfig

    monkeypatch.setitem(registry.AGENTS, "cheater", lambda: Cheater(*bait))
    agents = ["cheater", "fixed-512", "offline-oracle"]
    config = ReportConfig(regimes=["bursty"], agents=agents, seeds=2, draws=10)
    rows, result = _rows(config)
    assert result["agent_sandbox"]["level"] == "full"
    assert rows["cheater"] == rows["fixed-512"]
    assert rows["cheater"] != rows["offline-oracle"]
    assert os.listdir(bait[1]) == ["future.csv"]
    # In-process, the same cheater reads the evaluator's files and plays otherwise.
    inproc, _ = _rows(ReportConfig(**{**config.__dict__, "in_process_agents": True}))
    assert inproc["cheater"] != inproc["fixed-512"]


# --- the escaper: answers the evaluator with something other than an action ------------


class _Boom:
    """Unpickling it writes ``path`` (what a crafted answer would do in the evaluator)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def _worker_socket() -> int:
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return fd
        except OSError:
            continue
    raise LookupError("no socket")


class Escaper(Agent):
    """Writes a frame of its choice on its worker's socket instead of an action."""

    name = "escaper"

    def __init__(self, how: str, canary: str) -> None:
        self.how, self.canary = how, canary

    def act(self, obs: np.ndarray) -> np.ndarray:
        from multiprocessing.connection import Connection

        conn = Connection(os.dup(_worker_socket()))
        if self.how == "pickle":
            conn.send(("ok", _Boom(self.canary)))  # the old answer format, with a payload
        elif self.how == "huge":
            os.write(conn.fileno(), b"\x7f\xff\xff\xf0")  # a length header of ~2 GiB
        elif self.how == "bad-slot":
            conn.send_bytes(b"E" + (99).to_bytes(4, "little") + b"forged")
        elif self.how == "odd-action":
            conn.send_bytes(b"A" + b"\x01" * 7)
        return np.zeros(len(obs), dtype=np.int64)


@pytest.mark.parametrize("how", ["pickle", "huge", "bad-slot", "odd-action"])
def test_an_answer_that_is_not_an_action_is_refused_and_never_loaded(tmp_path, how):
    canary = tmp_path / "canary"
    agent = SealedAgent(Escaper(how, str(canary)))
    try:
        with pytest.raises(RuntimeError, match="sealed agent escaper: .*its worker was stopped"):
            run_episode(DiLoCoSyncEnv("bursty"), agent, 0)
    finally:
        agent.close()
    assert not canary.exists()
    if how == "pickle":  # the payload is real: loading it (as the old parent did) runs it
        proof = tmp_path / "proof"
        pickle.loads(pickle.dumps(("ok", _Boom(str(proof)))))
        assert proof.read_text() == "pwned"


class _Sleeper(Agent):
    name = "sleeper"

    def act(self, obs: np.ndarray) -> np.ndarray:
        import time

        time.sleep(60)
        return np.zeros(len(obs), dtype=np.int64)


def test_a_worker_that_does_not_answer_is_stopped_after_the_limit(monkeypatch):
    monkeypatch.setenv("DILOCO_GYM_MAX_AGENT_SECONDS", "2")
    agent = SealedAgent(_Sleeper())
    proc = agent._worker.proc
    try:
        with pytest.raises(RuntimeError, match="sealed agent sleeper: no answer within 2 s"):
            run_episode(DiLoCoSyncEnv("bursty"), agent, 0)
    finally:
        agent.close()
    assert proc.poll() is not None


# --- the level, required and reported ------------------------------------------------


def test_require_sandbox_refuses_a_lower_level(monkeypatch):
    from diloco_gym.agents.registry import make_agent

    monkeypatch.setattr(sealed, "_evaluator_undumpable", lambda: False)
    monkeypatch.setattr(sealed, "_STATUS", None)  # this worker's level is not the machine's
    sealed.require_sandbox(True)
    try:
        with pytest.raises(SandboxError, match="missing: evaluator memory"):
            SealedAgent(make_agent("fixed-512"))
    finally:
        sealed.require_sandbox(False)


def test_require_sandbox_on_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    base = [sys.executable, "-m", "diloco_gym.cli", "run", "--agent", "fixed-512", "--seeds", "1"]
    r = subprocess.run(
        [*base, "--require-sandbox", "--in-process-agents"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2 and "exclude each other" in r.stderr
    level = sandbox_status()["level"]
    r = subprocess.run(
        [*base, "--require-sandbox"], capture_output=True, text=True, env=env, timeout=300
    )
    if level == "full":
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 1 and "--require-sandbox" in r.stderr


def test_the_report_states_its_sealing_level(tmp_path):
    from diloco_gym.eval.report import ReportConfig, run_protocol, write_report

    config = ReportConfig(regimes=["bursty"], agents=["fixed-512"], seeds=2, draws=10)
    result = run_protocol(config, progress=False)
    write_report(result, tmp_path / "r", force=False)
    record = json.loads((tmp_path / "r" / "report.json").read_text())["agent_sandbox"]
    assert record == sandbox_status()
    assert record["level"] in ("full", "partial", "process")
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"Sandbox level: **{record['level']}**" in md
    inproc = run_protocol(ReportConfig(**{**config.__dict__, "in_process_agents": True}))
    assert inproc["agent_sandbox"]["level"] == "none"
