"""The ``sweep`` command (:mod:`diloco_gym.commands.sweep`): bad option values and a bad
sweep file fail with one line and their exit status before any cell; ``run`` passes its
options to :func:`diloco_gym.scale.sweep.run_sweep` (replaced here: no cell runs) and maps
its outcomes (summary lines, failed cells, a foreign ``--out``, Ctrl-C) to exit statuses."""

from __future__ import annotations

import pytest

from diloco_gym.cli import main
from diloco_gym.scale import sweep as scale_sweep

SPEC = 'name = "t"\nagents = ["fixed-512"]\nseeds = 2\ndraws = 20\n[grid]\nregime = ["bursty"]\n'


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def fake_sweep(monkeypatch):
    """Replace run_sweep: record its call, return ``result`` (or raise ``raises``)."""
    state = {"result": None, "raises": None, "calls": []}

    def fake(spec, out, **kw):
        state["calls"].append((spec, out, kw))
        if state["raises"] is not None:
            raise state["raises"]
        return state["result"]

    monkeypatch.setattr(scale_sweep, "run_sweep", fake)
    return state


def _result(**kw):
    res = {"complete": True, "cells": 2, "run": 2, "skipped": 0, "failed": 0}
    return {**res, "failure_summary": "", **kw}


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        (["--max-cells", "0"], "argument --max-cells: must be >= 1, got 0"),
        (["--max-cells", "many"], "argument --max-cells: not an integer: 'many'"),
        (["--jobs", "0"], "argument --jobs: must be >= 1, got 0"),
        (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
    ],
)
def test_bad_option_values_are_argparse_usage_errors(extra, wanted, spec_file, fails):
    line = fails(["sweep", str(spec_file), *extra], 2)
    assert line.startswith("diloco-gym sweep: error: ") and wanted in line
    assert line.endswith("(see: diloco-gym sweep --help)")


def test_ray_address_needs_the_ray_backend(spec_file, fake_sweep, fails):
    assert fails(["sweep", str(spec_file), "--ray-address", "auto"], 2) == (
        "diloco-gym: --ray-address needs --backend ray (got --backend serial)"
    )
    assert fake_sweep["calls"] == []


def test_a_missing_or_bad_sweep_file_fails_before_any_cell(tmp_path, fake_sweep, fails):
    missing = tmp_path / "none.toml"
    assert fails(["sweep", str(missing)], 2) == f"diloco-gym: {missing}: no such sweep file"
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace('regime = ["bursty"]', "regime = []"))
    line = fails(["sweep", str(bad)], 2)
    assert line.startswith(f"diloco-gym: {bad}: ") and "'regime'" in line
    assert fake_sweep["calls"] == []


def test_a_missing_trace_is_a_data_error(tmp_path, fake_sweep, fails):
    path = tmp_path / "s.toml"
    path.write_text(SPEC.replace('regime = ["bursty"]', 'trace = ["missing.csv"]'))
    line = fails(["sweep", str(path)], 1)
    assert line.startswith("diloco-gym: ") and "missing.csv" in line
    assert fake_sweep["calls"] == []


def test_run_passes_the_options_and_prints_the_summary(spec_file, fake_sweep, capsys, tmp_path):
    fake_sweep["result"] = _result(run=1, skipped=1)
    out = tmp_path / "o"
    argv = ["sweep", str(spec_file), "--out", str(out), "--max-cells", "1", "--no-progress"]
    assert main([*argv, "--retry-failed", "--jobs", "3", "--backend", "processes"]) == 0
    ((spec, got_out, kw),) = fake_sweep["calls"]
    assert spec.name == "t" and got_out == str(out)
    assert kw == {
        "backend": "processes",
        "jobs": 3,
        "ray_address": None,
        "progress": False,
        "retry_failed": True,
        "max_cells": 1,
    }
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "sweep t: 1 point, 2 cells: 1 run now, 1 stored before, 0 failed; complete",
        f"results in {out}/ (results.csv, results.parquet, summary.csv, summary.md, errors.csv)",
    ]


def test_the_default_out_is_named_after_the_sweep(spec_file, fake_sweep, capsys):
    fake_sweep["result"] = _result(complete=False)
    assert main(["sweep", str(spec_file)]) == 0
    assert fake_sweep["calls"][0][1] == "sweep-t"
    assert "incomplete (rerun to continue)" in capsys.readouterr().out


def test_failed_cells_are_a_data_error_after_the_summary(spec_file, fake_sweep, capsys):
    fake_sweep["result"] = _result(failed=2, run=2, failure_summary="2 x ValueError: boom")
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(spec_file), "--out", "x"])
    captured = capsys.readouterr()
    assert exc.value.code == 1
    assert "2 failed; complete" in captured.out
    assert captured.err.strip() == (
        "diloco-gym: sweep t: 2 cells failed: 2 x ValueError: boom "
        "(all in x/errors.csv; --retry-failed runs them again)"
    )


@pytest.mark.parametrize(
    ("raised", "code", "wanted"),
    [
        (
            FileExistsError("o is not a sweep directory"),
            2,
            "diloco-gym: o is not a sweep directory",
        ),
        (
            scale_sweep.SweepDataError("point 1: trace unreadable"),
            1,
            "diloco-gym: point 1: trace unreadable",
        ),
        (
            KeyboardInterrupt(),
            130,
            "diloco-gym: interrupted; the finished cells are stored in o/ (rerun to resume)",
        ),
    ],
)
def test_run_sweeps_errors_map_to_one_line_and_a_status(
    spec_file, fake_sweep, fails, raised, code, wanted
):
    fake_sweep["raises"] = raised
    assert fails(["sweep", str(spec_file), "--out", "o"], code) == wanted
