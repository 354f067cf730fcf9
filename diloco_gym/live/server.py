"""Built-in serving sidecar: a tiny torch language model behind an OpenAI-style HTTP API.

The sidecar lets ``diloco-gym calibrate`` run end to end on a laptop with no GPU and no
serving stack: it is a real HTTP server (:class:`http.server.ThreadingHTTPServer`, one
thread per request, loopback only) in its own process, running a real model on the CPU.

Model (:class:`TinyLM`): a randomly initialised (fixed seed) stack of linear-recurrent MLP
blocks. Layer ``l`` keeps a decayed running state ``s_t = decay * s_{t-1} + LN(x_t)`` and
adds ``MLP(s_t)`` to the residual stream. Prefill runs every prompt position through every
layer in batched matrix products (a chunked scan gives the states), so its cost grows with
the prompt; decoding is greedy, one token per step, each step a chain of matrix-vector
products over all weights, so it is memory-bound like a real LLM decode step. The defaults
make one decode step cost a few milliseconds on one CPU thread.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` (``model``,
``prompt``, ``max_tokens``; generation always runs exactly ``max_tokens`` steps, as with
vLLM's ``ignore_eos``). Responses carry the OpenAI fields (``choices``, ``usage``) plus an
``x_sidecar`` object with the server-side in-flight count at arrival and the server time.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["SidecarModelConfig", "TinyLM", "SidecarHTTPServer", "SidecarProcess", "start_sidecar"]

_SCAN_CHUNK = 32


class GenerationCancelled(RuntimeError):
    """Generation stopped early because the server is shutting down."""


@dataclass(frozen=True)
class SidecarModelConfig:
    """Configuration of the built-in sidecar.

    Attributes:
        model_name: the model id served (``/v1/models``) and expected in requests.
        vocab_size: vocabulary size (words are hashed into it).
        d_model: width of the residual stream.
        hidden: width of each block's MLP.
        n_layers: number of blocks.
        decay: state decay of the linear recurrence, in (0, 1).
        seed: seed of the random initialisation (same seed, same outputs).
        torch_threads: intra-op threads per request (1 leaves the cores to concurrency).
        max_prompt_tokens: prompts are truncated to their last ``max_prompt_tokens`` words.
        max_tokens_limit: largest ``max_tokens`` accepted.
    """

    model_name: str = "tiny-lm"
    vocab_size: int = 512
    d_model: int = 384
    hidden: int = 1536
    n_layers: int = 6
    decay: float = 0.9
    seed: int = 0
    torch_threads: int = 1
    max_prompt_tokens: int = 1024
    max_tokens_limit: int = 4096

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "hidden",
            "n_layers",
            "torch_threads",
            "max_prompt_tokens",
            "max_tokens_limit",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SidecarModelConfig.{name} must be an int >= 1, got {value!r}")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"SidecarModelConfig.decay must be in (0, 1), got {self.decay!r}")
        if not self.model_name:
            raise ValueError("SidecarModelConfig.model_name must not be empty")


def _build_model(cfg: SidecarModelConfig):
    """Construct :class:`TinyLM` lazily so that importing this module needs no torch."""
    import torch
    from torch import nn

    class _TinyLM(nn.Module):
        kernel: torch.Tensor  # buffers registered in __init__
        carry_pow: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.cfg = cfg
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(cfg.n_layers))
            self.up = nn.ModuleList(nn.Linear(cfg.d_model, cfg.hidden) for _ in range(cfg.n_layers))
            self.down = nn.ModuleList(
                nn.Linear(cfg.hidden, cfg.d_model) for _ in range(cfg.n_layers)
            )
            self.final = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            powers = cfg.decay ** torch.arange(_SCAN_CHUNK, dtype=torch.float32)
            lag = torch.arange(_SCAN_CHUNK)[:, None] - torch.arange(_SCAN_CHUNK)[None, :]
            # kernel[t, j] = decay**(t - j) for j <= t: the intra-chunk part of the scan.
            kernel = torch.where(lag >= 0, cfg.decay ** lag.clamp(min=0).float(), torch.zeros(()))
            self.register_buffer("kernel", kernel, persistent=False)
            self.register_buffer("carry_pow", powers * cfg.decay, persistent=False)

        def prefill(self, ids: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
            """Run the prompt; return the last position's logits and the layer states."""
            x = self.embed(torch.tensor(ids, dtype=torch.long))
            states = []
            for norm, up, down in zip(self.norms, self.up, self.down, strict=True):
                s = _scan(self.kernel, self.carry_pow, norm(x))
                states.append(s[-1].clone())
                x = x + down(torch.nn.functional.gelu(up(s)))
            return self.head(self.final(x[-1])), states

        def step(self, token: int, states: list[torch.Tensor]) -> torch.Tensor:
            """One decode step: update the layer states in place, return the logits."""
            x = self.embed.weight[token]
            for i, (norm, up, down) in enumerate(zip(self.norms, self.up, self.down, strict=True)):
                states[i].mul_(cfg.decay).add_(norm(x))
                x = x + down(torch.nn.functional.gelu(up(states[i])))
            return self.head(self.final(x))

        @torch.inference_mode()
        def generate(
            self, ids: list[int], max_tokens: int, cancelled: Callable[[], bool] | None = None
        ) -> list[int]:
            """Greedy decoding of exactly ``max_tokens`` tokens after ``ids``.

            ``cancelled`` is polled before every step; when it returns True the
            generation stops with :class:`GenerationCancelled`.
            """
            return _greedy_decode(self, ids, max_tokens, cancelled)

    with _fork_rng_seeded(cfg.seed):
        model = _TinyLM()
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def _scan(kernel: Any, carry_pow: Any, u: Any) -> Any:
    """States ``s_t = decay * s_{t-1} + u_t`` (``s_{-1} = 0``) for ``u`` of (T, d), in
    chunks of :data:`_SCAN_CHUNK`: ``kernel`` is the intra-chunk part, ``carry_pow`` carries
    the previous chunk's last state in."""
    import torch

    t_len, d = u.shape
    n_chunks = -(-t_len // _SCAN_CHUNK)
    pad = n_chunks * _SCAN_CHUNK - t_len
    if pad:
        u = torch.cat([u, u.new_zeros(pad, d)])
    chunks = torch.matmul(kernel, u.view(n_chunks, _SCAN_CHUNK, d))
    carry = u.new_zeros(d)
    for c in range(n_chunks):  # at most max_prompt_tokens / 32 iterations
        chunks[c] += carry_pow[:, None] * carry
        carry = chunks[c, -1]
    return chunks.view(-1, d)[:t_len]


def _greedy_decode(
    model: Any, ids: list[int], max_tokens: int, cancelled: Callable[[], bool] | None
) -> list[int]:
    """Greedy decoding of exactly ``max_tokens`` tokens after ``ids`` (see ``generate``)."""
    import torch

    logits, states = model.prefill(ids if ids else [0])
    out: list[int] = []
    for _ in range(max_tokens):
        if cancelled is not None and cancelled():
            raise GenerationCancelled("the server is shutting down")
        token = int(torch.argmax(logits))
        out.append(token)
        if len(out) < max_tokens:
            logits = model.step(token, states)
    return out


class _fork_rng_seeded:
    """Seed torch's global generator inside a block and restore it afterwards."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        import torch

        self._state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.random.set_rng_state(self._state)


class TinyLM:
    """Tokeniser plus model: text in, text out.

    Args:
        cfg: the sidecar configuration.
    """

    def __init__(self, cfg: SidecarModelConfig | None = None) -> None:
        self.cfg = cfg or SidecarModelConfig()
        self.model = _build_model(self.cfg)

    def tokenize(self, text: str) -> list[int]:
        """Whitespace words hashed into the vocabulary (CRC-32, so deterministic)."""
        words = text.split()[-self.cfg.max_prompt_tokens :]
        return [zlib.crc32(w.encode("utf-8")) % self.cfg.vocab_size for w in words]

    def complete(
        self, prompt: str, max_tokens: int, cancelled: Callable[[], bool] | None = None
    ) -> tuple[str, int, int]:
        """Generate ``max_tokens`` words; return (text, prompt tokens, completion tokens).

        Raises:
            GenerationCancelled: ``cancelled()`` became true during generation.
        """
        ids = self.tokenize(prompt)
        out = self.model.generate(ids, max_tokens, cancelled)
        return " ".join(f"t{tok}" for tok in out), len(ids), len(out)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


class SidecarHTTPServer(ThreadingHTTPServer):
    """OpenAI-compatible completions server around a :class:`TinyLM` (one thread a request).

    Args:
        lm: the model.
        port: TCP port on 127.0.0.1 (0 picks a free one; see ``server_port``).
    """

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, lm: TinyLM, port: int = 0) -> None:
        self.lm = lm
        self.inflight = 0
        self.served = 0
        self.stopping = False
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def enter(self) -> int:
        """Count a request in; return the in-flight count it found (excluding itself)."""
        with self._lock:
            before = self.inflight
            self.inflight += 1
            return before

    def leave(self) -> None:
        with self._lock:
            self.inflight -= 1
            self.served += 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (the calibration was stopped while requests were in
        flight) is not an error of the server: no traceback for a broken pipe or reset."""
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: SidecarHTTPServer
    server_version = "diloco-gym-sidecar/0.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        """Silence the per-request log lines of :class:`BaseHTTPRequestHandler`."""

    def _send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send_json(
                200,
                {"status": "ok", "inflight": self.server.inflight, "served": self.server.served},
            )
        elif path == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.server.lm.cfg.model_name,
                            "object": "model",
                            "created": 0,
                            "owned_by": "diloco-gym",
                        }
                    ],
                },
            )
        else:
            self._error(404, f"no route {self.path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        arrived = time.perf_counter()
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/completions":
            self._error(404, f"no route {self.path}", "not_found")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError) as exc:
            self._error(400, f"body is not valid JSON: {exc}")
            return
        if not isinstance(body, dict):
            self._error(400, "body must be a JSON object")
            return
        cfg = self.server.lm.cfg
        model = body.get("model", cfg.model_name)
        if model != cfg.model_name:
            self._error(
                404,
                f"model {model!r} not found; this sidecar serves {cfg.model_name!r}",
                "not_found",
            )
            return
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            self._error(400, "prompt must be a string")
            return
        max_tokens = body.get("max_tokens", 16)
        if (
            not isinstance(max_tokens, int)
            or isinstance(max_tokens, bool)
            or not 1 <= max_tokens <= cfg.max_tokens_limit
        ):
            self._error(
                400,
                f"max_tokens must be an integer in [1, {cfg.max_tokens_limit}], got {max_tokens!r}",
            )
            return
        inflight = self.server.enter()
        try:
            text, n_prompt, n_out = self.server.lm.complete(
                prompt, max_tokens, lambda: self.server.stopping
            )
        except GenerationCancelled as exc:
            self.server.leave()
            self._error(503, str(exc), "server_error")
            return
        except Exception as exc:  # a model failure is a 500, never a dead server thread
            self.server.leave()
            self._error(500, f"generation failed: {exc}", "server_error")
            return
        self.server.leave()
        server_ms = (time.perf_counter() - arrived) * 1000.0
        self._send_json(
            200,
            {
                "id": f"cmpl-{self.server.served}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": cfg.model_name,
                "choices": [
                    {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
                ],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": n_out,
                    "total_tokens": n_prompt + n_out,
                },
                "x_sidecar": {"inflight_at_arrival": inflight, "server_ms": server_ms},
            },
        )


def _sidecar_main(conn: Any, cfg: SidecarModelConfig, port: int) -> None:
    """Entry point of the sidecar process: serve until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        import torch

        torch.set_num_threads(cfg.torch_threads)
        lm = TinyLM(cfg)
        lm.complete("warm up the kernels", 4)
        server = SidecarHTTPServer(lm, port)
    except BaseException as exc:  # report start-up failures to the parent
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except (OSError, ValueError):  # the parent is gone (killed): exit quietly
            pass
        conn.close()
        return
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="sidecar-http", daemon=True
    )
    thread.start()
    try:
        conn.send(("ready", server.server_port, lm.num_parameters()))
    except (OSError, ValueError):  # the parent is gone before we were ready
        server.shutdown()
        server.server_close()
        return
    parent = os.getppid()
    try:
        while True:
            # A closed pipe (EOFError) or a new parent pid means the parent is gone.
            if conn.poll(0.5):
                if conn.recv() == "stop":
                    break
            if os.getppid() != parent:
                break
    except (EOFError, OSError):
        pass
    finally:
        server.stopping = True  # generations in progress end at their next token (503)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        # Wait for those requests to unwind (bounded): a process that exits while daemon
        # threads run torch kernels aborts in C++ ("terminate called ...").
        deadline = time.monotonic() + 3.0
        while server.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if server.inflight > 0:
            os._exit(0)  # skip interpreter finalisation under the running threads


