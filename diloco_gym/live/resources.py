"""What a run starts and must release whatever happens (:class:`Resources`): the built-in
server (started in a thread while the merge workers spawn) or the connection to an external
endpoint, the merge workers, the progress ticker and the CPU sampler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diloco_gym.live.config import (
    default_engine_threads,
)
from diloco_gym.live.engine import (
    EngineProcess,
    kv_settings,
    start_engine,
)
from diloco_gym.live.errors import (
    CalibrationError,
    EndpointUnavailableError,
)
from diloco_gym.live.merges import MergeCluster
from diloco_gym.live.rate import warm_up_run
from diloco_gym.live.replay import (
    CpuSampler,
    Endpoint,
    probe_endpoint,
)
from diloco_gym.live.server import SidecarProcess, start_sidecar
from diloco_gym.live.state import Job, RunState, TraceWindow

__all__ = [
    "Resources",
    "builtin_starter",
    "start_builtin",
    "connect_external",
]


@dataclass
class Resources:
    """What a run starts and must release, whatever happens: the progress ticker, the
    replayer (held by ``run``), the merge workers, the server with its start-up thread and
    the CPU sampler. :meth:`close` releases them in that order."""

    run: RunState
    cpu: CpuSampler
    cluster: MergeCluster | None = None
    server: SidecarProcess | EngineProcess | None = None
    starter: threading.Thread | None = None
    server_box: dict = field(default_factory=dict)  # the start-up thread's "handle" or "error"
    ticker_stop: threading.Event = field(default_factory=threading.Event)
    ticker: threading.Thread | None = None

    def start_server(self, start: Callable[[], Any]) -> None:
        """Run ``start`` in a thread; its server (or its error) lands in ``server_box``."""

        def _start_server() -> None:
            try:
                self.server_box["handle"] = start()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                self.server_box["error"] = exc

        self.starter = threading.Thread(target=_start_server, name="server-start", daemon=True)
        self.starter.start()

    def join_starter(self) -> None:
        """Wait for the start-up thread (if any) and take the server it brought up."""
        if self.starter is not None:
            self.starter.join()
            self.server = self.server_box.get("handle")

    def start_ticker(self, every_s: float, say: Callable[[str], None]) -> None:
        """Print a progress line every ``every_s`` seconds until :meth:`close`."""
        run = self.run

        def _tick() -> None:
            assert run.replayer is not None  # set before the ticker starts
            while not self.ticker_stop.wait(every_s):
                c = run.replayer.counts() if run.replayer else {}
                say(
                    f"t={run.clock():6.1f} s {run.stage}: sent {c.get('sent', 0)}/"
                    f"{c.get('planned', 0)}, ok {c.get('ok', 0)}, errors "
                    f"{c.get('errors', 0)}, outstanding {c.get('outstanding', 0)}, merge "
                    f"{'active' if run.replayer.state.merge_id >= 0 else 'idle'}"
                )

        self.ticker = threading.Thread(target=_tick, name="calibrate-progress", daemon=True)
        self.ticker.start()

    def close(self) -> None:
        """Release everything, in order; the server only once its start-up has finished."""
        self.ticker_stop.set()
        if self.ticker is not None:
            self.ticker.join(timeout=1.0)
        if self.run.replayer is not None:
            self.run.replayer.close()
        if self.cluster is not None:
            self.cluster.close()
        # An interrupted start-up may still be bringing the server up: wait for it so that
        # it can be stopped rather than orphaned.
        self.join_starter()
        if self.server is not None:
            self.server.stop()
        self.cpu.stop()


def builtin_starter(job: Job, longest: tuple[int, int]) -> Callable[[], Any]:
    """Announce the built-in server and return the call that starts it (it runs in a
    thread, see :func:`start_builtin`)."""
    cfg, say = job.cfg, job.say
    if cfg.engine == "transformers":
        kv = kv_settings(*longest, max_concurrent=cfg.engine_max_concurrent)
        threads = cfg.engine_threads or default_engine_threads(cfg.merge)
        say(
            f"starting transformers serve --continuous-batching (KV: block "
            f"{kv.block_size}, {kv.num_blocks} blocks, {kv.max_batch_tokens} batch "
            f"tokens; longest request {longest[0]} + {longest[1]} tokens; {threads} torch "
            f"thread{'s' if threads > 1 else ''}) and the merge workers"
        )
        return lambda: start_engine(
            kv, cfg.engine_model, cfg.engine_start_timeout_s, threads=threads
        )
    say(
        "starting the built-in fallback server (dependency-free, one thread per "
        "request, no batching) and the merge workers"
    )
    return lambda: start_sidecar(cfg.sidecar)


def start_builtin(
    job: Job, run: RunState, res: Resources, longest: tuple[int, int]
) -> tuple[str, str]:
    """Start the built-in server and the merge workers; returns ``(url, model)``.

    The server starts in a thread while the workers spawn: both load torch at once.
    """
    start = builtin_starter(job, longest)
    res.cluster = MergeCluster(job.cfg.merge)
    res.start_server(start)
    try:
        res.cluster.start()
    finally:
        res.join_starter()
    if "error" in res.server_box:
        err = res.server_box["error"]
        if isinstance(err, CalibrationError):
            raise CalibrationError(str(err))
        raise CalibrationError(f"the built-in {job.cfg.engine} server failed to start: {err}")
    assert res.server is not None
    return _describe_builtin(job, run, res.server)


def _describe_builtin(
    job: Job, run: RunState, server: SidecarProcess | EngineProcess
) -> tuple[str, str]:
    """Record and announce the started built-in server; returns ``(url, model)``."""
    url = server.url
    if isinstance(server, EngineProcess):
        model = server.model
        run.endpoint = {
            "kind": "built-in",
            "engine": "transformers",
            "url": url,
            "model": model,
            **server.describe(),
        }
        job.say(
            f"transformers serve (continuous batching) on a {server.parameters / 1e6:.1f}"
            f" M-parameter Llama at {url}"
        )
    else:
        model = job.cfg.model or job.cfg.sidecar.model_name
        run.endpoint = {
            "kind": "built-in",
            "engine": "builtin-fallback",
            "url": url,
            "model": model,
            **server.describe(),
        }
        job.say(
            f"built-in fallback server {model} ({server.num_parameters / 1e6:.1f} M "
            f"parameters) at {url}"
        )
    return url, model


def connect_external(
    job: Job, run: RunState, res: Resources, window: TraceWindow, longest: tuple[int, int]
) -> tuple[str, str]:
    """Probe the external endpoint, warm it up, then start the merge workers; returns
    ``(url, model)``."""
    cfg, say = job.cfg, job.say
    assert job.endpoint is not None  # not a built-in run
    url = job.endpoint
    say(f"probing {url}")
    try:
        info = probe_endpoint(url, timeout_s=min(cfg.timeout_s, 10.0))
    except EndpointUnavailableError as exc:
        raise EndpointUnavailableError(
            f"{exc}. Is the server running? Omit --endpoint to use the built-in engine."
        ) from None
    model = cfg.model or (info["models"][0] if info["models"] else "")
    if not model:
        raise CalibrationError(f"{url}/v1/models {info['models_error']}; pass --model")
    if not info["models"]:
        say(f"note: {url}/v1/models {info['models_error']}; using --model {model}")
    run.endpoint = {
        "kind": "external",
        "url": url,
        "model": model,
        "models_listed": info["models"],
    }
    say(f"endpoint {url} answers; model {model}")
    warm_up_run(run, Endpoint.parse(url), model, cfg, window.prompt, window.output, longest, say)
    res.cluster = MergeCluster(cfg.merge)
    say(f"starting {cfg.merge.workers} merge workers")
    res.cluster.start()
    return url, model
