"""The command line: one error path, safe report --force, atomic reports, help and units."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import diloco_gym
from diloco_gym.cli import main
from diloco_gym.commands import run as run_command
from diloco_gym.eval import report as rep
from diloco_gym.eval import report_figures, summary
from diloco_gym.sim.loaders import save_native
from diloco_gym.sim.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
QUICK = [
    "--seeds",
    "2",
    "--regimes",
    "bursty",
    "--agents",
    "fixed-512",
    "--draws",
    "20",
    "--no-progress",
]


def _cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m diloco_gym.cli ARGS`` in a subprocess, importing this checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DILOCO_GYM_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, "-m", "diloco_gym.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fails(argv: list[str], capsys, code: int) -> str:
    """Run ``main(argv)``, check it exits with ``code`` after one stderr line; return it."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == code, (exc.value.code, capsys.readouterr())
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("diloco-gym: "), err
    assert "Traceback" not in err
    return lines[0]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def small_result():
    cfg = rep.ReportConfig(regimes=["bursty"], agents=["fixed-512", "wa-diloco"], seeds=2, draws=20)
    return rep.run_protocol(cfg, progress=False)


def _short_trace(path: Path, duration_s: float) -> Path:
    n = max(2, int(duration_s))
    save_native(
        Trace(np.linspace(0.0, duration_s * 0.99, n), np.full(n, 100), np.full(n, 10), duration_s),
        path,
    )
    return path


# ------------------------------------------------------------------ report --force safety
def test_force_refuses_the_current_directory_and_keeps_its_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    line = _fails(["report", "--out", ".", "--force", *QUICK], capsys, 2)
    assert "current directory" in line
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_force_refuses_home_root_and_a_parent_of_the_cwd(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "work" / "deep").mkdir(parents=True)
    (home / "keep.txt").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home / "work" / "deep")
    assert "home directory" in _fails(["report", "--out", str(home), "--force", *QUICK], capsys, 2)
    assert "contains the current directory" in _fails(
        ["report", "--out", "..", "--force", *QUICK], capsys, 2
    )
    with pytest.raises(FileExistsError, match="filesystem root"):
        rep.prepare_out_dir(Path(os.path.abspath(os.sep)), force=True)
    assert (home / "keep.txt").exists()


def test_force_refuses_a_non_empty_directory_without_the_marker(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "results.csv").write_text("not a report")
    (out / "thesis.tex").write_text("precious")
    line = _fails(["report", "--out", str(out), "--force", *QUICK], capsys, 2)
    assert rep.MARKER in line and "only a previous report" in line
    assert (out / "thesis.tex").read_text() == "precious"
    assert (out / "results.csv").read_text() == "not a report"


@pytest.mark.slow
def test_force_replaces_a_marked_report_and_refuses_an_unmarked_old_one(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "--out", str(out), *QUICK]) == 0
    assert (out / rep.MARKER).is_file()
    assert "already exists" in _fails(["report", "--out", str(out), *QUICK], capsys, 2)
    (out / "report.md").write_text("old")
    assert main(["report", "--out", str(out), "--force", *QUICK]) == 0
    assert (out / "report.md").read_text().startswith("# diloco-gym")
    # a report of an earlier version (no marker, only report-like files) is recognised,
    # but not replaced: nothing tells its files from the user's, so --force deletes none
    (out / rep.MARKER).unlink()
    assert rep.is_report_dir(out)
    before = sorted(p.name for p in out.iterdir())
    msg = _fails(["report", "--out", str(out), "--force", *QUICK], capsys, 2)
    assert f"refusing to replace {out}: it has no diloco-gym report marker" in msg
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no stray siblings


def test_empty_existing_directory_needs_no_force(tmp_path, small_result):
    out = tmp_path / "empty"
    out.mkdir()
    rep.write_report(small_result, out)
    assert (out / "report.md").is_file()


# ------------------------------------------------------------------ atomic replacement
def test_interrupted_replacement_keeps_the_old_report(tmp_path, small_result, monkeypatch):
    out = tmp_path / "r"
    rep.write_report(small_result, out)
    (out / "report.md").write_text("old report")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(rep, "write_figures", boom)
    with pytest.raises(KeyboardInterrupt):
        rep.write_report(small_result, out, force=True)
    assert (out / "report.md").read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.slow
