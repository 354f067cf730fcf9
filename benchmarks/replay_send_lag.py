"""How closely the open-loop load generator's send times follow the trace, per client.

Usage::

    python benchmarks/replay_send_lag.py                    # 200 req/s for 10 s, both clients
    python benchmarks/replay_send_lag.py --rate 400 --duration 5 --repeats 3
    python benchmarks/replay_send_lag.py --json out.json    # also save every number

Configuration of every row: the built-in engine (``diloco_gym.live.server``, a real HTTP
server in a child process) with a deliberately small model (d_model 32, hidden 32, one
layer, so that the server's own CPU use disturbs the client little), requests with 8
prompt words and 1 output token, arrivals evenly spaced at ``--rate`` requests per second
(a Poisson trace has the same mean rate; even spacing makes every request's lag its own),
``max_outstanding`` 256, per-request timeout 30 s.

Send lag = ``send_s - scheduled_s`` of each request: when the client actually started the
request minus when the trace says it arrives. The two clients of
:class:`~diloco_gym.live.replay.OpenLoopReplayer` are timed alternately against the same
server so that a busy machine affects both alike: ``async`` (one event loop, aiohttp) and
``threads`` (one thread per request over ``http.client``). Each row reports p50, p99 and
the maximum in milliseconds, how many requests were sent and answered, and the client's
CPU time per request (this process's user + system time over the replay, divided by the
requests; the server is another process).

Before each repeat a ``floor`` row times a bare sleeper at the same arrivals with no HTTP
(:func:`timer_floor`): how late this machine wakes a thread and an event loop. No client
can follow the trace more closely than that floor.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diloco_gym.live.replay import CLIENTS, Endpoint, OpenLoopReplayer  # noqa: E402
from diloco_gym.live.server import SidecarModelConfig, start_sidecar  # noqa: E402
from diloco_gym.sim.traces import Trace  # noqa: E402

SMALL_ENGINE = SidecarModelConfig(d_model=32, hidden=32, n_layers=1)


def even_trace(rate_rps: float, duration_s: float) -> Trace:
    """``rate_rps * duration_s`` requests evenly spaced over ``duration_s`` seconds."""
    n = int(round(rate_rps * duration_s))
    return Trace(
        arrival_s=np.arange(n, dtype=float) / rate_rps,
        prompt_tokens=np.full(n, 8, dtype=np.int64),
        output_tokens=np.ones(n, dtype=np.int64),
        duration_s=float(duration_s),
        name=f"even-{rate_rps:g}rps",
    )


def timer_floor(rate_rps: float, duration_s: float) -> dict:
    """How late this machine wakes a sleeper at each arrival, with no HTTP at all: a thread
    waiting on an event until each arrival (as the threaded dispatcher does) and an event
    loop sleeping until it (as the async one does), run one after the other. Their p99 is
    the floor under any client's send lag here (the OS scheduler and timer slack)."""
    import asyncio
    import threading

    times = np.arange(int(round(rate_rps * duration_s)), dtype=float) / rate_rps

    def thread_lateness() -> np.ndarray:
        stop = threading.Event()
        t0 = time.monotonic() + 0.2
        late = []
        for t in times:
            while (delay := t0 + t - time.monotonic()) > 0:
                stop.wait(min(delay, 0.05))
            late.append(time.monotonic() - t0 - t)
        return np.array(late) * 1e3

    async def loop_lateness() -> np.ndarray:
        t0 = time.monotonic() + 0.2
        late = []
        for t in times:
            delay = t0 + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append(time.monotonic() - t0 - t)
        return np.array(late) * 1e3

    out = {}
    for name, late in (("thread", thread_lateness()), ("loop", asyncio.run(loop_lateness()))):
        out[f"{name}_p50_ms"] = float(np.percentile(late, 50))
        out[f"{name}_p99_ms"] = float(np.percentile(late, 99))
    return out


def measure(url: str, model: str, client: str, trace: Trace, lead_s: float = 0.5) -> dict:
    """Replay ``trace`` with ``client``; the send-lag statistics of every sent request."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    replayer = OpenLoopReplayer(
        Endpoint.parse(url), model, 30.0, lambda: time.monotonic() - t0, client=client
    )
    try:
        replayer.start_phase("bench", trace, lead_s, trace.prompt_tokens, trace.output_tokens)
        replayer.wait_sent(trace.duration_s + 60.0)
        replayer.drain(60.0)
        records = replayer.snapshot()
    finally:
        replayer.close()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lag_ms = np.array([(r.send_s - r.scheduled_s) * 1e3 for r in records if r.sent])
    return {
        "client": client,
        "rate_rps": len(records) / trace.duration_s,
        "requests": len(records),
        "sent": int(lag_ms.size),
        "ok": sum(r.ok for r in records),
        "lag_p50_ms": float(np.percentile(lag_ms, 50)) if lag_ms.size else float("nan"),
        "lag_p99_ms": float(np.percentile(lag_ms, 99)) if lag_ms.size else float("nan"),
        "lag_max_ms": float(lag_ms.max()) if lag_ms.size else float("nan"),
        "cpu_ms_per_request": 1e3 * cpu_s / max(1, len(records)),
    }


def run(rate_rps: float, duration_s: float, repeats: int) -> list[dict]:
    """Alternate the clients ``repeats`` times against one built-in engine, each repeat
    after a ``floor`` row (:func:`timer_floor`, client ``"floor"``)."""
    trace = even_trace(rate_rps, duration_s)
    rows: list[dict] = []
    with start_sidecar(SMALL_ENGINE) as engine:
        for repeat in range(repeats):
            rows.append({"repeat": repeat, "client": "floor", **timer_floor(rate_rps, duration_s)})
            for client in CLIENTS:
                row = measure(engine.url, SMALL_ENGINE.model_name, client, trace)
                rows.append({"repeat": repeat, **row})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per replay")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of the two clients")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = run(args.rate, args.duration, args.repeats)
    print(
        f"built-in engine (d_model 32, hidden 32, 1 layer), {args.rate:g} req/s evenly "
        f"spaced for {args.duration:g} s, 8 prompt words, 1 output token; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    )
    print(
        "repeat  client   sent/planned  answered  lag p50 ms  lag p99 ms  lag max ms  "
        "CPU ms/request"
    )
    for r in rows:
        if r["client"] == "floor":
            print(
                f"{r['repeat']:>6}  floor: a bare sleeper wakes late by p50/p99 "
                f"{r['thread_p50_ms']:.2f}/{r['thread_p99_ms']:.2f} ms (thread), "
                f"{r['loop_p50_ms']:.2f}/{r['loop_p99_ms']:.2f} ms (event loop)"
            )
            continue
        print(
            f"{r['repeat']:>6}  {r['client']:<7}  {r['sent']:>5}/{r['requests']:<6}  "
            f"{r['ok']:>8}  {r['lag_p50_ms']:>10.2f}  {r['lag_p99_ms']:>10.2f}  "
            f"{r['lag_max_ms']:>10.2f}  {r['cpu_ms_per_request']:>14.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
