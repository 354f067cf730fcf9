"""``diloco-gym sweep``: a grid of protocol runs that resumes where it stopped (a stopped or
killed sweep, resumed, writes exactly what an uninterrupted one does), records a raising cell
and completes the rest, and refuses malformed sweep files with one line naming the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diloco_gym.cli import main
from diloco_gym.scale.sweep import SweepDataError, SweepFileError, load_sweep, run_sweep
from diloco_gym.sim.loaders import save_native
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.traces import Trace

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = ("results.csv", "summary.csv", "errors.csv", "summary.md")

SPEC = """
name = "t"
agents = ["fixed-512", "wa-diloco"]
seeds = 3
draws = 30
[grid]
regime = ["bursty", "sync-heavy"]
merge_budget = [8, 16]
"""


def _write(tmp: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("whole")
    res = run_sweep(load_sweep(_write(tmp, SPEC)), tmp / "out", progress=False)
    assert res["complete"] and res["failed"] == 0 and res["run"] == res["cells"] == 16
    got = _outputs(tmp / "out")
    table = pd.read_csv(tmp / "out" / "results.csv")
    assert len(table) == 4 * 3 * 2  # points x seeds x agents
    assert list(table.columns[:4]) == ["sweep", "point", "grid.regime", "grid.merge_budget"]
    # The budget is the env's: every episode of a point merges exactly that many times.
    assert (table["merges"] == table["grid.merge_budget"]).all()
    assert len(pd.read_csv(tmp / "out" / "summary.csv")) == 4 * 2
    parquet = pd.read_parquet(tmp / "out" / "results.parquet")
    pd.testing.assert_frame_equal(parquet, table, check_dtype=False)
    return got


@pytest.mark.slow
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, uninterrupted):
    spec = load_sweep(_write(tmp_path, SPEC))
    first = run_sweep(
        spec, tmp_path / "out", progress=False, max_cells=5, backend="processes", jobs=2
    )
    assert first["run"] == 5 and not first["complete"]
    assert "not run yet" in (tmp_path / "out" / "summary.md").read_text()
    second = run_sweep(spec, tmp_path / "out", progress=False, backend="processes", jobs=2)
    assert second["skipped"] == 5 and second["run"] == 11 and second["complete"]
    assert _outputs(tmp_path / "out") == uninterrupted
    third = run_sweep(spec, tmp_path / "out", progress=False)
    assert third["run"] == 0 and third["skipped"] == 16
    assert _outputs(tmp_path / "out") == uninterrupted


@pytest.mark.slow
def test_killed_sweep_resumes(tmp_path, uninterrupted):
    """SIGKILL mid-sweep (a half-written last record included): the rerun runs only what
    is missing and writes the uninterrupted sweep's files."""
    cfg = _write(tmp_path, SPEC)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diloco_gym.cli",
            "sweep",
            str(cfg),
            "--out",
            str(out),
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = out / "cells.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if store.exists() and store.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stored = store.read_bytes().count(b"\n")
    assert 2 <= stored < 16, "the sweep must be killed before it finished"
    with open(store, "ab") as f:
        f.write(b'{"key": "unit/half-written", "ok": tr')  # a record cut by the kill
    res = run_sweep(load_sweep(cfg), out, progress=False)
    assert res["complete"] and res["skipped"] == stored and res["run"] == 16 - stored
    assert _outputs(out) == uninterrupted


