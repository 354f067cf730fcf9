"""Open-loop replay of a trace against an OpenAI-compatible completions endpoint.

Requests are sent at the trace's arrival times whatever happens to earlier requests
(*open loop*, as real users do), so a slow server never delays later sends (unless more
than ``max_outstanding`` requests are outstanding; the actual ``send_s`` then trails the
``scheduled_s`` of the trace, and both are recorded). Two clients: ``client="threads"``
(the default) runs each request in its own thread over a fresh ``http.client``
connection; ``client="async"`` runs one event loop that starts each request as a task on an
aiohttp session (pooled connections, as vLLM's serving benchmark does). Both build each
request's body before its arrival, so the timed path holds no prompt building.
``benchmarks/replay_send_lag.py`` measures how far each trails the trace and how late the
machine wakes a bare sleeper (the floor under both); on a loaded 2-core host at 200 req/s
both stay near that floor and the threads cost a little less CPU per request, so they stay
the default (docs/calibration.md has the numbers).

Each request is a ``POST /v1/completions`` with ``model``, ``prompt`` and ``max_tokens``
with a per-request timeout. A
:class:`RequestRecord` keeps the send time, latency, status, error, the client's in-flight
count at the send and the state of the merge flag at the send (read under the same lock as
the send time, so the flag agrees exactly with the recorded merge windows).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from diloco_gym.live.errors import EndpointUnavailableError
from diloco_gym.sim.traces import Trace

__all__ = [
    "Endpoint",
    "EndpointUnavailableError",
    "RequestRecord",
    "CpuSampler",
    "OpenLoopReplayer",
    "probe_endpoint",
    "wait_until_healthy",
    "make_prompt",
    "post_completion",
    "check_completion",
    "first_bytes",
]


@dataclass(frozen=True)
class Endpoint:
    """A parsed ``http://host:port[/prefix]`` endpoint URL.

    Attributes:
        url: the URL as given (without a trailing slash).
        host: host name.
        port: TCP port.
        prefix: path prefix before ``/v1/...`` (usually empty).
    """

    url: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parse ``url``; only plain ``http`` is supported.

        Raises:
            EndpointUnavailableError: the URL is not an ``http://host[:port]`` URL.
        """
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme != "http" or not parts.hostname:
            raise EndpointUnavailableError(
                f"endpoint {url!r} is not an http://HOST:PORT URL (https is not supported)"
            )
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise EndpointUnavailableError(f"endpoint {url!r}: bad port ({exc})") from None
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):  # accept both http://h:p and http://h:p/v1
            prefix = prefix[:-3]
        return cls(url.strip().rstrip("/"), parts.hostname, port, prefix)

    def path(self, route: str) -> str:
        return self.prefix + route


def _request(
    endpoint: Endpoint, method: str, route: str, body: dict | None, timeout_s: float
) -> tuple[int, bytes]:
    """One HTTP exchange on a fresh connection; return (status, body bytes)."""
    payload = None if body is None else json.dumps(body).encode("utf-8")
    return _exchange(endpoint, method, route, payload, timeout_s)


#: Headers of a completion request sent by the async client (the body is JSON bytes).
_JSON_HEADERS = {"Content-Type": "application/json"}