class SidecarProcess:
    """A running built-in sidecar in a child process (use :func:`start_sidecar`).

    Attributes:
        url: base URL, ``http://127.0.0.1:<port>``.
        port: the port chosen by the operating system.
        config: the model configuration.
        num_parameters: model size.
        pid: the child's process id.
    """

    def __init__(
        self,
        process: mp.process.BaseProcess,
        conn: Any,
        port: int,
        config: SidecarModelConfig,
        num_parameters: int,
    ) -> None:
        self._process = process
        self._conn = conn
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config = config
        self.num_parameters = num_parameters

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def describe(self) -> dict:
        return {
            "kind": "built-in",
            "url": self.url,
            "parameters": self.num_parameters,
            **asdict(self.config),
        }

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server and reap the process (terminate, then kill, if it lingers)."""
        try:
            self._conn.send("stop")
        except (OSError, ValueError):
            pass
        _reap(self._process, timeout_s)
        self._conn.close()

    def __enter__(self) -> SidecarProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _reap(process: mp.process.BaseProcess, timeout_s: float) -> None:
    """Join ``process``; escalate to SIGTERM and then SIGKILL if it does not exit."""
    process.join(timeout_s)
    if process.is_alive():
        process.terminate()
        process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)


def start_sidecar(
    cfg: SidecarModelConfig | None = None, port: int = 0, start_timeout_s: float = 120.0
) -> SidecarProcess:
    """Start the built-in sidecar in a spawned process and wait until it serves.

    Args:
        cfg: model configuration (defaults: :class:`SidecarModelConfig`).
        port: port on 127.0.0.1; 0 lets the operating system pick a free one.
        start_timeout_s: how long to wait for the model to load.

    Returns:
        The running sidecar; call :meth:`SidecarProcess.stop` (or use it as a context
        manager) to shut it down.

    Raises:
        RuntimeError: the sidecar failed to start (with the child's error message).
    """
    from diloco_gym.live.replay import wait_until_healthy

    cfg = cfg or SidecarModelConfig()
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(
        target=_sidecar_main, args=(child_conn, cfg, port), name="diloco-gym-sidecar", daemon=True
    )
    process.start()
    child_conn.close()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not parent_conn.poll(0.2):
            if not process.is_alive():
                raise RuntimeError(
                    f"built-in sidecar exited during start-up (exit code {process.exitcode})"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"built-in sidecar did not start within {start_timeout_s} s")
        message = parent_conn.recv()
        if message[0] != "ready":
            raise RuntimeError(f"built-in sidecar failed to start: {message[1]}")
        _, chosen, n_params = message
        handle = SidecarProcess(process, parent_conn, chosen, cfg, n_params)
        wait_until_healthy(handle.url, timeout_s=max(1.0, deadline - time.monotonic()))
        return handle
    except BaseException:
        try:
            parent_conn.send("stop")
        except (OSError, ValueError):
            pass
        _reap(process, 2.0)
        parent_conn.close()
        raise
