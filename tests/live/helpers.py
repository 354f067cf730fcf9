"""Helpers shared by the live tests: stand-ins, stub servers and synthetic runs."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import active_children
from types import SimpleNamespace

import numpy as np
import pytest

from diloco_gym.live import calibrate as calibrate_mod
from diloco_gym.live import resources as resources_mod
from diloco_gym.live.calibrate import (
    CalibrationConfig,
)
from diloco_gym.live.errors import (
    MergeWorkerError,
)
from diloco_gym.live.merges import MergeConfig, MergeReport
from diloco_gym.live.plan import phase_key
from diloco_gym.live.replay import (
    RequestRecord,
)
from diloco_gym.live.state import RunState


class Stubs:
    """Stand-ins for the server, the merge cluster, the replayer and the CPU sampler that
    append what happens to them to ``events``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        self.start_delay_s = 0.0
        self.start_error: BaseException | None = None
        self.cluster_start_error: BaseException | None = None
        self.fail_at_merge: int | None = None
        self.merge_s = 0.0
        # The server start waits for the cluster start (at most 5 s), so that the order of
        # the events does not depend on thread scheduling.
        self.cluster_started = threading.Event()
        self.threads: dict[str, str] = {}
        stubs = self

        class Server:
            url = "http://127.0.0.1:9"
            pid = 4242
            num_parameters = 1_500_000

            def is_alive(self) -> bool:
                return True

            def describe(self) -> dict:
                return {"kind": "built-in", "parameters": self.num_parameters}

            def stop(self) -> None:
                stubs.events.append("server.stop")

        def start_sidecar(cfg: object) -> Server:
            stubs.threads["server"] = threading.current_thread().name
            stubs.cluster_started.wait(5.0)
            time.sleep(stubs.start_delay_s)
            if stubs.start_error is not None:
                stubs.events.append("server failed")
                raise stubs.start_error
            stubs.events.append("server started")
            return Server()

        class Cluster:
            backend = "gloo"

            def __init__(self, cfg: MergeConfig) -> None:
                self.cfg = cfg
                self.merges = 0

            def start(self) -> Cluster:
                stubs.threads["cluster"] = threading.current_thread().name
                stubs.events.append("cluster.start")
                stubs.cluster_started.set()
                if stubs.cluster_start_error is not None:
                    raise stubs.cluster_start_error
                return self

            def describe(self) -> dict:
                return {"backend": "gloo", "init_method": "tcp://127.0.0.1:1"}

            def merge(self, window_s: float, link_share: float = 1.0) -> MergeReport:
                k = self.merges
                self.merges += 1
                time.sleep(stubs.merge_s)
                if stubs.fail_at_merge == k:
                    stubs.events.append(f"merge {k} failed")
                    raise MergeWorkerError(f"merge worker rank 1 died during merge {k}")
                stubs.events.append(f"merge {k}")
                return MergeReport(k, allreduces=3, checkpoint_s=0.25)

            def kill_worker(self, rank: int) -> None:
                pass

            def close(self) -> None:
                stubs.events.append("cluster.close")

        class Replayer:
            def __init__(self, ep, model, timeout_s, clock, max_outstanding, cpu) -> None:
                self.clock = clock
                self.state = SimpleNamespace(merge_id=-1)
                self.sending = False
                self.outstanding = 0

            def set_merge(self, k: int) -> float:
                self.state.merge_id = k
                return self.clock()

            def clear_merge(self) -> float:
                self.state.merge_id = -1
                return self.clock()

            def start_phase(self, name, win, origin, prompt, output, repeat=0) -> None:
                stubs.events.append(f"phase {name} {repeat}")

            def counts(self, *phase: object) -> dict:
                return {"sent": 0, "planned": 0, "ok": 0, "errors": 0, "outstanding": 0,
                        "timeouts": 0, "done": 0}  # fmt: skip

            def snapshot(self) -> list:
                return []

            def close(self) -> None:
                stubs.events.append("replayer.close")

        class Cpu:
            def start(self) -> Cpu:
                return self

            def stop(self) -> None:
                stubs.events.append("cpu.stop")

        monkeypatch.setattr(resources_mod, "start_sidecar", start_sidecar)
        monkeypatch.setattr(resources_mod, "MergeCluster", Cluster)
        monkeypatch.setattr(calibrate_mod, "OpenLoopReplayer", Replayer)
        monkeypatch.setattr(calibrate_mod, "CpuSampler", Cpu)


