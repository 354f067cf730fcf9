"""The steps of :func:`run_calibration` with every process and socket stubbed out.

These tests pin what the run does around its measurements, without a server, merge
workers or requests: the progress lines it prints (timings masked), the partial file it
saves, the exception it raises and the order in which it releases what it started (the
server start-up thread joined before the server is stopped, the replayer and the merge
workers closed, the CPU sampler stopped last). They run in a fraction of a second.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from diloco_gym.live import calibrate as calibrate_mod  # noqa: E402
from diloco_gym.live.calibrate import CalibrationConfig, partial_path, run_calibration  # noqa: E402
from diloco_gym.live.errors import (  # noqa: E402
    CalibrationError,
    CalibrationTerminated,
    MergeWorkerError,
)
from diloco_gym.live.merges import MergeConfig, MergeReport  # noqa: E402


class _Stubs:
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

            def merge(self, window_s: float) -> MergeReport:
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

        monkeypatch.setattr(calibrate_mod, "start_sidecar", start_sidecar)
        monkeypatch.setattr(calibrate_mod, "MergeCluster", Cluster)
        monkeypatch.setattr(calibrate_mod, "OpenLoopReplayer", Replayer)
        monkeypatch.setattr(calibrate_mod, "CpuSampler", Cpu)


def _config(**kw: object) -> CalibrationConfig:
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


def _masked(lines: list[str]) -> list[str]:
    """The lines with their decimal numbers (timings, not addresses) replaced by ``#``."""
    return [re.sub(r"(?<![\d.])\d+\.\d+(?![\d.])", "#", line) for line in lines]


def test_error_in_the_phase_loop_saves_the_partial_file_and_cleans_up_in_order(
    tmp_path, monkeypatch
):
    """A merge worker dies in the second sync phase: the partial file holds the first
    phases, the error carries its path, and everything is released in order."""
    stubs = _Stubs(monkeypatch)
    stubs.fail_at_merge = 4  # three merges per sync phase: the second merge of sync 2
    out = tmp_path / "cal.json"
    lines: list[str] = []
    with pytest.raises(MergeWorkerError, match="died during merge 4") as info:
        run_calibration(None, "ordinary", 1.0, out, config=_config(), progress=lines.append)
    partial = partial_path(out)
    assert info.value.path == str(partial) and not out.exists()
    doc = json.loads(partial.read_text())
    assert doc["complete"] is False and doc["stage"] == "sync 2"
    assert doc["error"] == "merge worker rank 1 died during merge 4"
    assert [m["merge_id"] for m in doc["merges"]] == [0, 1, 2, 3, 4]
    assert all(m["end_s"] is not None for m in doc["merges"])  # windows closed on the way out
    assert set(doc["metadata"]["phases"]) == {"control", "sync", "control-2", "sync-2"}
    assert stubs.events == [
        "cluster.start",
        "server started",
        "phase control 0",
        "phase sync 0",
        "merge 0",
        "merge 1",
        "merge 2",
        "phase control 1",
        "phase sync 1",
        "merge 3",
        "merge 4 failed",
        "replayer.close",
        "cluster.close",
        "server.stop",
        "cpu.stop",
    ]
    assert _masked(lines) == [
        "starting the built-in fallback server (dependency-free, one thread per request, no "
        "batching) and the merge workers",
        "built-in fallback server tiny-lm (# M parameters) at http://127.0.0.1:9",
        "2 merge workers ready: gloo all-reduce of 1 MiB over tcp://127.0.0.1:1",
        "trace regime ordinary: 1 requests in a 1 s window (# req/s); 3 merges of # s per "
        "sync phase; phases: control1, sync1, control2, sync2",
        "control phase 1/2 (no merges): 1 s, 1 requests",
        "sync phase 1/2: 1 s, 1 requests, 3 merges",
        "merge 1/3:   #-  # s, 3 all-reduces, checkpoint # s",
        "merge 2/3:   #-  # s, 3 all-reduces, checkpoint # s",
        "merge 3/3:   #-  # s, 3 all-reduces, checkpoint # s",
        "control phase 2/2 (no merges): 1 s, 1 requests",
        "sync phase 2/2: 1 s, 1 requests, 3 merges",
        "merge 1/3:   #-  # s, 3 all-reduces, checkpoint # s",
        f"partial measurements saved to {partial} (complete: false)",
    ]


