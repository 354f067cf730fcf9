"""A real continuous-batching serving engine as the calibration sidecar.

``diloco-gym calibrate`` without ``--endpoint`` serves requests with transformers'
OpenAI-compatible server (``transformers serve --continuous-batching``: paged attention,
requests join and leave the running batch at every decode step, as in vLLM, TGI or
SGLang), started as a subprocess on a free loopback port. No model is downloaded: a small
Llama with random weights and a word-level tokenizer is built from a config and a seed and
saved with ``save_pretrained`` (same config and seed, same files, same outputs).

The KV-cache settings are derived from the longest request the run can send
(:func:`kv_settings`): the page (block) size, the number of blocks and the batch-token
budget are chosen so that the longest prompt fits into one prefill batch and at least
``max_concurrent`` requests of the longest size fit in the cache at once, so that no request
can starve waiting for room that never comes.

Needs the ``live`` extra (``pip install "diloco-gym[live]"``, which pulls in
``transformers[serving]``); :func:`engine_available` says whether it is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diloco_gym.io import free_port
from diloco_gym.live.errors import CalibrationError

__all__ = [
    "EngineModelConfig",
    "KVSettings",
    "kv_settings",
    "build_model",
    "EngineProcess",
    "start_engine",
    "engine_available",
    "group_running",
    "LIVE_EXTRA_HINT",
]

#: The one-line installation hint used wherever the engine is missing.
LIVE_EXTRA_HINT = (
    "the built-in serving engine needs the live extra: pip install "
    '"diloco-gym[live]" (transformers[serving]); or pass --endpoint URL, or '
    "--engine builtin-fallback for the dependency-free fallback server"
)

#: Word-level vocabulary: special tokens first, then ``w0``, ``w1``, ... (the words that
#: :func:`diloco_gym.live.replay.make_prompt` writes), so a prompt of n words is n tokens.
_SPECIAL = ("<unk>", "<s>", "</s>")

_LLAMA_KEYS = {
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
}


@dataclass(frozen=True)
class EngineModelConfig:
    """Size of the locally built Llama (random weights, fixed seed).

    The defaults (about 1.2 M parameters, two layers of width 128) make a decode step of
    a small batch cost a few milliseconds of model time on one CPU core, so that the
    engine's own scheduling, not the model, sets the pace on a small host.

    Attributes:
        vocab_size: vocabulary size (>= 1,000: :func:`make_prompt` uses 997 words).
        hidden_size / intermediate_size / num_hidden_layers / num_attention_heads /
            num_key_value_heads: the Llama shape.
        max_position_embeddings: longest sequence (prompt + output) the model accepts.
        seed: seed of the random initialisation.
        dtype: weight dtype (``float32`` on CPU).
    """

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 4096
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"engine model config: {name} must be an int >= 1, got {v!r}")
        if self.vocab_size < 1000:
            raise ValueError(
                f"engine model config: vocab_size must be >= 1000 (prompts use "
                f"997 distinct words), got {self.vocab_size}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"engine model config: hidden_size {self.hidden_size} is not a "
                f"multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "engine model config: num_attention_heads must be a multiple of num_key_value_heads"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                f"engine model config: dtype must be float32, bfloat16 or "
                f"float16, got {self.dtype!r}"
            )

    @classmethod
    def from_json(cls, text: str, where: str = "--engine-model-config") -> EngineModelConfig:
        """Parse a JSON object (a string, or ``@FILE``) of this class's fields.

        Raises:
            ValueError: not JSON, not an object, an unknown key, or a bad value (one line,
                naming ``where``).
        """
        from diloco_gym.sim import parsing
        from diloco_gym.sim.limits import LimitError

        if text.startswith("@"):
            try:
                text = parsing.read_text(text[1:])  # at most DILOCO_GYM_MAX_SETTINGS_BYTES
            except LimitError as exc:
                raise ValueError(f"{where}: {exc}") from None
            except OSError as exc:
                raise ValueError(f"{where}: cannot read {text[1:]}: {exc.strerror}") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: cannot read {text[1:]}: {exc}") from None
        try:
            data = parsing.parse_json(text, where)  # at most DILOCO_GYM_MAX_NESTING deep
        except LimitError:
            raise
        except ValueError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    def fingerprint(self) -> str:
        """A short hash of the config (names the built model directory)."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class KVSettings:
    """Continuous-batching KV-cache settings (``--cb-*`` flags of ``transformers serve``).

    Attributes:
        block_size: tokens per KV page.
        num_blocks: pages in the cache.
        max_batch_tokens: most tokens (prefill plus decode) in one forward pass.
        longest_prompt / longest_output: the longest request these settings admit.
        max_concurrent: requests of the longest size that fit in the cache at once.
    """

    block_size: int
    num_blocks: int
    max_batch_tokens: int
    longest_prompt: int
    longest_output: int
    max_concurrent: int

    def flags(self) -> list[str]:
        return [
            "--cb-block-size",
            str(self.block_size),
            "--cb-num-blocks",
            str(self.num_blocks),
            "--cb-max-batch-tokens",
            str(self.max_batch_tokens),
        ]

    def blocks_for(self, prompt_tokens: int, output_tokens: int) -> int:
        """KV pages one request of this size holds at its end."""
        return math.ceil((prompt_tokens + output_tokens) / self.block_size)

    def admits(self, prompt_tokens: int, output_tokens: int, concurrent: int = 1) -> bool:
        """Whether ``concurrent`` requests of this size fit: the prompt fits in one batch
        next to a decode token per other request, and their pages fit in the cache."""
        return (
            prompt_tokens + concurrent - 1 <= self.max_batch_tokens
            and concurrent * self.blocks_for(prompt_tokens, output_tokens) <= self.num_blocks
        )


