"""The orchestration of a live calibration run (:mod:`diloco_gym.live.calibrate`).

With every process and socket stubbed out (``Stubs``): the progress lines a run prints
(timings masked), the partial file it saves, the exception it raises and the order in which
it releases what it started. End to end (marked ``slow``): the whole loop for a 10 s trace
window against the built-in sidecar with two gloo workers, and the faults against a stub
endpoint in this process. Every test that starts processes checks that none is left
behind."""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.errors import DataError
from diloco_gym.eval.calibration import (
    load_calibration,
    validate_calibration,
)
from diloco_gym.live import calibrate as calibrate_mod
from diloco_gym.live.calibrate import (
    CalibrationConfig,
    partial_path,
    run_calibration,
)
from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command
from diloco_gym.live.document import summary_lines
from diloco_gym.live.errors import (
    CalibrationError,
    CalibrationTerminated,
    EndpointUnavailableError,
    MergeWorkerError,
)
from diloco_gym.live.merges import MergeConfig, free_port
from diloco_gym.live.plan import phase_order
from diloco_gym.live.probe import ProbeConfig
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace

from .helpers import (
    Stubs,
    assert_no_children,
    check_measured,
    fast_config,
    masked,
    records_of,
    stub_config,
    stubbed_config,
)

pytest.importorskip("torch")