def test_progress_ticker_reports_the_stage(tmp_path, monkeypatch):
    """The ticker's lines name the stage, the counts and whether a merge is open."""
    stubs = _Stubs(monkeypatch)
    stubs.fail_at_merge = 0
    stubs.merge_s = 0.35
    lines: list[str] = []
    with pytest.raises(MergeWorkerError):
        run_calibration(
            None,
            "ordinary",
            1.0,
            tmp_path / "c.json",
            config=_config(progress_every_s=0.1, repeats=1, control=False),
            progress=lines.append,
        )
    ticks = [line for line in lines if line.startswith("t=")]
    assert ticks, lines
    pattern = (
        r"t= *\d+\.\d s (setup|sync 1): sent 0/0, ok 0, errors 0, outstanding 0, "
        r"merge (active|idle)"
    )
    assert all(re.fullmatch(pattern, line) for line in ticks), ticks
    assert any(line.endswith("merge active") for line in ticks), ticks
    assert stubs.events[-4:] == ["replayer.close", "cluster.close", "server.stop", "cpu.stop"]


@pytest.mark.parametrize(
    ("interrupt", "message"),
    [
        (KeyboardInterrupt, "interrupted by Ctrl-C during the setup stage"),
        (CalibrationTerminated, "terminated by SIGTERM during the setup stage"),
    ],
)
def test_interrupt_during_start_up_waits_for_the_server_then_stops_it(
    tmp_path, monkeypatch, interrupt, message
):
    """Ctrl-C (or SIGTERM) while the merge workers start and the server is still coming
    up: the start-up thread is joined, so the server it brings up is stopped, not
    orphaned; the partial file names the interruption."""
    stubs = _Stubs(monkeypatch)
    stubs.start_delay_s = 0.3
    stubs.cluster_start_error = interrupt()
    out = tmp_path / "cal.json"
    lines: list[str] = []
    with pytest.raises(interrupt) as info:
        run_calibration(None, "ordinary", 1.0, out, config=_config(), progress=lines.append)
    assert info.value.path == str(partial_path(out))
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and doc["error"] == message
    assert stubs.events == [
        "cluster.start",
        "server started",
        "cluster.close",
        "server.stop",
        "cpu.stop",
    ]
    assert lines[1:] == [
        message,
        f"partial measurements saved to {partial_path(out)} (complete: false)",
    ]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("no port"), "the built-in builtin-fallback server failed to start: no port"),
        (CalibrationError("model too large"), "model too large"),
    ],
)
def test_server_start_failure_is_a_calibration_error(tmp_path, monkeypatch, error, expected):
    """A server that fails to start: a :class:`CalibrationError` (its own message, or
    wrapped), the merge workers closed, nothing to stop, the sampler stopped."""
    stubs = _Stubs(monkeypatch)
    stubs.start_error = error
    out = tmp_path / "cal.json"
    with pytest.raises(CalibrationError) as info:
        run_calibration(None, "ordinary", 1.0, out, config=_config(), progress=None)
    assert type(info.value) is CalibrationError and str(info.value) == expected
    assert info.value.path == str(partial_path(out))
    assert json.loads(partial_path(out).read_text())["error"] == expected
    assert stubs.events == ["cluster.start", "server failed", "cluster.close", "cpu.stop"]


def test_the_server_starts_in_a_thread_beside_the_merge_workers(tmp_path, monkeypatch):
    """The server starts in its own thread while the merge workers spawn in the main
    thread (both load torch): a server start that waits for the cluster start does not
    hold up the run."""
    stubs = _Stubs(monkeypatch)
    stubs.fail_at_merge = 0
    t0 = time.monotonic()
    with pytest.raises(MergeWorkerError):
        run_calibration(
            None, "ordinary", 1.0, tmp_path / "c.json", config=_config(repeats=1), progress=None
        )
    assert time.monotonic() - t0 < 4.0  # the server start did not wait out its 5 s
    assert stubs.threads == {"server": "server-start", "cluster": "MainThread"}


