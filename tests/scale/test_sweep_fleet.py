"""Fleet points in ``diloco-gym sweep``: each point is the fleet report of ``report --fleet``
(the same numbers), run as a cell per episode and one for the fleet's calibration; rows
carry the grid's columns, the summary the worst site's excess; a rerun skips the stored
cells and writes the same bytes, a stopped sweep resumes episode by episode; single-host
keys are refused naming the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from diloco_gym.cli import main
from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.report import run_protocol
from diloco_gym.scale.sweep import SweepDataError, SweepFileError, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "fleet.toml"
OUTPUTS = ("results.csv", "summary.csv", "errors.csv", "summary.md", "results.parquet")

SPEC = """
name = "f"
fleet = "fleet.toml"
agents = ["online-forecast-budget", "fixed-budget"]
seeds = 2
draws = 20
[grid]
merge_budget = [40, 60]
"""


def _sweep_dir(tmp: Path, text: str = SPEC) -> Path:
    shutil.copy(EXAMPLE, tmp / "fleet.toml")  # the sweep names it relative to itself
    (tmp / "s.toml").write_text(text)
    return tmp / "s.toml"


def _outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    tmp = tmp_path_factory.mktemp("fleet")
    spec = load_sweep(_sweep_dir(tmp))
    res = run_sweep(spec, tmp / "out", progress=False)
    # 2 points: 2 episodes and a calibration each (its env differs: the budget)
    assert res["complete"] and res["failed"] == 0 and res["run"] == res["cells"] == 6
    from diloco_gym.eval import cells

    assert not cells._CACHE  # the sealed agents' workers ended with the sweep
    return tmp, _outputs(tmp / "out")


def test_fleet_points_are_the_fleet_report_with_grid_columns(whole):
    tmp, _ = whole
    rows = pd.read_csv(tmp / "out" / "results.csv")
    assert list(rows.columns[:3]) == ["sweep", "point", "grid.merge_budget"]
    assert len(rows) == 2 * 2 * 2  # points x seeds x agents
    assert (rows["syncs"] == rows["grid.merge_budget"]).all()
    assert {f"site_{s}_sync_excess_pct" for s in ("eu", "us", "asia", "small")} <= set(rows)
    summary = pd.read_csv(tmp / "out" / "summary.csv")
    assert len(summary) == 2 * 2
    for col in ("worst_site_sync_excess_pct", "p_holm_all_points", "calibration_verdict"):
        assert summary[col].notna().all(), col
    assert (summary["p_holm_all_points"] >= summary["p_holm"] - 1e-12).all()
    md = (tmp / "out" / "summary.md").read_text()
    assert "worst_site_sync_excess_pct" in md and "Fleet points" in md
    # the same numbers as the fleet report run directly at that budget
    direct = run_protocol(
        FleetReportConfig(
            fleet=str(EXAMPLE),
            agents=["online-forecast-budget", "fixed-budget"],
            seeds=2,
            draws=20,
            env={"merge_budget": 60},
            in_process_agents=True,
        )
    )["summary"]
    got = summary[summary["grid.merge_budget"] == 60].reset_index(drop=True)
    cols = ["sync_excess_pct", "matched_random_mean", "oracle_same_budget_pct"]
    pd.testing.assert_frame_equal(
        got[["agent", *cols, "worst_site_sync_excess_pct", "verdict"]],
        direct[["agent", *cols, "worst_site_sync_excess_pct", "verdict"]],
    )


def test_rerun_skips_stored_fleet_cells_and_writes_the_same_bytes(whole):
    tmp, first = whole
    spec = load_sweep(tmp / "s.toml")
    again = run_sweep(spec, tmp / "out", progress=False)
    assert again["run"] == 0 and again["skipped"] == 6 and again["complete"]
    assert _outputs(tmp / "out") == first


@pytest.mark.slow
def test_stopped_fleet_sweep_resumes_on_processes(tmp_path, whole):
    _, first = whole
    spec = load_sweep(_sweep_dir(tmp_path))
    out = tmp_path / "out"
    part = run_sweep(spec, out, progress=False, max_cells=4, backend="processes", jobs=2)
    assert part["run"] == 4 and not part["complete"]
    assert "cell(s) not run yet" in (out / "summary.md").read_text()
    rest = run_sweep(spec, out, progress=False, backend="processes", jobs=2)
    assert rest["run"] == 2 and rest["skipped"] == 4 and rest["complete"]
    assert _outputs(out) == first


@pytest.mark.slow
def test_an_edited_fleet_file_runs_its_points_again(tmp_path):
    cfg = _sweep_dir(tmp_path, SPEC.replace("[40, 60]", "[40]"))
    out = tmp_path / "out"
    assert run_sweep(load_sweep(cfg), out, progress=False)["run"] == 3
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet.read_text().replace("bits = 8 ", "bits = 4 "))
    assert run_sweep(load_sweep(cfg), out, progress=False)["run"] == 3


def test_fleet_axis_and_fleet_params_in_env(tmp_path):
    _sweep_dir(tmp_path)
    shutil.copy(EXAMPLE, tmp_path / "b.toml")
    spec = load_sweep(
        _sweep_dir(
            tmp_path,
            'agents = ["fixed-budget"]\nseeds = 2\n[grid]\nfleet = ["fleet.toml", "b.toml"]\n'
            '"env.bits" = [8, 4]\n',
        )
    )
    assert spec.fleet and len(spec.points) == 4
    assert [p.params["fleet"] for p in spec.points[::2]] == ["fleet.toml", "b.toml"]
    assert spec.points[1].env == {"bits": 4}
    assert spec.points[3].config.fleet == str((tmp_path / "b.toml").resolve())
    assert not spec.points[0].config.in_process_agents  # sealed, as report --fleet
    opt_out = _sweep_dir(tmp_path, 'fleet = "fleet.toml"\nin_process_agents = true\n')
    assert load_sweep(opt_out).points[0].config.in_process_agents
    # the report's calibration file is a fleet key ("reference": the shipped one)
    cal = _sweep_dir(tmp_path, 'fleet = "fleet.toml"\n[grid]\ncalibration = ["reference"]\n')
    assert load_sweep(cal).points[0].config.calibration is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('fleet = "fleet.toml"\nregime = "bursty"\n', "key 'regime' is not used with fleet"),
        ('fleet = "fleet.toml"\n[grid]\nsidecar = ["x"]\n', "axis 'sidecar' is not used with"),
        ('fleet = "fleet.toml"\ntrace = "t.csv"\n', "key 'trace' is not used with fleet"),
        ('fleet = "fleet.toml"\nrate_scale = 2.0\n', "key 'rate_scale' is not used with"),
        ('fleet = "fleet.toml"\n[env]\nsites = 3\n', "unknown env parameter 'sites'"),
        ('fleet = "fleet.toml"\n"env.nope" = 1\n', "unknown env parameter 'nope'"),
        ('fleet = "fleet.toml"\nseeds = 1\n', "point 0 \\(the only point\\): seeds must be >= 2"),
        ('fleet = "fleet.toml"\n"env.bits" = 12\n', "bits must be one of"),
        ('[grid]\nfleet = ["fleet.toml", 3]\n', "grid axis 'fleet' must be a string"),
    ],
)
def test_bad_fleet_sweep_file(tmp_path, text, match):
    cfg = _sweep_dir(tmp_path, text)
    with pytest.raises(SweepFileError, match=match) as exc:
        load_sweep(cfg)
    assert str(cfg) in str(exc.value) and "\n" not in str(exc.value)


def test_missing_or_malformed_fleet_file_is_a_data_error(tmp_path, capsys):
    cfg = _sweep_dir(tmp_path, '[grid]\nfleet = ["fleet.toml", "none.toml"]\n')
    with pytest.raises(SweepDataError, match="point 1 \\(fleet=none.toml\\).*none.toml"):
        load_sweep(cfg)
    cfg = _sweep_dir(tmp_path, 'fleet = "fleet.toml"\ncalibration = "missing.json"\n')
    with pytest.raises(SweepDataError, match="point 0 .*missing.json"):
        load_sweep(cfg)
    (tmp_path / "bad.toml").write_text("[fleet]\nspeed = 3\n")
    cfg = _sweep_dir(tmp_path, 'fleet = "bad.toml"\n')
    with pytest.raises(SweepDataError, match="speed"):
        load_sweep(cfg)
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"])
    assert exc.value.code == 1 and "speed" in capsys.readouterr().err


def test_the_docs_fleet_sweep_example_loads_as_written():
    spec = load_sweep(ROOT / "docs" / "examples" / "fleet-sweep.toml")
    assert spec.fleet and len(spec.points) == 6
    assert {p.config.fleet for p in spec.points} == {str(EXAMPLE.resolve())}
    assert [p.env for p in spec.points[:2]] == [
        {"merge_budget": 50, "bits": 8},
        {"merge_budget": 50, "bits": 4},
    ]
    text = (ROOT / "docs" / "fleet.md").read_text()
    assert "docs/examples/fleet-sweep.toml" in text


def test_a_rounds_fleet_sweep_runs_the_own_rule_over_quorum_and_grace(tmp_path):
    """A sweep whose fleet has per-site timing: ``X+own`` agents and ``env.quorum`` /
    ``env.grace_s`` axes run, every episode keeps the point's rounds budget, and the
    summary carries the rounds' columns."""
    shutil.copy(ROOT / "docs" / "examples" / "fleet-rounds.toml", tmp_path / "r.toml")
    (tmp_path / "s.toml").write_text(
        'fleet = "r.toml"\nagents = ["fixed-budget", "fixed-budget+own"]\nseeds = 2\n'
        "draws = 10\nin_process_agents = true\nmerge_budget = 10\n"
        '[grid]\n"env.quorum" = [2, 4]\n"env.grace_s" = [4.5]\n'
    )
    res = run_sweep(load_sweep(tmp_path / "s.toml"), tmp_path / "out", progress=False)
    assert res["complete"] and res["failed"] == 0 and res["run"] == 2 * (2 + 1)
    rows = pd.read_csv(tmp_path / "out" / "results.csv")
    assert (rows["syncs"] == 10).all()
    assert set(rows["agent"]) == {"fixed-budget", "fixed-budget+own"}
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert {"dropped_contributions", "token_share_mean", "dropped_progress"} <= set(summary)
    assert len(summary) == 4 and summary["token_share_mean"].between(0, 1).all()
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| token_share_mean | p_holm |" in md and "an upper bound with no certified" in md
