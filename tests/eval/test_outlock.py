"""Output directories: ``--force`` replaces only what a report wrote, a symbolic link is kept,
and one writer at a time (report, frontier and sweep share these rules)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_gym.eval import outlock
from diloco_gym.eval import report as rep

ROOT = Path(__file__).resolve().parents[2]


def _fill(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "report.md").write_text(text)
        (tmp / "results.csv").write_text("a\n1\n")

    return fill


def test_marker_lists_the_files_written(tmp_path):
    out = tmp_path / "r"
    rep.write_output_dir(out, False, _fill("one"))
    marker = (out / rep.MARKER).read_text()
    assert marker.splitlines()[-2:] == ["report.md", "results.csv"]
    assert rep.is_report_dir(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no lock file left


def test_force_refuses_a_report_dir_holding_user_files_and_names_them(tmp_path):
    out = tmp_path / "r"
    rep.write_output_dir(out, False, _fill("one"))
    (out / "my_notes.md").write_text("mine")
    (out / "mydata").mkdir()
    (out / "mydata" / "x.bin").write_bytes(b"1")
    with pytest.raises(FileExistsError) as err:
        rep.write_output_dir(out, True, _fill("two"))
    msg = str(err.value)
    assert "'my_notes.md'" in msg and "'mydata/'" in msg and "no report wrote" in msg
    assert (out / "my_notes.md").read_text() == "mine"
    assert (out / "mydata" / "x.bin").read_bytes() == b"1"
    assert (out / "report.md").read_text() == "one"
    # the user moves them out: the report is replaced
    (out / "my_notes.md").unlink()
    (out / "mydata" / "x.bin").unlink()
    (out / "mydata").mkdir(exist_ok=True)
    (out / "mydata").rmdir()
    rep.write_output_dir(out, True, _fill("two"))
    assert (out / "report.md").read_text() == "two"


def test_an_old_marker_without_a_list_accepts_only_report_files(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / rep.MARKER).write_text(rep._MARKER_TEXT)  # the marker of 0.4.0: no file list
    (out / "report.md").write_text("old")
    (out / "fig_bursty.png").write_bytes(b"png")
    assert rep.is_report_dir(out)
    (out / "thesis.tex").write_text("precious")
    assert not rep.is_report_dir(out)
    with pytest.raises(FileExistsError, match="'thesis.tex'"):
        rep.prepare_out_dir(out, True)
    outlock.release_out_locks()


def test_a_symlinked_output_keeps_the_link_and_replaces_its_target(tmp_path):
    target = tmp_path / "real"
    rep.write_output_dir(target, False, _fill("one"))
    link = tmp_path / "link_rep"
    link.symlink_to(target)
    rep.write_output_dir(link, True, _fill("two"))
    assert link.is_symlink() and Path(os.readlink(link)) == target
    assert (target / "report.md").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link_rep", "real"]  # nothing stray


def _hold_lock(out: Path) -> subprocess.Popen:
    """A second process that takes ``out``'s lock and keeps it until killed."""
    code = (
        "import sys, time\n"
        "from diloco_gym.eval import outlock\n"
        f"outlock.lock_out_dir({str(out)!r})\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path, capsys):
    from diloco_gym.cli import main
    from diloco_gym.scale.sweep import run_sweep

    out = tmp_path / "new_dir"
    holder = _hold_lock(out)
    try:
        with pytest.raises(FileExistsError) as err:
            rep.write_output_dir(out, False, _fill("mine"))
        assert f"PID {holder.pid}" in str(err.value) and ".new_dir.lock" in str(err.value)
        assert not out.exists()
        with pytest.raises(SystemExit) as exc:
            main(["report", "--out", str(out), "--seeds", "2", "--regimes", "bursty"])
        assert exc.value.code == 2
        assert "another diloco-gym process" in capsys.readouterr().err
        with pytest.raises(FileExistsError, match="refusing to write the sweep"):
            run_sweep(None, out)  # type: ignore[arg-type]  # refused before the spec is read
    finally:
        holder.kill()
        holder.wait()
    # the holder died: its lock went with it, and the stale lock file does not block
    time.sleep(0.1)
    rep.write_output_dir(out, False, _fill("mine"))
    assert (out / "report.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new_dir"]


@pytest.mark.slow
def test_two_concurrent_reports_one_wins_the_other_is_refused(tmp_path):
    """Two ``report --out new_dir`` at once: exactly one writes, the other exits 2 naming the
    lock (both exited 0 before, one silently replacing the other)."""
    args = [
        sys.executable,
        "-m",
        "diloco_gym.cli",
        "report",
        "--out",
        str(tmp_path / "new_dir"),
        "--seeds",
        "2",
        "--regimes",
        "bursty",
        "--agents",
        "fixed-512",
        "--draws",
        "10",
        "--no-progress",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=300) for p in procs)
    errs = [p.stderr.read() if p.stderr else "" for p in procs]
    assert codes == [0, 2], (codes, errs)
    # the loser is refused by the lock, or (had the winner finished before it started) by
    # the finished report; never replaced silently
    assert any("another diloco-gym process" in e or "already exists" in e for e in errs), errs
