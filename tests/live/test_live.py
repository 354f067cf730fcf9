"""Live calibration (diloco_gym.live): real sidecar, real merges, faults, fit.

The end-to-end test runs the whole loop for a 10 s trace window (twice: the sync phase and
the no-sync control) against the built-in sidecar with two gloo workers all-reducing
8 MiB; the fault tests use a stub endpoint in this process so that they only pay for the
merge workers. Every test that starts processes checks that none is left behind.
"""

from __future__ import annotations

import _thread
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import active_children
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from diloco_gym.eval.calibration import load_calibration  # noqa: E402
from diloco_gym.live import (  # noqa: E402
    CalibrationConfig,
    CalibrationError,
    EndpointUnavailableError,
    MergeConfig,
    MergeWorkerError,
    SidecarModelConfig,
    plan_merges,
    run_calibration,
)
from diloco_gym.live.calibrate import _summary_lines, partial_path  # noqa: E402
from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command  # noqa: E402
from diloco_gym.live.engine import engine_available  # noqa: E402
from diloco_gym.live.fit import (  # noqa: E402
    RunData,
    fit_service_costs,
    fit_sidecar_live,
    measured_effect_sizes,
    simulate_phase,
)
from diloco_gym.live.merges import free_port  # noqa: E402
from diloco_gym.live.replay import (  # noqa: E402
    Endpoint,
    check_completion,
    post_completion,
    probe_endpoint,
)
from diloco_gym.live.server import SidecarHTTPServer, TinyLM  # noqa: E402
from diloco_gym.sim.sidecar import SidecarParams  # noqa: E402