# --------------------------------------------------------------------------- the command


def test_every_calibrate_option_reaches_the_run(tmp_path, monkeypatch):
    """Each option of ``calibrate`` lands in the config (or argument) of the run."""
    import argparse

    from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command

    seen: dict = {}

    def fake_run(endpoint, source, duration_s, out, *, trace_format, config):
        seen.update(endpoint=endpoint, source=source, duration_s=duration_s, out=out)
        seen.update(trace_format=trace_format, config=config)
        return SimpleNamespace(complete=True)

    monkeypatch.setattr(calibrate_mod, "run_calibration", fake_run)
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    argv = ["--regime", "bursty", "--format", "azure", "--endpoint", "http://h:1"]
    argv += ["--engine", "builtin-fallback", "--engine-model-config", '{"num_hidden_layers": 3}']
    argv += ["--engine-threads", "3"]
    argv += ["--model", "m", "--duration", "12", "--rate", "3.5", "--target-utilization", "0.4"]
    argv += ["--probe-step-seconds", "6", "--repeats", "2", "--overload-inflight", "40"]
    argv += ["--overload-timeouts", "0.3", "--start", "7", "--merge-mb", "4", "--workers", "3"]
    argv += ["--backend", "gloo", "--merge-seconds", "5", "--gap-seconds", "2", "9"]
    argv += ["--no-control", "--timeout", "11", "--label", "ordinary"]
    argv += ["--max-failure-rate", "0.25", "--seed", "17", "--out", str(tmp_path / "o.json")]
    assert run_calibrate_command(parser.parse_args(argv)) == 0
    cfg = seen["config"]
    assert (seen["endpoint"], seen["source"], seen["duration_s"]) == ("http://h:1", "bursty", 12)
    assert (seen["out"], seen["trace_format"]) == (str(tmp_path / "o.json"), "azure")
    assert (cfg.engine, cfg.engine_model.num_hidden_layers, cfg.model) == (
        "builtin-fallback",
        3,
        "m",
    )
    assert (cfg.rate_rps, cfg.target_utilization, cfg.probe.step_s) == (3.5, 0.4, 6.0)
    assert cfg.engine_threads == 3
    assert (cfg.repeats, cfg.overload_inflight, cfg.overload_timeout_fraction) == (2, 40, 0.3)
    assert (cfg.start_s, cfg.merge.merge_mb, cfg.merge.workers, cfg.merge.backend) == (
        7.0, 4.0, 3, "gloo"
    )  # fmt: skip
    assert (cfg.merge_seconds, cfg.gap_seconds, cfg.control) == (5.0, (2.0, 9.0), False)
    assert (cfg.timeout_s, cfg.label, cfg.max_error_fraction, cfg.seed) == (
        11.0, "ordinary", 0.25, 17
    )  # fmt: skip
    seen.clear()
    assert (
        run_calibrate_command(
            parser.parse_args(["--no-probe", "--trace", str(tmp_path / "no.csv")])
        )
        == 2
    )
    assert seen == {}  # a missing trace file is a usage error before the run
    defaults = parser.parse_args(["--no-probe"])
    assert run_calibrate_command(defaults) == 0
    assert seen["config"].probe is None and seen["source"] == "sync-heavy"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--repeats", "0"], "CalibrationConfig.repeats must be an int >= 1, got 0"),
        (["--engine-model-config", '{"bogus": 1}'], "bogus"),
        (["--target-utilization", "1.5"], "target_utilization must be in (0, 1]"),
        (["--engine-threads", "0"], "CalibrationConfig.engine_threads must be None or an int >= 1"),
    ],
)
def test_bad_calibrate_options_are_usage_errors(tmp_path, monkeypatch, capsys, argv, fragment):
    """An invalid setting is exit 2 with one line on stderr, before anything runs."""
    import argparse

    from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command

    monkeypatch.setattr(calibrate_mod, "run_calibration", lambda *a, **k: pytest.fail("ran"))
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    args = parser.parse_args([*argv, "--out", str(tmp_path / "o.json")])
    assert run_calibrate_command(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the probe


def test_probe_steps_lines_and_ramp(monkeypatch):
    """The probe's progress lines, step records and ramp (a failure retried once, then a
    halving of a first rate that never passed, two halvings at most) with a stub replayer
    whose steps pass or fail as scripted."""
    import numpy as np

    from diloco_gym.live import probe as probe_mod
    from diloco_gym.live.probe import ProbeConfig, probe_capacity
    from diloco_gym.live.replay import Endpoint, RequestRecord

    outcomes = iter(["fail", "fail", "unanswered", "unanswered", "pass", "fail", "fail"])
    drained: list[int] = []

    class Replayer:
        def __init__(self, *args: object) -> None:
            self.kind = next(outcomes)
            self.polls = 0

        @property
        def outstanding(self) -> int:
            self.polls += 1
            drained.append(self.polls)
            return 1 if self.polls < 2 else 0  # one poll with a request outstanding

        def start_phase(self, phase, trace, origin, prompt, output) -> None:
            self.n = trace.prompt_tokens.size

        def snapshot(self) -> list:
            if self.kind == "unanswered":  # sent, never answered
                return [RequestRecord(i, "probe", 0.0, 1, 1, send_s=0.0, status=0,
                                      error="in flight") for i in range(self.n)]  # fmt: skip
            lat = 0.01 if self.kind == "pass" else 0.1  # slow, but in time
            return [
                RequestRecord(
                    i, "probe", 0.0, 1, 1, send_s=0.0, latency_s=lat, status=200, error=""
                )
                for i in range(self.n)
            ]

        def close(self) -> None:
            pass

    monkeypatch.setattr(probe_mod, "OpenLoopReplayer", Replayer)
    lines: list[str] = []
    idle = {"idle_p95_s": 0.01, "idle_mean_s": 0.01}
    cfg = ProbeConfig(step_s=0.05, max_steps=8, growth=2.0, start_rps=80.0, grace_s=0.0)
    stops: list[int] = []
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"),
        "m",
        np.array([1]),
        np.array([1]),
        idle,
        1.0,
        cfg,
        lines.append,
        stop=lambda: stops.append(1),
    )
    assert lines == [
        "probe step 1: 80.00 req/s offered, 4/4 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 2: 80.00 req/s offered, 4/4 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 3: 40.00 req/s offered, 0/2 answered in time, p95 n/a (limit 0.04 s): "
        "NOT sustainable",
        "probe step 4: 40.00 req/s offered, 0/2 answered in time, p95 n/a (limit 0.04 s): "
        "NOT sustainable",
        "probe step 5: 20.00 req/s offered, 1/1 answered in time, p95 0.01 s (limit 0.04 s): "
        "sustainable",
        "probe step 6: 40.00 req/s offered, 2/2 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 7: 40.00 req/s offered, 2/2 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
    ]
    assert res.capacity_rps == 20.0 and res.upper_rps == 40.0
    assert res.steps[2] == {
        "offered_rps": 40.0,
        "requests": 2,
        "sent": 2,
        "ok_in_time": 0,
        "throughput_rps": 0.0,
        "completed_fraction": 0.0,
        "p95_s": None,
        "p95_limit_s": 0.04,
        "sustainable": False,
    }
    assert res.steps[4]["throughput_rps"] == 20.0 and res.steps[4]["completed_fraction"] == 1.0
    assert drained.count(1) == 7 and stops  # every step drained, stop() polled


