"""The report's time split (``benchmarks/time_split.py``): it runs the command as the CLI
does, every part it names took time, and the parts add up to the total it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a small report in a subprocess


def test_a_small_report_splits_into_parts_that_add_up():
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "time_split.py"), "report", "--seeds", "2",
            "--regimes", "bursty", "--draws", "20", "--in-process-agents",
        ],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    total = float(re.search(r": ([\d.]+) s in this process", out).group(1))
    lines = re.findall(r"^  (\S[^:]*?)\s+([\d.-]+) s$", out, flags=re.M)
    parts = {name: float(value) for name, value in lines}
    ran = (
        "start-up (importing the CLI and its modules)",
        "agents' episodes",
        "scoring",
        "calibration check",
        "statistics",
        "figures",
        "everything else",
    )
    assert all(parts[name] > 0 for name in ran), parts  # each part a report has ran
    assert parts["episode builds"] == parts["rate-clairvoyant reference"] == 0.0  # frontier's
    assert sum(parts.values()) == pytest.approx(total, abs=0.05)  # printed to 0.01 s each
    decisions = int(re.search(r"agent decisions: ([\d,]+)", out).group(1).replace(",", ""))
    assert decisions > 2 * 8 * 10  # two episodes of eight agents, tens of decisions each
    rest = float(re.search(r"everything but the episodes: ([\d.]+) s", out).group(1))
    assert rest == pytest.approx(total - parts["agents' episodes"], abs=0.02)


def test_a_backend_that_runs_cells_elsewhere_is_refused():
    """Cells in other processes would escape the timers: the split says so and stops."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "time_split.py"), "--backend", "processes"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "without --backend" in proc.stderr
