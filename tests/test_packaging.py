"""Packaging: pyproject lists every package folder, and the agents install inside the
project's namespace (``diloco_gym.agents``), never as a top-level ``agents`` package that
another distribution could overwrite."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_agents_folder_is_the_namespace_package() -> None:
    """``diloco_gym/agents`` is a link to the top-level ``agents/`` folder (one copy of the
    code), and pyproject finds packages under ``diloco_gym`` only."""
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["packages"]["find"]["include"] == ["diloco_gym*"]
    link = ROOT / "diloco_gym" / "agents"
    assert link.is_symlink() and link.resolve() == (ROOT / "agents").resolve()


def test_agents_import_inside_the_namespace() -> None:
    import diloco_gym.agents.registry as registry

    assert Path(registry.__file__).resolve().parent == (ROOT / "agents").resolve()
    assert registry.make_agent("fixed-512").name == "fixed-512"


@pytest.mark.slow
def test_the_wheel_installs_no_top_level_agents_package(tmp_path) -> None:
    """The built wheel holds ``diloco_gym/agents/...`` with the shipped models, and no
    top-level ``agents/`` (installing another distribution that ships ``agents/__init__.py``
    must not overwrite ours)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path), str(ROOT)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("diloco_gym-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "diloco_gym/agents/heuristics.py" in names
    assert "diloco_gym/agents/reference/model.zip" in names
    assert "diloco_gym/agents/reference/budget-bursty/model.zip" in names
    assert "diloco_gym/data/calibration_reference.json" in names
    assert "diloco_gym/data/normal_quantiles_14.npy" in names  # the token tables' grid
    assert not [n for n in names if n.startswith("agents/")]
