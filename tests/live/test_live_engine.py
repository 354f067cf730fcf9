"""Live calibration with a real engine: KV settings, the transformers engine, the capacity
probe, the overload stop, repeated phases with bootstrap intervals, and the "uncertain"
verdict. Loopback only; every test is short (the engine tests use a tiny model)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from diloco_gym.eval.calibration import (  # noqa: E402
    CalibrationFileError,
    load_calibration,
    measured_intervals,
    transfer_verdict,
    validate_calibration,
)
from diloco_gym.live import calibrate as calibrate_mod  # noqa: E402
from diloco_gym.live.calibrate import (  # noqa: E402
    CalibrationConfig,
    partial_path,
    phase_order,
    run_calibration,
)
from diloco_gym.live.engine import (  # noqa: E402
    EngineModelConfig,
    build_model,
    engine_available,
    kv_settings,
    start_engine,
)
from diloco_gym.live.errors import CalibrationError  # noqa: E402
from diloco_gym.live.fit import RunData, bootstrap_intervals, measured_effect_sizes  # noqa: E402
from diloco_gym.live.merges import MergeConfig  # noqa: E402
from diloco_gym.live.probe import ProbeConfig, probe_capacity, warm_up  # noqa: E402
from diloco_gym.live.replay import Endpoint, make_prompt, post_completion  # noqa: E402

needs_live = pytest.mark.skipif(
    not engine_available(), reason='needs the live extra: pip install "diloco-gym[live]"'
)


# --------------------------------------------------------------------------- KV settings


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


# --------------------------------------------------------------------------- the engine


_TINY = EngineModelConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


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
    with pytest.raises(ProcessLookupError):
        os.killpg(engine.pid, 0)  # nothing of its process group is left
    assert time.monotonic() - t0 < 60


def test_missing_live_extra_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate_mod, "engine_available", lambda: False)
    with pytest.raises(CalibrationError, match=r'pip install "diloco-gym\[live\]"'):
        run_calibration(None, "sync-heavy", 5.0, tmp_path / "c.json", progress=None)
    assert not (tmp_path / "c.json").exists()


# --------------------------------------------------------------------------- stubs


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


@pytest.fixture
def queue_server():
    servers: list = []

    def make(slots: int, service_s: float, stall_after: int | None = None) -> str:
        server = _QueueServer(slots, service_s, stall_after)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield make
    for server, thread in servers:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join(2)


def test_probe_finds_a_known_capacity(queue_server):
    """Four slots of 0.2 s: capacity 20 req/s. The ramp's capacity (its highest sustainable
    step) lies within two growth steps below and 20 % above it (a short step just above
    capacity builds only a short queue); the step above it is not sustainable. The service
    time is long next to the thread-scheduling jitter of a loaded 2-core host."""
    url = queue_server(slots=4, service_s=0.2)
    ep = Endpoint.parse(url)
    idle = warm_up(ep, "queue-model", (8, 4), (8, 4), 5.0, long_requests=1, idle_requests=3)
    assert 0.19 <= idle["idle_p95_s"] < 0.6
    cfg = ProbeConfig(step_s=2.0, growth=1.4, start_rps=6.0, max_steps=8, p95_factor=4.0)
    result = probe_capacity(ep, "queue-model", np.array([8]), np.array([4]), idle, 5.0, cfg)
    assert 20.0 / 1.4 / 1.4 <= result.capacity_rps <= 20.0 * 1.2, result.steps
    assert np.isfinite(result.upper_rps) and result.upper_rps > result.capacity_rps
    # The ramp ends with a confirmed failure (twice at the same rate), and every lower rate
    # passed (perhaps on its second try: a single failure can be a transient).
    last = result.steps[-1]
    assert last["sustainable"] is False
    at_last = [s for s in result.steps if s["offered_rps"] == pytest.approx(last["offered_rps"])]
    assert [s["sustainable"] for s in at_last] == [False, False]
    lower = {
        round(s["offered_rps"], 6)
        for s in result.steps
        if s["offered_rps"] < last["offered_rps"] - 1e-9
    }
    assert all(
        any(s["sustainable"] for s in result.steps if round(s["offered_rps"], 6) == r)
        for r in lower
    )


def _stub_config(**kw) -> CalibrationConfig:
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


def test_overload_stop_on_a_stalling_engine(tmp_path, queue_server):
    """An engine that stops answering: in-flight requests pile up and the run stops within
    a few seconds (not after the 20 s window and every timeout) with a clear message and a
    partial file."""
    url = queue_server(slots=2, service_s=0.01, stall_after=4)  # warm-up passes, then stalls
    out = tmp_path / "o.json"
    began: list[float] = []

    def progress(line: str) -> None:
        if line.startswith("sync phase") and not began:
            began.append(time.monotonic())

    with pytest.raises(CalibrationError, match="overload: .* requests in flight") as info:
        run_calibration(
            url,
            "sync-heavy",
            20.0,
            out,
            progress=progress,
            config=_stub_config(overload_inflight=6, timeout_s=30.0),
        )
    assert began and time.monotonic() - began[0] < 8.0  # 8 req/s: 6 in flight within ~1 s
    assert "--target-utilization" in str(info.value) or "--rate" in str(info.value)
    assert not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and doc["error"].startswith("overload")
    assert info.value.path == str(partial_path(out))


def test_overload_stop_on_timeouts(tmp_path, queue_server):
    url = queue_server(slots=1, service_s=0.01, stall_after=4)
    out = tmp_path / "t.json"
    began: list[float] = []

    def progress(line: str) -> None:
        if line.startswith("sync phase") and not began:
            began.append(time.monotonic())

    with pytest.raises(CalibrationError, match="overload: .* timed out"):
        run_calibration(
            url,
            "sync-heavy",
            20.0,
            out,
            progress=progress,
            config=_stub_config(overload_inflight=1000, timeout_s=0.5, rate_rps=4.0),
        )
    assert began and time.monotonic() - began[0] < 8.0
    assert json.loads(partial_path(out).read_text())["error"].startswith("overload")


def test_probed_run_with_repeats_records_capacity_and_intervals(tmp_path, queue_server):
    """End to end on a stub of known capacity (20 req/s): the probe, the replay at the
    target utilization, repeated phases in a seeded order, intervals in a valid file."""
    url = queue_server(slots=4, service_s=0.2)
    out = tmp_path / "r.json"
    cfg = _stub_config(
        rate_rps=None,
        repeats=2,
        target_utilization=0.3,
        probe=ProbeConfig(step_s=2.0, growth=1.6, start_rps=8.0, max_steps=3),
        bootstrap_resamples=200,
    )
    result = run_calibration(url, "sync-heavy", 3.0, out, progress=None, config=cfg)
    doc = result.document
    assert result.complete
    cap = doc["capacity"]
    assert 20.0 / 1.6 / 1.6 <= cap["capacity_rps"] <= 20.0 * 1.2
    assert cap["rate_rps"] == pytest.approx(0.3 * cap["capacity_rps"])
    assert doc["metadata"]["trace"]["rate_rps"] == pytest.approx(cap["rate_rps"])
    assert sorted(doc["metadata"]["phase_order"]) == ["control", "control-2", "sync", "sync-2"]
    assert doc["metadata"]["phase_order"] == [
        (n if k == 0 else f"{n}-{k + 1}") for n, k in phase_order(cfg)
    ]
    reps = doc["records"]["repeat"]
    assert set(reps) == {0, 1}
    boot = doc["measured"]["intervals"]
    assert boot["repeats"] == 2 and len(boot["per_repeat"]["p95_sync_ratio"]) == 2
    entry = doc["regimes"]["sync-heavy"]
    if boot["p95_sync_ratio"] is not None:
        lo, hi = entry["p95_sync_ratio_ci"]
        assert lo <= hi
    validate_calibration(doc, str(out))
    assert load_calibration(out).complete


# --------------------------------------------------------------------------- statistics


def test_phase_order_is_seeded_and_pairs_sync_with_control():
    cfg = CalibrationConfig(repeats=6, seed=4)
    order = phase_order(cfg)
    assert order == phase_order(cfg)
    for k in range(6):
        assert sorted(n for n, r in order if r == k) == ["control", "sync"]
    firsts = [order[2 * k][0] for k in range(6)]
    assert set(firsts) == {"sync", "control"}  # randomized within pairs, not fixed
    assert [n for n, _ in phase_order(CalibrationConfig(repeats=2, control=False))] == [
        "sync",
        "sync",
    ]


def _repeated_data(ratios: list[float], n: int = 60, seed: int = 0) -> RunData:
    """Repeats whose merge-active requests are ``ratio`` times slower (per repeat)."""
    rng = np.random.default_rng(seed)
    phase, lat, active, rep = [], [], [], []
    for k, ratio in enumerate(ratios):
        base = rng.uniform(0.9, 1.1, n)
        act = np.arange(n) % 3 == 0
        phase += ["sync"] * n + ["control"] * n
        lat += list(np.where(act, base * ratio, base)) + list(rng.uniform(0.9, 1.1, n))
        active += list(act) + [False] * n
        rep += [k] * (2 * n)
    m = len(lat)
    return RunData(
        np.array(phase, dtype=object),
        np.zeros(m),
        np.array(lat),
        np.ones(m, np.int64),
        np.ones(m, np.int64),
        np.array(active),
        np.zeros(m, np.int64),
        np.full(m, np.nan),
        [],
        10.0,
        10.0,
        repeat=np.array(rep),
        windows_by_repeat={},
    )


def test_bootstrap_interval_over_repeats():
    steady = _repeated_data([1.5, 1.5, 1.5, 1.5, 1.5])
    noisy = _repeated_data([1.0, 2.0, 1.1, 1.9, 1.5])
    b1 = bootstrap_intervals(steady, resamples=400)
    b2 = bootstrap_intervals(noisy, resamples=400)
    point = measured_effect_sizes(noisy)["p95_sync_ratio"]
    lo, hi = b2["p95_sync_ratio"]
    assert lo <= point <= hi
    assert hi - lo > 3 * (b1["p95_sync_ratio"][1] - b1["p95_sync_ratio"][0])
    assert json.dumps(b2) == json.dumps(bootstrap_intervals(noisy, resamples=400))  # seeded
    assert b1["per_repeat"]["p95_sync_ratio"] == pytest.approx([1.5 * 1.0] * 5, rel=0.1)
    single = bootstrap_intervals(_repeated_data([1.5]), resamples=400)
    assert single["p95_sync_ratio"] is None and "fewer than two" in single["note"]


def test_transfer_verdict_says_uncertain_when_the_interval_is_too_wide():
    sim = {"p95_high_low": 1.2, "p95_sync_ratio": 1.5}
    measured = {"p95_high_low": 1.2, "p95_sync_ratio": 1.52}
    assert transfer_verdict(sim, measured) == "calibrated"
    assert transfer_verdict(sim, measured, interval=None) == "calibrated"  # unchanged
    narrow = {"p95_sync_ratio": (1.49, 1.54)}
    assert transfer_verdict(sim, measured, interval=narrow) == "calibrated"
    wide = {"p95_sync_ratio": (1.1, 2.0)}
    assert transfer_verdict(sim, measured, interval=wide) == "uncertain"
    # an interval reaching the no-effect band makes "uncalibrated" uncertain too
    far = {"p95_high_low": 1.2, "p95_sync_ratio": 1.3}
    assert transfer_verdict(sim, far) == "uncalibrated"
    assert transfer_verdict(sim, far, interval={"p95_sync_ratio": (1.25, 1.35)}) == "uncalibrated"
    assert transfer_verdict(sim, far, interval={"p95_sync_ratio": (1.0, 1.6)}) == "uncertain"
    assert measured_intervals({"p95_sync_ratio": 1.5, "p95_sync_ratio_ci": [1.4, 1.6]}) == {
        "p95_sync_ratio": (1.4, 1.6)
    }
    assert measured_intervals({"p95_sync_ratio": 1.5}) == {}


def test_schema_accepts_intervals_and_capacity_and_rejects_bad_ones(tmp_path):
    doc = {
        "source": "live",
        "regimes": {
            "sync-heavy": {
                "p95_high_low": 1.1,
                "p95_sync_ratio": 1.3,
                "p95_sync_ratio_ci": [1.1, 1.6],
            }
        },
        "capacity": {
            "capacity_rps": 3.2,
            "target_utilization": 0.5,
            "utilization": 0.49,
            "rate_rps": 1.6,
            "rate_source": "x",
            "probe": {"steps": []},
        },
    }
    validate_calibration(doc, "f.json")
    bad = json.loads(json.dumps(doc))
    bad["regimes"]["sync-heavy"]["p95_sync_ratio_ci"] = [1.1, 1.2, 1.3]
    with pytest.raises(CalibrationFileError, match="2 to 2 items, got 3"):
        validate_calibration(bad, "f.json")
    bad = json.loads(json.dumps(doc))
    bad["capacity"]["target_utilization"] = 1.5
    with pytest.raises(CalibrationFileError, match="capacity.target_utilization"):
        validate_calibration(bad, "f.json")
    # the shipped reference file (without the new fields) still loads
    assert load_calibration().regimes


def test_overload_grace_lets_a_merge_backlog_drain():
    """A backlog above the limit that drains within the grace (a merge stalled the engine)
    does not stop the run; one that stays above it for longer, or exceeds 4x the limit,
    does."""
    from diloco_gym.live.calibrate import _check_overload, _Run

    class Fake:
        outstanding = 0

        def counts(self, *args: object) -> dict:
            return {"timeouts": 0, "done": 0}

    now = [0.0]
    run = _Run(t0=0.0, started_utc="")
    run.clock = lambda: now[0]
    run.replayer, run.current, run.overload_limit = Fake(), ("sync", 0), 10
    cfg = CalibrationConfig(merge_seconds=4.0)  # grace max(10, 8) = 10 s

    def at(t: float, outstanding: int) -> None:
        now[0] = t
        run.replayer.outstanding = outstanding
        _check_overload(run, cfg)

    at(0.0, 20)
    at(8.0, 30)  # above the limit for 8 s: within the grace
    at(9.0, 5)  # drained: the clock restarts
    at(15.0, 20)
    at(24.0, 20)
    with pytest.raises(CalibrationError, match="above the limit 10 for 11 s"):
        at(26.0, 20)
    run.over_since = None
    with pytest.raises(CalibrationError, match="more than 4 x the limit 10"):
        at(30.0, 41)


def test_warm_up_sends_concurrent_bursts_before_timing_idle_requests(queue_server):
    url = queue_server(slots=4, service_s=0.2)
    t0 = time.monotonic()
    out = warm_up(
        Endpoint.parse(url),
        "queue-model",
        (16, 8),
        (8, 4),
        5.0,
        long_requests=1,
        idle_requests=2,
        burst=4,
    )
    # 1 + 2 x 4 (concurrent: each burst takes one service time) + 2, one at a time
    assert len(out["longest_s"]) == 1 and len(out["burst_s"]) == 8 and len(out["idle_s"]) == 2
    assert time.monotonic() - t0 < 0.2 * (1 + 2 + 2) + 1.5  # not 11 sequential services
    assert out["idle_p95_s"] >= 0.19


def test_overload_limit_allows_a_merge_backlog():
    from diloco_gym.live.calibrate import _overload_limit, _Run

    run = _Run(t0=0.0, started_utc="")
    cfg = CalibrationConfig(merge_seconds=4.0)
    assert _overload_limit(run, cfg, 1.0) == 64  # no probe
    run.capacity = {
        "probe": {
            "steps": [{"sustainable": True, "p95_s": 0.2}, {"sustainable": False, "p95_s": None}]
        }
    }
    assert _overload_limit(run, cfg, 1.0) == 16  # floor
    assert _overload_limit(run, cfg, 5.0) == 40  # 2 x 5 req/s x 4 s of merge
    assert _overload_limit(run, CalibrationConfig(merge_seconds=0.5), 50.0) == 50  # 4 x 50 x 0.2
    assert _overload_limit(run, CalibrationConfig(overload_inflight=7), 50.0) == 7


def test_probe_upper_bound_ignores_an_early_transient_failure(monkeypatch):
    """A cold first step that fails, then a ramp that never fails: capacity is the last
    step and there is no upper bound (not the cold step's rate)."""
    from diloco_gym.live import probe as probe_mod

    outcomes = iter([False, True, True, True, False, False])

    class FakeReplayer:
        outstanding = 0

        def __init__(self, *args: object) -> None:
            self.ok = next(outcomes)

        def start_phase(self, phase, trace, origin, prompt, output) -> None:
            self.n = trace.prompt_tokens.size

        def snapshot(self) -> list:
            from diloco_gym.live.replay import RequestRecord

            lat = 0.01 if self.ok else 99.0
            return [
                RequestRecord(
                    i, "probe", 0.0, 1, 1, send_s=0.0, latency_s=lat, status=200, error=""
                )
                for i in range(self.n)
            ]

        def close(self) -> None:
            pass

    monkeypatch.setattr(probe_mod, "OpenLoopReplayer", FakeReplayer)
    idle = {"idle_p95_s": 0.01, "idle_mean_s": 0.01}
    cfg = ProbeConfig(step_s=0.05, max_steps=3, growth=2.0, start_rps=100.0, grace_s=0.0)
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"), "m", np.array([1]), np.array([1]), idle, 1.0, cfg
    )
    assert [s["sustainable"] for s in res.steps] == [False, True, True]
    # 100 fails, 100 again (a transient?) passes, then 200 passes
    assert [s["offered_rps"] for s in res.steps] == pytest.approx([100.0, 100.0, 200.0])
    assert res.capacity_rps == pytest.approx(200.0)
    assert np.isnan(res.upper_rps)
    # two failures in a row at a rate end the ramp there
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"),
        "m",
        np.array([1]),
        np.array([1]),
        idle,
        1.0,
        replace(cfg, max_steps=5, start_rps=50.0),
    )
    assert [s["offered_rps"] for s in res.steps] == pytest.approx([50.0, 100.0, 100.0])


