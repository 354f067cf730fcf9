"""Output directory locks: one writer at a time (report, frontier and sweep share this
rule; the directory's other rules are tested in ``test_output_dir.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_gym.eval import output_dir

ROOT = Path(__file__).resolve().parents[2]


def _fill(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "report.md").write_text(text)
        (tmp / "results.csv").write_text("a\n1\n")

    return fill


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
            output_dir.write_output_dir(out, False, _fill("mine"))
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
    output_dir.write_output_dir(out, False, _fill("mine"))
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
