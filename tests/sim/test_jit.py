"""The compiled kernel's machine code is cached on disk, also when the package directory is
read-only (an install into a system site-packages): numba then uses its per-user cache
directory, and a second process loads the cached code instead of compiling it."""

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
from diloco_gym.sim import jit
env = gym.make("DiLoCoSync-v0")
obs, _ = env.reset(seed=3)
for a in [0, 1] * 20:
    obs, *_ = env.step(a)
assert diloco_gym.__file__.startswith(sys.argv[1]), diloco_gym.__file__
# Compiled in this process, or loaded from the on-disk cache:
stats = {name: getattr(jit, name).stats for name in ("observe_rows", "isolated_cost_one")}
print(json.dumps({k: [v.cache_hits.total(), v.cache_misses.total()] for k, v in stats.items()}
                 | {"obs": obs.tolist()}))
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
    env["XDG_CACHE_HOME"] = str(cache_home)  # numba's per-user cache lives under it
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
    for name in ("observe_rows", "isolated_cost_one"):
        hits, misses = second[name]
        assert hits >= 1 and misses == 0, (name, second[name])  # loaded, not compiled
    assert not list((site / "diloco_gym").rglob("*.nbi"))  # nothing beside the sources
    assert list(cache_home.rglob("*.nbi"))  # numba's per-user cache holds the code


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


# ------------------------------------------------------------------ parallel variants
def test_parallel_ok_needs_a_large_batch_threads_and_the_main_thread(monkeypatch):
    import threading

    from diloco_gym.sim import jit

    monkeypatch.setattr(jit, "get_num_threads", lambda: 2)
    assert jit.parallel_ok(64, 64)
    assert not jit.parallel_ok(63, 64)
    seen = []
    t = threading.Thread(target=lambda: seen.append(jit.parallel_ok(64, 64)))
    t.start()
    t.join()
    assert seen == [False]  # numba's workqueue layer must not be entered from two threads
    monkeypatch.setattr(jit, "get_num_threads", lambda: 1)
    assert not jit.parallel_ok(10_000, 1)


def test_blocks_cover_the_rows_once_in_order():
    from diloco_gym.sim import jit

    for m in (1, 2, 3, 7, 64, 1000):
        nc = jit.blocks(m)
        assert 1 <= nc <= m
        for n_blocks in range(1, min(m, 5) + 1):
            bounds = [jit._lo(c, n_blocks, m) for c in range(n_blocks + 1)]
            assert bounds[0] == 0 and bounds[-1] == m
            assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False))


def test_parallel_variants_equal_the_serial_rules_bit_for_bit():
    """The vector env with ``parallel=True`` (every parallel variant: episode builds, cost
    queue rows, merge costs, observation) against ``parallel=False``, 1,024 envs: the
    same observations, rewards, terminations and infos at every step."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401  (registers the ids)
    from diloco_gym.sim import jit

    calls = dict.fromkeys(
        ("isolated_costs", "observe_rows", "episode_core_rows", "cost_queue_rows"), 0
    )
    originals = {name: getattr(jit, name + "_par") for name in calls}

    def counting(name):
        def call(*args):
            calls[name] += 1
            return originals[name](*args)

        return call

    runs = []
    for parallel in (False, True):
        venv = gym.make_vec(
            "DiLoCoSync-v0", num_envs=1024, vectorization_mode="vector_entry_point",
            parallel=parallel,
        )  # fmt: skip
        for name in calls:
            setattr(jit, name + "_par", counting(name))
        try:
            table = np.random.default_rng(3).integers(0, 2, (90, 1024))
            out = [venv.reset(seed=11)[0]]
            for t in range(90):  # episodes end and restart from step ~60 on
                obs, rew, term, trunc, info = venv.step(table[t])
                out += [obs, rew, term, trunc, info.get("merged"), info.get("episode_seed")]
        finally:
            for name in calls:
                setattr(jit, name + "_par", originals[name])
        venv.close()
        runs.append(out)
        if not parallel:
            assert not any(calls.values()), calls
    if jit.get_num_threads() > 1:  # the parallel run did take every parallel variant
        assert all(n > 0 for n in calls.values()), calls
    assert np.count_nonzero(np.concatenate(runs[1][4::6])) > 0  # some episodes ended (truncated)
    for a, b in zip(*runs, strict=True):
        if a is None:
            assert b is None
        else:
            np.testing.assert_array_equal(a, b)