def test_fit_notes_a_ratio_the_model_cannot_reach():
    """Two merge-active requests, one of them 500x slower: no slowdown up to the search
    bound (64) reproduces that p95 ratio, and the fit says so instead of silently returning
    the bound; a 50x one is reachable and gets no such note."""
    from diloco_gym.live.fit import fit_sidecar_live

    def fit(slow_s: float):
        n = 12
        lat = np.full(n, 0.1)
        act = np.zeros(n, bool)
        act[[3, 8]] = True
        lat[3] = slow_s
        data = RunData(
            np.array(["sync"] * n, dtype=object),
            np.arange(n, dtype=float),
            lat,
            np.ones(n, np.int64),
            np.ones(n, np.int64),
            act,
            np.zeros(n, np.int64),
            np.full(n, np.nan),
            [(3.0, 3.5), (8.0, 8.5)],
            float(n),
            0.0,
        )
        return fit_sidecar_live(data, measured_effect_sizes(data))

    unreachable = fit(50.0)
    assert unreachable.params.sync_slowdown == pytest.approx(64.0, rel=1e-3)
    assert any("cannot reproduce" in note for note in unreachable.notes), unreachable.notes
    reachable = fit(5.0)
    assert reachable.sim_p95_sync_ratio == pytest.approx(47.55, rel=0.02)
    assert not any("cannot reproduce" in note for note in reachable.notes)
