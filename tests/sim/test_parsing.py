"""Settings, calibration and metadata files are parsed within the limits: size, nesting depth
and YAML aliases (diloco_gym/sim/parsing.py), with one line naming the file.

Each file kind is given 100,000 nested brackets (which ended in a ``RecursionError`` naming
no file) and a nesting of 150 levels, which parses but is above ``DILOCO_GYM_MAX_NESTING``
(100). The cases that hung or exhausted memory (a YAML "billion laughs", a 10^8-point grid,
10,000 fleet sites) run the command line in a subprocess under an address-space cap and a
timeout.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from diloco_gym.sim import parsing
from diloco_gym.sim.limits import LimitError

ROOT = Path(__file__).resolve().parents[2]
#: Address-space cap of the command-line subprocesses (imports take about 1.5 GB of it).
CAP_BYTES = 3 * 2**30

DEEP = 100_000


def _json_deep(levels: int) -> str:
    return '{"a": ' + "[" * levels + "]" * levels + "}"


def _toml_deep(key: str, levels: int) -> str:
    return f"{key} = " + "[" * levels + "]" * levels + "\n"


# ------------------------------------------------------------------------ the helpers


def test_nesting_depth_counts_tables_and_lists_without_recursion():
    assert parsing.nesting_depth(3) == 0
    assert parsing.nesting_depth({}) == 1
    assert parsing.nesting_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(50_000):  # far deeper than Python's recursion limit
        deep = [deep]
    assert parsing.nesting_depth(deep) == 50_001


def test_nesting_limit_and_its_variable(monkeypatch):
    text = _json_deep(150)
    with pytest.raises(LimitError) as err:
        parsing.parse_json(text, "x.json")
    assert str(err.value).startswith("x.json: nesting depth: 151 is above the limit of 100 ")
    assert "DILOCO_GYM_MAX_NESTING" in str(err.value)
    monkeypatch.setenv("DILOCO_GYM_MAX_NESTING", "200")
    assert parsing.nesting_depth(parsing.parse_json(text, "x.json")) == 151


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parsing.parse_json, "[" * DEEP + "]" * DEEP),
        (parsing.parse_toml, _toml_deep("a", DEEP)),
        (parsing.parse_yaml, "a: " + "[" * DEEP + "]" * DEEP),
        (parsing.parse_yaml, "a:\n" + "".join(" " * i + "- \n" for i in range(0, 4000, 2))),
    ],
    ids=["json", "toml", "yaml-flow", "yaml-block"],
)
def test_too_deep_to_parse_is_a_limit_error(parse: Callable, text: str):
    with pytest.raises(LimitError, match=r"^f\.x: nesting depth: ") as err:
        parse(text, "f.x")
    assert "\n" not in str(err.value)


def _laughs(levels: int = 9) -> str:
    """The "billion laughs": 9 levels of 9 aliases, 10^9 values in 342 bytes."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_aliases_are_counted_expanded_before_anything_is_built(monkeypatch):
    with pytest.raises(LimitError, match=r"^l\.yaml: YAML values, aliases expanded, so far: "):
        parsing.parse_yaml(_laughs(), "l.yaml")
    # a fair use of an anchor: one table shared by two grid values
    shared = "base: &b {alpha: 0.1, draws: 3}\ngrid:\n  agents: [*b, *b]\n"
    assert parsing.parse_yaml(shared, "s.yaml")["grid"]["agents"][1] == {"alpha": 0.1, "draws": 3}
    # the table, its 2 keys, a0 (1 + 9) and a1 (1 + 9 x 10): 104 values, aliases expanded
    monkeypatch.setenv("DILOCO_GYM_MAX_YAML_NODES", "104")
    two = _laughs(1)
    assert len(parsing.parse_yaml(two, "t.yaml")["a1"]) == 9
    monkeypatch.setenv("DILOCO_GYM_MAX_YAML_NODES", "103")
    with pytest.raises(LimitError, match="DILOCO_GYM_MAX_YAML_NODES"):
        parsing.parse_yaml(two, "t.yaml")


def test_a_recursive_yaml_alias_is_refused():
    with pytest.raises(LimitError, match=r"^r\.yaml: a YAML alias refers to a node that"):
        parsing.parse_yaml("a: &a [1, *a]\n", "r.yaml")


