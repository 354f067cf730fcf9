"""The frontier runs on the report's backends (serial, processes, Ray) with byte-identical
frontier.csv and curves.csv, synthetic regimes and trace windows alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diloco_gym.cli import main
from diloco_gym.eval import frontier as fr

ROOT = Path(__file__).resolve().parents[2]

SMALL = {
    "regimes": ["bursty", "sync-heavy"],
    "budgets_per_hour": [60.0, 96.0],
    "seeds": 3,
    "draws": 30,
    "budget_agents": ["online-forecast-budget", "fixed-budget"],
    "free_agents": ["fixed-512", "wa-diloco"],
}


def _files(config: fr.FrontierConfig, out: Path, **backend) -> tuple[bytes, bytes, dict]:
    result = fr.run_frontier(config, progress=False, **backend)
    fr.write_frontier(result, out)
    payload = json.loads((out / "frontier.json").read_text())
    for volatile in ("elapsed_s", "command"):  # timings and the command may differ
        payload.pop(volatile, None)
    return (out / "frontier.csv").read_bytes(), (out / "curves.csv").read_bytes(), payload


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return _files(fr.FrontierConfig(**SMALL), tmp_path_factory.mktemp("serial") / "f")


@pytest.mark.slow
def test_frontier_identical_on_two_processes(serial, tmp_path) -> None:
    got = _files(fr.FrontierConfig(**SMALL), tmp_path / "f", backend="processes", jobs=2)
    assert got[0] == serial[0] and got[1] == serial[1]
    assert got[2] == serial[2]
    # Every unit is there: 2 regimes x 3 seeds x (2 free + 2 budget agents x 2 budgets).
    assert len(serial[0].splitlines()) == 1 + 2 * 3 * (2 + 2 * 2)


@pytest.mark.slow
def test_trace_frontier_identical_on_two_processes(tmp_path) -> None:
    """Trace windows: every worker rebuilds the windows from the file."""
    config = dict(
        trace=str(ROOT / "traces" / "bursty.csv"),
        window_s=300.0,
        budgets_per_hour=[96.0],
        seeds=2,
        draws=20,
        budget_agents=["online-forecast-budget"],
        free_agents=["fixed-512"],
    )
    one = _files(fr.FrontierConfig(**config), tmp_path / "serial")
    two = _files(fr.FrontierConfig(**config), tmp_path / "proc", backend="processes", jobs=2)
    assert one[:2] == two[:2] and one[2] == two[2]
    assert b"replay:bursty" in one[0]


@pytest.mark.slow
def test_frontier_identical_on_ray(serial, tmp_path) -> None:
    pytest.importorskip("ray")
    import ray

    from diloco_gym.backends import init_ray

    started = not ray.is_initialized()
    init_ray(jobs=2)
    try:
        got = _files(fr.FrontierConfig(**SMALL), tmp_path / "f", backend="ray")
    finally:
        if started:
            ray.shutdown()
    assert got[0] == serial[0] and got[1] == serial[1] and got[2] == serial[2]


def test_cli_frontier_ray_address_needs_ray_backend(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main(
            [
                "frontier",
                "--backend",
                "processes",
                "--ray-address",
                "auto",
                "--out",
                str(tmp_path / "f"),
                "--no-progress",
            ]
        )
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "--ray-address needs --backend ray" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "f").exists()


def test_cli_frontier_help_lists_the_backends(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["frontier", "--help"])
    out = capsys.readouterr().out
    assert "--backend {serial,processes,ray}" in out and "--jobs" in out