def test_new_report_is_complete_before_the_old_one_moves(tmp_path, small_result, monkeypatch):
    out = tmp_path / "r"
    rep.write_report(small_result, out)
    real_replace = os.replace
    seen = []

    def spy(src, dst):
        src, dst = Path(src), Path(dst)
        if src == out:  # the old report is moved aside: the new one must be complete
            partial = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
            assert len(partial) == 1
            assert {"report.md", "results.csv", "report.json", rep.MARKER} <= {
                p.name for p in partial[0].iterdir()
            }
        seen.append((src.name, dst.name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    rep.write_report(small_result, out, force=True)
    assert [d for _, d in seen] == [f".r.old-{os.getpid()}", "r"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.slow
def test_a_killed_run_leaves_only_leftovers_the_next_run_cleans(tmp_path):
    """The process dies (os._exit) right after moving the old report aside."""
    out = tmp_path / "r"
    script = f"""
import os, sys
from diloco_gym.eval import report as rep
from diloco_gym.eval import summary
cfg = rep.ReportConfig(regimes=["bursty"], agents=["fixed-512"], seeds=2, draws=10)
res = rep.run_protocol(cfg, progress=False)
rep.write_report(res, {str(out)!r})
real = os.replace
def dying(src, dst):
    real(src, dst)
    if ".old-" in str(dst):
        os._exit(9)
os.replace = dying
rep.write_report(res, {str(out)!r}, force=True)
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert (
        "r" not in left and any(".old-" in n for n in left) and any(".partial-" in n for n in left)
    ), left
    # an unrelated hidden directory with a similar name but no marker is not touched
    foreign = tmp_path / f".r.partial-{_dead_pid()}"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    cleaned = rep.clean_leftovers(out)
    assert len(cleaned) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [foreign.name]


def test_next_run_removes_leftovers_and_writes_the_report(tmp_path, small_result):
    out = tmp_path / "r"
    pid = _dead_pid()
    for kind in ("partial", "old"):
        d = tmp_path / f".r.{kind}-{pid}"
        d.mkdir()
        (d / rep.MARKER).write_text("diloco-gym report directory")
        (d / "report.md").write_text("stale")
    rep.write_report(small_result, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


# ------------------------------------------------------------------ one error path
@pytest.mark.slow
def test_run_trace_errors_are_one_line(tmp_path, capsys):
    missing = tmp_path / "missing.csv"
    assert "missing.csv" in _fails(
        ["run", "--agent", "fixed-512", "--trace", str(missing)], capsys, 1
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("# duration_s=100\narrival_s,prompt_tokens,output_tokens\n1.0,abc,3\n")
    assert "row 1" in _fails(
        ["run", "--agent", "fixed-512", "--trace", str(bad), "--format", "native"], capsys, 1
    )
    assert "native.csv" in _fails(
        [
            "run",
            "--agent",
            "fixed-512",
            "--trace",
            str(_short_trace(tmp_path / "native.csv", 100.0)),
            "--format",
            "azure",
        ],
        capsys,
        1,
    )
    short = _short_trace(tmp_path / "short.csv", 30.0)
    line = _fails(["run", "--agent", "fixed-512", "--trace", str(short), "--seeds", "1"], capsys, 1)
    assert "too short" in line and "at least 39.0 s" in line
    # the stated minimum is the real one: a 39.1 s trace runs as one 39.1 s window...
    ok = _short_trace(tmp_path / "ok.csv", 39.1)
    assert (
        main(
            [
                "run",
                "--agent",
                "fixed-512",
                "--trace",
                str(ok),
                "--seeds",
                "1",
                "--window-s",
                "39.1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    # ...and a window below it is refused with that minimum
    line = _fails(
        ["run", "--agent", "fixed-512", "--trace", str(ok), "--window-s", "30"], capsys, 2
    )
    assert "too short" in line and "at least 39.0 s" in line
    assert "too short" in _fails(
        ["report", "--out", str(tmp_path / "r"), "--trace", str(short), *QUICK], capsys, 1
    )
    # with a progress bar open, the message is still the last and only line
    res = _cli(
        [
            "report",
            "--out",
            "r",
            "--trace",
            str(short),
            "--seeds",
            "2",
            "--agents",
            "fixed-512",
            "--draws",
            "10",
        ],
        tmp_path,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("diloco-gym: ")
    assert not (tmp_path / "r").exists()


def test_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    def broken(args):
        raise TypeError("something internal")

    monkeypatch.setattr(run_command, "run", broken)
    line = _fails(["run", "--agent", "fixed-512"], capsys, 1)
    assert "internal error: TypeError: something internal" in line
    monkeypatch.setenv("DILOCO_GYM_TRACEBACK", "1")
    with pytest.raises(TypeError):
        main(["run", "--agent", "fixed-512"])


def test_ctrl_c_during_report_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(rep, "run_protocol", interrupted)
    line = _fails(["report", "--out", str(tmp_path / "r"), *QUICK], capsys, 130)
    assert "interrupted" in line and "no report written" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigint_to_a_running_report_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diloco_gym.cli",
            "report",
            "--out",
            "r",
            "--seeds",
            "400",
            "--draws",
            "2000",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    err = ""
    assert proc.stderr is not None
    while time.monotonic() < deadline:  # wait for the progress bar: episodes are running
        ch = proc.stderr.read(1)
        err += ch
        if "report:" in err or not ch:
            break
    assert "report:" in err, err
    # the rest of the progress line sits in the text stream's buffer, which communicate()
    # (reading the file descriptor itself) would skip
    err += proc.stderr.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=60)
    err += rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1].startswith("diloco-gym: interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_entry_point_prints_no_traceback(tmp_path):
    res = _cli(["run", "--agent", "fixed-512", "--trace", "nope.csv"], tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr
    assert "nope.csv" in res.stderr


# ------------------------------------------------------------------ help, version, units
def test_version_comes_from_package_metadata(capsys):
    import re
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"diloco-gym {diloco_gym.__version__}"
    assert diloco_gym.__version__ == version("diloco-gym")
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert declared is not None and diloco_gym.__version__ == declared.group(1)


def test_help_shows_defaults_and_explains_seed0(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 20)" in text and "(default: bursty)" in text
    # stated once, in the help's own words (not again as "(default: auto)")
    assert text.count("(default: auto") == 1 and "(default: auto, by extension" in text
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "SEED0 .. SEED0+SEEDS-1" in text and "never used in training" in text
    assert "(default: 1000)" in text


def test_console_and_markdown_use_merges_per_hour_and_small_p(tmp_path, small_result):
    summary = small_result["summary"].copy()
    summary.loc[:, "p_value"] = 1e-5
    summary.loc[:, "p_holm"] = 2e-4
    text = rep.console_summary(summary)
    assert "merges/h" in text.splitlines()[0]
    assert "<0.001" in text and "0.000" not in text
    per_hour = f"{summary['merges_per_hour'].iloc[0]:.1f}"
    assert per_hour in text
    md = rep.render_markdown({**small_result, "summary": summary}, [])
    assert "| merges/h |" in md and "<0.001" in md


def test_run_table_uses_merges_per_hour(capsys):
    assert main(["run", "--agent", "fixed-512", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if "seed" in ln and "merges" in ln)
    assert "merges/h" in header
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("0 "))
    assert float(row.split()[1]) == pytest.approx(48.0)  # 8 merges in 600 s


# ------------------------------------------------------------------ figures
def test_no_claim_panels_carry_words_not_zero_bars(small_result, monkeypatch, tmp_path):
    zero = small_result["summary"].copy()
    zero["regime"] = "ordinary"
    for c in (
        "sync_excess_pct",
        "matched_random_pct",
        "matched_random_p05",
        "matched_random_p95",
        "oracle_same_budget_pct",
        "diff_pp",
        "diff_ci_low",
        "diff_ci_high",
    ):
        zero[c] = 0.0
    rows = small_result["rows"].copy()
    rows2 = rows.assign(regime="ordinary")
    result = {
        **small_result,
        "summary": pd.concat([small_result["summary"], zero]),
        "rows": pd.concat([rows, rows2]),
        "timelines": {},
    }
    drawn = {}

    def keep(fig, out, name, names):
        drawn[name] = [t.get_text() for ax in fig.axes for t in ax.texts]
        drawn[name + ":bars"] = sum(len(ax.patches) for ax in fig.axes)
        names.append(name)

    monkeypatch.setattr(report_figures, "_save", keep)
    report_figures.write_figures(result, tmp_path)
    assert "no claim: no SLO effect" in drawn["fig_ordinary.png"]
    assert drawn["fig_ordinary.png:bars"] == 0
    assert "no claim: no SLO effect" not in drawn["fig_bursty.png"]
    assert drawn["fig_bursty.png:bars"] > 0
    verdict_only = small_result["summary"].assign(verdict="no claim (no SLO effect)")
    assert report_figures._no_claim_reason(verdict_only) is not None
    assert report_figures._no_claim_reason(small_result["summary"]) is None


def test_scatter_labels_do_not_overprint():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.array([48.0, 48.0, 56.0, 48.0, 96.0])
    y = np.array([6.66, 6.55, 7.35, 4.76, 12.9])
    names = ["fixed-512", "calibrated-wa", "wa-diloco", "offline-oracle", "fixed-256"]
    ax.scatter(x, y)
    ax.set_xlim(0, 200)
    ax.set_ylim(0, 25)
    report_figures._annotate_points(fig, ax, x, y, names)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) >= 3
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (ax.texts[i].get_text(), ax.texts[j].get_text())
    assert sorted(n for t in ax.texts for n in t.get_text().split(", ")) == sorted(names)
    plt.close(fig)


def test_timeline_key_is_in_words(small_result):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from diloco_gym.envs.render import plot_timeline_panels

    tl = small_result["timelines"]["bursty"]
    fig = plt.figure(figsize=(12, 4))
    plot_timeline_panels(fig, tl["episode"], tl["schedules"], tl["params"], tl["sidecar"])
    legend = fig.axes[0].get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert any("misses its SLO only because of a merge" in t for t in labels)
    assert any("merge window" in t for t in labels)
    plt.close(fig)


def test_report_json_and_files_of_a_cli_report(tmp_path):
    out = tmp_path / "r"
    assert main(["report", "--out", str(out), *QUICK]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["summary"][0]["merges_per_hour"] == pytest.approx(48.0)
    assert "merges_per_hour" in pd.read_csv(out / "results.csv").columns


@pytest.mark.slow
def test_report_holm_across_settings(tmp_path, capsys):
    """--holm-across-settings: one Holm family over every regime x agent, named in
    report.json and report.md; without it one family per regime, and the all-settings p
    beside it."""
    quick = ["--seeds", "2", "--agents", "fixed-512", "wa-diloco", "--draws", "20"]
    args = [*quick, "--regimes", "bursty", "sync-heavy", "--no-progress"]
    per, allf = tmp_path / "per", tmp_path / "all"
    assert main(["report", "--out", str(per), *args]) == 0
    assert main(["report", "--out", str(allf), *args, "--holm-across-settings"]) == 0
    jp, ja = (json.loads((d / "report.json").read_text()) for d in (per, allf))
    assert jp["holm_family"] == summary.HOLM_PER_SETTING
    assert ja["holm_family"] == summary.HOLM_ACROSS_SETTINGS
    assert {r["holm_family"] for r in jp["summary"]} == {2}
    assert {r["holm_family"] for r in ja["summary"]} == {4}
    p_all = [r["p_holm_all_settings"] for r in jp["summary"]]
    assert [r["p_holm"] for r in ja["summary"]] == pytest.approx(p_all)
    assert "--holm-across-settings makes the verdicts use it" in (per / "report.md").read_text()
    assert summary.HOLM_ACROSS_SETTINGS in (allf / "report.md").read_text()
    fleet = ["report", "--fleet", str(FLEET_EXAMPLE), "--out", str(tmp_path / "f")]
    msg = _fails([*fleet, "--holm-across-settings"], capsys, 2)
    assert "--holm-across-settings not used with --fleet" in msg


# ------------------------------------------------------------------ fleet
FLEET_EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "fleet.toml"


@pytest.mark.slow
def test_run_fleet_table(capsys):
    assert (
        main(["run", "--agent", "pressure-gate", "--fleet", str(FLEET_EXAMPLE), "--seeds", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "4 sites, F=4, 8-bit" in out
    header = next(ln for ln in out.splitlines() if "syncs/h" in ln)
    assert all(n in header for n in ("eu", "us", "asia", "small", "worst site"))


def test_fleet_file_errors_are_one_line(tmp_path, capsys):
    assert "fleet configuration file not found" in _fails(
        ["run", "--agent", "pressure-gate", "--fleet", str(tmp_path / "no.toml")], capsys, 1
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet]\nbits = 12\n")
    msg = _fails(["run", "--agent", "pressure-gate", "--fleet", str(bad)], capsys, 1)
    assert str(bad) in msg and "bits must be one of" in msg
    prec = tmp_path / "prec.toml"
    prec.write_text('[fleet]\nbits_options = [4, 32]\n[[site]]\nname = "bursty"\n')
    for argv, what in (
        (["run", "--agent", "pressure-gate", "--fleet", str(prec)], "run --fleet"),
        (["frontier", "--fleet", str(prec), "--out", str(tmp_path / "fr")], "frontier --fleet"),
        (["report", "--fleet", str(prec), "--out", str(tmp_path / "rp")], "fleet report"),
    ):
        msg = _fails(argv, capsys, 1)
        assert what in msg and "scores fixed-precision fleets only" in msg, msg
    assert "--stride-s not used with --fleet" in _fails(
        ["report", "--fleet", str(FLEET_EXAMPLE), "--stride-s", "60", "--out", str(tmp_path / "j")],
        capsys,
        2,
    )
    assert "--rate-scale not used with --fleet" in _fails(
        ["run", "--agent", "pressure-gate", "--fleet", str(FLEET_EXAMPLE), "--rate-scale", "2"],
        capsys,
        2,
    )
    assert "--fleet replaces --regimes" in _fails(
        ["report", "--fleet", str(FLEET_EXAMPLE), "--regimes", "bursty", "--out",
         str(tmp_path / "r")], capsys, 2,
    )  # fmt: skip


@pytest.mark.slow
def test_frontier_fleet_runs_each_budget_at_matched_syncs(tmp_path, capsys):
    """``frontier --fleet``: budgets in merges/h become syncs per 600 s episode; matched
    random runs at the agent's syncs; the same command gives the same frontier.csv."""
    args = ["frontier", "--fleet", str(FLEET_EXAMPLE), "--budgets", "300", "400", "--seeds", "2",
            "--draws", "20", "--budget-agents", "fixed-budget", "--agent", "pressure-gate",
            "--in-process-agents", "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "fleet frontier written to" in out and "| 50 | fixed-budget |" in out
    f = pd.read_csv(tmp_path / "a" / "frontier.csv")
    assert sorted(set(f["budget"])) == [50, 67]  # 300 and 400 merges/h x 600 s, rounded
    assert set(f["agent"]) == {"fixed-budget", "pressure-gate"}
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    one = (tmp_path / "a" / "frontier.csv").read_bytes()
    assert one == (tmp_path / "b" / "frontier.csv").read_bytes()


@pytest.mark.slow
def test_report_fleet_writes_a_report(tmp_path, capsys):
    out = tmp_path / "fleet-report"
    args = ["report", "--fleet", str(FLEET_EXAMPLE), "--agents", "pressure-gate", "--seeds", "2"]
    assert main([*args, "--draws", "20", "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["fleet"]["sites"] == ["eu", "us", "asia", "small"]
    assert data["summary"][0]["verdict"] == "inconclusive (too few episodes)"
    assert (out / "results.csv").is_file() and (out / "report.md").is_file()


@pytest.mark.parametrize("command", ["run", "report", "frontier", "bench", "sweep", "tune"])
def test_help_states_each_default_once_and_no_false_ones(command):
    import argparse

    from diloco_gym.cli import build_parser

    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices[command].format_help().split())  # one line, no wrapping
    assert "(default: None)" not in text and "(default: False)" not in text
    for action in sub.choices[command]._actions:
        if action.help and action.required:
            assert "default" not in (action.help or ""), action.dest
    helps = [" ".join((a.help or "").split()) for a in sub.choices[command]._actions]
    assert all(h.count("default") <= 1 for h in helps)
    # a real default is still shown once
    if command == "report":
        assert text.count("report directory (default: report)") == 1


@pytest.mark.slow
def test_bench_writes_a_submission_that_validates(tmp_path, capsys):
    """``diloco-gym bench`` on one task, then ``--validate`` of the submission it wrote: the
    honest file passes; with one score changed, one line names the task and both numbers."""
    out = tmp_path / "bench"
    small = ["--tasks", "bursty@72/h", "--seeds", "2", "--draws", "10", "--no-progress"]
    small += ["--in-process-agents"]  # sealing is the frontier's (tested there)
    args = ["bench", "--agent", "wa-diloco", "--group", "pair", "fixed-budget", "pressure-gate"]
    assert main([*args, *small, "--out", str(out)]) == 0
    assert "| wa-diloco | 1 | 1 |" in capsys.readouterr().out
    sub = out / "submission.json"
    assert main(["bench", "--validate", str(sub), "--no-progress", "--in-process-agents"]) == 0
    assert "valid: 3 claimed score(s) on 1 task(s)" in capsys.readouterr().out
    doc = json.loads(sub.read_text())
    doc["entrants"][0]["scores"]["bursty@72/h"] = [0.99]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    line = _fails(
        ["bench", "--validate", str(bad), "--no-progress", "--in-process-agents"], capsys, 1
    )
    assert line.startswith(f"diloco-gym: {bad}: entrant wa-diloco, task bursty@72/h, run 0 ")
    assert "claimed gap captured 0.9900, the replay gives " in line
