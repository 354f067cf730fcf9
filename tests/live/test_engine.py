"""The built-in engine (:mod:`diloco_gym.live.engine`): KV settings, the model configuration,
the model build, and ``start_engine`` around a stand-in server process (no model built, no
``live`` extra needed) and, with the extra, around the real one."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.live import engine as engine_mod
from diloco_gym.live import replay as replay_mod
from diloco_gym.live.engine import (
    EngineModelConfig,
    build_model,
    engine_available,
    kv_settings,
    start_engine,
)
from diloco_gym.live.errors import (
    CalibrationError,
    EndpointUnavailableError,
)
from diloco_gym.live.merges import free_port
from diloco_gym.live.replay import (
    Endpoint,
    make_prompt,
    post_completion,
)

needs_live = pytest.mark.skipif(
    not engine_available(), reason='needs the live extra: pip install "diloco-gym[live]"'
)


@pytest.mark.parametrize(
    ("prompt", "output", "concurrent"),
    [(1, 1, 1), (256, 128, 32), (700, 104, 8), (1529, 256, 16), (4000, 1000, 4)],
)
def test_kv_settings_admit_the_longest_request(prompt, output, concurrent):
    kv = kv_settings(prompt, output, concurrent)
    assert kv.admits(prompt, output)  # the longest request alone
    assert kv.admits(prompt, output, concurrent)  # and max_concurrent of them at once
    assert kv.max_batch_tokens >= prompt  # its prefill fits one batch: it cannot starve
    assert kv.max_batch_tokens % kv.block_size == 0
    assert kv.blocks_for(prompt, output) <= 64 or kv.block_size == 256
    # every smaller request is admitted too
    rng = np.random.default_rng(0)
    for p, o in zip(rng.integers(1, prompt + 1, 50), rng.integers(1, output + 1, 50), strict=True):
        assert kv.admits(int(p), int(o), concurrent)
    flags = kv.flags()
    assert flags[flags.index("--cb-num-blocks") + 1] == str(kv.num_blocks)


def test_kv_settings_for_short_requests_do_not_admit_longer_ones():
    """The check can fail: settings sized for 256-token prompts reject a 1,529-token one
    (the prompt that starved the engine in the failed 40 s run)."""
    kv = kv_settings(256, 64, 8)
    assert not kv.admits(1529, 64)
    assert not kv.admits(256, 64, concurrent=9 * 8)
    with pytest.raises(ValueError, match="longest_prompt"):
        kv_settings(0, 10)


def test_engine_model_config_from_json(tmp_path):
    cfg = EngineModelConfig.from_json(
        '{"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2}'
    )
    assert cfg.hidden_size == 64 and cfg.vocab_size == 4096
    path = tmp_path / "m.json"
    path.write_text('{"num_hidden_layers": 1}')
    assert EngineModelConfig.from_json(f"@{path}").num_hidden_layers == 1
    for text, fragment in [
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
        ('{"layers": 3}', "unknown key(s) layers"),
        ('{"hidden_size": 100, "num_attention_heads": 3}', "multiple"),
        ('{"vocab_size": 50}', "vocab_size must be >= 1000"),
        (f"@{tmp_path}/missing.json", "cannot read"),
    ]:
        with pytest.raises(ValueError, match="--engine-model-config") as info:
            EngineModelConfig.from_json(text)
        assert fragment in str(info.value)


_TINY = EngineModelConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


@pytest.mark.slow
@needs_live
def test_build_model_is_deterministic(tmp_path):
    def digest(directory: Path) -> str:
        return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()

    a = build_model(_TINY, tmp_path / "a")
    b = build_model(_TINY, tmp_path / "b")
    c = build_model(EngineModelConfig(**{**_TINY.__dict__, "seed": 1}), tmp_path / "c")
    assert digest(a) == digest(b) != digest(c)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    assert len(tok(make_prompt(40, 3), add_special_tokens=False)["input_ids"]) == 40


@pytest.mark.slow
@needs_live
def test_engine_starts_answers_and_stops(tmp_path):
    """transformers serve --continuous-batching on a tiny model: answers completions of the
    requested length (concurrently), then stops with its whole process group."""
    t0 = time.monotonic()
    kv = kv_settings(64, 16, max_concurrent=4)
    engine = start_engine(kv, _TINY, start_timeout_s=60)
    try:
        assert engine.is_alive() and engine.url.startswith("http://127.0.0.1:")
        assert engine.describe()["kv"]["num_blocks"] == kv.num_blocks
        ep = Endpoint.parse(engine.url)
        results: list = []

        def ask(i: int) -> None:
            results.append(post_completion(ep, engine.model, make_prompt(64, i), 16, 30.0))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        assert len(results) == 3
        for status, body, err in results:
            assert (status, err) == (200, ""), err
            assert body["usage"]["completion_tokens"] == 16  # no early end of sequence
            assert body["usage"]["prompt_tokens"] == 64  # one token per word
    finally:
        engine.stop()
    assert not engine.is_alive()
    assert _gone(engine.pid, timeout_s=0.0)  # nothing of its process group still runs
    assert time.monotonic() - t0 < 60


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Whether process group ``pid`` has no running process left (waiting up to
    ``timeout_s``); zombies waiting for ``init`` to reap them do not count."""
    deadline = time.monotonic() + timeout_s
    while engine_mod.group_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """Patch the model build and the serve command; returns a dict that the stand-in
    server fills (its pid, argv and environment) and the temporary directories made."""
    state: dict = {"mode": "hang", "tmpdirs": []}
    report = tmp_path / "server.json"
    child = tmp_path / "child.pid"

    def build(cfg: EngineModelConfig, directory: Path) -> Path:
        directory.mkdir(parents=True)
        (directory / "diloco_gym_engine.json").write_text(json.dumps({"parameters": 123}))
        return directory

    script = (
        "import json, os, sys, time\n"
        f"json.dump({{'pid': os.getpid(), 'argv': sys.argv[1:], 'env': dict(os.environ)}}, "
        f"open({str(report)!r}, 'w'))\n"
        "if 'MODE' == 'exit':\n"
        "    print('bad flag --continuous-batching', flush=True)\n"
        "    sys.exit(3)\n"
        "if 'MODE' == 'fork' and os.fork() == 0:\n"
        "    import signal\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"    open({str(child)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "    sys.exit(0)\n"
        "time.sleep(60)\n"
    )

    def command() -> list[str]:
        return [sys.executable, "-c", script.replace("MODE", state["mode"])]

    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs) -> str:
        path = real_mkdtemp(*args, **kwargs)
        state["tmpdirs"].append(path)
        return path

    monkeypatch.setattr(engine_mod, "build_model", build)
    monkeypatch.setattr(engine_mod, "_serve_command", command)
    monkeypatch.setattr(engine_mod.tempfile, "mkdtemp", mkdtemp)
    state["report"] = lambda: json.loads(report.read_text())
    state["child"] = lambda: int(child.read_text())
    return state


def test_engine_command_line_and_environment(fake_engine, monkeypatch):
    monkeypatch.setattr(replay_mod, "wait_until_healthy", lambda url, timeout_s: None)
    kv = kv_settings(64, 16, max_concurrent=4)
    engine = start_engine(kv, EngineModelConfig(), start_timeout_s=5.0, threads=2)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the stand-in writes its report on start
            try:
                seen = fake_engine["report"]()
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        port = engine.url.rsplit(":", 1)[1]
        assert engine.url == f"http://127.0.0.1:{port}" and engine.parameters == 123
        model_dir = engine.model
        assert Path(model_dir).parent == Path(fake_engine["tmpdirs"][0])
        expected = [model_dir, "--continuous-batching", *kv.flags(), "--host", "127.0.0.1"]
        expected += ["--port", port, "--device", "cpu", "--dtype", EngineModelConfig().dtype]
        expected += ["--log-level", "warning"]
        assert seen["argv"] == expected and engine.command[-len(expected) :] == expected
        env = seen["env"]
        assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"]) == ("1", "1")
        assert (env["TOKENIZERS_PARALLELISM"], env["PYTHONUNBUFFERED"]) == ("false", "1")
        assert env["OMP_NUM_THREADS"] == "2"
        assert seen["pid"] == engine.pid and engine.is_alive()
    finally:
        engine.stop()
    assert _gone(engine.pid) and not Path(fake_engine["tmpdirs"][0]).exists()


def test_stop_clears_a_worker_that_outlives_the_server(fake_engine, monkeypatch):
    """A worker the server forked that ignores SIGTERM (the server itself exits on it) is
    killed too: stop does not return while any process of the group still runs."""
    fake_engine["mode"] = "fork"
    monkeypatch.setattr(replay_mod, "wait_until_healthy", lambda url, timeout_s: None)
    engine = start_engine(kv_settings(64, 16, 4), EngineModelConfig(), start_timeout_s=5.0)
    try:
        deadline, worker = time.monotonic() + 10, -1
        while time.monotonic() < deadline:  # the worker writes its pid once it ignores TERM
            try:
                worker = fake_engine["child"]()
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        assert os.getpgid(worker) == engine.pid
    finally:
        engine.stop(timeout_s=5.0)
    assert not engine.is_alive()
    assert _gone(engine.pid, timeout_s=0.0)


def test_engine_that_exits_during_start_up(fake_engine):
    fake_engine["mode"] = "exit"
    with pytest.raises(CalibrationError) as info:
        start_engine(kv_settings(64, 16, 4), EngineModelConfig(), start_timeout_s=10.0)
    assert str(info.value) == (
        "transformers serve exited during start-up (exit code 3): bad flag --continuous-batching"
    )
    assert not Path(fake_engine["tmpdirs"][0]).exists()


def test_engine_that_never_answers_is_stopped(fake_engine):
    t0 = time.monotonic()
    with pytest.raises(CalibrationError, match=r"did not answer http://127\.0\.0\.1:\d+/health "
                       r"within 1 s: no output"):  # fmt: skip
        start_engine(kv_settings(64, 16, 4), EngineModelConfig(), start_timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert _gone(fake_engine["report"]()["pid"])
    assert not Path(fake_engine["tmpdirs"][0]).exists()


def test_ctrl_c_while_waiting_for_the_engine_stops_it(fake_engine, monkeypatch):
    def interrupted(url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the server has started
            try:
                fake_engine["report"]()
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(replay_mod, "wait_until_healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_engine(kv_settings(64, 16, 4), EngineModelConfig(), start_timeout_s=10.0)
    assert _gone(fake_engine["report"]()["pid"])
    assert not Path(fake_engine["tmpdirs"][0]).exists()


def test_engine_build_failure_leaves_nothing_behind(fake_engine, monkeypatch):
    def broken(cfg: EngineModelConfig, directory: Path) -> Path:
        raise OSError("disk full")

    monkeypatch.setattr(engine_mod, "build_model", broken)
    with pytest.raises(OSError, match="disk full"):
        start_engine(kv_settings(64, 16, 4), EngineModelConfig())
    assert not Path(fake_engine["tmpdirs"][0]).exists()


def test_request_longer_than_the_model_is_refused_before_anything_starts(fake_engine):
    cfg = EngineModelConfig()
    kv = kv_settings(cfg.max_position_embeddings, 16, 4)
    with pytest.raises(CalibrationError, match="exceeds the engine model's max_position"):
        start_engine(kv, cfg)
    assert fake_engine["tmpdirs"] == []


def test_unhealthy_is_an_endpoint_error():
    """The start-up loop relies on this: a port nobody serves is EndpointUnavailableError."""

    with pytest.raises(EndpointUnavailableError):
        replay_mod.wait_until_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=0.2)