@pytest.mark.slow
def test_raising_cell_is_recorded_and_the_rest_completes(tmp_path):
    spec = load_sweep(_write(tmp_path, SPEC.replace("[8, 16]", "[8, 1000]")))
    out = tmp_path / "out"
    res = run_sweep(spec, out, progress=False, backend="processes", jobs=2)
    assert res["complete"]
    # An infeasible budget fails the units of its two points (3 seeds each); their
    # calibration cells do not step the env and succeed.
    assert res["failed"] == 6
    errors = pd.read_csv(out / "errors.csv")
    assert sorted(errors["point"].unique()) == [1, 3]
    assert errors["error"].str.startswith("ValueError: merge_budget=1000 is infeasible").all()
    table = pd.read_csv(out / "results.csv")
    assert sorted(table["point"].unique()) == [0, 2] and len(table) == 2 * 3 * 2
    assert set(pd.read_csv(out / "summary.csv")["point"]) == {0, 2}
    assert "## Failed cells (6)" in (out / "summary.md").read_text()
    # Failed cells are stored: a rerun skips them, --retry-failed runs them again.
    assert run_sweep(spec, out, progress=False)["run"] == 0
    assert run_sweep(spec, out, progress=False, retry_failed=True)["run"] == 6


@pytest.mark.slow
def test_trace_grid_with_windows_and_loads(tmp_path):
    """A grid over a trace's window and its target utilisation (paths relative to the
    sweep file)."""
    (tmp_path / "tr").mkdir()
    gen = replace(REGIMES["bursty"], duration_s=1800.0)
    tr = gen(np.random.default_rng(3))
    save_native(
        Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s),
        tmp_path / "tr" / "b.csv",
    )
    cfg = _write(
        tmp_path,
        'agents = ["fixed-512"]\ndraws = 20\ntrace = "tr/b.csv"\n'
        "[grid]\nwindow_s = [300, 600, 1200]\nrate_scale = [0.5, 1.0]\n",
    )
    res = run_sweep(load_sweep(cfg), tmp_path / "out", progress=False)
    # 1,200 s windows of the trace replayed at its own rate: one window, no paired test.
    assert res["complete"] and res["failed"] == 0
    table = pd.read_csv(tmp_path / "out" / "results.csv")
    windows = table.groupby(["grid.window_s", "grid.rate_scale"]).size().to_dict()
    assert windows == {
        (300, 0.5): 12,
        (300, 1.0): 6,
        (600, 0.5): 6,
        (600, 1.0): 3,
        (1200, 0.5): 3,
        (1200, 1.0): 1,
    }
    assert set(table["regime"]) == {"replay:b"} and set(table["unit"]) == {"window"}
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert len(summary) == 5
    assert (
        "point 5 (window_s=1200, rate_scale=1.0): no summary (fewer than 2 units)"
        in (tmp_path / "out" / "summary.md").read_text()
    )


@pytest.mark.parametrize(
    "text, match",
    [
        ('regime = "bursty"\nbogus = 1\n', "unknown key 'bogus'"),
        ("[grid]\nregime = []\n", "grid axis 'regime' must be a non-empty list"),
        ('[grid]\nregime = ["nope"]\n', "point 0 \\(regime=nope\\): unknown regime 'nope'"),
        ('regime = "bursty"\n[grid]\n"env.nope" = [1]\n', "unknown env parameter 'nope'"),
        ('regime = "bursty"\n[grid]\nseeds = [1]\n', "seeds must be >= 2"),
        ("seeds = 3\n", "no regime or trace"),
        ("regime = [\n", "not valid TOML"),
        ('trace = "missing.csv"\n', "missing.csv does not exist"),
        # Types are checked by the file's declarative model before any point is built.
        ('regime = "bursty"\nseeds = "3"\n', "key 'seeds' must be an integer, got '3'"),
        ('regime = "bursty"\n[grid]\nwindow_s = [600, "x"]\n', "grid axis 'window_s' must be"),
        ('regime = "bursty"\nagents = [1]\n', "agents must be a name or a list of names"),
        ('name = 3\nregime = "bursty"\n', "name must be a string, got 3"),
        ('grid = 3\nregime = "bursty"\n', "\\[grid\\] and \\[env\\] must be tables"),
    ],
)
def test_bad_sweep_file(tmp_path, text, match):
    cfg = _write(tmp_path, text)
    with pytest.raises(SweepFileError, match=match) as exc:
        load_sweep(cfg)
    assert str(cfg) in str(exc.value) and "\n" not in str(exc.value)