def test_read_text_refuses_past_the_limit_and_special_files(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text("x = 1\n" * 100)
    assert parsing.read_text(path) == "x = 1\n" * 100
    monkeypatch.setenv("DILOCO_GYM_MAX_SETTINGS_BYTES", "100")
    with pytest.raises(LimitError, match=r"s\.toml: file size in bytes: 600 is above the limit"):
        parsing.read_text(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LimitError, match="not a regular file"):
        parsing.read_text(fifo)  # refused unopened: opening a FIFO blocks


# ------------------------------------------------------------ every kind of file


def _fleet(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.sim.fleet import FleetConfigError
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return lambda: _expect(FleetConfigError, path, lambda: load_fleet_toml(path))


def _sweep(tmp_path: Path, text: str, suffix: str) -> Callable[[], object]:
    from diloco_gym.scale.sweep import SweepFileError, load_sweep

    path = tmp_path / f"sweep{suffix}"
    path.write_text(text)
    return lambda: _expect(SweepFileError, path, lambda: load_sweep(path))


def _train(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.rl.config import ConfigError, load_config_file

    path = tmp_path / "train.toml"
    path.write_text(text)
    return lambda: _expect(ConfigError, path, lambda: load_config_file(path))


def _site_calibration(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.sim.fleet import FleetConfigError, site_calibration

    path = tmp_path / "site_cal.json"
    path.write_text(text)
    site_calibration.cache_clear()
    return lambda: _expect(FleetConfigError, path, lambda: site_calibration(str(path)))


def _learner_calibration(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.sim.learner_calibration import (
        LearnerCalibrationError,
        load_learner_calibration,
    )

    path = tmp_path / "learners.json"
    path.write_text(text)
    return lambda: _expect(LearnerCalibrationError, path, lambda: load_learner_calibration(path))


def _calibration(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.eval.calibration import CalibrationFileError, load_calibration

    path = tmp_path / "calibration.json"
    path.write_text(text)
    return lambda: _expect(CalibrationFileError, path, lambda: load_calibration(path))


def _meta(tmp_path: Path, text: str) -> Callable[[], object]:
    from diloco_gym.rl.run_dir import read_meta

    path = tmp_path / "meta.json"
    path.write_text(text)
    return lambda: _expect(ValueError, path, lambda: read_meta(path))


def _expect(kind: type[Exception], path: Path, load: Callable[[], object]) -> str:
    """The one-line error ``load()`` raises, of type ``kind``, naming ``path``."""
    with pytest.raises(kind) as err:
        load()
    text = str(err.value)
    assert str(path) in text and "\n" not in text, text
    return text


KINDS: dict[str, Callable[[Path, int], Callable[[], object]]] = {
    "fleet-toml": lambda tmp, n: _fleet(tmp, "[fleet]\n" + _toml_deep("bits_options", n)),
    "sweep-toml": lambda tmp, n: _sweep(tmp, _toml_deep("regime", n), ".toml"),
    "sweep-yaml": lambda tmp, n: _sweep(tmp, "regime: " + "[" * n + "]" * n + "\n", ".yaml"),
    "train-config": lambda tmp, n: _train(tmp, "[algo]\n" + _toml_deep("policy_kwargs", n)),
    "site-calibration": lambda tmp, n: _site_calibration(tmp, _json_deep(n)),
    "learner-calibration": lambda tmp, n: _learner_calibration(tmp, _json_deep(n)),
    "calibration": lambda tmp, n: _calibration(tmp, _json_deep(n)),
    "meta-json": lambda tmp, n: _meta(tmp, _json_deep(n)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("levels", [DEEP, 150])
def test_deeply_nested_files_are_refused_naming_the_file(tmp_path, kind, levels):
    """A ``RecursionError`` (no file named) before: now one line with the file and the
    nesting limit's variable, whether the parser gave up (100,000 levels) or not (150)."""
    message = KINDS[kind](tmp_path, levels)()
    assert "nesting depth" in message and "DILOCO_GYM_MAX_NESTING" in message, message


def test_settings_files_are_read_within_the_size_limit(tmp_path, monkeypatch):
    """A settings file is refused by its size before it is read (it was read whole)."""
    monkeypatch.setenv("DILOCO_GYM_MAX_SETTINGS_BYTES", "1000")
    padding = "# " + "x" * 2000 + "\n"
    for check in (
        _fleet(tmp_path, padding),
        _sweep(tmp_path, padding + 'regime = "bursty"\n', ".toml"),
        _train(tmp_path, padding),
        _meta(tmp_path, json.dumps({"pad": "x" * 2000})),
    ):
        assert "DILOCO_GYM_MAX_SETTINGS_BYTES" in str(check())


# ----------------------------------------------- the command line, under a memory cap


def _cli(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m diloco_gym.cli ARGS`` under :data:`CAP_BYTES` of address space."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    full_env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "diloco_gym.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        check=False,
    )


def _one_line(out: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("diloco-gym: ") and "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_cli_billion_laughs_sweep_is_refused(tmp_path):
    """A 1.3 KB YAML sweep whose aliases stand for 10^9 values hung while memory grew."""
    chain = [line.split(": ", 1)[1] for line in _laughs().splitlines()]
    text = f"agents: [{', '.join(chain)}]\nregime: bursty\ngrid:\n  seeds: [2, 3]\n"
    path = tmp_path / "laughs.yaml"
    path.write_text(text)
    out = _cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"], tmp_path)
    _one_line(out, 2, str(path), "DILOCO_GYM_MAX_YAML_NODES")


def test_cli_huge_grid_is_refused_before_it_is_expanded(tmp_path):
    """A 700-byte sweep of 8 axes of 10 values (10^8 points) hung expanding its grid."""
    values = {
        "seeds": range(2, 12),
        "draws": range(100, 110),
        "seed0": range(10),
        "merge_budget": range(1, 11),
        "alpha": [i / 100 for i in range(1, 11)],
        "window_s": range(600, 610),
        "rate_scale": [1 + i / 10 for i in range(10)],
        "env.excess_weight": [1 + i / 10 for i in range(10)],
    }
    axes = "".join(f'"{k}" = [{", ".join(map(str, v))}]\n' for k, v in values.items())
    path = tmp_path / "grid.toml"
    path.write_text('regime = "bursty"\n[grid]\n' + axes)
    assert path.stat().st_size < 1000
    out = _cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"], tmp_path)
    _one_line(out, 2, str(path), "100,000,000 is above the limit", "DILOCO_GYM_MAX_GRID_POINTS")


def test_cli_ten_thousand_fleet_sites_are_refused(tmp_path):
    """10,000 sites in a 400 KB TOML exhausted memory (1,000 took 2.1 GB), and the error
    handler, importing modules while out of memory, printed a traceback."""
    path = tmp_path / "fleet.toml"
    path.write_text("".join(f'[[site]]\nname = "s{i}"\nregime = "bursty"\n' for i in range(10_000)))
    out = _cli(["run", "--agent", "fixed-256", "--fleet", str(path), "--seeds", "2"], tmp_path)
    _one_line(out, 1, str(path), "10,000 is above the limit of 256", "DILOCO_GYM_MAX_FLEET_SITES")


def test_cli_long_dotted_toml_key_is_refused_before_parsing(tmp_path):
    """A 200 KB line ``a.a.a... = 1`` of 100,000 parts: tomllib's memory is quadratic in a
    dotted key's parts (10,000 parts took 430 MB), so it is counted before the parser runs;
    a quoted value's dots and a list of floats are not keys."""
    path = tmp_path / "dotted.toml"
    path.write_text('regime = "bursty"\n' + ".".join(["a"] * 100_000) + " = 1\n")
    out = _cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"], tmp_path)
    _one_line(out, 2, str(path), "a dotted key's parts): 100,000 is above the limit of 100")
    fine = 'name = "' + "a." * 500 + '"\nx = [' + ", ".join(["1.5"] * 500) + "]\n"
    assert parsing.parse_toml(fine, "f.toml")["x"][-1] == 1.5


def test_cli_long_yaml_list_is_refused_as_it_is_composed(tmp_path):
    """A YAML sweep of 4 M one-digit values (8 MB) built its nodes first (2.7 GB, 74 s):
    they are counted as they are composed."""
    path = tmp_path / "long.yaml"
    path.write_text("regime: bursty\ngrid:\n  seeds: [" + ",".join(["2"] * 4_000_000) + "]\n")
    out = _cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"], tmp_path)
    _one_line(out, 2, str(path), "YAML values read: 100,001 is above the limit of 100,000")


def test_cli_out_of_memory_is_one_line_without_imports(tmp_path):
    """A command that fills memory ends in one line: the error handler imports nothing
    (it imported the live stack's errors, and tqdm, while out of memory, and failed with a
    traceback) and lets the frames that held the memory go first."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    script = (
        "import sys\n"
        "from diloco_gym import cli\n"
        "def exhaust(args):\n"
        "    held = []\n"
        "    while True:\n"
        "        held.append(bytearray(2**20))\n"
        "for name, module in cli.COMMANDS:\n"
        "    if name == 'run':\n"
        "        module.run = exhaust\n"
        "sys.exit(cli.main(['run', '--agent', 'fixed-256']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        check=False,
    )
    _one_line(out, 1, "out of memory")
