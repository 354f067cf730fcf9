"""Where the compiled code is cached (:mod:`diloco_gym.sim.jit_cache`): the per-user cache
directory keyed by the package version, never beside the package's sources (numba's
default when they are writable, which left files in site-packages that a later editable
install turned into a namespace package); ``NUMBA_CACHE_DIR`` overrides it, and an
unwritable directory compiles in memory with a warning. Each case runs one compiled
function in a fresh process on a copy of the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


CHEAP_PROBE = """
import json, sys, warnings
warnings.simplefilter("always")
import diloco_gym
from diloco_gym.sim import iir1, jit_cache
with warnings.catch_warnings(record=True) as caught:
    y = iir1(1.0, -0.5, [1.0, 2.0, 3.0])
assert y.tolist() == [1.0, 2.5, 4.25], y
assert diloco_gym.__file__.startswith(sys.argv[1]), diloco_gym.__file__
print(json.dumps({"cache_dir": jit_cache.cache_dir(), "version": diloco_gym.__version__,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _cheap_run(site: Path, **env_vars: str) -> dict:
    """One compiled function (``sim.iir1``) run in a fresh process on the package copy under
    ``site``, with the environment variables given (and no NUMBA_CACHE_DIR unless given)."""
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env |= {"PYTHONPATH": str(site), **env_vars}
    out = subprocess.run(
        [sys.executable, "-c", CHEAP_PROBE, str(site)],
        capture_output=True,
        text=True,
        env=env,
        cwd=site,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _package_copy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "diloco_gym", site / "diloco_gym", ignore=shutil.ignore_patterns("__pycache__")
    )
    return site


def _compiled_files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.suffix in (".nbi", ".nbc")]


@pytest.mark.slow
def test_a_writable_install_gets_no_cache_files_beside_its_sources(tmp_path):
    """A package directory that is writable (``pip install .`` into a user's virtual
    environment) is left as installed: the compiled code goes to the per-user cache
    directory ``$XDG_CACHE_HOME/diloco-gym/<version>/numba``."""
    site = _package_copy(tmp_path)
    home = tmp_path / "home"
    got = _cheap_run(site, XDG_CACHE_HOME=str(home), HOME=str(home))
    want = home / "diloco-gym" / got["version"] / "numba"
    assert got["cache_dir"] == str(want)
    assert _compiled_files(want)
    assert not _compiled_files(site), _compiled_files(site)
    assert got["warnings"] == []


@pytest.mark.slow
def test_numba_cache_dir_set_by_the_user_wins(tmp_path):
    site = _package_copy(tmp_path)
    home, mine = tmp_path / "home", tmp_path / "mine"
    got = _cheap_run(site, XDG_CACHE_HOME=str(home), HOME=str(home), NUMBA_CACHE_DIR=str(mine))
    assert got["cache_dir"] == str(mine)
    assert _compiled_files(mine)
    assert not _compiled_files(site) and not _compiled_files(home)


@pytest.mark.slow
def test_an_unwritable_cache_directory_compiles_without_a_cache(tmp_path):
    """When the per-user cache directory cannot be created (here its parent is a regular
    file, which stops root too), the package still runs: one warning names the directory,
    the code is compiled in memory, and nothing is written beside the sources."""
    site = _package_copy(tmp_path)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file\n")
    got = _cheap_run(site, XDG_CACHE_HOME=str(blocked), HOME=str(blocked))
    assert got["cache_dir"] is None
    assert len(got["warnings"]) == 1 and "cannot be written" in got["warnings"][0]
    assert str(blocked) in got["warnings"][0]
    assert not _compiled_files(site), _compiled_files(site)


@pytest.mark.slow
def test_an_unwritable_numba_cache_dir_does_not_fall_back_beside_the_sources(tmp_path):
    """numba itself falls back to the sources' ``__pycache__`` when ``NUMBA_CACHE_DIR``
    cannot be written; the package compiles without a cache instead."""
    site = _package_copy(tmp_path)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file\n")
    home = tmp_path / "home"
    got = _cheap_run(
        site, XDG_CACHE_HOME=str(home), HOME=str(home), NUMBA_CACHE_DIR=str(blocked / "x")
    )
    assert got["cache_dir"] is None
    assert len(got["warnings"]) == 1 and "NUMBA_CACHE_DIR" in got["warnings"][0]
    assert not _compiled_files(site) and not _compiled_files(home)