def kv_settings(longest_prompt: int, longest_output: int, max_concurrent: int = 32) -> KVSettings:
    """KV settings under which no request up to the longest can starve.

    The page size is the power of two (16 to 256) that splits the longest request into
    at most 64 pages; the cache holds ``max_concurrent`` longest requests (plus one page
    each of slack for the page being filled), and the batch-token budget takes the longest
    prompt in one prefill while every other admitted request decodes a token.

    Raises:
        ValueError: a size below 1.
    """
    for name, v in (
        ("longest_prompt", longest_prompt),
        ("longest_output", longest_output),
        ("max_concurrent", max_concurrent),
    ):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"kv_settings: {name} must be an int >= 1, got {v!r}")
    longest = longest_prompt + longest_output
    block = 16
    while block < 256 and math.ceil(longest / block) > 64:
        block *= 2
    per_request = math.ceil(longest / block) + 1
    num_blocks = per_request * max_concurrent
    tokens = longest_prompt + max_concurrent
    max_batch_tokens = math.ceil(tokens / block) * block
    return KVSettings(
        block, num_blocks, max_batch_tokens, longest_prompt, longest_output, max_concurrent
    )


def engine_available() -> bool:
    """Whether the ``live`` extra (transformers with its serving dependencies) is installed."""
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("transformers", "fastapi", "uvicorn", "tokenizers")
    )


