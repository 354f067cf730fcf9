"""The compiled kernel's machine code is cached on disk in a per-user cache directory keyed by
the package version (``diloco_gym.sim.jit_cache``), never beside the package's sources
(numba's default when they are writable, which left files in site-packages that a later
editable install turned into a namespace package); also when the package directory is
read-only, and a second process loads the cached code instead of compiling it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import gymnasium as gym
import numpy as np
import diloco_gym
from diloco_gym.sim import jit, jit_step
env = gym.make("DiLoCoSync-v0")
obs, _ = env.reset(seed=3)
for a in [0, 1] * 20:
    obs, *_ = env.step(a)
assert diloco_gym.__file__.startswith(sys.argv[1]), diloco_gym.__file__
# Compiled in this process, or loaded from the on-disk cache:
stats = {"observe_rows": jit.observe_rows.stats, "step_rows": jit_step.step_rows.stats}
print(json.dumps({k: [v.cache_hits.total(), v.cache_misses.total()] for k, v in stats.items()}
                 | {"obs": obs.tolist(), "version": diloco_gym.__version__}))
"""


def _make_read_only(path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(root, name)
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _run(pkg_parent: Path, cache_home: Path) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pkg_parent)
    env["XDG_CACHE_HOME"] = str(cache_home)  # the per-user cache directory lives under it
    env["HOME"] = str(cache_home)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(pkg_parent)],
        capture_output=True,
        text=True,
        env=env,
        cwd=pkg_parent,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_package_compiles_once_into_the_user_cache(tmp_path):
    _read_only_case(tmp_path)


@pytest.mark.slow
def test_read_only_package_uses_the_user_cache(tmp_path):
    """As root (CI runs as root, and root may write anywhere) the read-only install is
    simulated by pointing numba's in-tree cache at an unwritable place: the package copy's
    ``__pycache__`` is a file, so nothing can be written beside the sources."""
    _read_only_case(tmp_path, block_pycache=True)


def _read_only_case(tmp_path: Path, block_pycache: bool = False) -> None:
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "diloco_gym", site / "diloco_gym", ignore=shutil.ignore_patterns("__pycache__")
    )
    if block_pycache:
        for d in (site / "diloco_gym").rglob("*"):
            if d.is_dir():
                (d / "__pycache__").write_text("not a directory\n")
        (site / "diloco_gym" / "__pycache__").write_text("not a directory\n")
    _make_read_only(site)
    cache_home = tmp_path / "home"
    cache_home.mkdir()
    first = _run(site, cache_home)
    second = _run(site, cache_home)
    assert first["obs"] == second["obs"]
    for name in ("observe_rows", "step_rows"):
        hits, misses = second[name]
        assert hits >= 1 and misses == 0, (name, second[name])  # loaded, not compiled
    assert not list((site / "diloco_gym").rglob("*.nbi"))  # nothing beside the sources
    assert list((cache_home / "diloco-gym" / first["version"] / "numba").rglob("*.nbi"))


def test_compiled_first_order_filter_equals_scipy_lfilter_bit_for_bit():
    """``sim.iir1`` (the AR(1) pressure series and the rate EWMAs) gives
    ``scipy.signal.lfilter([b0], [1, a1], x, axis=-1)`` exactly, zeros and signs included."""
    from scipy.signal import lfilter

    from diloco_gym.sim import iir1

    rng = np.random.default_rng(0)
    for _ in range(50):
        x = rng.standard_normal((3, 517)) * rng.choice([1e-3, 1.0, 1e3])
        x[:, rng.integers(0, 517, 20)] = 0.0
        for b0, a1 in ((1.0, -0.95), (0.5, -0.5), (0.02, -0.98), (1.0, -rng.random())):
            want = lfilter([b0], [1.0, a1], x, axis=-1)
            assert iir1(b0, a1, x).tobytes() == want.tobytes()
            assert iir1(b0, a1, x[0]).tobytes() == want[0].tobytes()


# --------------------------------------------------------------------------- bound_call
def test_bound_call_calls_each_argument_types_own_overload():
    """``bound_call`` binds the compiled overload of exactly its arguments' types (dtype,
    dimensions, layout, writeability): each gives what the dispatcher gives, and copies and
    pickles bind again."""
    import copy
    import pickle

    import numba

    from diloco_gym.sim import bound_call

    @numba.njit(cache=False)
    def add_one(x, out):
        for i in range(x.size):
            out[i] = x[i] + 1
        return x.size

    read_only = np.arange(4.0)
    read_only.setflags(write=False)
    cases = [
        np.arange(4, dtype=np.int64),
        np.arange(4.0),
        np.arange(8.0)[::2],  # not contiguous
        read_only,
        np.arange(4, dtype=np.int32),
    ]
    entries = set()
    for x in cases:
        out = np.zeros(4)
        call = bound_call(add_one, (x, out))
        assert call.func is not add_one  # the entry point, not the dispatcher
        entries.add(call.func)
        assert call() == 4 and out.tolist() == (x + 1).tolist()
        for twin in (copy.deepcopy(call), pickle.loads(pickle.dumps(call))):
            twin_out = twin.args[1]
            twin_out[:] = 0.0
            assert twin() == 4 and twin_out.tolist() == (x + 1).tolist()
            assert out.tolist() == (x + 1).tolist()  # the copy wrote its own output
    assert len(entries) == len(cases)  # one overload per argument types
    assert bound_call(add_one, (cases[1], np.zeros(4))).func in entries  # found again