# --------------------------------------------------------------------------- the document


def _synthetic_run(no_pressure: bool) -> calibrate_mod._Run:
    """A run of two repeats with scripted records (merge-active requests 2.5x slower);
    ``no_pressure``: nothing in flight, so the high-pressure class is empty."""
    import numpy as np

    from diloco_gym.live.replay import RequestRecord

    rng = np.random.default_rng(0)
    records = []
    run = calibrate_mod._Run(t0=0.0, started_utc="2026-01-01T00:00:00+00:00", label="ordinary")
    for rep in range(2):
        for phase, origin in (("sync", 100.0 * rep), ("control", 100.0 * rep + 50)):
            key = calibrate_mod._phase_key(phase, rep)
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


@pytest.mark.parametrize("no_pressure", [False, True])
def test_document_of_a_run_is_a_valid_calibration(no_pressure):
    """The document of a complete run validates; an effect size whose class is empty is
    written as 1.0, listed under ``undefined`` and named in the note, without an interval."""
    from diloco_gym.eval.calibration import validate_calibration

    cfg = CalibrationConfig(bootstrap_resamples=50)
    doc = calibrate_mod._finite(calibrate_mod._document(_synthetic_run(no_pressure), True, cfg))
    validate_calibration(doc, "synthetic")
    entry = doc["regimes"]["ordinary"]
    assert list(doc)[:3] == ["source", "regimes", "complete"] and doc["complete"] is True
    assert doc["requests"]["ok"] == 240 and doc["measured"]["intervals"]["repeats"] == 2
    assert entry["p95_sync_ratio"] == doc["measured"]["p95_sync_ratio"] > 1.5
    assert "p95_sync_ratio_ci" in entry and doc["fitted_sidecar"]
    if no_pressure:
        assert entry["p95_high_low"] == 1.0 and entry["undefined"] == ["p95_high_low"]
        assert "p95_high_low_ci" not in entry
        assert entry["note"] == (
            "live calibration; undefined (empty class), written as 1.0: p95_high_low"
        )
    else:
        assert "undefined" not in entry and entry["note"] == "live calibration"
        assert entry["p95_high_low"] == doc["measured"]["p95_high_low"]
    partial = calibrate_mod._document(_synthetic_run(no_pressure), False, cfg, intervals=False)
    assert "(incomplete run)" in partial["regimes"]["ordinary"]["note"]
    assert "p95_sync_ratio_ci" not in partial["regimes"]["ordinary"]


