"""``start_engine`` around a stand-in server process: no model is built and nothing needs
the ``live`` extra. What is pinned: the command line and environment the server gets, the
errors of a server that exits or never becomes healthy, and that on every failure
(Ctrl-C included) the process group is gone and the temporary directory removed."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from diloco_gym.live import engine as engine_mod
from diloco_gym.live import replay as replay_mod
from diloco_gym.live.engine import EngineModelConfig, kv_settings, start_engine
from diloco_gym.live.errors import CalibrationError, EndpointUnavailableError


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Whether process group ``pid`` has no process left (waiting up to ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """Patch the model build and the serve command; returns a dict that the stand-in
    server fills (its pid, argv and environment) and the temporary directories made."""
    state: dict = {"mode": "hang", "tmpdirs": []}
    report = tmp_path / "server.json"

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
    from diloco_gym.live.merges import free_port

    with pytest.raises(EndpointUnavailableError):
        replay_mod.wait_until_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=0.2)