def test_in_process_agents_is_a_sweep_key(tmp_path):
    """``in_process_agents = true`` opts a sweep's points out of sealing (README); the
    default runs them sealed, as the report does."""
    base = 'regime = "bursty"\nagents = ["fixed-512"]\nseeds = 2\n'
    assert not load_sweep(_write(tmp_path, base)).points[0].config.in_process_agents
    spec = load_sweep(_write(tmp_path, base + "in_process_agents = true\n"))
    assert spec.points[0].config.in_process_agents
    with pytest.raises(SweepFileError, match="key 'in_process_agents' must be"):
        load_sweep(_write(tmp_path, base + 'in_process_agents = "yes"\n'))


def test_cli_sweep(tmp_path, capsys):
    cfg = _write(
        tmp_path,
        'regime = "sync-heavy"\nagents = ["fixed-256"]\nseeds = 2\n'
        "draws = 10\n[grid]\nrate_scale = [0.5, 1.0]\n",
    )
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert "6 cells: 6 run now, 0 stored before, 0 failed; complete" in capsys.readouterr().out
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert "0 run now, 6 stored before" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(tmp_path / "none.toml"), "--no-progress"])
    assert exc.value.code == 2 and "no such sweep file" in capsys.readouterr().err


def test_yaml_sweep_equals_toml(tmp_path):
    pytest.importorskip("yaml")
    toml = load_sweep(_write(tmp_path, SPEC))
    yaml_text = (
        "name: t\nagents: [fixed-512, wa-diloco]\nseeds: 3\ndraws: 30\n"
        "grid:\n  regime: [bursty, sync-heavy]\n  merge_budget: [8, 16]\n"
    )
    got = load_sweep(_write(tmp_path, yaml_text, "s.yaml"))
    assert [(p.params, p.env, p.config) for p in got.points] == [
        (p.params, p.env, p.config) for p in toml.points
    ]


