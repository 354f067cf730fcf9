"""The shipped traces are exactly what the generators make."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco_gym.sim.loaders import load_trace
from diloco_gym.sim.make_traces import main
from diloco_gym.sim.regimes import REGIMES

SHIPPED = Path(__file__).resolve().parents[2] / "traces"


def test_regeneration_is_byte_identical(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    for name in REGIMES:
        new = (tmp_path / f"{name}.csv").read_bytes()
        assert new == (SHIPPED / f"{name}.csv").read_bytes(), name
    assert "bursty.csv" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(REGIMES))
def test_shipped_traces_load(name):
    tr = load_trace(SHIPPED / f"{name}.csv")
    assert tr.duration_s == 600.0 and tr.num_requests > 1000