# --------------------------------------------------------------------------- the rate


@pytest.mark.parametrize(
    ("capacity", "upper", "rate_rps", "builtin", "rate", "source"),
    [
        (8.0, 12.0, None, True, 4.0, "target_utilization x probed capacity"),
        (8.0, float("nan"), 3.0, True, 3.0, "--rate"),
        (float("nan"), float("nan"), 3.0, False, 3.0, "--rate"),
        (float("nan"), float("nan"), None, True, None, None),  # the run stops
    ],
)
def test_choose_rate_from_the_probe(monkeypatch, capacity, upper, rate_rps, builtin, rate, source):
    """The replay rate: ``rate_rps`` when given, else ``target_utilization`` x the probed
    capacity; a probe that sustained nothing stops a run without ``rate_rps``."""
    import math

    import numpy as np

    from diloco_gym.live.probe import ProbeConfig, ProbeResult
    from diloco_gym.live.replay import Endpoint

    steps = [{"offered_rps": 2.5, "sustainable": False}]
    seen: dict = {}

    def fake_probe(ep, model, prompt, output, idle, timeout_s, cfg, say, stop):
        seen.update(cfg=cfg, idle=idle)
        stop()  # the server check
        return ProbeResult(capacity, upper, 0.2, 0.1, steps, cfg)

    monkeypatch.setattr(calibrate_mod, "probe_capacity", fake_probe)
    cfg = CalibrationConfig(seed=9, rate_rps=rate_rps, probe=ProbeConfig(step_s=3.0))
    run = calibrate_mod._Run(t0=0.0, started_utc="now")
    run.warmup = {"idle_p95_s": 0.2, "idle_mean_s": 0.1}
    lines: list[str] = []
    server = SimpleNamespace(is_alive=lambda: True, pid=1)
    args = (run, Endpoint.parse("http://127.0.0.1:9"), "m", cfg, builtin)
    args += (np.array([4]), np.array([2]), server, lines.append)
    if rate is None:
        with pytest.raises(CalibrationError) as info:
            calibrate_mod._choose_rate(*args)
        assert str(info.value) == (
            "capacity probe: the engine did not sustain even 2.50 req/s (p95 within 4 x its "
            "idle p95 of 0.20 s): use a smaller model (--engine-model-config), smaller "
            "requests, or --rate"
        )
        return
    assert calibrate_mod._choose_rate(*args) == rate == run.rate_rps == run.capacity["rate_rps"]
    assert run.capacity["rate_source"] == source and run.stage == "probe"
    assert seen["cfg"] == ProbeConfig(step_s=3.0, seed=9) and seen["idle"] is run.warmup
    assert lines[0] == (
        "capacity probe (merge workers idle): steps of 3 s, rate x1.5 per step, sustainable "
        "while p95 <= 4 x idle p95"
    )
    if math.isfinite(capacity):
        tail = "(12.00 req/s was not)" if math.isfinite(upper) else "(the ramp never saturated it)"
        assert lines[1:] == [f"capacity: 8.00 req/s sustainable {tail}"]
    else:
        assert lines[1:] == []