def stubbed_config(**kw: object) -> CalibrationConfig:
    base: dict = dict(
        seed=3,
        merge=MergeConfig(workers=2, merge_mb=1),
        merge_seconds=0.2,
        gap_seconds=(0.1, 0.1),
        lead_seconds=0.1,
        timeout_s=1.0,
        warmup_requests=0,
        progress_every_s=60.0,
        engine="builtin-fallback",
        probe=None,
        repeats=2,
    )
    base.update(kw)
    return CalibrationConfig(**base)


def masked(lines: list[str]) -> list[str]:
    """The lines with their decimal numbers (timings, not addresses) replaced by ``#``."""
    return [re.sub(r"(?<![\d.])\d+\.\d+(?![\d.])", "#", line) for line in lines]


def synthetic_document_run(no_pressure: bool) -> RunState:
    """A run of two repeats with scripted records (merge-active requests 2.5x slower);
    ``no_pressure``: nothing in flight, so the high-pressure class is empty."""

    rng = np.random.default_rng(0)
    records = []
    run = RunState(t0=0.0, started_utc="2026-01-01T00:00:00+00:00", label="ordinary")
    for rep in range(2):
        for phase, origin in (("sync", 100.0 * rep), ("control", 100.0 * rep + 50)):
            key = phase_key(phase, rep)
            run.phases[key] = {"name": phase, "repeat": rep, "origin_s": origin, "duration_s": 6.0}
            for i in range(60):
                active = phase == "sync" and i % 3 == 0
                records.append(
                    RequestRecord(
                        i, phase, i * 0.1, int(rng.integers(5, 50)), int(rng.integers(5, 50)),
                        send_s=origin + i * 0.1,
                        latency_s=float(rng.uniform(0.1, 0.3) * (2.5 if active else 1.0)),
                        status=200, error="", merge_active=active, merge_id=rep if active else -1,
                        inflight=0 if no_pressure else int(rng.integers(0, 8)), repeat=rep,
                    )
                )  # fmt: skip
        run.merges.append(
            {"merge_id": rep, "repeat": rep, "start_s": 100.0 * rep, "end_s": 100.0 * rep + 6}
        )
    run.replayer = SimpleNamespace(snapshot=lambda: records)  # type: ignore[assignment]
    run.order = [("sync", 0), ("control", 0), ("sync", 1), ("control", 1)]
    run.plan = [(0.0, 6.0)]
    return run


