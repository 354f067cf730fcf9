"""The long-trace benchmark's trace writer (``benchmarks/day_trace.py``): the same seed
writes the same trace, the arrivals are a Poisson process at the asked rate, and the file
loads back equal through the native loader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.sim.loaders.native import load_native

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def day_trace():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import day_trace as module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_the_same_seed_gives_the_same_trace_and_another_seed_another(day_trace):
    a = day_trace.day_trace(24, 0.25, 20.0)
    assert a == day_trace.day_trace(24, 0.25, 20.0)
    assert a != day_trace.day_trace(25, 0.25, 20.0)


def test_arrivals_are_poisson_at_the_rate_and_tokens_positive_integers(day_trace):
    tr = day_trace.day_trace(7, 1.0, 20.0)
    expected = 20.0 * 3600.0
    # a Poisson count: within 5 standard deviations of its mean
    assert abs(tr.num_requests - expected) < 5.0 * np.sqrt(expected)
    gaps = np.diff(tr.arrival_s)
    assert gaps.min() >= 0.0 and tr.arrival_s[-1] < tr.duration_s == 3600.0
    # exponential gaps: the coefficient of variation is 1
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03
    for tokens, mu in ((tr.prompt_tokens, 6.5), (tr.output_tokens, 5.0)):
        assert tokens.dtype == np.int64 and tokens.min() >= 1
        assert abs(np.median(np.log(tokens)) - mu) < 0.05


def test_the_script_writes_a_file_that_loads_back_equal(day_trace, tmp_path):
    out = tmp_path / "day.csv"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "day_trace.py"), str(out), "--hours", "0.1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "requests over 360 s" in done.stdout
    assert load_native(out) == day_trace.day_trace(24, 0.1, 20.0)


def test_the_script_refuses_a_non_positive_length(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "day_trace.py"), str(tmp_path / "x.csv"),
         "--hours", "0"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "--hours and --rate must be positive" in done.stderr
    assert not (tmp_path / "x.csv").exists()
