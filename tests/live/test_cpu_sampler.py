"""The host CPU sampler of the live replay: psutil where installed, else the load average."""

from __future__ import annotations

import builtins
import time

import pytest

from diloco_gym.live.replay import CpuSampler


def _sample(sampler: CpuSampler, wait_s: float = 1.0) -> float | None:
    sampler.start()
    deadline = time.monotonic() + wait_s
    while sampler.value is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    return sampler.value


def test_sampler_reads_psutil(monkeypatch):
    psutil = pytest.importorskip("psutil")
    calls = []

    def fake(interval=None):
        calls.append(interval)
        return 37.5

    monkeypatch.setattr(psutil, "cpu_percent", fake)
    assert _sample(CpuSampler(interval_s=0.02)) == pytest.approx(0.375)
    assert calls and all(c is None for c in calls)  # never blocks the sampling thread


def test_sampler_without_psutil_uses_the_load_average(monkeypatch):
    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError("no psutil")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.0, 0.0))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _sample(CpuSampler(interval_s=0.02)) == pytest.approx(0.25)