def assert_no_children(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert active_children() == [], f"orphan processes: {active_children()}"


def records_of(doc: dict) -> list[dict]:
    cols = doc["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


class _StubHandler(BaseHTTPRequestHandler):
    """A fast fake OpenAI endpoint; ``server.mode`` picks its behaviour."""

    server: _StubServer

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.server.mode == "raw":
            self._raw(200, self.server.body)
        elif self.server.mode == "models500":
            self._raw(500, b"Internal Server Error\n")
        elif self.server.mode == "models-garbage":
            self._raw(200, b"\x89PNG\r\n\x1a\n\x00\x00 not a model list")
        else:
            self._json(200, {"data": [{"id": "stub-model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.mode == "raw":
            self._raw(200, self.server.body)
            return
        with self.server.lock:
            self.server.count += 1
            n = self.server.count
        warm = n <= 4  # the warm-up (1 longest + 3 idle requests) always succeeds
        if self.server.mode == "flaky" and not warm and n % 3 == 1:
            self._json(500, {"error": {"message": "boom"}})
            return
        if self.server.mode == "flaky" and not warm and n % 3 == 2:
            time.sleep(1.0)  # beyond the client's timeout
        time.sleep(0.01)
        if self.server.mode == "garbage" and not warm:  # HTTP 200, but not a completion
            self._json(200, {"object": "list", "data": []})
            return
        if self.server.mode == "html" and not warm:
            self._raw(200, b"<html>\xff\xfe proxy login page</html>")
            return
        self._json(
            200, {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.body = b""
        self.count = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _StubHandler)


def fast_config(**kw) -> CalibrationConfig:
    base = dict(
        seed=3,
        rate_rps=4.0,
        merge=MergeConfig(workers=2, merge_mb=2),
        merge_seconds=1.5,
        gap_seconds=(1.0, 1.0),
        lead_seconds=0.5,
        timeout_s=5.0,
        warmup_requests=1,
        progress_every_s=60.0,
        engine="builtin-fallback",
        probe=None,
        repeats=1,
    )
    base.update(kw)
    return CalibrationConfig(**base)


GARBAGE_BODIES = [
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"{}",
    b'{"choices": null}',
    b'{"choices": [null]}',
    b'{"choices": [{"text": null}]}',
    b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1e3}}',
    b"[" * 100000,
    b"1" * 5000,
    b"\xff\xfe\x00garbage",
    b"<html>502</html>",
    b'{"data": {"id": "m"}}',
    b'{"data": [{"name": "m"}]}',
    b'{"data": "abc"}',
]


def stub_config(**kw) -> CalibrationConfig:
    base = dict(
        seed=2,
        rate_rps=8.0,
        merge=MergeConfig(workers=2, merge_mb=1),
        merge_seconds=1.0,
        gap_seconds=(1.0, 1.0),
        lead_seconds=0.5,
        timeout_s=3.0,
        warmup_requests=1,
        progress_every_s=60.0,
        probe=None,
        repeats=1,
        engine="builtin-fallback",
    )
    base.update(kw)
    return CalibrationConfig(**base)


class _QueueHandler(BaseHTTPRequestHandler):
    """An OpenAI-style endpoint served by ``slots`` workers of fixed service time: its
    capacity is ``slots / service_s`` requests per second. ``stall_after`` answers that many
    completions, then holds every later one until the server shuts down."""

    server: _QueueServer

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up
            pass

    def do_GET(self) -> None:  # noqa: N802
        self._json({"data": [{"id": "queue-model"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        srv = self.server
        with srv.lock:
            srv.count += 1
            n = srv.count
        if srv.stall_after is not None and n > srv.stall_after:
            srv.released.wait(60)
            return
        with srv.slots:
            time.sleep(srv.service_s)
        self._json(
            {
                "choices": [{"text": "x"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]},
            }
        )


class _QueueServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, slots: int, service_s: float, stall_after: int | None = None) -> None:
        self.slots = threading.BoundedSemaphore(slots)
        self.service_s = service_s
        self.stall_after = stall_after
        self.count = 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        super().__init__(("127.0.0.1", 0), _QueueHandler)


#: The consistency check's words for a p95 ratio no real sidecar can have
#: (``diloco_gym.eval.calibration.consistency.check_ratios``).
IMPLAUSIBLE = "physically implausible"


def check_measured(check, *args):
    """``check(*args)`` (``load_calibration`` or ``validate_calibration``) on a file that a
    short live run measured; its result, or a skip that says why when the project's own
    consistency check refuses the run's p95 ratio as physically implausible (below
    :data:`~diloco_gym.eval.calibration.consistency.MIN_PLAUSIBLE_RATIO`): on a loaded
    machine a few seconds of requests can have a control phase slower than the merges'
    phase, a measurement the machine spoiled, not a fault of the code under test. Every
    other refusal fails the test."""
    from diloco_gym.eval.calibration import CalibrationFileError

    try:
        return check(*args)
    except CalibrationFileError as exc:
        if IMPLAUSIBLE not in str(exc):
            raise
        pytest.skip(
            "the live measurement is invalid on this machine (the calibration's consistency "
            f"check refused it: {exc}); the machine was too loaded for a short run, rerun "
            "it on an idle one"
        )