def test_missing_or_bad_calibration_fails_before_any_cell_with_exit_1(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    for name, match in (("missing.json", "missing.json"), ("bad.json", "bad.json")):
        cfg = _write(
            tmp_path,
            f'regime = "bursty"\nagents = ["fixed-512"]\nseeds = 2\ndraws = 10\n'
            f'[grid]\ncalibration = ["reference", "{name}"]\n',
        )
        with pytest.raises(SweepDataError, match=f"point 1 \\(calibration={name}\\).*{match}"):
            load_sweep(cfg)
        out = tmp_path / f"o-{name}"
        with pytest.raises(SystemExit) as exc:
            main(["sweep", str(cfg), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert exc.value.code == 1 and name in err and err.count("\n") == 1
        assert not (out / "cells.jsonl").exists()  # nothing ran


def test_a_point_that_cannot_be_planned_stops_the_sweep_before_any_cell(tmp_path):
    gen = replace(REGIMES["bursty"], duration_s=700.0)
    tr = gen(np.random.default_rng(1))
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, 700.0), tmp_path / "t.csv")
    cfg = _write(
        tmp_path,
        'trace = "t.csv"\nagents = ["fixed-512"]\ndraws = 10\n[grid]\nwindow_s = [300, 900]\n',
    )
    with pytest.raises(
        SweepDataError, match=r"1 of 2 point\(s\) cannot run.*point 1 \(window_s=900\)"
    ):
        run_sweep(load_sweep(cfg), tmp_path / "o", progress=False)
    assert (
        not (tmp_path / "o" / "cells.jsonl").exists()
        or not (tmp_path / "o" / "cells.jsonl").read_text()
    )


def test_cli_sweep_with_failed_cells_exits_1_with_a_summary(tmp_path, capsys):
    cfg = _write(
        tmp_path,
        'regime = "bursty"\nagents = ["fixed-512"]\nseeds = 2\ndraws = 10\n'
        "[grid]\nmerge_budget = [8, 1000]\n",
    )
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"])
    out, err = capsys.readouterr()
    assert exc.value.code == 1
    assert "2 failed; complete" in out  # the counts line still comes first
    assert "2 cells failed: 2x ValueError: merge_budget=1000 is infeasible" in err
    assert "(point(s) 1)" in err and "errors.csv" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_docs_sweep_example_is_valid_as_written_and_runs(tmp_path):
    """docs/scale-out.md's example: every point loads and plans as written (from the
    repository root, where its paths resolve); a copy with fewer seeds and draws runs."""
    import re

    text = (ROOT / "docs" / "scale-out.md").read_text()
    block = re.search(r"## Sweeps.*?```toml\n(.+?)```", text, flags=re.S)
    assert block is not None
    example = block.group(1)
    # Its relative path is relative to the sweep file, which it expects in the repository
    # root; the copy in tmp_path names the same file absolutely.
    assert '"diloco_gym/data/calibration_reference.json"' in example
    example = example.replace('"diloco_gym/', f'"{ROOT.as_posix()}/diloco_gym/')
    spec = load_sweep(_write(tmp_path, example))
    assert len(spec.points) == 24
    small = re.sub(r"(?m)^seeds = \d+", "seeds = 2", example)
    small = re.sub(r"(?m)^draws = \d+", "draws = 10", small)
    small = re.sub(r"(?m)^merge_budget = .*$", "merge_budget = [8]", small)
    small = re.sub(r"(?m)^rate_scale = .*$", "rate_scale = [1.0]", small)
    small = re.sub(r"(?m)^agents = .*$", 'agents = ["fixed-512", "wa-diloco"]', small)
    cfg = _write(tmp_path, small, name="small.toml")
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 0


def test_a_sweep_never_writes_among_someone_elses_files(tmp_path, capsys):
    """A non-empty directory without the sweep's cells.jsonl is refused before any cell
    runs (its files untouched); a file as OUT too; a sweep's own directory resumes."""
    cfg = _write(tmp_path, 'regime = "bursty"\nagents = ["fixed-512"]\nseeds = 2\ndraws = 2\n')
    notes = tmp_path / "mine"
    notes.mkdir()
    (notes / "results.csv").write_text("my numbers\n")
    with pytest.raises(
        FileExistsError, match=r"not a sweep.s directory.*results\.csv.*no cells\.jsonl"
    ):
        run_sweep(load_sweep(cfg), notes, progress=False)
    assert [p.name for p in notes.iterdir()] == ["results.csv"]
    assert (notes / "results.csv").read_text() == "my numbers\n"
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(cfg), "--out", str(notes), "--no-progress"])
    assert exc.value.code == 2 and "is not a sweep's directory" in capsys.readouterr().err
    with pytest.raises(FileExistsError, match="not a directory"):
        run_sweep(load_sweep(cfg), cfg, progress=False)
    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    first = run_sweep(load_sweep(cfg), out, progress=False)
    assert first["complete"] and first["run"] == first["cells"] > 0
    (out / "my-notes.txt").write_text("kept\n")  # a sweep's directory with notes resumes
    assert run_sweep(load_sweep(cfg), out, progress=False)["run"] == 0
    assert (out / "my-notes.txt").read_text() == "kept\n"


def test_a_model_path_is_relative_to_the_sweep_file(tmp_path, monkeypatch):
    """Like its trace and calibration, a sweep file's learned-agent run directory is
    relative to the file's folder, not to the working directory; names stay names."""
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = _write(
        tmp_path / "sweeps",
        'agents = ["fixed-512", "runs/m", "/abs/run"]\nseeds = 2\n[grid]\nregime = ["bursty"]\n',
    )
    agents = load_sweep(cfg).points[0].config.agents
    assert agents == ["fixed-512", str((tmp_path / "sweeps" / "runs" / "m").resolve()), "/abs/run"]
