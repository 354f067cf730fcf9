"""The agents end to end: the report's deployability marks and `diloco-gym run` / `train`."""

from __future__ import annotations

import numpy as np
import pytest

import diloco_gym
from diloco_gym.cli import main
from diloco_gym.sim.traces import Trace


def test_report_marks_non_deployable_agents():
    from diloco_gym.eval.report import ReportConfig, render_markdown, run_protocol

    res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=["fixed-512", "offline-oracle"], seeds=2, draws=20),
        progress=False,
    )
    rows, summ = res["rows"], res["summary"].set_index("agent")
    assert dict(zip(rows["agent"], rows["deployable"], strict=True)) == {
        "fixed-512": True,
        "offline-oracle": False,
    }
    assert bool(summ.loc["offline-oracle", "deployable"]) is False
    assert bool(summ.loc["fixed-512", "deployable"]) is True
    md = render_markdown(res, [])
    assert "| offline-oracle (non-deployable) |" in md and "| fixed-512 |" in md
    with pytest.raises(ValueError, match="given twice"):
        run_protocol(
            ReportConfig(regimes=["bursty"], agents=["fixed-512", "fixed-512"], seeds=2, draws=2),
            progress=False,
        )


def test_cli_run_marks_the_oracle_non_deployable(capsys):
    assert main(["run", "--agent", "offline-oracle", "--regime", "bursty", "--seeds", "2"]) == 0
    assert "agent offline-oracle (non-deployable) on bursty" in capsys.readouterr().out


def test_cli_run_prints_per_seed_table(capsys):
    assert main(["run", "--agent", "wa-diloco", "--regime", "bursty", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "sync-excess %" in out and "total" in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 "))]) == 2


def test_cli_run_unknown_names(capsys):
    with pytest.raises(SystemExit, match="valid agents"):
        main(["run", "--agent", "nope", "--regime", "bursty", "--seeds", "1"])
    with pytest.raises(SystemExit, match="valid regimes: ordinary"):
        main(["run", "--agent", "fixed-256", "--regime", "burst", "--seeds", "1"])


def test_cli_run_on_a_trace_file(tmp_path, capsys):
    from diloco_gym.sim.loaders import save_native

    tr = diloco_gym.get_regime("bursty")(np.random.default_rng(0))
    path = tmp_path / "t.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    assert (
        main(
            [
                "run",
                "--agent",
                "fixed-512",
                "--trace",
                str(path),
                "--format",
                "native",
                "--seeds",
                "2",
            ]
        )
        == 0
    )
    assert "fixed-512 on t" in capsys.readouterr().out


def test_cli_train_without_the_rl_extra(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)  # as if SB3 were missing
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "ppo", "--timesteps", "10", "--out", "x"])
    assert exc.value.code == 2
    assert "needs the 'rl' extra" in capsys.readouterr().err
