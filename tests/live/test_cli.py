"""The ``calibrate`` command (:mod:`diloco_gym.live.cli`): every option reaches the run, bad
options are usage errors, a refused endpoint and SIGTERM end it cleanly."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from diloco_gym.cli import main
from diloco_gym.errors import DataError, UsageError
from diloco_gym.live import calibrate as calibrate_mod
from diloco_gym.live.calibrate import (
    partial_path,
)
from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command
from diloco_gym.live.engine import (
    engine_available,
)
from diloco_gym.live.merges import free_port

pytest.importorskip("torch")


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
    argv += ["--no-control", "--timeout", "11", "--label", "ordinary", "--link-shares", "1", "0.5"]
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
    assert cfg.link_shares == (1.0, 0.5)
    assert (cfg.timeout_s, cfg.label, cfg.max_error_fraction, cfg.seed) == (
        11.0, "ordinary", 0.25, 17
    )  # fmt: skip
    seen.clear()
    with pytest.raises(UsageError):
        run_calibrate_command(
            parser.parse_args(["--no-probe", "--trace", str(tmp_path / "no.csv")])
        )
    assert seen == {}  # a missing trace file is a usage error before the run
    defaults = parser.parse_args(["--no-probe"])
    assert run_calibrate_command(defaults) == 0
    assert seen["config"].probe is None and seen["source"] == "sync-heavy"
    assert seen["config"].link_shares == (1.0,)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--repeats", "0"], "CalibrationConfig.repeats must be an int >= 1, got 0"),
        (["--engine-model-config", '{"bogus": 1}'], "bogus"),
        (["--target-utilization", "1.5"], "target_utilization must be in (0, 1]"),
        (["--engine-threads", "0"], "CalibrationConfig.engine_threads must be None or an int >= 1"),
        (["--link-shares", "0.5"], "CalibrationConfig.link_shares must include 1"),
    ],
)
def test_bad_calibrate_options_are_usage_errors(tmp_path, monkeypatch, capsys, argv, fragment):
    """An invalid setting is exit 2 with one line on stderr, before anything runs."""
    import argparse

    from diloco_gym.live.cli import add_calibrate_arguments, run_calibrate_command

    monkeypatch.setattr(calibrate_mod, "run_calibration", lambda *a, **k: pytest.fail("ran"))
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    args = parser.parse_args([*argv, "--out", str(tmp_path / "o.json")])
    with pytest.raises(UsageError) as exc:
        run_calibrate_command(args)
    assert exc.value.exit_code == 2 and fragment in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1 and capsys.readouterr().err == ""
    # Through the command line: one line, the project's prefix, exit 2.
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", *argv, "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("diloco-gym: ") and fragment in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refused_endpoint(tmp_path, capsys):
    parser = add_calibrate_arguments(argparse.ArgumentParser())
    out = tmp_path / "cli.json"
    args = parser.parse_args(
        ["--endpoint", f"http://127.0.0.1:{free_port()}", "--duration", "5", "--out", str(out)]
    )
    with pytest.raises(DataError, match="cannot reach the serving endpoint") as exc:
        run_calibrate_command(args)
    assert exc.value.exit_code == 1
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert both.count("partial measurements saved") == 1, both  # said once, not twice
    assert not out.exists()
    assert json.loads((tmp_path / "cli.partial.json").read_text())["complete"] is False
    bad = parser.parse_args(["--regime", "no-such-regime", "--out", str(out)])
    with pytest.raises(UsageError, match="neither a regime"):
        run_calibrate_command(bad)


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
    assert err.strip() == "diloco-gym: terminated (SIGTERM)"
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
