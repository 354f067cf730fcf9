"""The parallel variants of the compiled rules (:mod:`diloco_gym.sim.jit_parallel`): when
they are taken, and that they give the serial rules' results bit for bit."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.sim import compiled_rows, jit, jit_parallel

RULES = ("step_rows", "observe_rows", "episode_core_rows", "cost_queue_rows")


def test_parallel_ok_needs_a_large_batch_threads_and_the_main_thread(monkeypatch):
    monkeypatch.setattr(jit_parallel, "get_num_threads", lambda: 2)
    assert jit_parallel.parallel_ok(64, 64)
    assert not jit_parallel.parallel_ok(63, 64)
    assert compiled_rows("observe_rows", True, 64, 64) is not jit.observe_rows
    assert compiled_rows("observe_rows", False, 64, 64) is jit.observe_rows  # not asked for
    assert compiled_rows("observe_rows", True, 63, 64) is jit.observe_rows  # too few rows
    seen = []
    t = threading.Thread(target=lambda: seen.append(compiled_rows("observe_rows", True, 64, 64)))
    t.start()
    t.join()
    assert seen == [jit.observe_rows]  # numba's workqueue layer: never from two threads at once
    monkeypatch.setattr(jit_parallel, "get_num_threads", lambda: 1)
    assert not jit_parallel.parallel_ok(10_000, 1)


def test_blocks_cover_the_rows_once_in_order():
    for m in (1, 2, 3, 7, 64, 1000):
        assert 1 <= jit_parallel.blocks(m) <= m
        for nc in range(1, min(m, 5) + 1):
            bounds = [jit_parallel._lo(c, nc, m) for c in range(nc + 1)]
            assert bounds[0] == 0 and bounds[-1] == m
            assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False))


def _run(parallel: bool, calls: dict) -> list:
    """90 steps of 1,024 envs (episodes end from step ~60 on), counting the parallel
    variants' calls."""
    originals = {name: getattr(jit_parallel, name) for name in RULES}

    def counting(name):
        def call(*args):
            calls[name] += 1
            return originals[name](*args)

        return call

    venv = gym.make_vec(
        "DiLoCoSync-v0", num_envs=1024, vectorization_mode="vector_entry_point",
        parallel=parallel,
    )  # fmt: skip
    for name in RULES:
        setattr(jit_parallel, name, counting(name))
    try:
        table = np.random.default_rng(3).integers(0, 2, (90, 1024))
        out = [venv.reset(seed=11)[0]]
        for t in range(90):
            obs, rew, term, trunc, info = venv.step(table[t])
            out += [obs, rew, term, trunc, info.get("merged"), info.get("episode_seed")]
    finally:
        for name in RULES:
            setattr(jit_parallel, name, originals[name])
        venv.close()
    return out


def test_parallel_variants_equal_the_serial_rules_bit_for_bit():
    """The vector env with ``parallel=True`` (every parallel variant: episode builds, cost
    queue rows, the steps, observation) against ``parallel=False``, 1,024 envs: the
    same observations, rewards, terminations and infos at every step."""
    calls = dict.fromkeys(RULES, 0)
    serial = _run(False, calls)
    assert not any(calls.values()), calls
    parallel = _run(True, calls)
    if jit_parallel.get_num_threads() > 1:  # the parallel run took every parallel variant
        assert all(n > 0 for n in calls.values()), calls
    assert np.count_nonzero(np.concatenate(parallel[4::6])) > 0  # episodes ended, restarted
    for a, b in zip(serial, parallel, strict=True):
        if a is None:
            assert b is None
        else:
            np.testing.assert_array_equal(a, b)
