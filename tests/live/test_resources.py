"""What a run starts and releases (:mod:`diloco_gym.live.resources`): the server start-up
thread beside the merge workers, the engine's threads, and the release order."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from diloco_gym.live import resources as resources_mod
from diloco_gym.live.calibrate import (
    CalibrationConfig,
    run_calibration,
)
from diloco_gym.live.config import default_engine_threads
from diloco_gym.live.errors import (
    MergeWorkerError,
)
from diloco_gym.live.merges import MergeConfig
from diloco_gym.live.resources import builtin_starter

from .helpers import Stubs, stubbed_config

pytest.importorskip("torch")


def test_the_server_starts_in_a_thread_beside_the_merge_workers(tmp_path, monkeypatch):
    """The server starts in its own thread while the merge workers spawn in the main
    thread (both load torch): a server start that waits for the cluster start does not
    hold up the run."""
    stubs = Stubs(monkeypatch)
    stubs.fail_at_merge = 0
    t0 = time.monotonic()
    with pytest.raises(MergeWorkerError):
        run_calibration(
            None,
            "ordinary",
            1.0,
            tmp_path / "c.json",
            config=stubbed_config(repeats=1),
            progress=None,
        )
    assert time.monotonic() - t0 < 4.0  # the server start did not wait out its 5 s
    assert stubs.threads == {"server": "server-start", "cluster": "MainThread"}


def test_engine_threads_default_to_the_cores_the_merge_workers_leave(monkeypatch):
    """Without --engine-threads the engine gets the host's CPUs minus the workers' threads
    (at least one), and the start-up passes that count on and announces it."""

    assert default_engine_threads(MergeConfig(workers=2), cpus=2) == 1
    assert default_engine_threads(MergeConfig(workers=2), cpus=16) == 14
    assert default_engine_threads(MergeConfig(workers=3, torch_threads=2), cpus=16) == 10
    assert default_engine_threads(MergeConfig(workers=4), cpus=2) == 1

    started: dict = {}

    def fake_start_engine(kv, model_cfg, timeout_s, threads=None):
        started["threads"] = threads
        return "engine"

    monkeypatch.setattr(resources_mod, "start_engine", fake_start_engine)
    lines: list[str] = []
    for cfg, expected in (
        (CalibrationConfig(merge=MergeConfig(workers=2)), default_engine_threads(MergeConfig())),
        (CalibrationConfig(engine_threads=5), 5),
    ):
        job = SimpleNamespace(cfg=cfg, say=lines.append)
        assert builtin_starter(job, (64, 16))() == "engine"
        assert started["threads"] == expected
        assert f"; {expected} torch thread" in lines[-1]


def test_close_releases_everything_in_order_even_mid_start_up():
    """``Resources.close``: ticker, replayer, merge workers, then the server once its
    start-up thread has brought it up (stopped, not orphaned), then the CPU sampler."""
    import threading

    from diloco_gym.live.resources import Resources
    from diloco_gym.live.state import RunState

    events: list[str] = []
    ready = threading.Event()

    def thing(name: str) -> SimpleNamespace:
        return SimpleNamespace(
            close=lambda: events.append(f"{name}.close"),
            stop=lambda: events.append(f"{name}.stop"),
        )

    def slow_start() -> SimpleNamespace:
        ready.wait(5.0)
        time.sleep(0.2)
        events.append("server started")
        return thing("server")

    run = RunState(t0=0.0, started_utc="now")
    run.replayer = thing("replayer")  # type: ignore[assignment]
    res = Resources(run, thing("cpu"))  # type: ignore[arg-type]
    res.cluster = thing("cluster")  # type: ignore[assignment]
    res.start_ticker(60.0, events.append)
    res.start_server(slow_start)
    ready.set()
    res.close()
    assert events == [
        "replayer.close",
        "cluster.close",
        "server started",
        "server.stop",
        "cpu.stop",
    ]
    assert not res.ticker.is_alive() and not res.starter.is_alive()


def test_a_failed_server_start_is_kept_for_the_caller():
    from diloco_gym.live.resources import Resources
    from diloco_gym.live.state import RunState

    def broken() -> None:
        raise OSError("no port")

    res = Resources(RunState(t0=0.0, started_utc="now"), SimpleNamespace(stop=lambda: None))  # type: ignore[arg-type]
    res.start_server(broken)
    res.join_starter()
    assert res.server is None and isinstance(res.server_box["error"], OSError)