@pytest.mark.slow
def test_error_in_the_phase_loop_saves_the_partial_file_and_cleans_up_in_order(
    tmp_path, monkeypatch
):
    """A merge worker dies in the second sync phase: the partial file holds the first
    phases, the error carries its path, and everything is released in order."""
    stubs = Stubs(monkeypatch)
    stubs.fail_at_merge = 4  # three merges per sync phase: the second merge of sync 2
    out = tmp_path / "cal.json"
    lines: list[str] = []
    with pytest.raises(MergeWorkerError, match="died during merge 4") as info:
        run_calibration(None, "ordinary", 1.0, out, config=stubbed_config(), progress=lines.append)
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
    assert masked(lines) == [
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
    stubs = Stubs(monkeypatch)
    stubs.fail_at_merge = 0
    stubs.merge_s = 0.35
    lines: list[str] = []
    with pytest.raises(MergeWorkerError):
        run_calibration(
            None,
            "ordinary",
            1.0,
            tmp_path / "c.json",
            config=stubbed_config(progress_every_s=0.1, repeats=1, control=False),
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
    stubs = Stubs(monkeypatch)
    stubs.start_delay_s = 0.3
    stubs.cluster_start_error = interrupt()
    out = tmp_path / "cal.json"
    lines: list[str] = []
    with pytest.raises(interrupt) as info:
        run_calibration(None, "ordinary", 1.0, out, config=stubbed_config(), progress=lines.append)
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
    stubs = Stubs(monkeypatch)
    stubs.start_error = error
    out = tmp_path / "cal.json"
    with pytest.raises(CalibrationError) as info:
        run_calibration(None, "ordinary", 1.0, out, config=stubbed_config(), progress=None)
    assert type(info.value) is CalibrationError and str(info.value) == expected
    assert info.value.path == str(partial_path(out))
    assert json.loads(partial_path(out).read_text())["error"] == expected
    assert stubs.events == ["cluster.start", "server failed", "cluster.close", "cpu.stop"]


def test_missing_live_extra_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate_mod, "engine_available", lambda: False)
    with pytest.raises(CalibrationError, match=r'pip install "diloco-gym\[live\]"'):
        run_calibration(None, "sync-heavy", 5.0, tmp_path / "c.json", progress=None)
    assert not (tmp_path / "c.json").exists()


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
    recs = records_of(doc)
    assert result.complete and doc["complete"] is True and doc["error"] is None
    assert {r["phase"] for r in recs} == {"sync", "control"}
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 0.8 * len(recs) and len(ok) >= 10
    assert all(r["latency_s"] > 0 and r["status"] == 200 for r in ok)
    assert all(r["send_s"] >= r["scheduled_s"] - 1e-6 for r in ok)  # never early
    assert doc["requests"]["ok"] == len(ok)
    assert any(line.startswith("merge 1/") for line in lines)
    assert any("sync phase" in line for line in lines)
    assert_no_children()


@pytest.mark.slow
def test_live_run_flags_match_merge_windows(live_run):
    doc = live_run[0].document
    windows = {m["merge_id"]: (m["start_s"], m["end_s"]) for m in doc["merges"]}
    assert len(windows) == len(doc["schedule"]) >= 2
    for m in doc["merges"]:  # real merges: all-reduces and a checkpoint of the tensor
        assert m["allreduces"] >= 1 and m["bytes_per_allreduce"] == 8 * 2**20
        assert m["checkpoint_bytes"] >= 8 * 2**20
        assert m["end_s"] - m["start_s"] >= m["planned_length_s"] - 0.05
    recs = [r for r in records_of(doc) if r["send_s"] is not None]
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
    cal = check_measured(load_calibration, out)
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
    assert not list(out.parent.glob(".*.partial-*")), "temporary file left behind"


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
    summary = summary_lines(doc)
    assert summary[0].startswith("measured p95 sync ratio 1.004")
    assert summary[1:] == ["fit note: " + doc["fit"]["notes"][0]]
    assert summary_lines({"measured": {}, "fitted_sidecar": {}, "fit": {"error": "fit failed: x"}})[
        1:
    ] == ["fit note: fit failed: x"]
    with_failures = {
        **doc,
        "requests": {
            "errors": 3,
            "sent": 30,
            "by_status": {"200": 27, "invalid response": 2, "timed out": 1},
        },
        "metadata": {"config": {"max_error_fraction": 0.5}},
    }
    assert summary_lines(with_failures)[1] == (
        "3 of 30 requests failed (10 %, within the 50 % limit; invalid response: 2, timed "
        "out: 1); they are left out of the measurements"
    )


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
    assert_no_children()


def test_endpoint_that_never_answers_times_out(tmp_path):

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
    cfg = fast_config(timeout_s=0.3, merge=MergeConfig(workers=1, merge_mb=1), control=False)
    with pytest.raises(CalibrationError, match="requests failed") as info:
        run_calibration(url, "ordinary", 3.0, out, config=cfg, progress=None)
    assert "above the 50 % limit" in str(info.value) and not out.exists()
    doc = json.loads(Path(info.value.path).read_text())
    assert doc["complete"] is False
    counts = doc["requests"]
    assert counts["timeouts"] >= 1 and counts["by_status"].get("500", 0) >= 1
    assert counts["ok"] >= 1 and counts["errors"] == counts["completed"] - counts["ok"]
    recs = records_of(doc)
    assert all(r["latency_s"] is None for r in recs if r["error"] == "timed out")
    assert_no_children()


@pytest.mark.slow
def test_failures_within_the_limit_leave_the_run_complete(tmp_path, stub):
    """The failure limit is a setting: with 90 % allowed the same flaky endpoint gives a
    complete run, and the summary says how many requests failed and why."""
    out = tmp_path / "tolerant.json"
    lines: list[str] = []
    cfg = fast_config(
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
    assert_no_children()


@pytest.mark.slow
def test_killed_worker_marks_run_incomplete(tmp_path, stub):
    out = tmp_path / "killed.json"
    cfg = fast_config(kill_worker_at_merge=0, merge_seconds=3.0)
    t0 = time.monotonic()
    with pytest.raises(MergeWorkerError, match=r"rank 1 .* died during merge 0") as info:
        run_calibration(stub(), "ordinary", 6.0, out, config=cfg, progress=None)
    assert info.value.path == str(partial_path(out)) and not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and "died" in doc["error"]
    assert doc["merges"][0]["end_s"] is not None  # the window was closed on the way out
    assert time.monotonic() - t0 < 40
    assert_no_children()


@pytest.mark.slow
def test_ctrl_c_saves_partial_measurements(tmp_path, stub):
    out = tmp_path / "interrupted.json"

    def progress(line: str) -> None:
        if line.startswith("merge 1/") and threading.current_thread() is threading.main_thread():
            # What Ctrl-C does in the main thread: Python's SIGINT handler raises
            # KeyboardInterrupt there. Raised here directly: a signal tripped with
            # _thread.interrupt_main() is handled at the main thread's next bytecode, which
            # can be a finaliser run by the garbage collector (its exceptions are ignored),
            # so under a loaded test run the interrupt was sometimes lost.
            raise KeyboardInterrupt

    cfg = fast_config(merge=MergeConfig(workers=1, merge_mb=1))
    with pytest.raises(KeyboardInterrupt) as info:
        run_calibration(stub(), "ordinary", 6.0, out, config=cfg, progress=progress)
    assert info.value.path == str(partial_path(out)) and not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and "Ctrl-C" in doc["error"]
    assert doc["requests"]["sent"] >= 1
    assert_no_children()


@pytest.mark.parametrize("mode", ["garbage", "html"])
@pytest.mark.slow
def test_invalid_completions_are_failures_and_the_run_is_incomplete(tmp_path, stub, mode):
    """HTTP 200 answers that are not completions were counted as successes (a file marked
    complete with slots 0.25); now they are failures, and above the limit the run stops."""
    out = tmp_path / "garbage.json"
    lines: list[str] = []
    cfg = fast_config(merge=MergeConfig(workers=1, merge_mb=1), control=False)
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
    assert_no_children()


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
    with pytest.raises(DataError) as exc:
        run_calibrate_command(args)
    msg, captured = str(exc.value), capsys.readouterr()
    for fragment in fragments:
        assert fragment in msg, msg
    assert "pass --model" in msg and "lists no model" not in msg
    assert (captured.out + captured.err).count("partial measurements saved") == 1
    assert not out.exists() and partial_path(out).exists()
    assert_no_children()


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
    cfg = fast_config(merge=MergeConfig(workers=1, merge_mb=1), control=False)
    result = run_calibration(stub(), "sync-heavy", 3.0, out, config=cfg, progress=None)
    assert result.complete and result.path == str(out)
    assert check_measured(load_calibration, out).complete is True
    assert not partial_path(out).exists()
    assert_no_children()


def test_label_must_be_a_regime(tmp_path):
    from diloco_gym.live.calibrate import prepare_trace

    trace = Trace(np.arange(20.0), np.ones(20), np.ones(20), 20.0, name="my_trace")
    with pytest.raises(ValueError, match="'my_trace' is not one: pass --label"):
        prepare_trace(trace, 5.0, CalibrationConfig(start_s=0.0))
    win, label, _, _ = prepare_trace(trace, 5.0, CalibrationConfig(start_s=0.0, label="bursty"))
    assert label == "bursty" and win.num_requests == 5


@pytest.mark.slow
def test_probed_run_with_repeats_records_capacity_and_intervals(tmp_path, queue_server):
    """End to end on a stub of known capacity (20 req/s): the probe, the replay at the
    target utilization, repeated phases in a seeded order, intervals in a valid file."""
    url = queue_server(slots=4, service_s=0.2)
    out = tmp_path / "r.json"
    cfg = stub_config(
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
    assert check_measured(load_calibration, out).complete