def test_choose_rate_without_a_probe():
    """No probe: ``rate_rps``, else 2 req/s built in, else the trace's own rate (None)."""
    from diloco_gym.live.replay import Endpoint

    ep = Endpoint.parse("http://127.0.0.1:9")
    for rate_rps, builtin, rate, source in [
        (5.0, False, 5.0, "--rate"),
        (None, True, 2.0, "built-in default (no probe)"),
        (None, False, None, "the trace's own rate (no probe)"),
    ]:
        run = calibrate_mod._Run(t0=0.0, started_utc="now")
        cfg = CalibrationConfig(rate_rps=rate_rps, probe=None)
        assert (
            calibrate_mod._choose_rate(run, ep, "m", cfg, builtin, None, None, None, print) == rate
        )
        assert run.capacity == {
            "target_utilization": 0.5,
            "rate_source": source,
            "rate_rps": rate,
        }


def test_engine_threads_default_to_the_cores_the_merge_workers_leave(monkeypatch):
    """Without --engine-threads the engine gets the host's CPUs minus the workers' threads
    (at least one), and the start-up passes that count on and announces it."""
    from diloco_gym.live.calibrate import CalibrationConfig, default_engine_threads
    from diloco_gym.live.merges import MergeConfig

    assert default_engine_threads(MergeConfig(workers=2), cpus=2) == 1
    assert default_engine_threads(MergeConfig(workers=2), cpus=16) == 14
    assert default_engine_threads(MergeConfig(workers=3, torch_threads=2), cpus=16) == 10
    assert default_engine_threads(MergeConfig(workers=4), cpus=2) == 1

    started: dict = {}

    def fake_start_engine(kv, model_cfg, timeout_s, threads=None):
        started["threads"] = threads
        return "engine"

    monkeypatch.setattr(calibrate_mod, "start_engine", fake_start_engine)
    lines: list[str] = []
    for cfg, expected in (
        (CalibrationConfig(merge=MergeConfig(workers=2)), default_engine_threads(MergeConfig())),
        (CalibrationConfig(engine_threads=5), 5),
    ):
        job = SimpleNamespace(cfg=cfg, say=lines.append)
        assert calibrate_mod._builtin_starter(job, (64, 16))() == "engine"
        assert started["threads"] == expected
        assert f"; {expected} torch thread" in lines[-1]


def test_a_server_slower_than_the_slo_is_marked_out_of_range():
    """Every request takes over 5 s against a 1 s SLO: the document says so (``fit``
    and the regime's note), and the command warns (it wrote ``complete: true`` silently)."""
    import dataclasses

    from diloco_gym.eval.calibration import validate_calibration

    run = _synthetic_run(False)
    slow = [dataclasses.replace(r, latency_s=r.latency_s + 5.0) for r in run.replayer.snapshot()]
    run.replayer = SimpleNamespace(snapshot=lambda: slow)  # type: ignore[assignment]
    cfg = CalibrationConfig(bootstrap_resamples=20)
    doc = calibrate_mod._finite(calibrate_mod._document(run, True, cfg))
    validate_calibration(doc, "synthetic")
    assert "SLO" in doc["fit"]["out_of_range"], doc["fit"]
    assert "outside the model's range" in doc["regimes"]["ordinary"]["note"]
    fast = calibrate_mod._finite(calibrate_mod._document(_synthetic_run(False), True, cfg))
    assert "out_of_range" not in fast["fit"]