def build_model(cfg: EngineModelConfig, directory: str | os.PathLike[str]) -> Path:
    """Build the Llama and its word-level tokenizer deterministically into ``directory``.

    Returns:
        ``directory`` (holding ``config.json``, the safetensors weights and the tokenizer).

    Raises:
        CalibrationError: the ``live`` extra is missing.
    """
    if not engine_available():
        raise CalibrationError(LIVE_EXTRA_HINT)
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(_SPECIAL)}
    for i in range(cfg.vocab_size - len(_SPECIAL)):
        vocab[f"w{i}"] = i + len(_SPECIAL)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    llama = LlamaConfig(
        **{k: v for k, v in asdict(cfg).items() if k in _LLAMA_KEYS},
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(llama).to(getattr(torch, cfg.dtype))
    finally:
        torch.random.set_rng_state(state)
    # A random model emits the end-of-sequence token now and then; serving engines run
    # benchmarks with ignore_eos so that every request decodes its requested length.
    # transformers serve has no such switch, so the end token's output row is zeroed: its
    # logit is exactly 0, below the largest of 4,000 random logits, so greedy decoding
    # (temperature 0) does not stop early.
    with torch.no_grad():
        model.lm_head.weight[2].zero_()
        model.model.embed_tokens.weight[2].zero_()
    model.generation_config.eos_token_id = None
    model.save_pretrained(out)
    fast.save_pretrained(out)
    (out / "diloco_gym_engine.json").write_text(
        json.dumps(
            {**asdict(cfg), "parameters": int(sum(p.numel() for p in model.parameters()))}, indent=1
        )
    )
    return out


def _serve_command() -> list[str]:
    exe = Path(sys.executable).with_name("transformers")
    if exe.exists():
        return [str(exe), "serve"]
    found = shutil.which("transformers")
    if found:
        return [found, "serve"]
    return [
        sys.executable,
        "-c",
        "import sys; from transformers.cli.transformers import main; "
        "sys.argv[0] = 'transformers'; main()",
        "serve",
    ]


@dataclass
class EngineProcess:
    """A running ``transformers serve`` subprocess (use :func:`start_engine`).

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        model: the model id requests must name (the model directory: the server is pinned
            to it).
        kv: the KV-cache settings it runs with.
        config: the model config.
        parameters: model size.
        command: the command line.
        log_path: the server's combined stdout and stderr.
        threads: its torch intra-op threads (``None``: torch's default).
    """

    url: str
    model: str
    kv: KVSettings
    config: EngineModelConfig
    parameters: int
    command: list[str]
    log_path: str
    _process: subprocess.Popen = field(repr=False)
    _tmpdir: str | None = field(default=None, repr=False)
    _log: Any = field(default=None, repr=False)
    threads: int | None = None

    @property
    def pid(self) -> int:
        return self._process.pid

    def is_alive(self) -> bool:
        return self._process.poll() is None

    def describe(self) -> dict:
        return {
            "kind": "transformers-serve",
            "url": self.url,
            "model": self.model,
            "parameters": self.parameters,
            "model_config": asdict(self.config),
            "kv": asdict(self.kv),
            "command": self.command,
            "threads": self.threads,
            "transformers": _version("transformers"),
            "torch": _version("torch"),
        }

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                tail = deque(handle, maxlen=lines)
        except OSError:
            return ""
        return " | ".join(line.strip() for line in tail if line.strip())

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server and everything it started: SIGTERM to its process group, then
        SIGKILL if it lingers; reap it; remove the built model. Safe to call twice."""
        proc = self._process
        if proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
                _signal_group(proc.pid, sig)
                try:
                    proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # The server is gone; clear stragglers of its group (workers it forked that
        # outlived it or ignore SIGTERM).
        _clear_group(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. A zombie does not count: it has
    exited and only waits for its parent (``init`` for orphans) to reap it. Reads ``/proc``
    where there is one; elsewhere any process of the group counts."""
    proc_dir = Path("/proc")
    if not (proc_dir / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _clear_group(pgid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL whatever of group ``pgid`` still runs and wait (up to ``timeout_s``) until
    none of it does."""
    deadline = time.monotonic() + timeout_s
    while group_running(pgid):
        _signal_group(pgid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - informative only
        return "unknown"


def start_engine(
    kv: KVSettings,
    cfg: EngineModelConfig | None = None,
    start_timeout_s: float = 180.0,
    threads: int | None = None,
) -> EngineProcess:
    """Build the model and start ``transformers serve --continuous-batching`` on it.

    The server runs in its own process group on a free port of 127.0.0.1 (nothing else can
    reach it); the model and the server log live in a temporary directory removed by
    :meth:`EngineProcess.stop`. On any failure (including Ctrl-C while waiting) the server
    is stopped before the error propagates, so no process is left behind.

    Args:
        kv: KV-cache settings (:func:`kv_settings`).
        cfg: model size (default :class:`EngineModelConfig`).
        start_timeout_s: how long to wait for ``GET /health`` to answer 200.
        threads: torch intra-op threads of the server (``None``: torch's default).

    Raises:
        CalibrationError: the ``live`` extra is missing, or the server exited or did not
            become healthy in time (with the last lines of its log).
    """
    cfg = cfg or EngineModelConfig()
    if kv.longest_prompt + kv.longest_output > cfg.max_position_embeddings:
        raise CalibrationError(
            f"the longest request ({kv.longest_prompt} + {kv.longest_output} tokens) exceeds "
            f"the engine model's max_position_embeddings {cfg.max_position_embeddings}: "
            f"raise it with --engine-model-config or cap the request sizes"
        )
    handle = _launch_engine(kv, cfg, threads)
    try:
        _wait_for_engine(handle, start_timeout_s)
    except BaseException:
        handle.stop(timeout_s=2.0)
        raise
    return handle


def _serve_arguments(
    model_dir: Path, kv: KVSettings, cfg: EngineModelConfig, port: int
) -> list[str]:
    """The ``transformers serve`` command line for ``model_dir`` on ``port``."""
    return [
        *_serve_command(),
        str(model_dir),
        "--continuous-batching",
        *kv.flags(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        cfg.dtype,
        "--log-level",
        "warning",
    ]


def _serve_environment(threads: int | None) -> dict[str, str]:
    """The server's environment: offline (nothing is downloaded), unbuffered output."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _launch_engine(kv: KVSettings, cfg: EngineModelConfig, threads: int | None) -> EngineProcess:
    """Build the model in a temporary directory and start the server on it (not yet
    healthy); on any failure the process is killed and the directory removed."""
    tmpdir = tempfile.mkdtemp(prefix="diloco-gym-engine-")
    proc: subprocess.Popen | None = None
    log = None
    try:
        model_dir = build_model(cfg, Path(tmpdir) / f"llama-{cfg.fingerprint()}")
        parameters = json.loads((model_dir / "diloco_gym_engine.json").read_text())["parameters"]
        port = free_port()
        command = _serve_arguments(model_dir, kv, cfg, port)
        log_path = str(Path(tmpdir) / "serve.log")
        log = open(log_path, "w")  # noqa: SIM115 - closed by EngineProcess.stop
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_serve_environment(threads),
            start_new_session=True,
        )
        return EngineProcess(
            f"http://127.0.0.1:{port}",
            str(model_dir),
            kv,
            cfg,
            parameters,
            command,
            log_path,
            proc,
            tmpdir,
            log,
            threads,
        )
    except BaseException:
        if proc is not None:  # the server and all it forked, then reap the server
            _clear_group(proc.pid)
            proc.wait()
        if log is not None:
            log.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise


def _wait_for_engine(handle: EngineProcess, start_timeout_s: float) -> None:
    """Poll ``/health`` until the server answers; raise when it exits or times out (the
    caller stops it)."""
    from diloco_gym.live.errors import EndpointUnavailableError
    from diloco_gym.live.replay import wait_until_healthy

    deadline = time.monotonic() + start_timeout_s
    while True:
        if not handle.is_alive():
            raise CalibrationError(
                f"transformers serve exited during start-up (exit code "
                f"{handle._process.returncode}): {handle.log_tail() or 'no output'}"
            )
        try:
            wait_until_healthy(handle.url, timeout_s=1.0)
            return
        except EndpointUnavailableError:
            if time.monotonic() > deadline:
                raise CalibrationError(
                    f"transformers serve did not answer {handle.url}/health within "
                    f"{start_timeout_s:.0f} s: {handle.log_tail() or 'no output'}"
                ) from None