def _post(endpoint: Endpoint, route: str, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
    """``POST`` a ready JSON body on a fresh connection; return (status, body bytes)."""
    return _exchange(endpoint, "POST", route, payload, timeout_s)


def _exchange(
    endpoint: Endpoint, method: str, route: str, payload: bytes | None, timeout_s: float
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        headers = {"Connection": "close"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, endpoint.path(route), body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


def first_bytes(data: bytes, n: int = 80) -> str:
    """The start of a response body, printable whatever it holds (bytes escaped)."""
    shown = repr(bytes(data[:n]))
    return shown + (" ..." if len(data) > n else "")


def _model_ids(status: int, data: bytes) -> tuple[list[str], str]:
    """Model ids of a ``/v1/models`` answer, or ``([], why not)``."""
    if status != 200:
        return [], f"answered HTTP {status} (first bytes: {first_bytes(data)})"
    try:
        listed = json.loads(data).get("data")
        models = [str(m["id"]) for m in listed]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return [], (
            f"answered HTTP 200 with a body that is not an OpenAI model list "
            f"(first bytes: {first_bytes(data)})"
        )
    return models, "" if models else "lists no model"


def probe_endpoint(url: str, timeout_s: float = 5.0) -> dict:
    """Check that an endpoint answers; return what it says about its models.

    ``GET /v1/models`` is tried first, then ``GET /health``; any HTTP answer counts as up.

    Returns:
        ``{"status": int, "models": [ids], "models_error": str}``: ``models`` is empty when
        none is listed, and ``models_error`` then says why (the HTTP status and the first
        bytes of a body that is not a model list, or ``"lists no model"``).

    Raises:
        EndpointUnavailableError: no HTTP answer (refused, timed out, unreachable).
    """
    endpoint = Endpoint.parse(url)
    last = ""
    for route in ("/v1/models", "/health"):
        try:
            status, data = _request(endpoint, "GET", route, None, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            last = _describe_error(exc)
            if isinstance(exc, ConnectionRefusedError):
                break  # a refused port refuses every route
            continue
        if route == "/v1/models":
            models, why = _model_ids(status, data)
        else:
            models, why = [], f"/v1/models did not answer ({last})"
        return {"status": status, "models": models, "models_error": why}
    raise EndpointUnavailableError(f"cannot reach the serving endpoint {endpoint.url} ({last})")


def wait_until_healthy(url: str, timeout_s: float = 30.0) -> None:
    """Poll ``GET /health`` until it answers 200.

    Raises:
        EndpointUnavailableError: no healthy answer within ``timeout_s``.
    """
    endpoint = Endpoint.parse(url)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            status, _ = _request(endpoint, "GET", "/health", None, 2.0)
            if status == 200:
                return
            last = f"HTTP {status}"
        except (OSError, http.client.HTTPException) as exc:
            last = _describe_error(exc)
        if time.monotonic() > deadline:
            raise EndpointUnavailableError(
                f"{endpoint.url}/health not healthy after {timeout_s:.0f} s ({last})"
            )
        time.sleep(0.1)


def make_prompt(n_tokens: int, salt: int) -> str:
    """A prompt of ``n_tokens`` whitespace-separated words (varied by ``salt``)."""
    return " ".join(f"w{(salt * 7919 + i * 104729) % 997}" for i in range(max(1, n_tokens)))


def check_completion(body: object, max_tokens: int) -> str:
    """Why a parsed HTTP-200 body is not a completion of ``max_tokens`` tokens ("" if it is).

    A completion is a JSON object with a non-empty ``choices`` list whose first entry has
    a ``text`` string; when the server reports ``usage``, it must be an object whose
    ``completion_tokens`` (if present) is an integer in ``[0, max_tokens]``.
    """
    if not isinstance(body, dict):
        return f"JSON {type(body).__name__} instead of an object"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no 'choices' list"
    first = choices[0]
    if not isinstance(first, dict) or not isinstance(first.get("text"), str):
        return "choices[0] has no 'text' string"
    usage = body.get("usage")
    if usage is None:
        return ""
    if not isinstance(usage, dict):
        return "'usage' is not an object"
    generated = usage.get("completion_tokens")
    if generated is None:
        return ""
    if (
        isinstance(generated, bool)
        or not isinstance(generated, int)
        or not 0 <= generated <= max_tokens
    ):
        return (
            f"usage.completion_tokens is {json.dumps(generated)[:40]}, expected an "
            f"integer in [0, {max_tokens}]"
        )
    return ""


def post_completion(
    endpoint: Endpoint, model: str, prompt: str, max_tokens: int, timeout_s: float
) -> tuple[int, dict | None, str]:
    """Send one completion request; return (status, parsed body or None, error text).

    ``status`` is 0 when no HTTP answer came back (``error`` says why). An HTTP 200 whose
    body is not a completion (see :func:`check_completion`) has the error ``"invalid
    response: ..."`` and counts as a failed request.
    """
    body = _completion_body(model, prompt, max_tokens)
    try:
        status, data = _request(endpoint, "POST", "/v1/completions", body, timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        return 0, None, _describe_error(exc)
    return _completion_outcome(status, data, max_tokens)


def _completion_body(model: str, prompt: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0}


def _completion_outcome(status: int, data: bytes, max_tokens: int) -> tuple[int, dict | None, str]:
    """(status, parsed body or None, error text) of one completion answer."""
    try:
        parsed = json.loads(data) if data else None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly nested
        parsed = None
    if status != 200:
        message = ""
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message", ""))
        return status, parsed, f"HTTP {status}" + (f": {message[:200]}" if message else "")
    if parsed is None:
        return status, None, f"invalid response: not JSON (first bytes: {first_bytes(data)})"
    why = check_completion(parsed, int(max_tokens))
    if why:
        return status, parsed if isinstance(parsed, dict) else None, f"invalid response: {why}"
    return status, parsed, ""


def _describe_async_error(exc: BaseException) -> str:
    """The same wording as :func:`_describe_error` for the async client's errors."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    cause: BaseException | None = exc
    while cause is not None:  # aiohttp wraps the socket error
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = getattr(cause, "os_error", None) or cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}"


class CpuSampler:
    """Host CPU utilisation in [0, 1], sampled in a background thread with psutil (every
    platform psutil supports; it comes with the ``live`` extra).

    Without psutil the value is the 1-minute load average divided by the number of CPUs
    (capped at 1), and ``None`` where that is not available either.

    Args:
        interval_s: sampling period.
    """

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.value: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _run(self) -> None:
        import os

        try:
            import psutil

            have_psutil = True
            psutil.cpu_percent(interval=None)  # the first call starts the measurement
        except ImportError:
            have_psutil = False
        while not self._stop.wait(self.interval_s):
            if have_psutil:  # utilisation of all CPUs since the previous call
                self.value = float(min(1.0, max(0.0, psutil.cpu_percent(interval=None) / 100)))
                continue
            try:
                self.value = min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
            except OSError:
                self.value = None

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)


@dataclass
class RequestRecord:
    """One replayed request.

    Times are seconds on the run clock (``time.monotonic()`` minus the run's origin).

    Attributes:
        index: position in the phase's trace window.
        phase: ``"sync"`` (merges scheduled) or ``"control"`` (no-sync load match).
        scheduled_s: when the trace says it arrives.
        send_s: when it was actually sent.
        latency_s: send to full response, seconds (NaN when it failed).
        status: HTTP status (0 = no HTTP answer).
        error: empty when the request succeeded, ``"not sent"`` before its send, ``"in
            flight"`` while outstanding, else why it failed (``"connection refused"``,
            ``"timed out"``, ``"HTTP 500: ..."``, ``"invalid response: ..."`` for an HTTP
            200 whose body is not a completion).
        prompt_tokens / output_tokens: requested sizes (``usage`` overrides when returned).
        merge_active: a merge window was open at the send (read with the send time).
        merge_id: which merge (-1 when none).
        inflight: requests of this client outstanding at the send (excluding itself).
        cpu_util: host CPU utilisation at the send (NaN when unknown).
        server_inflight: the server's own in-flight count at arrival when it reports one
            (the built-in sidecar does), else -1.
        repeat: which repetition of the phase (0 for the first).
    """

    index: int
    phase: str
    scheduled_s: float
    prompt_tokens: int
    output_tokens: int
    send_s: float = float("nan")
    latency_s: float = float("nan")
    status: int = -1
    error: str = "not sent"
    merge_active: bool = False
    merge_id: int = -1
    inflight: int = 0
    cpu_util: float = float("nan")
    server_inflight: int = -1
    repeat: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def sent(self) -> bool:
        return not math.isnan(self.send_s)

    @property
    def done(self) -> bool:
        """An answer (or a failure) came back."""
        return self.status != -1


@dataclass
class _SharedState:
    """What the dispatcher reads at each send (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    merge_id: int = -1  # open merge window, -1 when none
    inflight: int = 0


#: The load generator's clients: ``"async"`` (one event loop, aiohttp) and ``"threads"``
#: (one thread per request over ``http.client``, the default).
CLIENTS = ("async", "threads")


class _Phase:
    """The handle of a phase dispatched on the event loop (``join`` / ``is_alive`` as a
    thread's)."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def join(self, timeout: float | None = None) -> None:
        try:
            self._future.result(timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass

    def is_alive(self) -> bool:
        return not self._future.done()

    def cancel(self) -> None:
        """Stop the dispatcher (it may be asleep until its next arrival)."""
        self._future.cancel()


class OpenLoopReplayer:
    """Send a trace's requests at their arrival times and record the outcomes.

    With ``client="threads"`` (the default) each request runs in its own thread over
    ``http.client``. With ``client="async"`` one event loop in a background thread sleeps
    until each arrival and starts the request as a task on an ``aiohttp.ClientSession``
    (pooled keep-alive connections), as vLLM's serving benchmark does; it needs aiohttp
    (the ``live`` extra) and falls back to the threads without it. Which keeps closer to the
    trace depends on the host (module docstring).

    Args:
        endpoint: the parsed endpoint.
        model: model id sent in every request.
        timeout_s: per-request timeout.
        clock: the run clock (seconds); must be monotonic.
        max_outstanding: most requests outstanding at once (beyond, sends wait).
        cpu: optional CPU sampler read at each send.
        client: ``"async"`` or ``"threads"``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        timeout_s: float,
        clock: Callable[[], float],
        max_outstanding: int = 256,
        cpu: CpuSampler | None = None,
        client: str = "threads",
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"client {client!r} is unknown; valid: {', '.join(CLIENTS)}")
        if client == "async":
            try:
                import aiohttp  # noqa: F401
            except ImportError:
                client = "threads"  # without the live extra: the stdlib client
        self.endpoint = endpoint
        self.model = model
        self.timeout_s = timeout_s
        self.clock = clock
        self.cpu = cpu
        self.client = client
        self.max_outstanding = max_outstanding
        self.state = _SharedState()
        self.records: list[RequestRecord] = []
        # Daemon threads (not a pool) so that requests abandoned at a stop never hold up
        # interpreter exit; the semaphore bounds how many are outstanding at once.
        self._slots = threading.Semaphore(max_outstanding)
        self._stop = threading.Event()
        self._dispatcher: threading.Thread | _Phase | None = None
        self._pending = 0
        self._pending_cv = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._http: Any = None
        self._aslots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()
        self._http_errors: tuple[type[BaseException], ...] = (OSError,)

    # ---- merge flag (called by the coordinator) ----
    def set_merge(self, merge_id: int) -> float:
        """Open merge window ``merge_id``; return the clock time it opened."""
        with self.state.lock:
            self.state.merge_id = merge_id
            return self.clock()

    def clear_merge(self) -> float:
        """Close the open merge window; return the clock time it closed."""
        with self.state.lock:
            self.state.merge_id = -1
            return self.clock()

    # ---- dispatch ----
    def start_phase(
        self,
        phase: str,
        trace: Trace,
        origin_s: float,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        repeat: int = 0,
    ) -> threading.Thread | _Phase:
        """Start sending ``trace`` with arrival ``a`` at clock time ``origin_s + a``
        (records are labelled ``phase`` and ``repeat``).

        Returns:
            The dispatcher (``join`` it, or call :meth:`wait_sent`).
        """
        records = [
            RequestRecord(i, phase, float(origin_s + a), int(p), int(o), repeat=repeat)
            for i, (a, p, o) in enumerate(
                zip(trace.arrival_s, prompt_tokens, output_tokens, strict=True)
            )
        ]
        self.records.extend(records)
        if self.client == "async":
            loop = self._event_loop()
            # Import aiohttp and open the session now, not at the first send.
            asyncio.run_coroutine_threadsafe(self._open_client(), loop).result()
            phase_handle = _Phase(
                asyncio.run_coroutine_threadsafe(self._dispatch_async(records), loop)
            )
            self._dispatcher = phase_handle
            return phase_handle
        thread = threading.Thread(
            target=self._dispatch, args=(records,), name=f"dispatch-{phase}", daemon=True
        )
        self._dispatcher = thread
        thread.start()
        return thread

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The replayer's event loop, running in a daemon thread (started once)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._loop_thread = threading.Thread(
                target=loop.run_forever, name="replay-loop", daemon=True
            )
            self._loop_thread.start()
        return self._loop

    async def _open_client(self) -> None:
        """The pooled async session and the outstanding-request bound (once, on the loop).

        One connector of ``max_outstanding`` connections (no per-host limit below it), so
        the pool never queues a send that the outstanding bound allows.
        """
        import aiohttp

        if self._http is None:
            connector = aiohttp.TCPConnector(limit=self.max_outstanding, limit_per_host=0)
            self._http = aiohttp.ClientSession(
                f"http://{self.endpoint.host}:{self.endpoint.port}",
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                skip_auto_headers=("User-Agent",),
            )
            self._aslots = asyncio.Semaphore(self.max_outstanding)
            self._http_errors = (aiohttp.ClientError, asyncio.TimeoutError, OSError)

    def _payload(self, rec: RequestRecord) -> bytes:
        """The request body of ``rec`` (built before its send time, off the timed path)."""
        prompt = make_prompt(rec.prompt_tokens, rec.index)
        return json.dumps(_completion_body(self.model, prompt, rec.output_tokens)).encode()

    async def _dispatch_async(self, records: list[RequestRecord]) -> None:
        assert self._aslots is not None
        loop = asyncio.get_running_loop()
        for rec in records:
            payload = self._payload(rec)
            delay = rec.scheduled_s - self.clock()
            if delay > 0:
                # One timer to the arrival (a stop cancels the task and so this sleep).
                await asyncio.sleep(delay)
            if self._stop.is_set():
                return
            # Returns at once (no yield) while fewer than max_outstanding are outstanding.
            await self._aslots.acquire()
            with self._pending_cv:
                self._pending += 1
            task = loop.create_task(self._send_async(rec, payload))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_async(self, rec: RequestRecord, payload: bytes) -> None:
        try:
            self._begin(rec)
            start = time.monotonic()
            try:
                async with self._http.post(
                    self.endpoint.path("/v1/completions"),
                    data=payload,
                    headers=_JSON_HEADERS,
                ) as response:
                    data = await response.read()
                outcome = _completion_outcome(response.status, data, rec.output_tokens)
            except self._http_errors as exc:
                outcome = (0, None, _describe_async_error(exc))
            self._finish(rec, *outcome, time.monotonic() - start)
        finally:
            assert self._aslots is not None
            self._aslots.release()
            with self._pending_cv:
                self._pending -= 1
                self._pending_cv.notify_all()

    def _dispatch(self, records: list[RequestRecord]) -> None:
        for rec in records:
            payload = self._payload(rec)
            while True:
                delay = rec.scheduled_s - self.clock()
                if delay <= 0:
                    break
                if self._stop.wait(min(delay, 0.05)):
                    return
            while not self._slots.acquire(timeout=0.05):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                self._slots.release()
                return
            with self._pending_cv:
                self._pending += 1
            threading.Thread(
                target=self._send, args=(rec, payload), name=f"request-{rec.index}", daemon=True
            ).start()

    def _begin(self, rec: RequestRecord) -> None:
        """Record the send (time, merge flag, in-flight count, CPU)."""
        cpu = self.cpu.value if self.cpu is not None else None
        with self.state.lock:
            rec.send_s = self.clock()
            rec.merge_id = self.state.merge_id
            rec.merge_active = rec.merge_id >= 0
            rec.inflight = self.state.inflight
            rec.error = "in flight"
            rec.cpu_util = float("nan") if cpu is None else cpu
            self.state.inflight += 1

    def _finish(
        self, rec: RequestRecord, status: int, body: dict | None, error: str, elapsed: float
    ) -> None:
        """Record the answer (only a validated completion's fields are read)."""
        usage = (body or {}).get("usage") if not error else None
        extra = (body or {}).get("x_sidecar") if not error else None
        usage = usage if isinstance(usage, dict) else {}
        extra = extra if isinstance(extra, dict) else {}
        with self.state.lock:  # snapshots read records under this lock
            self.state.inflight -= 1
            rec.status, rec.error = status, error
            if not error:
                rec.latency_s = elapsed
                if isinstance(usage.get("completion_tokens"), int):
                    rec.output_tokens = usage["completion_tokens"]
                if isinstance(usage.get("prompt_tokens"), int):
                    rec.prompt_tokens = usage["prompt_tokens"]
                if isinstance(extra.get("inflight_at_arrival"), int):
                    rec.server_inflight = extra["inflight_at_arrival"]

    def _send(self, rec: RequestRecord, payload: bytes) -> None:
        try:
            self._begin(rec)
            start = time.monotonic()
            try:
                status, data = _post(self.endpoint, "/v1/completions", payload, self.timeout_s)
                outcome = _completion_outcome(status, data, rec.output_tokens)
            except (OSError, http.client.HTTPException) as exc:
                outcome = (0, None, _describe_error(exc))
            self._finish(rec, *outcome, time.monotonic() - start)
        finally:
            self._slots.release()
            with self._pending_cv:
                self._pending -= 1
                self._pending_cv.notify_all()

    def wait_sent(self, timeout_s: float | None = None) -> bool:
        """Wait for the current phase's dispatcher to send its last request."""
        if self._dispatcher is None:
            return True
        self._dispatcher.join(timeout_s)
        return not self._dispatcher.is_alive()

    def drain(self, timeout_s: float) -> bool:
        """Wait until no request is outstanding; return False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._pending_cv:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pending_cv.wait(min(left, 0.2))
        return True

    @property
    def sending(self) -> bool:
        """The current phase's dispatcher has requests left to send."""
        return self._dispatcher is not None and self._dispatcher.is_alive()

    @property
    def outstanding(self) -> int:
        with self._pending_cv:
            return self._pending

    def snapshot(self) -> list[RequestRecord]:
        """Consistent copies of all records so far."""
        with self.state.lock:
            return [replace(r) for r in self.records]

    def counts(self, phase: str | None = None, repeat: int | None = None) -> dict:
        """Planned / sent / ok / error / timed-out counts so far (of one phase and repeat
        when given; ``outstanding`` is always over all phases)."""
        recs = [
            r
            for r in self.snapshot()
            if (phase is None or r.phase == phase) and (repeat is None or r.repeat == repeat)
        ]
        return {
            "planned": len(recs),
            "sent": sum(r.sent for r in recs),
            "ok": sum(r.ok for r in recs),
            "errors": sum(1 for r in recs if r.done and not r.ok),
            "timeouts": sum(1 for r in recs if r.done and r.error == "timed out"),
            "done": sum(r.done for r in recs),
            "outstanding": self.outstanding,
        }

    def close(self, wait_s: float = 0.0) -> None:
        """Stop dispatching; give outstanding requests ``wait_s`` seconds, then abandon them.

        Abandoned requests finish (or time out) in the background; snapshots taken before
        they finish show them as ``in flight``. The event loop closes its client and stops
        once they have.
        """
        self._stop.set()
        if isinstance(self._dispatcher, _Phase):
            self._dispatcher.cancel()
        if self._dispatcher is not None:
            self._dispatcher.join(timeout=2.0)
        if wait_s > 0:
            self.drain(wait_s)
        if self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop)

    async def _shut_down(self) -> None:
        """Let abandoned requests finish (at most their timeout), close the client, stop."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.timeout_s + 1.0)
        if self._http is not None:
            await self._http.close()
        asyncio.get_running_loop().stop()