def test_the_document_records_no_machine_paths():
    run = _synthetic_run(False)
    run.endpoint = {
        "kind": "transformers-serve",
        "model": "/tmp/diloco-gym-engine-abc/llama-1",
        "command": ["/work/venv/bin/transformers", "serve", "/tmp/diloco-gym-engine-abc/llama-1"],
        "url": "http://127.0.0.1:5000",
        "model_config": {"hidden_size": 128},
        "transformers": "5.24.0",
    }
    run.cluster = {"backend": "gloo", "checkpoint": True, "checkpoint_dir": "/tmp/merge-xyz"}
    doc = calibrate_mod._document(run, True, CalibrationConfig(bootstrap_resamples=20))
    text = json.dumps(doc["metadata"])
    assert "/tmp/" not in text and "/venv/" not in text, text
    endpoint = doc["metadata"]["endpoint"]
    assert endpoint["model"] == "llama-1" and "command" not in endpoint
    assert endpoint["url"] == "http://127.0.0.1:5000" and endpoint["model_config"]
    assert doc["metadata"]["merges"] == {"backend": "gloo", "checkpoint": True}


def test_uncertain_run_is_marked_with_each_reason_and_printed():
    """The busy-host run: the probe accepted 16.83 req/s on a retry after a failed step at
    that rate, the control p95 was 4.4 s (0.41 s in the probe at that load), and the
    measured p95 sync ratio 0.836 < 1 while the fitted sync_slowdown was 0.854."""
    from diloco_gym.eval.calibration import validate_calibration
    from diloco_gym.live.calibrate import _summary_lines, uncertain_reasons

    steps = [
        {"offered_rps": 8.4, "sustainable": True, "p95_s": 0.30},
        {"offered_rps": 16.83, "sustainable": False, "p95_s": None},
        {"offered_rps": 16.83, "sustainable": True, "p95_s": 0.41},
        {"offered_rps": 33.7, "sustainable": False, "p95_s": None},
    ]
    doc = {
        "capacity": {"capacity_rps": 16.83, "rate_rps": 9.09, "probe": {"steps": steps}},
        "measured": {"p95_control_ms": 4400.0, "p95_sync_ratio": 0.836},
        "fitted_sidecar": {"sync_slowdown": 0.854},
    }
    reasons = uncertain_reasons(doc)
    assert len(reasons) == 3
    assert "unstable capacity probe: the step at 16.830 req/s failed" in reasons[0]
    assert "control p95 4.400 s is 10.7x the probe's 0.410 s at 16.830 req/s" in reasons[1]
    assert "measured p95 sync ratio is 0.836" in reasons[2] and "0.854" in reasons[2]
    # A clean run has none.
    clean = {
        "capacity": {"capacity_rps": 16.83, "rate_rps": 9.09, "probe": {"steps": steps[2:]}},
        "measured": {"p95_control_ms": 600.0, "p95_sync_ratio": 1.4},
        "fitted_sidecar": {"sync_slowdown": 0.854},
    }
    assert uncertain_reasons(clean) == []
    # Printed on the terminal with the summary, and allowed by the file's schema.
    full = {
        "measured": {"p95_sync_ratio": 0.836, "p95_high_low": 1.0, "pressure_latency_corr": 0.1},
        "fitted_sidecar": {"sync_slowdown": 0.854},
        "fit": {"notes": []},
        "uncertain": reasons,
    }
    lines = _summary_lines(full)
    assert [ln for ln in lines if ln.startswith("UNCERTAIN: ")] == [
        f"UNCERTAIN: {r}" for r in reasons
    ]
    ref = json.loads(
        (
            Path(__file__).resolve().parents[2] / "tests/fixtures/live_cpu_calibration.json"
        ).read_text()
    )
    ref["uncertain"] = reasons
    validate_calibration(ref, "cal.json")