def _assert_no_children(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert active_children() == [], f"orphan processes: {active_children()}"


def _records(doc: dict) -> list[dict]:
    cols = doc["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


# --------------------------------------------------------------------------- stub endpoint


class _StubHandler(BaseHTTPRequestHandler):
    """A fast fake OpenAI endpoint; ``server.mode`` picks its behaviour."""

    server: _StubServer

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.server.mode == "raw":
            self._raw(200, self.server.body)
        elif self.server.mode == "models500":
            self._raw(500, b"Internal Server Error\n")
        elif self.server.mode == "models-garbage":
            self._raw(200, b"\x89PNG\r\n\x1a\n\x00\x00 not a model list")
        else:
            self._json(200, {"data": [{"id": "stub-model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.mode == "raw":
            self._raw(200, self.server.body)
            return
        with self.server.lock:
            self.server.count += 1
            n = self.server.count
        warm = n <= 4  # the warm-up (1 longest + 3 idle requests) always succeeds
        if self.server.mode == "flaky" and not warm and n % 3 == 1:
            self._json(500, {"error": {"message": "boom"}})
            return
        if self.server.mode == "flaky" and not warm and n % 3 == 2:
            time.sleep(1.0)  # beyond the client's timeout
        time.sleep(0.01)
        if self.server.mode == "garbage" and not warm:  # HTTP 200, but not a completion
            self._json(200, {"object": "list", "data": []})
            return
        if self.server.mode == "html" and not warm:
            self._raw(200, b"<html>\xff\xfe proxy login page</html>")
            return
        self._json(
            200, {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.body = b""
        self.count = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _StubHandler)


@pytest.fixture
def stub():
    def make(mode: str = "ok") -> str:
        server = _StubServer(mode)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    servers: list = []
    make.servers = servers
    yield make
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(2)


def _fast_config(**kw) -> CalibrationConfig:
    base = dict(
        seed=3,
        rate_rps=4.0,
        merge=MergeConfig(workers=2, merge_mb=2),
        merge_seconds=1.5,
        gap_seconds=(1.0, 1.0),
        lead_seconds=0.5,
        timeout_s=5.0,
        warmup_requests=1,
        progress_every_s=60.0,
        engine="builtin-fallback",
        probe=None,
        repeats=1,
    )
    base.update(kw)
    return CalibrationConfig(**base)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("live") / "calibration.json"
    lines: list[str] = []
    cfg = CalibrationConfig(
        seed=1,
        rate_rps=1.5,
        merge=MergeConfig(workers=2, merge_mb=8),
        merge_seconds=2.5,
        gap_seconds=(1.5, 2.5),
        lead_seconds=1.0,
        warmup_requests=1,
        progress_every_s=4.0,
        engine="builtin-fallback",
        probe=None,
        repeats=1,
    )
    t0 = time.monotonic()
    result = run_calibration(None, "sync-heavy", 10.0, out, config=cfg, progress=lines.append)
    return result, out, lines, time.monotonic() - t0


@pytest.mark.slow
def test_live_run_records_requests(live_run):
    result, _, lines, _ = live_run
    doc = result.document
    recs = _records(doc)
    assert result.complete and doc["complete"] is True and doc["error"] is None
    assert {r["phase"] for r in recs} == {"sync", "control"}
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 0.8 * len(recs) and len(ok) >= 10
    assert all(r["latency_s"] > 0 and r["status"] == 200 for r in ok)
    assert all(r["send_s"] >= r["scheduled_s"] - 1e-6 for r in ok)  # never early
    assert doc["requests"]["ok"] == len(ok)
    assert any(line.startswith("merge 1/") for line in lines)
    assert any("sync phase" in line for line in lines)
    _assert_no_children()


@pytest.mark.slow
def test_live_run_flags_match_merge_windows(live_run):
    doc = live_run[0].document
    windows = {m["merge_id"]: (m["start_s"], m["end_s"]) for m in doc["merges"]}
    assert len(windows) == len(doc["schedule"]) >= 2
    for m in doc["merges"]:  # real merges: all-reduces and a checkpoint of the tensor
        assert m["allreduces"] >= 1 and m["bytes_per_allreduce"] == 8 * 2**20
        assert m["checkpoint_bytes"] >= 8 * 2**20
        assert m["end_s"] - m["start_s"] >= m["planned_length_s"] - 0.05
    recs = [r for r in _records(doc) if r["send_s"] is not None]
    active = [r for r in recs if r["merge_active"]]
    assert active, "no request was sent during a merge"
    for r in recs:
        inside = [k for k, (lo, hi) in windows.items() if lo <= r["send_s"] <= hi]
        if r["merge_active"]:
            assert r["phase"] == "sync" and inside == [r["merge_id"]]
        else:
            assert r["merge_id"] == -1
            # Inactive requests lie outside every window (edges are shared instants).
            assert all(
                min(abs(r["send_s"] - lo), abs(r["send_s"] - hi)) < 1e-3
                for k in inside
                for lo, hi in [windows[k]]
            )


@pytest.mark.slow
def test_live_run_calibration_file(live_run):
    result, out, _, _ = live_run
    cal = load_calibration(out)
    entry = cal.measured("sync-heavy")
    assert entry["p95_sync_ratio"] > 0 and entry["p95_high_low"] > 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True
    params = SidecarParams(**doc["fitted_sidecar"])
    assert params.decode_ms_per_token >= 0 and params.slots > 0
    assert doc["metadata"]["merges"]["backend"] in ("gloo", "nccl")
    assert doc["metadata"]["endpoint"]["kind"] == "built-in"
    assert doc["metadata"]["endpoint"]["url"].startswith("http://127.0.0.1:")
    m, fit = doc["measured"], doc["fit"]
    assert fit["sim_p95_sync_ratio"] is not None
    if m["p95_sync_ratio"] > fit["sim_p95_sync_ratio_no_slowdown"]:
        # The fitted sync_slowdown reproduces the measured ratio on the same window.
        assert fit["sim_p95_sync_ratio"] == pytest.approx(m["p95_sync_ratio"], rel=0.02)
    else:  # the model cannot go lower: no slowdown
        assert params.sync_slowdown == 0.0
    assert not list(out.parent.glob(".*.tmp")), "temporary file left behind"


@pytest.mark.slow
def test_live_run_prints_the_fit_notes(live_run):
    """What the fit could not determine (in the file's ``fit.notes``) is also said on the
    console, not only stored."""
    _, out, lines, _ = live_run
    notes = json.loads(out.read_text())["fit"]["notes"]
    printed = [ln.removeprefix("fit note: ") for ln in lines if ln.startswith("fit note: ")]
    assert printed == notes
    doc = {
        "measured": {"p95_sync_ratio": 1.004},
        "fitted_sidecar": {"sync_slowdown": 0.0},
        "fit": {
            "notes": [
                "measured p95 sync ratio 1.004 is at or below the model's ratio "
                "with no slowdown (1.066, ...): sync_slowdown = 0"
            ]
        },
    }
    summary = _summary_lines(doc)
    assert summary[0].startswith("measured p95 sync ratio 1.004")
    assert summary[1:] == ["fit note: " + doc["fit"]["notes"][0]]
    assert _summary_lines(
        {"measured": {}, "fitted_sidecar": {}, "fit": {"error": "fit failed: x"}}
    )[1:] == ["fit note: fit failed: x"]
    with_failures = {
        **doc,
        "requests": {
            "errors": 3,
            "sent": 30,
            "by_status": {"200": 27, "invalid response": 2, "timed out": 1},
        },
        "metadata": {"config": {"max_error_fraction": 0.5}},
    }
    assert _summary_lines(with_failures)[1] == (
        "3 of 30 requests failed (10 %, within the 50 % limit; invalid response: 2, timed "
        "out: 1); they are left out of the measurements"
    )


# --------------------------------------------------------------------------- faults


def test_refused_endpoint_gives_clear_error_and_incomplete_file(tmp_path):
    port = free_port()  # nothing listens there any more
    out = tmp_path / "refused.json"
    with pytest.raises(EndpointUnavailableError, match="connection refused") as info:
        run_calibration(f"http://127.0.0.1:{port}", "sync-heavy", 5.0, out, progress=None)
    assert "Omit --endpoint" in str(info.value)
    partial = tmp_path / "refused.partial.json"
    assert info.value.path == str(partial) and not out.exists()
    doc = json.loads(partial.read_text())
    assert doc["complete"] is False and "connection refused" in doc["error"]
    # a valid file that measured nothing: loadable only when explicitly allowed
    assert load_calibration(partial, allow_empty=True).complete is False
    with pytest.raises(ValueError, match="measured nothing"):
        load_calibration(partial)
    _assert_no_children()


def test_endpoint_that_never_answers_times_out(tmp_path):
    import socket

    with socket.socket() as sock:  # accepts connections (backlog) but never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(EndpointUnavailableError, match="timed out"):
            run_calibration(
                url,
                "ordinary",
                5.0,
                tmp_path / "t.json",
                config=CalibrationConfig(timeout_s=0.3),
                progress=None,
            )
        assert time.monotonic() - t0 < 5.0
    assert json.loads((tmp_path / "t.partial.json").read_text())["complete"] is False


@pytest.mark.slow
def test_failed_and_timed_out_requests_are_recorded(tmp_path, stub):
    url = stub("flaky")
    out = tmp_path / "flaky.json"
    cfg = _fast_config(timeout_s=0.3, merge=MergeConfig(workers=1, merge_mb=1), control=False)
    with pytest.raises(CalibrationError, match="requests failed") as info:
        run_calibration(url, "ordinary", 3.0, out, config=cfg, progress=None)
    assert "above the 50 % limit" in str(info.value) and not out.exists()
    doc = json.loads(Path(info.value.path).read_text())
    assert doc["complete"] is False
    counts = doc["requests"]
    assert counts["timeouts"] >= 1 and counts["by_status"].get("500", 0) >= 1
    assert counts["ok"] >= 1 and counts["errors"] == counts["completed"] - counts["ok"]
    recs = _records(doc)
    assert all(r["latency_s"] is None for r in recs if r["error"] == "timed out")
    _assert_no_children()


@pytest.mark.slow
def test_failures_within_the_limit_leave_the_run_complete(tmp_path, stub):
    """The failure limit is a setting: with 90 % allowed the same flaky endpoint gives a
    complete run, and the summary says how many requests failed and why."""
    out = tmp_path / "tolerant.json"
    lines: list[str] = []
    cfg = _fast_config(
        timeout_s=0.3,
        merge=MergeConfig(workers=1, merge_mb=1),
        control=False,
        max_error_fraction=0.9,
    )
    result = run_calibration(stub("flaky"), "ordinary", 3.0, out, config=cfg, progress=lines.append)
    counts = result.document["requests"]
    assert result.complete and 0 < counts["errors"] and counts["ok"] > 0
    assert any(
        line.startswith(f"{counts['errors']} of {counts['sent']} requests failed")
        and "within the 90 % limit" in line
        for line in lines
    ), lines
    _assert_no_children()


@pytest.mark.slow
def test_killed_worker_marks_run_incomplete(tmp_path, stub):
    out = tmp_path / "killed.json"
    cfg = _fast_config(kill_worker_at_merge=0, merge_seconds=3.0)
    t0 = time.monotonic()
    with pytest.raises(MergeWorkerError, match=r"rank 1 .* died during merge 0") as info:
        run_calibration(stub(), "ordinary", 6.0, out, config=cfg, progress=None)
    assert info.value.path == str(partial_path(out)) and not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and "died" in doc["error"]
    assert doc["merges"][0]["end_s"] is not None  # the window was closed on the way out
    assert time.monotonic() - t0 < 40
    _assert_no_children()


@pytest.mark.slow
def test_ctrl_c_saves_partial_measurements(tmp_path, stub):
    out = tmp_path / "interrupted.json"

    def progress(line: str) -> None:
        if line.startswith("merge 1/") and threading.current_thread() is threading.main_thread():
            _thread.interrupt_main()  # what Ctrl-C does

    cfg = _fast_config(merge=MergeConfig(workers=1, merge_mb=1))
    with pytest.raises(KeyboardInterrupt) as info:
        run_calibration(stub(), "ordinary", 6.0, out, config=cfg, progress=progress)
    assert info.value.path == str(partial_path(out)) and not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and "Ctrl-C" in doc["error"]
    assert doc["requests"]["sent"] >= 1
    _assert_no_children()


def test_cli_refused_endpoint(tmp_path, capsys):
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    out = tmp_path / "cli.json"
    args = parser.parse_args(
        ["--endpoint", f"http://127.0.0.1:{free_port()}", "--duration", "5", "--out", str(out)]
    )
    assert run_calibrate_command(args) == 1
    captured = capsys.readouterr()
    assert "cannot reach the serving endpoint" in captured.err
    both = captured.out + captured.err
    assert both.count("partial measurements saved") == 1, both  # said once, not twice
    assert not out.exists()
    assert json.loads((tmp_path / "cli.partial.json").read_text())["complete"] is False
    bad = parser.parse_args(["--regime", "no-such-regime", "--out", str(out)])
    assert run_calibrate_command(bad) == 2
    assert "neither a regime" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["garbage", "html"])
@pytest.mark.slow
def test_invalid_completions_are_failures_and_the_run_is_incomplete(tmp_path, stub, mode):
    """HTTP 200 answers that are not completions were counted as successes (a file marked
    complete with slots 0.25); now they are failures, and above the limit the run stops."""
    out = tmp_path / "garbage.json"
    lines: list[str] = []
    cfg = _fast_config(merge=MergeConfig(workers=1, merge_mb=1), control=False)
    with pytest.raises(CalibrationError, match="invalid response") as info:
        run_calibration(stub(mode), "ordinary", 3.0, out, config=cfg, progress=lines.append)
    message = str(info.value)
    assert "above the 50 % limit" in message and "none succeeded" in message
    assert (
        "no 'choices' list" if mode == "garbage" else "not JSON (first bytes: b'<html>\\xff"
    ) in message
    assert not out.exists()
    doc = json.loads(partial_path(out).read_text())
    counts = doc["requests"]
    assert doc["complete"] is False and counts["ok"] == 0
    assert counts["invalid"] == counts["errors"] == counts["by_status"]["invalid response"] >= 3
    assert sum("partial measurements saved" in line for line in lines) == 1
    _assert_no_children()


def test_check_completion():
    good = {"choices": [{"text": "a b"}], "usage": {"completion_tokens": 2}}
    assert check_completion(good, 2) == ""
    assert check_completion({"choices": [{"text": ""}]}, 4) == ""  # usage not reported
    bad = [
        ([], "JSON list instead of an object"),
        ({}, "no 'choices' list"),
        ({"choices": []}, "no 'choices' list"),
        ({"choices": [1]}, "no 'text' string"),
        ({"choices": [{"text": 3}]}, "no 'text' string"),
        ({**good, "usage": [2]}, "'usage' is not an object"),
        ({**good, "usage": {"completion_tokens": 3}}, "expected an integer in [0, 2]"),
        ({**good, "usage": {"completion_tokens": "2"}}, 'is "2"'),
        ({**good, "usage": {"completion_tokens": -1}}, "in [0, 2]"),
    ]
    for body, fragment in bad:
        assert fragment in check_completion(body, 2), body


GARBAGE_BODIES = [
    b"",
    b"null",
    b"[]",
    b'"text"',
    b"{}",
    b'{"choices": null}',
    b'{"choices": [null]}',
    b'{"choices": [{"text": null}]}',
    b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1e3}}',
    b"[" * 100000,
    b"1" * 5000,
    b"\xff\xfe\x00garbage",
    b"<html>502</html>",
    b'{"data": {"id": "m"}}',
    b'{"data": [{"name": "m"}]}',
    b'{"data": "abc"}',
]


def test_garbage_answers_never_raise(stub):
    """Whatever an endpoint answers with HTTP 200, a completion is either valid or an
    "invalid response" failure, and a model list is either ids or a stated reason."""
    url = stub("raw")
    server = stub.servers[-1][0]
    ep = Endpoint.parse(url)
    for body in GARBAGE_BODIES:
        server.body = body
        status, _, error = post_completion(ep, "m", "a b", 4, 5.0)
        assert status == 200 and error.startswith("invalid response: "), (body[:20], error)
        assert "\ufffd" not in error
        info = probe_endpoint(url)
        assert info["models"] == [] and info["models_error"], body[:20]


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("models500", ["/v1/models answered HTTP 500", "b'Internal Server Error\\n'"]),
        (
            "models-garbage",
            [
                "answered HTTP 200 with a body that is not an OpenAI model list",
                "b'\\x89PNG\\r\\n\\x1a\\n",
            ],
        ),
    ],
)
def test_models_route_errors_are_reported(tmp_path, stub, capsys, mode, fragments):
    """/v1/models answering 500 or garbage is said as such (status, first bytes), not as
    "lists no model"; the run stops before any worker starts."""
    out = tmp_path / "m.json"
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--endpoint", stub(mode), "--duration", "3", "--out", str(out)])
    assert run_calibrate_command(args) == 1
    captured = capsys.readouterr()
    for fragment in fragments:
        assert fragment in captured.err, captured.err
    assert "pass --model" in captured.err and "lists no model" not in captured.err
    assert (captured.out + captured.err).count("partial measurements saved") == 1
    assert not out.exists() and partial_path(out).exists()
    _assert_no_children()


def test_failed_run_never_overwrites_a_complete_file(tmp_path):
    out = tmp_path / "good.json"
    good = json.dumps(
        {
            "source": "an earlier complete run",
            "complete": True,
            "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 1.4}},
        }
    )
    out.write_text(good)
    with pytest.raises(EndpointUnavailableError):
        run_calibration(f"http://127.0.0.1:{free_port()}", "sync-heavy", 5.0, out, progress=None)
    assert out.read_text() == good
    assert json.loads((tmp_path / "good.partial.json").read_text())["complete"] is False
    assert partial_path("a/x.json") == Path("a/x.partial.json")
    assert partial_path("x") == Path("x.partial.json")


@pytest.mark.slow
def test_complete_run_writes_the_target_and_removes_a_stale_partial(tmp_path, stub):
    out = tmp_path / "fresh.json"
    partial_path(out).write_text("{}")
    cfg = _fast_config(merge=MergeConfig(workers=1, merge_mb=1), control=False)
    result = run_calibration(stub(), "sync-heavy", 3.0, out, config=cfg, progress=None)
    assert result.complete and result.path == str(out)
    assert load_calibration(out).complete is True
    assert not partial_path(out).exists()
    _assert_no_children()


def test_label_must_be_a_regime(tmp_path):
    from diloco_gym.live.calibrate import prepare_trace
    from diloco_gym.sim.traces import Trace

    trace = Trace(np.arange(20.0), np.ones(20), np.ones(20), 20.0, name="my_trace")
    with pytest.raises(ValueError, match="'my_trace' is not one: pass --label"):
        prepare_trace(trace, 5.0, CalibrationConfig(start_s=0.0))
    win, label, _, _ = prepare_trace(trace, 5.0, CalibrationConfig(start_s=0.0, label="bursty"))
    assert label == "bursty" and win.num_requests == 5


def _children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list child processes")
@pytest.mark.parametrize(
    "engine",
    [
        None,
        "builtin-fallback",
        pytest.param(
            "transformers",
            marks=pytest.mark.skipif(
                not engine_available(),
                reason='needs the live extra: pip install "diloco-gym[live]"',
            ),
        ),
    ],
    ids=["stub-endpoint", "builtin-fallback", "transformers-engine"],
)
@pytest.mark.slow
def test_sigterm_is_handled_like_ctrl_c(tmp_path, stub, engine):
    """SIGTERM to ``calibrate``: partial file saved, children ended, one line, exit 143."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "term.json"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONUNBUFFERED="1")
    builtin = engine is not None
    endpoint = ["--engine", engine] if builtin else ["--endpoint", stub()]
    cmd = [
        sys.executable,
        "-m",
        "diloco_gym.cli",
        "calibrate",
        *endpoint,
        "--regime",
        "ordinary",
        "--duration",
        "20",
        "--rate",
        "4",
        "--workers",
        "2",
        "--merge-mb",
        "1",
        "--merge-seconds",
        "1.5",
        "--gap-seconds",
        "1",
        "1",
        "--no-control",
        "--no-probe",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # wait until the merges run
            lines.append(line)
            if "merge 1/" in line or time.monotonic() > deadline:
                break
        assert any("merge 1/" in line for line in lines), lines
        children = _children_of(proc.pid)
        names = {
            pid: (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
            for pid in children
        }
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout = "".join(lines) + rest
    assert proc.returncode == 143, (stdout, err)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err.strip() == "terminated (SIGTERM)"
    assert stdout.count("partial measurements saved") == 1
    assert not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and "SIGTERM" in doc["error"]

    def alive() -> set[int]:
        found = set()
        for pid in children:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                found.add(pid)
        return found

    workers = {pid for pid, cmd in names.items() if "spawn_main" in cmd}
    # the two merge workers (and the fallback server, a spawned process too)
    assert len(workers) >= 2 + (engine == "builtin-fallback")
    if engine == "transformers":
        assert any("transformers" in cmd and "serve" in cmd for cmd in names.values()), names
    assert not alive() & workers, "merge workers outlived the command"
    # The workers are reaped before the command exits; multiprocessing's resource tracker
    # (one of the children) exits when it sees the parent's pipe close: give it 5 s.
    until = time.monotonic() + 5.0
    while alive() and time.monotonic() < until:
        time.sleep(0.1)
    assert not alive(), f"child processes still alive after the run: {alive()} {names}"


# --------------------------------------------------------------------------- pieces


def test_builtin_server_is_quiet_about_clients_that_went_away(capsys):
    """A stopped calibration leaves requests in flight; the sidecar's write to their closed
    sockets printed a BrokenPipeError traceback. Other errors still print."""
    server = SidecarHTTPServer(TinyLM(SidecarModelConfig(d_model=16, hidden=16, n_layers=1)))
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise exc
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real bug" in capsys.readouterr().err
    finally:
        server.server_close()


def test_builtin_server_speaks_openai(tmp_path):
    lm = TinyLM(SidecarModelConfig(d_model=32, hidden=64, n_layers=2))
    server = SidecarHTTPServer(lm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ep = Endpoint.parse(server.url + "/v1")
        assert probe_endpoint(server.url)["models"] == ["tiny-lm"]
        status, body, err = post_completion(ep, "tiny-lm", "a b c", 5, 5.0)
        assert (status, err) == (200, "")
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        again = post_completion(ep, "tiny-lm", "a b c", 5, 5.0)[1]
        assert again["choices"][0]["text"] == body["choices"][0]["text"]  # greedy, seeded
        assert post_completion(ep, "other", "a", 1, 5.0)[0] == 404
        assert post_completion(ep, "tiny-lm", "a", 0, 5.0)[0] == 400
    finally:
        server.shutdown()
        server.server_close()


def test_plan_merges_fits_the_phase():
    cfg = CalibrationConfig(merge_seconds=8.0, gap_seconds=(8.0, 16.0), lead_seconds=2.0)
    plan = plan_merges(120.0, cfg)
    assert plan == plan_merges(120.0, cfg)  # seeded
    assert plan[0][0] == 2.0 and all(s + n <= 120.0 for s, n in plan)
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(plan, plan[1:], strict=False)]
    assert all(8.0 - 1e-9 <= g <= 16.0 + 1e-9 for g in gaps)
    assert len(plan_merges(5.0, cfg)) == 1  # a short phase still gets one merge


def _synthetic_run(params: SidecarParams, seed: int = 0) -> RunData:
    """Requests whose latencies come from the sidecar model itself (known parameters)."""
    rng = np.random.default_rng(seed)
    n = 200  # 2 req/s: little queueing, so the idle-server fit sees the service costs
    offsets = np.sort(rng.uniform(0, 100, n))
    prompt = rng.integers(20, 300, n)
    output = rng.integers(10, 120, n)
    windows = [(10.0, 18.0), (40.0, 48.0), (70.0, 78.0)]
    active = np.zeros(n, bool)
    for lo, hi in windows:
        active |= (offsets >= lo) & (offsets < hi)
    data = RunData(
        np.array(["sync"] * n + ["control"] * n, dtype=object),
        np.concatenate([offsets, offsets]),
        np.zeros(2 * n),
        np.concatenate([prompt, prompt]),
        np.concatenate([output, output]),
        np.concatenate([active, np.zeros(n, bool)]),
        np.zeros(2 * n, np.int64),
        np.full(2 * n, np.nan),
        windows,
        100.0,
        100.0,
    )
    lat_sync, _ = simulate_phase(data, "sync", params)
    lat_ctrl, _ = simulate_phase(data, "control", params, with_merges=False)

    def inflight(lat: np.ndarray) -> np.ndarray:  # earlier requests not finished yet
        end = offsets + lat
        return np.array([(end[:i] > offsets[i]).sum() for i in range(n)])

    return RunData(
        data.phase,
        data.offset_s,
        np.concatenate([lat_sync, lat_ctrl]),
        data.prompt_tokens,
        data.output_tokens,
        data.sync_active,
        np.concatenate([inflight(lat_sync), inflight(lat_ctrl)]),
        data.cpu_util,
        windows,
        100.0,
        100.0,
    )


def test_fit_recovers_known_sidecar():
    truth = SidecarParams(
        ttft_ms=40.0,
        prefill_ms_per_token=0.2,
        decode_ms_per_token=5.0,
        slots=4.0,
        sync_slowdown=0.8,
    )
    data = _synthetic_run(truth)
    measured = measured_effect_sizes(data)
    assert measured["p95_sync_ratio"] > 1.3
    fit = fit_sidecar_live(data, measured)
    p = fit.params
    assert p.decode_ms_per_token == pytest.approx(5.0, rel=0.05)
    assert p.ttft_ms == pytest.approx(40.0, abs=1.0)
    assert fit.sim_p95_sync_ratio == pytest.approx(measured["p95_sync_ratio"], rel=0.02)
    assert p.sync_slowdown == pytest.approx(0.8, rel=0.1)


def test_effect_sizes_and_least_squares_by_hand():
    lat = np.array([1.0, 1.0, 2.0, 2.0])
    data = RunData(
        np.array(["sync"] * 4, dtype=object),
        np.arange(4.0),
        lat,
        np.ones(4, np.int64),
        np.ones(4, np.int64),
        np.array([False, False, True, True]),
        np.array([0, 0, 4, 4]),
        np.full(4, np.nan),
        [(1.5, 3.5)],
        4.0,
        0.0,
    )
    m = measured_effect_sizes(data)
    assert m["p95_sync_ratio"] == pytest.approx(2.0)
    assert m["p95_high_low"] == pytest.approx(2.0)  # in-flight 4 / norm 4 = pressure 1
    assert m["pressure_latency_corr"] == pytest.approx(1.0)
    assert np.isnan(m["cpu_latency_corr"])
    fit = fit_service_costs(
        np.array([0, 0, 0]), np.array([1, 2, 3]), np.array([0.015, 0.020, 0.025])
    )
    assert fit["ttft_ms"] == pytest.approx(10.0) and fit["decode_ms_per_token"] == pytest.approx(
        5.0
    )
