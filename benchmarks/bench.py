"""Speed and memory of diloco-gym, measured against Gymnasium's CartPole in the same process.

Usage::

    python benchmarks/bench.py                 # the full run (a few minutes)
    python benchmarks/bench.py --quick         # a smoke run for CI (seconds)
    python benchmarks/bench.py --json out.json # also save every number

What it measures (``benchmarks/README.md`` has the numbers and the profile):

* **headline, the default configuration** (what ``gym.make("DiLoCoSync-v2")`` gives:
  ``skip_forced=True``, fresh episodes), uniformly random actions, in agent decisions
  (``step`` calls) per second and episodes per second:
  single env vs ``gym.make("CartPole-v1")``, and the native vector env at 1,024 envs vs
  CartPole's native vector env at 1,024 envs.
* **single env**: ``gym.make("DiLoCoSync-v2", skip_forced=False)`` (one step per decision,
  517 decisions per 600 s episode) vs ``gym.make("CartPole-v1")``, both under uniformly
  random actions, resets included.
* **vector env**: ``gym.make_vec(..., num_envs=N, vectorization_mode="vector_entry_point")``
  for ``DiLoCoSync-v2`` (fresh episodes, and separately the opt-in ``episode_pool=N``)
  vs CartPole's native vector env, random actions, over whole episodes (with
  ``skip_forced=False`` every episode has the same length, so all envs reset together; the
  window covers whole episodes so that every env pays for its resets).
* **fresh-episode ceiling**: the fastest fresh episodes could be without a faster step:
  the pool's stepping plus, for every episode the window restarts, only its random draws
  (seeding ``default_rng`` and drawing exactly the numbers the episode uses, none of the
  simulation); a bound on what any faster episode builder could reach.
* **matched-random envelope**: 1000 uniform feasible schedules with the same number of
  merges on one 600 s episode, costed by summing ``episode.merge_cost``.
* **offline oracle**: a 24-hour bursty trace, its episode (merge costs included) and the
  exact free-budget dynamic programme; the DP alone is reported separately.
* **memory**: resident set size before and after 10 million vector-env steps with the
  episode pool, and a shorter run with fresh episodes (every episode built and dropped).
* **profile**: where the default configuration's time goes (an episode of the single env,
  a step of the vector env), and where a ``skip_forced=False`` episode reset's time goes
  (trace generation, merge costs, the rest).

Timings are wall-clock; each throughput is the best of a few repeats, and DiLoCo and
CartPole are timed alternately so that a busy machine affects both alike.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import resource
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np

# The source tree measured: this checkout, or DILOCO_GYM_BENCH_SRC (--ab points it at an
# older revision's tree, so both codes run under the same benchmark functions).
sys.path.insert(0, os.environ.get("DILOCO_GYM_BENCH_SRC") or str(Path(__file__).parents[1]))

import diloco_gym  # noqa: E402  (registers the ids)
from diloco_gym.envs import env as env_module  # noqa: E402
from diloco_gym.sim import learners as lrn  # noqa: E402
from diloco_gym.sim import regimes, schedules
from diloco_gym.sim.sidecar import merge_costs  # noqa: E402
from diloco_gym.sim.traces import PRESSURE_DT_S  # noqa: E402

try:  # this tree's modules; 0.4.0's code (an A/B's older side) had them in envs.core
    from diloco_gym.envs import episode as episode_module
    from diloco_gym.envs.params import EnvParams
except ImportError:
    from diloco_gym.envs import core as episode_module  # type: ignore[no-redef]
    from diloco_gym.envs.core import EnvParams  # type: ignore[no-redef]

SRC = sys.path[0]

TARGETS = {
    "default_single_ratio_to_cartpole": 0.3,
    "default_vector_ratio_to_cartpole": 0.05,
    "single_ratio_to_cartpole": 0.5,
    "vector_steps_per_s": 1_000_000,
    "vector_ratio_to_cartpole": 0.25,
    "envelope_s": 0.5,
    "oracle_24h_s": 2.0,
    "rss_growth_pct": 5.0,
}


def rss_mib() -> float:
    """Resident set size now (``/proc/self/status``; peak RSS where that is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def best_of(fn, repeats: int) -> float:
    """Smallest wall time of ``repeats`` calls of ``fn`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ----------------------------------------------------------------------------- single env
def _single_env_runner(env_id: str, steps: int, seed: int, **kwargs):
    """A made env and a function that steps it ``steps`` times (random actions, resets
    included) and returns the wall time."""
    env = gym.make(env_id, **kwargs)
    actions = np.random.default_rng(seed).integers(0, 2, steps).tolist()
    env.reset(seed=seed)

    def run() -> float:
        t0 = time.perf_counter()
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        return time.perf_counter() - t0

    return env, run


def _counting_runner(env, steps: int, seed: int):
    """A function that steps ``env`` ``steps`` times with uniformly random actions (resets
    included) and returns ``(seconds, episodes finished)``."""
    actions = np.random.default_rng(seed).integers(0, 2, steps).tolist()

    def run() -> tuple[float, int]:
        episodes = 0
        t0 = time.perf_counter()
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
                episodes += 1
        return time.perf_counter() - t0, episodes

    return run


def bench_single_default(steps: int, rounds: int, env_id: str = "DiLoCoSync-v2") -> dict:
    """The default configuration: ``gym.make(env_id)`` (``DiLoCoSync-v2``: ``skip_forced=True``,
    fresh episodes; ``DiLoCoFleet-v1`` and the deprecated ``DiLoCoFleet-v0``: the default
    fleet of 4 bursty sites, F=1, 32-bit, on the fleet model v1 and v0) against
    ``gym.make("CartPole-v1")``, uniformly random actions, resets included, in paired rounds
    of ``steps`` agent decisions each; ratios are medians of the rounds'."""
    with warnings.catch_warnings():  # DiLoCoFleet-v0's deprecation, measured on purpose
        warnings.filterwarnings("ignore", "DiLoCoFleet-v0 is deprecated", FutureWarning)
        warnings.filterwarnings("ignore", ".*DiLoCoFleet-v0 is out of date", DeprecationWarning)
        dil_env = gym.make(env_id)
    cart_env = gym.make("CartPole-v1")
    dil_env.reset(seed=0)
    cart_env.reset(seed=0)
    dil, cart = _counting_runner(dil_env, steps, 0), _counting_runner(cart_env, steps, 0)
    dil(), cart()  # warm-up
    d_rates, c_rates, d_eps, c_eps = [], [], [], []
    for _ in range(rounds):
        dt, e = dil()
        d_rates.append(steps / dt)
        d_eps.append(e / dt)
        dt, e = cart()
        c_rates.append(steps / dt)
        c_eps.append(e / dt)
    dil_env.close()
    cart_env.close()
    ratios = np.array(d_rates) / np.array(c_rates)
    return {
        "diloco_steps_per_s": float(np.median(d_rates)),
        "diloco_episodes_per_s": float(np.median(d_eps)),
        "cartpole_steps_per_s": float(np.median(c_rates)),
        "cartpole_episodes_per_s": float(np.median(c_eps)),
        "ratio": float(np.median(ratios)),
        "ratio_min": float(ratios.min()),
        "ratio_max": float(ratios.max()),
        "rounds": rounds,
        "steps": steps,
        "note": "default gym.make (skip_forced=True, fresh episodes), random actions, "
        "resets included; median of paired rounds",
    }


def bench_fleet_build(episodes: int, repeats: int, row: dict) -> dict:
    """The default fleet's episode build alone (``DiLoCoFleet-v1``'s ``build_episode`` of
    fresh seeds: four sites' requests, their no-merge replay and what an episode holds,
    no step), in ms per episode; and the ratio to CartPole the fleet env could reach if a
    reset and its decisions cost nothing else (``row``: the fleet env's row, for its
    decisions per episode and CartPole's rate). Best of ``repeats``."""
    env = gym.make("DiLoCoFleet-v1").unwrapped
    env.build_episode(10**6)  # warm-up (compiled functions)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        for seed in range(k * episodes, (k + 1) * episodes):
            env.build_episode(seed)
        return (time.perf_counter() - t0) * 1000.0 / episodes

    ms = min(run(k) for k in range(repeats))
    per_episode = row["diloco_steps_per_s"] / row["diloco_episodes_per_s"]
    ceiling = per_episode * 1000.0 / ms
    return {
        "episodes": episodes,
        "build_ms": ms,
        "decisions_per_episode": per_episode,
        "ceiling_decisions_per_s": ceiling,
        "ceiling_ratio": ceiling / row["cartpole_steps_per_s"],
        "note": "DiLoCoFleet-v1 build_episode of fresh seeds, best of repeats; the ceiling "
        "is the fleet env's decisions per episode over the build alone",
    }


#: the compiled calls of a fleet episode, by the module accessor that holds them (a tree
#: without one of them, an A/B's older side, is timed without it)
FLEET_COMPILED = (
    ("compiled_draws", "synthetic_batch", "traces"),
    ("compiled", "synthetic_rows", "traces"),
    ("compiled", "episode_core_rows", "episodes"),
    ("compiled", "cost_queue_rows", "cost_queue"),
    ("compiled_stats", "replay_counts_sites", "replays"),
    ("compiled_stats", "replay_summary_one", "replays"),
)


def bench_fleet_profile(steps: int, row: dict) -> dict:
    """Where the default fleet env's episodes go (``gym.make("DiLoCoFleet-v1")``, random
    actions, ms per episode): the reset (of it the episode build), the steps, the closing
    replays; and the compiled work among them (the traces' draws and arrays, the episodes'
    arrays, the cost queue, the compiled steps with the syncs' costs at every site, the
    replays), timed around each compiled call. ``ceiling_ratio``: the ratio to CartPole
    (``row``: the fleet env's bench row, for CartPole's rate) of a fleet env whose episodes
    cost their compiled work alone, no Python at all."""
    import diloco_gym.sim as sim

    env = gym.make("DiLoCoFleet-v1")
    u = env.unwrapped
    spent = dict.fromkeys(("reset", "_episode_of_seed", "episode_summary", "step", "advance"), 0.0)
    parts = dict.fromkeys(("traces", "episodes", "cost_queue", "replays"), 0.0)
    saved = []
    for accessor, name, part in FLEET_COMPILED:
        module = getattr(sim, accessor, lambda: None)()
        fn = getattr(module, name, None)
        if fn is not None:
            saved.append((module, name, fn))
            setattr(module, name, _timed(fn, parts, part))
    _timed_methods(u, ("episode_summary", "_episode_of_seed"), spent)
    _timed_methods(u._fused, ("advance",), spent)  # a reset's forced decisions, compiled
    _time_compiled_step(u, spent)
    actions = np.random.default_rng(2).integers(0, 2, steps).tolist()
    try:
        for _ in range(2):  # warm-up, then the timed run
            env.reset(seed=0)
            for k in spent:
                spent[k] = 0.0
            for k in parts:
                parts[k] = 0.0
            episodes, total = _run_episodes(env, actions, spent)
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
    env.close()
    k = 1000.0 / max(1, episodes)
    steps_ms = (spent["step"] + spent["advance"]) * k
    compiled_ms = sum(parts.values()) * k + steps_ms
    per_episode = steps / max(1, episodes)
    return {
        "episodes": episodes,
        "decisions_per_episode": per_episode,
        "episode_ms": total * k,
        "reset_ms": spent["reset"] * k,
        "build_ms": spent["_episode_of_seed"] * k,
        "summary_ms": spent["episode_summary"] * k,
        "compiled_ms": compiled_ms,
        "compiled_parts_ms": {**{p: v * k for p, v in parts.items()}, "steps": steps_ms},
        "python_ms": total * k - compiled_ms,
        "ceiling_ratio": per_episode * 1000.0 / compiled_ms / row["cartpole_steps_per_s"],
        "note": "random actions; compiled work timed around each compiled call (the draws "
        "inside the traces' call where the tree draws there); the ceiling is the fleet env "
        "at its compiled work alone",
    }


def bench_fleet_vector(num_envs: int, steps: int, rounds: int) -> dict:
    """The default fleet's vector env (``gym.make_vec("DiLoCoFleet-v1", num_envs,
    vectorization_mode="vector_entry_point")``: the compiled fleet vector env where the
    tree has it, NEXT_STEP autoreset) and the vector env of ``num_envs`` fleet envs
    (``native=False``: Gymnasium's ``SyncVectorEnv`` over them), against CartPole's native
    vector env of as many envs, random actions, resets included, in paired rounds of
    ``steps`` vector steps; rates in env steps (decisions) per second. Skipped for a tree
    without a fleet vector env (an A/B's older side)."""
    kw = {"num_envs": num_envs, "vectorization_mode": "vector_entry_point"}
    try:
        fleet = gym.make_vec("DiLoCoFleet-v1", **kw)
    except gym.error.Error:
        return {"skipped": "this tree has no fleet vector env"}
    envs = {"fleet": fleet, "cartpole": gym.make_vec("CartPole-v1", **kw)}
    try:  # the fleet envs' vector env beside the compiled one (a tree that has both)
        envs["fleet_envs"] = gym.make_vec("DiLoCoFleet-v1", native=False, **kw)
    except TypeError:
        pass
    table = np.random.default_rng(1).integers(0, 2, (256, num_envs))
    for env in envs.values():
        env.reset(seed=0)
        for t in range(steps):  # warm-up (spreads the episode ends)
            env.step(table[t % 256])

    def run(k: str) -> tuple[float, int]:
        env, episodes = envs[k], 0
        t0 = time.perf_counter()
        for t in range(steps):
            _, _, terminated, truncated, _ = env.step(table[t % 256])
            episodes += int(np.count_nonzero(terminated | truncated))
        return time.perf_counter() - t0, episodes

    rates: dict[str, list[float]] = {k: [] for k in envs}
    eps: list[float] = []
    for _ in range(rounds):
        for k in envs:
            dt, e = run(k)
            rates[k].append(steps * num_envs / dt)
            if k == "fleet":
                eps.append(e / dt)
    for env in envs.values():
        env.close()
    ratios = np.array(rates["fleet"]) / np.array(rates["cartpole"])
    out = {
        "num_envs": num_envs,
        "class": type(fleet).__name__,
        "diloco_steps_per_s": float(np.median(rates["fleet"])),
        "diloco_episodes_per_s": float(np.median(eps)),
        "cartpole_steps_per_s": float(np.median(rates["cartpole"])),
        "ratio": float(np.median(ratios)),
        "ratio_min": float(ratios.min()),
        "ratio_max": float(ratios.max()),
        "rounds": rounds,
        "steps": steps,
    }
    if "fleet_envs" in rates:
        sync = np.array(rates["fleet_envs"])
        out["fleet_envs_steps_per_s"] = float(np.median(sync))
        out["fleet_envs_ratio"] = float(np.median(sync / np.array(rates["cartpole"])))
        out["speedup_over_fleet_envs"] = float(np.median(np.array(rates["fleet"]) / sync))
    return out


def bench_vector_default(num_envs: int, steps: int, rounds: int, **env_kwargs) -> dict:
    """The default configuration's native vector env (``gym.make_vec("DiLoCoSync-v2",
    num_envs, vectorization_mode="vector_entry_point")``: ``skip_forced=True``, fresh
    episodes, NEXT_STEP autoreset) against CartPole's, random actions, in paired rounds of
    ``steps`` vector steps each (after a warm-up that spreads the episode ends).
    ``env_kwargs``: a non-default configuration of the DiLoCo env instead (e.g.
    ``parallel=True``; its CPU-time ratio counts the calling thread only)."""
    kw = {"num_envs": num_envs, "vectorization_mode": "vector_entry_point"}
    envs = {
        "diloco": gym.make_vec("DiLoCoSync-v2", **kw, **env_kwargs),
        "cartpole": gym.make_vec("CartPole-v1", **kw),
    }
    tables = {}
    for k, env in envs.items():
        env.reset(seed=0)
        tables[k] = np.random.default_rng(1).integers(0, 2, (256, num_envs))
        for t in range(2 * steps):  # warm-up: episode lengths vary, so ends spread out
            env.step(tables[k][t % 256])

    cpu: list[float] = []  # the DiLoCo rounds' CPU seconds (this thread's)
    faults: list[int] = []  # the DiLoCo rounds' minor page faults (fresh memory touched)

    def run(k: str) -> tuple[float, int]:
        env, table = envs[k], tables[k]
        episodes = 0
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, t0 = time.thread_time(), time.perf_counter()
        for t in range(steps):
            _, _, terminated, truncated, _ = env.step(table[t % 256])
            episodes += int(np.count_nonzero(terminated | truncated))
        if k == "diloco":
            cpu.append(time.thread_time() - c0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return time.perf_counter() - t0, episodes

    rates: dict[str, list[float]] = {"diloco": [], "cartpole": []}
    eps: dict[str, list[float]] = {"diloco": [], "cartpole": []}
    # The floor, timed in the same rounds (a tree without the compiled generation, such
    # as an A/B's older side, has none).
    floor = floor_runner(32) if hasattr(regimes.SyntheticRegime, "draw_raw") else None
    if floor is not None:
        floor()
    floor_eps: list[float] = []
    floor_cpu_ms: list[float] = []  # CPU ms per floor episode (robust to a shared machine)
    ended: list[int] = []  # episodes the DiLoCo rounds ended
    for _ in range(rounds):
        for k in envs:
            dt, e = run(k)
            rates[k].append(steps * num_envs / dt)
            eps[k].append(e / dt)
            if k == "diloco":
                ended.append(e)
        c0 = time.thread_time()
        floor_eps.append(1000.0 / floor() if floor is not None else float("nan"))
        floor_cpu_ms.append((time.thread_time() - c0) * 1000.0 / 32)
    vs_floor = np.array(floor_eps) / np.array(eps["diloco"])
    # CPU ms per DiLoCo episode over CPU ms per floor episode, round by round
    diloco_cpu_ms = np.array(cpu) * 1000.0 / np.maximum(1, np.array(ended))
    vs_floor_cpu = diloco_cpu_ms / np.array(floor_cpu_ms)
    for env in envs.values():
        env.close()
    ratios = np.array(rates["diloco"]) / np.array(rates["cartpole"])
    return {
        "num_envs": num_envs,
        "steps": steps,
        "rounds": rounds,
        "diloco_steps_per_s": float(np.median(rates["diloco"])),
        "diloco_episodes_per_s": float(np.median(eps["diloco"])),
        "cartpole_steps_per_s": float(np.median(rates["cartpole"])),
        "cartpole_episodes_per_s": float(np.median(eps["cartpole"])),
        "ratio": float(np.median(ratios)),
        "ratio_min": float(ratios.min()),
        "ratio_max": float(ratios.max()),
        "floor_episodes_per_s": float(np.median(floor_eps)),
        "vs_floor": float(np.median(vs_floor)),
        "vs_floor_min": float(vs_floor.min()),
        "vs_floor_max": float(vs_floor.max()),
        "diloco_cpu_ms_per_episode": float(np.median(diloco_cpu_ms)),
        "floor_cpu_ms_per_episode": float(np.median(floor_cpu_ms)),
        "vs_floor_cpu": float(np.median(vs_floor_cpu)),
        # fresh memory the allocator took from the system and the step then faulted in: a
        # restart path that allocates per batch shows up here (it costs system time)
        "page_faults_per_step": float(np.median(faults)) / steps,
        "note": "default make_vec (skip_forced=True, fresh episodes), random actions, "
        "NEXT_STEP autoreset; median of paired rounds"
        + (f"; NON-DEFAULT {env_kwargs}" if env_kwargs else ""),
    }


def bench_single(steps: int, rounds: int) -> dict:
    """Paired rounds: DiLoCo and CartPole stepped back to back, ``steps`` each per round;
    the ratio is the median of the per-round ratios (a slow phase of a shared machine then
    hits both sides of a pair instead of one side of the comparison)."""
    dil_env, dil = _single_env_runner("DiLoCoSync-v2", steps, 0, skip_forced=False)
    cart_env, cart = _single_env_runner("CartPole-v1", steps, 0)
    dil(), cart()  # warm-up
    d_rates, c_rates = [], []
    for _ in range(rounds):
        d_rates.append(steps / dil())
        c_rates.append(steps / cart())
    dil_env.close()
    cart_env.close()
    ratios = np.array(d_rates) / np.array(c_rates)
    return {
        "diloco_steps_per_s": float(np.median(d_rates)),
        "cartpole_steps_per_s": float(np.median(c_rates)),
        "ratio": float(np.median(ratios)),
        "ratio_min": float(ratios.min()),
        "ratio_max": float(ratios.max()),
        "rounds": rounds,
        "steps": steps,
        "note": "skip_forced=False, random actions, resets included; median of paired rounds",
    }


# ----------------------------------------------------------------------------- vector env
def vector_rate(env, steps: int, seed: int) -> float:
    """Env steps per second over ``steps`` vector steps of uniformly random actions."""
    b = env.num_envs
    table = np.random.default_rng(seed).integers(0, 2, (min(steps, 4096), b))
    t0 = time.perf_counter()
    for t in range(steps):
        env.step(table[t % table.shape[0]])
    return steps * b / (time.perf_counter() - t0)


def desync(env, steps: int) -> None:
    """Step half an episode so that a timing window of whole episodes holds exactly one
    reset wave per episode (all envs share the episode length with skip_forced=False)."""
    table = np.random.default_rng(12345).integers(0, 2, (16, env.num_envs))
    for t in range(steps):
        env.step(table[t % 16])


def bench_vector(num_envs: int, episodes: int, repeats: int) -> dict:
    out: dict = {"num_envs": num_envs}
    kw = {"num_envs": num_envs, "vectorization_mode": "vector_entry_point"}
    t0 = time.perf_counter()
    fresh = gym.make_vec("DiLoCoSync-v2", skip_forced=False, **kw)
    fresh.reset(seed=0)
    out["fresh_first_reset_s"] = time.perf_counter() - t0
    n = int(fresh.unwrapped._bank_n[0])
    steps = episodes * n  # whole episodes: every env resets `episodes` times
    t0 = time.perf_counter()
    pooled = gym.make_vec("DiLoCoSync-v2", skip_forced=False, episode_pool=num_envs, **kw)
    pooled.reset(seed=0)
    out["pool_build_s"] = time.perf_counter() - t0
    cart = gym.make_vec("CartPole-v1", **kw)
    cart.reset(seed=0)
    desync(fresh, n // 2)
    desync(pooled, n // 2)
    desync(cart, n // 2)
    # The floor of fresh episodes: stepping as fast as the pool does, plus only the random
    # draws of the episodes that the window restarts (every env restarts `episodes` times).
    restarts = episodes * num_envs
    draws_only = fresh_floor_runner(64)
    rates: dict[str, list[float]] = {"fresh": [], "pool": [], "cartpole": [], "ceiling": []}
    draws_ms = []
    for r in range(repeats):
        rates["fresh"].append(vector_rate(fresh, steps, r))
        rates["cartpole"].append(vector_rate(cart, steps, r))
        rates["pool"].append(vector_rate(pooled, steps, r))
        draws_ms.append(draws_only())
        window_s = steps * num_envs / rates["pool"][-1] + restarts * draws_ms[-1] / 1000.0
        rates["ceiling"].append(steps * num_envs / window_s)
    best = {k: max(v) for k, v in rates.items()}
    out.update(
        {
            "fresh_ceiling_steps_per_s": best["ceiling"],
            "fresh_ceiling_ratio": best["ceiling"] / best["cartpole"],
            "draws_only_ms": min(draws_ms),
            "restarts_per_step": restarts / steps,
            "cartpole_step_ms": num_envs / best["cartpole"] * 1000.0,
            "steps_per_env": steps,
            "episode_decisions": n,
            "fresh_steps_per_s": best["fresh"],
            "pool_steps_per_s": best["pool"],
            "cartpole_steps_per_s": best["cartpole"],
            "fresh_ratio": best["fresh"] / best["cartpole"],
            "pool_ratio": best["pool"] / best["cartpole"],
            "note": "skip_forced=False, random actions, NEXT_STEP autoreset, whole episodes",
        }
    )
    for env in (fresh, pooled, cart):
        env.close()
    return out


def _draw_sizes(reg, lp: lrn.LearnerParams, seed: int) -> tuple:
    """The sizes of the generator calls that episode ``seed`` of periodic regime ``reg``
    makes (the exponentials batch, requests, pressure samples), read off a real draw; the
    generator state after :func:`_random_draws_only` with them is checked against it."""
    rng = np.random.default_rng(seed)
    arrivals = reg.draw(rng)[0]
    lp.draw_throughputs(rng)
    _, centres, widths = regimes._slice_grid(reg.duration_s)
    lam = reg.rate_rps(centres, np.random.default_rng(seed), _sorted=True) * widths
    total = float(np.cumsum(lam)[-1])  # as regimes.SyntheticRegime.draw_raw (jit.slice_counts)
    batch = regimes._exponential_batch(total)
    n_p = int(np.ceil(reg.duration_s / PRESSURE_DT_S - 1e-9))
    sizes = (batch, arrivals.size, n_p)
    check = np.random.default_rng(seed)
    _random_draws_only(reg, lp, check, *sizes)
    if check.bit_generator.state != rng.bit_generator.state:
        return None  # a second exponentials batch was needed (rare): skip this seed
    return sizes


def _random_draws_only(reg, lp: lrn.LearnerParams, rng, batch: int, m: int, n_p: int) -> None:
    """Exactly the random numbers an episode of the periodic regime ``reg`` draws (burst
    phase, arrivals, tokens, pressure noise and spikes, learner throughputs), nothing else."""
    rng.uniform(0.0, reg.burst_period_s)
    rng.standard_exponential(batch)
    rng.random(m)
    rng.standard_normal((2, n_p))
    rng.random((2, n_p))
    rng.normal(0.0, lp.throughput_sigma, lp.num_learners)


def fresh_floor_runner(episodes: int):
    """A function timing the random draws alone of ``episodes`` bursty episodes (seeding
    each generator and drawing exactly the numbers the episode uses, none of the
    simulation); it returns milliseconds per episode. Sizes are read off real draws once."""
    reg = regimes.get_regime("bursty")
    lp = lrn.LearnerParams()
    jobs = [
        (seed, sz) for seed in range(episodes) if (sz := _draw_sizes(reg, lp, seed)) is not None
    ]
    if not jobs:
        raise RuntimeError("fresh_floor_runner: the draws no longer match SyntheticRegime.draw")

    def run() -> float:
        t0 = time.perf_counter()
        for seed, sz in jobs:
            _random_draws_only(reg, lp, np.random.default_rng(seed), *sz)
        return (time.perf_counter() - t0) * 1000.0 / len(jobs)

    return run


def floor_runner(episodes: int, batch: int = 16):
    """A function timing the floor of ``episodes`` fresh bursty episodes (seeds 0, 1, ...)
    and returning milliseconds per episode: generating each episode's requests
    (``SyntheticRegime.draw_raw``: the random draws; then ``from_raw``: the compiled
    arrival times by time rescaling and token counts, ``batch`` episodes per call, as the
    vector env builds them) and replaying them without merges (service times, the compiled
    Lindley queue, latencies and SLO violations), nothing else (no features, no merge
    costs, no agent). Bursty has no pressure slowdown, so the pressure series do not enter
    the replay. The batch's arrays are reused between batches (``from_raw``'s scratch) as
    the vector env reuses them, so neither pays for fresh memory from the system."""
    from diloco_gym.sim.sidecar import base_latency_s, replay

    reg = regimes.get_regime("bursty")
    p = EnvParams()
    sc = reg.sidecar
    n_bins = int(np.ceil(reg.duration_s / p.step_seconds - 1e-9))
    zeros = np.zeros(n_bins)
    lp = lrn.LearnerParams()
    # the batch arrays reused as the vector env reuses them (no fresh memory per batch),
    # where this tree's from_raw takes them
    scratch: dict | None = {} if "scratch" in inspect.signature(reg.from_raw).parameters else None

    def run() -> float:
        t0 = time.perf_counter()
        for lo in range(0, episodes, batch):
            raws = []
            for seed in range(lo, min(episodes, lo + batch)):
                rng = np.random.default_rng(seed)
                raws.append(reg.draw_raw(rng))
                lp.draw_throughputs(rng)
            more = () if scratch is None else (scratch,)
            arrivals, prompt, output, counts, _ = reg.from_raw(raws, np.float64, *more)
            ends = np.cumsum(counts)
            for a, b in zip((ends - counts).tolist(), ends.tolist(), strict=True):
                # per episode, as the vector env's build: no batch-sized temporaries
                base = base_latency_s(prompt[a:b], output[a:b], sc)
                req_bin = np.minimum((arrivals[a:b] / p.step_seconds).astype(np.int64), n_bins - 1)
                replay(base, req_bin, zeros, None, sc, p.step_seconds).violated.sum()
        return (time.perf_counter() - t0) * 1000.0 / episodes

    return run


def bench_floor(episodes: int, repeats: int) -> dict:
    """The floor of a fresh episode (:func:`floor_runner`), per decision of the default
    bursty episode; best of ``repeats``."""
    reg = regimes.get_regime("bursty")
    n_dec = EnvParams().n_decisions(reg.duration_s)
    run = floor_runner(episodes)
    run()
    ms = min(run() for _ in range(repeats))
    return {
        "episodes": episodes,
        "decisions_per_episode": n_dec,
        "episode_ms": ms,
        "us_per_decision": ms * 1000.0 / n_dec,
        "decisions_per_s": n_dec * 1000.0 / ms,
        "note": "bursty: draws + compiled arrivals/tokens (16 per call) + no-merge replay "
        "per episode; best of repeats",
    }


def bench_training(timesteps: int, n_envs: int, repeats: int) -> dict:
    """Training throughput: PPO and MaskablePPO (``n_steps=256``, batch 64, one epoch,
    ``MlpPolicy``, CPU) for ``timesteps`` steps on the native vector env (``SB3VecEnv``,
    default ``DiLoCoSync-v2``) vs the same settings on CartPole (SB3's ``DummyVecEnv`` of
    ``n_envs`` CartPole-v1; MaskablePPO with all-true masks). Steps per second, best of
    ``repeats``; the ratio shows whether the environment is the bottleneck."""
    try:
        import torch
        from sb3_contrib import MaskablePPO
        from sb3_contrib.common.wrappers import ActionMasker
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError as e:  # the rl extra
        return {"skipped": f"needs the rl extra ({e.name})"}
    from diloco_gym.rl.sb3 import SB3VecEnv

    torch.set_num_threads(1)
    kw = {"n_steps": 256, "batch_size": 64, "n_epochs": 1, "verbose": 0, "device": "cpu"}

    def cart_env(masked: bool):
        wrapper = None
        if masked:

            def wrapper(e):
                return ActionMasker(e, lambda _e: np.ones(2, dtype=bool))

        return make_vec_env("CartPole-v1", n_envs=n_envs, seed=0, wrapper_class=wrapper)

    def rate(algo, make_env) -> float:
        best = 0.0
        for _ in range(repeats):
            env = make_env()
            model = algo("MlpPolicy", env, seed=0, **kw)
            t0 = time.perf_counter()
            model.learn(total_timesteps=timesteps)
            best = max(best, model.num_timesteps / (time.perf_counter() - t0))
            env.close()
        return best

    out: dict = {"timesteps": timesteps, "n_envs": n_envs, "settings": dict(kw)}
    for name, algo, masked in (("ppo", PPO, False), ("maskable_ppo", MaskablePPO, True)):
        d = rate(algo, lambda: SB3VecEnv(num_envs=n_envs))
        c = rate(algo, lambda m=masked: cart_env(m))
        out[name] = {"diloco_steps_per_s": d, "cartpole_steps_per_s": c, "ratio": d / c}
    return out


def _ab_child(out: Path) -> None:
    """One A/B measurement of the tree at ``SRC``: the two headline rows, written to ``out``."""
    res = {
        "src": SRC,
        "default_single": bench_single_default(5_000, 5),
        "default_vector": bench_vector_default(1024, 30, 3),
    }
    out.write_text(json.dumps(res, default=float))


def bench_ab(rev: str, rounds: int) -> dict:
    """The headline rows of revision ``rev``'s code and of this checkout's, in alternating
    subprocesses (``rounds`` each) of this script: the same benchmark functions, only the
    package differs (``DILOCO_GYM_BENCH_SRC``). ``rev``'s tree comes from ``git archive``."""
    import subprocess
    import tempfile

    here = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="diloco-ab-"))
    archive = subprocess.run(
        ["git", "-C", str(here), "archive", rev, "diloco_gym"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    trees = {rev: str(tmp), "this checkout": str(here)}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(rounds):
        for name, src in trees.items():
            out = tmp / "ab.json"
            env = dict(os.environ, DILOCO_GYM_BENCH_SRC=src)
            subprocess.run([sys.executable, __file__, "--ab-child", str(out)], env=env, check=True)
            runs[name].append(json.loads(out.read_text()))
    return {"rev": rev, "rounds": rounds, "results": ab_summary(runs)}


_AB_KEYS = (
    "diloco_steps_per_s",
    "cartpole_steps_per_s",
    "ratio",
    "vs_floor",
    "diloco_episodes_per_s",
    "floor_episodes_per_s",
)


def ab_summary(runs: dict[str, list[dict]]) -> dict:
    """The medians of each side's A/B runs (``runs``: side -> the children's results, one
    side named ``"this checkout"``). A tree without the compiled generation (0.4.0's) has no
    floor of its own: its vector env is also put against this checkout's floor
    (``vs_checkout_floor``), the machine's limit timed in that side's rounds."""
    res = {
        name: {
            row: {
                key: float(np.median([r[row][key] for r in rs]))
                for key in _AB_KEYS
                if key in rs[0][row]
            }
            for row in ("default_single", "default_vector")
        }
        for name, rs in runs.items()
    }
    here_floor = res["this checkout"]["default_vector"].get("floor_episodes_per_s", np.nan)
    for rows in res.values():
        v = rows["default_vector"]
        if not v.get("vs_floor", np.nan) > 0 and v.get("diloco_episodes_per_s", 0) > 0:
            v["vs_checkout_floor"] = float(here_floor / v["diloco_episodes_per_s"])
    return res


# ----------------------------------------------------------------------------- protocol parts
def bench_envelope(draws: int, repeats: int) -> dict:
    reg = regimes.get_regime("bursty")
    params = EnvParams()
    t0 = time.perf_counter()
    ep = episode_module.episode_from_seed(reg, 0, params, reg.sidecar, lrn.LearnerParams())
    build = time.perf_counter() - t0
    m = 8  # the reference's budget for a 600 s episode

    def run():
        rng = np.random.default_rng(1)
        sch = schedules.sample_uniform(ep.n_decisions, params.h_min, params.h_max, m, draws, rng)
        return ep.merge_cost[sch].sum(axis=1)

    dt = best_of(run, repeats)
    return {"draws": draws, "merges": m, "envelope_s": dt, "episode_build_s": build}


def bench_oracle(duration_s: float, repeats: int) -> dict:
    reg = replace(regimes.get_regime("bursty"), duration_s=duration_s)
    params = EnvParams()
    lp = lrn.LearnerParams()
    res: dict = {"duration_s": duration_s}
    best_total = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        rng = np.random.default_rng(0)
        trace = reg(rng)
        t1 = time.perf_counter()
        ep = episode_module.build_episode(trace, params, reg.sidecar, lp, rng, seed=0)
        cost = ep.merge_cost  # computed on first use: timed with the episode
        t2 = time.perf_counter()
        merges, total = schedules.optimal_schedule(cost, params.h_min, params.h_max)
        t3 = time.perf_counter()
        if t3 - t0 < best_total:
            best_total = t3 - t0
            res.update(
                trace_s=t1 - t0,
                build_episode_s=t2 - t1,
                dp_s=t3 - t2,
                total_s=t3 - t0,
                decisions=ep.n_decisions,
                requests=trace.num_requests,
                merges=int(merges.size),
                oracle_cost_requests=total,
            )
    return res


# ----------------------------------------------------------------------------- memory
def bench_memory(num_envs: int, total_steps: int, pool: bool) -> dict:
    """RSS before and after ``total_steps`` env steps (after one whole episode of warm-up)."""
    env = gym.make_vec(
        "DiLoCoSync-v2",
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        skip_forced=False,
        episode_pool=num_envs if pool else None,
    )
    env.reset(seed=0)
    n = int(env.unwrapped._bank_n[0])
    table = np.random.default_rng(0).integers(0, 2, (1024, num_envs))
    warm = n + 1  # one whole episode and its autoreset: every buffer exists
    for t in range(warm):
        env.step(table[t % 1024])
    gc.collect()
    start = rss_mib()
    steps = max(1, total_steps // num_envs)
    peak = start
    t0 = time.perf_counter()
    for t in range(steps):
        env.step(table[t % 1024])
        if t % 256 == 0:
            peak = max(peak, rss_mib())
    elapsed = time.perf_counter() - t0
    gc.collect()
    end = rss_mib()
    # The env's own arrays (its episode bank): the process RSS also holds whatever earlier
    # benchmarks in this process freed but the allocator kept.
    bank = (
        sum(
            v.nbytes
            for k, v in vars(env.unwrapped).items()
            if k.startswith("_bank_") and isinstance(v, np.ndarray)
        )
        / 2**20
    )
    env.close()
    return {
        "num_envs": num_envs,
        "episode_pool": pool,
        "env_steps": steps * num_envs,
        "bank_mib": bank,
        "rss_start_mib": start,
        "rss_end_mib": end,
        "rss_peak_mib": max(peak, end),
        "growth_pct": 100.0 * (end - start) / start,
        "seconds": elapsed,
    }


# ----------------------------------------------------------------------------- profile
def bench_profile(episodes: int, num_envs: int = 1024, steps: int = 517) -> dict:
    """Where the time goes (milliseconds): an episode's parts (mean over ``episodes`` seeds)
    and a fresh-episode vector step's parts (``steps`` steps of ``num_envs`` envs)."""
    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    reg = regimes.get_regime("bursty")
    params = replace(EnvParams(), skip_forced=False)
    lp = lrn.LearnerParams()
    venv = DiLoCoSyncVectorEnv(num_envs, regime="bursty", params=params)
    t = dict.fromkeys(("trace", "build", "costs", "draw", "core", "bank_row"), 0.0)
    for seed in range(episodes):
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        trace = reg(rng)
        t1 = time.perf_counter()
        ep = episode_module.build_episode(trace, params, reg.sidecar, lp, rng, seed=seed)
        t2 = time.perf_counter()
        starts = np.arange(ep.n_decisions, dtype=np.int64) * params.decision_interval
        merge_costs(
            ep.base_s,
            ep.req_bin,
            ep.pressure_bin,
            reg.sidecar,
            params.step_seconds,
            starts,
            params.merge_steps,
            ep.baseline.violated,
        )
        t3 = time.perf_counter()
        arrivals, prompt, output, net, ckpt = reg.draw(np.random.default_rng(seed), np.float64)
        t4 = time.perf_counter()
        episode_module.episode_core(
            arrivals, prompt, output, net, ckpt, reg.duration_s, params, reg.sidecar
        )
        t5 = time.perf_counter()
        venv._build_fresh(np.array([0]), [seed])
        t6 = time.perf_counter()
        for key, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
            t[key] += dt
    k = 1000.0 / episodes
    out = {
        "episodes": episodes,
        "trace_ms": t["trace"] * k,
        "merge_costs_ms": t["costs"] * k,
        "rest_of_build_ms": t["build"] * k,
        "episode_ms": (t["trace"] + t["build"] + t["costs"]) * k,
        "vector_draw_ms": t["draw"] * k,
        "vector_core_ms": t["core"] * k,
        "vector_bank_row_ms": t["bank_row"] * k,
    }
    # The same episodes built together, as a reset wave builds them.
    slots = np.arange(min(episodes, num_envs))
    t0 = time.perf_counter()
    venv._build_fresh(slots, list(range(slots.size)))
    out["vector_batched_row_ms"] = (time.perf_counter() - t0) * 1000.0 / slots.size

    # A fresh-episode vector step, split by timing the env's own methods in place.
    spent = {"_restart": 0.0, "step": 0.0, "_observe": 0.0}
    _timed_methods(venv, ("_restart", "_observe"), spent)
    _timed_methods(venv._fused, ("step",), spent)  # the compiled step of all rows
    venv.reset(seed=0)
    desync(venv, steps // 2)
    for key in spent:
        spent[key] = 0.0
    table = np.random.default_rng(1).integers(0, 2, (64, num_envs))
    t0 = time.perf_counter()
    for i in range(steps):
        venv.step(table[i % 64])
    total = time.perf_counter() - t0
    k = 1000.0 / steps
    out.update(
        {
            "step_ms": total * k,
            "step_restart_ms": spent["_restart"] * k,
            "step_compiled_ms": spent["step"] * k,
            "step_observe_ms": spent["_observe"] * k,
            "step_other_ms": (total - sum(spent.values())) * k,
            "step_num_envs": num_envs,
        }
    )
    venv.close()
    return out


def _timed(fn, spent: dict, key: str):
    """``fn`` wrapped to add its wall time to ``spent[key]``."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0

    return timed


def _timed_methods(obj, names, spent: dict) -> None:
    """Replace ``obj``'s methods ``names`` by wrappers adding their wall time to ``spent``."""
    for name in names:
        setattr(obj, name, _timed(getattr(obj, name), spent, name))


def _run_episodes(env, actions: list, spent: dict) -> tuple[int, float]:
    """Step ``env`` through ``actions``, resetting after each episode (the resets' time
    into ``spent["reset"]``); the episodes ended and the wall time."""
    episodes = 0
    t0 = time.perf_counter()
    for a in actions:
        if env.step(a)[3]:
            t1 = time.perf_counter()
            env.reset()
            spent["reset"] += time.perf_counter() - t1
            episodes += 1
    return episodes, time.perf_counter() - t0


def _time_compiled_step(u, spent: dict) -> None:
    """Time an env's compiled step call into ``spent["step"]``: the call the env binds at
    each reset (``FusedStep.bound_step``) is wrapped as it is bound."""
    bound = u._fused.bound_step
    u._fused.bound_step = lambda *args: _timed(bound(*args), spent, "step")


def bench_profile_default(steps: int, num_envs: int, vector_steps: int) -> dict:
    """Where the default configuration's time goes (milliseconds), random actions.

    Single env (``gym.make("DiLoCoSync-v2")``), per episode: the reset (of which the
    episode build, ``episode_from_seed``: trace draws and the agent-independent
    arrays), the compiled steps (``FusedStep.step``: options, merges with their costs and
    gains, forced decisions, reward, mask and observation), the final exact replay
    (``episode_summary``) and the rest of the steps (Gymnasium's wrappers, action checks,
    the info, the schedule). Vector env at ``num_envs`` (fresh episodes), per vector step:
    restarts (building the new episodes), the compiled step of all rows, observation, the
    rest.
    """
    env = gym.make("DiLoCoSync-v2")
    u = env.unwrapped
    spent = dict.fromkeys(("step", "episode_summary", "reset", "build"), 0.0)
    _timed_methods(u, ("episode_summary",), spent)
    _time_compiled_step(u, spent)
    build = env_module.episode_from_seed
    timed_build = _timed(build, spent, "build")
    actions = np.random.default_rng(2).integers(0, 2, steps).tolist()
    env.reset(seed=0)
    env_module.episode_from_seed = timed_build  # the name the env's reset calls
    try:
        episodes, total = _run_episodes(env, actions, spent)
    finally:
        env_module.episode_from_seed = build
    env.close()
    k = 1000.0 / max(1, episodes)
    out = {
        "episodes": episodes,
        "decisions_per_episode": steps / max(1, episodes),
        "episode_ms": total * k,
        "reset_ms": spent["reset"] * k,
        "build_ms": spent["build"] * k,
        "compiled_step_ms": spent["step"] * k,
        "summary_ms": spent["episode_summary"] * k,
        "steps_other_ms": (total - spent["reset"] - spent["step"] - spent["episode_summary"]) * k,
    }

    venv = gym.make_vec("DiLoCoSync-v2", num_envs=num_envs, vectorization_mode="vector_entry_point")
    vu = venv.unwrapped
    venv.reset(seed=0)
    table = np.random.default_rng(3).integers(0, 2, (64, num_envs))
    for t in range(vector_steps):  # warm-up: the episode ends spread out
        venv.step(table[t % 64])
    vspent = dict.fromkeys(("_restart", "step", "_observe"), 0.0)
    _timed_methods(vu, ("_restart", "_observe"), vspent)
    _timed_methods(vu._fused, ("step",), vspent)
    ended = 0
    t0 = time.perf_counter()
    for t in range(vector_steps):
        _, _, term, trunc, _ = venv.step(table[t % 64])
        ended += int(np.count_nonzero(term | trunc))
    vtotal = time.perf_counter() - t0
    venv.close()
    k = 1000.0 / vector_steps
    out.update(
        {
            "vector_num_envs": num_envs,
            "vector_step_ms": vtotal * k,
            "vector_restart_ms": vspent["_restart"] * k,
            "vector_compiled_step_ms": vspent["step"] * k,
            "vector_observe_ms": vspent["_observe"] * k,
            "vector_other_ms": (vtotal - sum(vspent.values())) * k,
            "vector_episodes_per_step": ended / vector_steps,
        }
    )
    return out


# ----------------------------------------------------------------------------- report
#: the fleet rows: result key, env id (the model v1, and the deprecated v0 for comparison)
FLEET_ROWS = (("default_fleet_v1", "DiLoCoFleet-v1"), ("default_fleet", "DiLoCoFleet-v0"))


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}/s"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_table(r: dict) -> None:
    s, v, e, o, p = (r[k] for k in ("single", "vector", "envelope", "oracle", "profile"))
    ds, dv = r["default_single"], r["default_vector"]
    t = TARGETS
    full = v["num_envs"] == 1024  # the vector targets are stated for 1,024 envs

    def vec_verdict(rate: float, ratio: float) -> str:
        if not full:
            return f"(n/a at {v['num_envs']})"
        return verdict(rate >= t["vector_steps_per_s"] and ratio >= t["vector_ratio_to_cartpole"])

    pd = r["profile_default"]
    rows = [
        (
            'DEFAULT single env: gym.make("DiLoCoSync-v2") (skip_forced=True, fresh episodes)',
            f"{ds['diloco_steps_per_s']:,.0f} decisions/s, "
            f"{ds['diloco_episodes_per_s']:,.0f} episodes/s",
            f"ratio {ds['ratio']:.3f} to CartPole-v1 ({fmt_rate(ds['cartpole_steps_per_s'])}); "
            f"median of {ds['rounds']} paired rounds, range {ds['ratio_min']:.3f}-"
            f"{ds['ratio_max']:.3f}",
            verdict(ds["ratio"] >= t["default_single_ratio_to_cartpole"]),
        ),
        (
            f"DEFAULT vector x{dv['num_envs']}: make_vec (skip_forced=True, fresh episodes)",
            f"{dv['diloco_steps_per_s']:,.0f} decisions/s, "
            f"{dv['diloco_episodes_per_s']:,.0f} episodes/s",
            f"ratio {dv['ratio']:.3f} to CartPole vector ({fmt_rate(dv['cartpole_steps_per_s'])});"
            f" median of {dv['rounds']} paired rounds, range {dv['ratio_min']:.3f}-"
            f"{dv['ratio_max']:.3f}",
            verdict(dv["ratio"] >= t["default_vector_ratio_to_cartpole"])
            if dv["num_envs"] == 1024
            else f"(n/a at {dv['num_envs']})",
        ),
        *(
            (
                f'DEFAULT fleet env: gym.make("{fid}") (4 bursty sites, F=1, 32-bit)',
                f"{r[key]['diloco_steps_per_s']:,.0f} decisions/s, "
                f"{r[key]['diloco_episodes_per_s']:,.1f} episodes/s",
                f"ratio {r[key]['ratio']:.4f} to CartPole-v1; median of "
                f"{r[key]['rounds']} paired rounds",
                "(no target)",
            )
            for key, fid in FLEET_ROWS
        ),
        *(
            (
                (
                    f'DEFAULT fleet vector env: gym.make_vec("DiLoCoFleet-v1", {fv["num_envs"]})',
                    f"{fv['diloco_steps_per_s']:,.0f} decisions/s",
                    f"ratio {fv['ratio']:.4f} to CartPole's vector env of as many envs; median "
                    f"of {fv['rounds']} paired rounds",
                    "(no target)",
                ),
            )
            if "skipped" not in (fv := r["fleet_vector"])
            else ()
        ),
        (
            "DEFAULT fleet env's episode build alone (4 sites, no step)",
            f"{r['fleet_build']['build_ms']:.2f} ms per episode",
            f"the fleet env's ceiling with free steps and resets: ratio "
            f"{r['fleet_build']['ceiling_ratio']:.3f} to CartPole-v1",
            "(no target)",
        ),
        (
            "DEFAULT fleet env: one episode, split",
            f"{r['fleet_profile']['episode_ms']:.2f} ms",
            f"compiled work {r['fleet_profile']['compiled_ms']:.2f} ms, Python "
            f"{r['fleet_profile']['python_ms']:.2f} ms; compiled work alone: ratio "
            f"{r['fleet_profile']['ceiling_ratio']:.3f} to CartPole-v1",
            "",
        ),
        (
            "DEFAULT single env: one episode, split",
            f"{pd['episode_ms']:.2f} ms",
            f"{pd['decisions_per_episode']:.0f} decisions: reset {pd['reset_ms']:.2f} (episode "
            f"build {pd['build_ms']:.2f}) + compiled steps {pd['compiled_step_ms']:.2f} + final "
            f"replay {pd['summary_ms']:.2f} + other step work {pd['steps_other_ms']:.2f} ms",
            "",
        ),
        (
            f"DEFAULT vector x{pd['vector_num_envs']}: one step, split",
            f"{pd['vector_step_ms']:.2f} ms",
            f"restarts {pd['vector_restart_ms']:.2f} ({pd['vector_episodes_per_step']:.1f} "
            f"episodes built) + compiled step {pd['vector_compiled_step_ms']:.2f} + observation "
            f"{pd['vector_observe_ms']:.2f} + other {pd['vector_other_ms']:.2f} ms",
            "",
        ),
        (
            "single env: DiLoCoSync-v2 skip_forced=False",
            fmt_rate(s["diloco_steps_per_s"]),
            f"ratio {s['ratio']:.2f} to CartPole-v1 ({fmt_rate(s['cartpole_steps_per_s'])}); "
            f"median of {s['rounds']} paired rounds, range {s['ratio_min']:.2f}-"
            f"{s['ratio_max']:.2f}",
            verdict(s["ratio"] >= t["single_ratio_to_cartpole"]),
        ),
        (
            f"vector x{v['num_envs']}: skip_forced=False, fresh episodes",
            fmt_rate(v["fresh_steps_per_s"]),
            f"ratio {v['fresh_ratio']:.2f} to CartPole vector "
            f"({fmt_rate(v['cartpole_steps_per_s'])})",
            vec_verdict(v["fresh_steps_per_s"], v["fresh_ratio"]),
        ),
        (
            f"vector x{v['num_envs']}: skip_forced=False, episode_pool={v['num_envs']}",
            fmt_rate(v["pool_steps_per_s"]),
            f"ratio {v['pool_ratio']:.2f} to CartPole vector "
            f"(pool built in {v['pool_build_s']:.1f} s)",
            vec_verdict(v["pool_steps_per_s"], v["pool_ratio"]),
        ),
        (
            f"vector x{v['num_envs']}: skip_forced=False, fresh-episode ceiling",
            fmt_rate(v["fresh_ceiling_steps_per_s"]),
            f"ratio {v['fresh_ceiling_ratio']:.2f}: pool-speed stepping + only the random draws "
            f"of each new episode ({v['draws_only_ms']:.3f} ms x {v['restarts_per_step']:.2f} "
            f"per step; CartPole's whole step {v['cartpole_step_ms']:.3f} ms)",
            "",
        ),
        (
            f"matched-random envelope, {e['draws']} draws",
            f"{e['envelope_s'] * 1000:.1f} ms",
            f"{e['merges']} merges, 600 s episode",
            verdict(e["envelope_s"] <= t["envelope_s"]),
        ),
        (
            f"offline oracle, {o['duration_s'] / 3600:.0f} h trace",
            f"{o['total_s']:.2f} s",
            f"trace {o['trace_s']:.2f} s + episode {o['build_episode_s']:.2f} s + DP "
            f"{o['dp_s'] * 1000:.0f} ms ({o['decisions']:,} decisions)",
            verdict(o["total_s"] <= t["oracle_24h_s"]) if o["duration_s"] >= 86400 else "(quick)",
        ),
        *[
            (
                f"RSS, {m['env_steps']:,} vector steps, skip_forced=False, "
                f"{'episode pool' if m['episode_pool'] else 'fresh episodes'}",
                f"{m['rss_start_mib']:.0f} -> {m['rss_end_mib']:.0f} MiB",
                f"growth {m['growth_pct']:+.1f} %, peak {m['rss_peak_mib']:.0f} MiB, env bank "
                f"{m['bank_mib']:.0f} MiB ({m['seconds']:.0f} s)",
                verdict(abs(m["growth_pct"]) <= t["rss_growth_pct"]),
            )
            for m in (r["memory_pool"], r["memory_fresh"])
        ],
        (
            "single env: episode with all merge costs",
            f"{p['episode_ms']:.2f} ms",
            f"trace {p['trace_ms']:.2f} + merge costs {p['merge_costs_ms']:.2f} + rest "
            f"{p['rest_of_build_ms']:.2f} ms",
            "",
        ),
        (
            "vector env: fresh episode (bank row), skip_forced=False",
            f"{p['vector_bank_row_ms']:.2f} ms",
            f"draws {p['vector_draw_ms']:.2f} + features and no-merge replay "
            f"{p['vector_core_ms']:.2f} ms + queue arrays; built {p['episodes']} together: "
            f"{p['vector_batched_row_ms']:.2f} ms each",
            "",
        ),
        (
            f"vector step x{p['step_num_envs']}, skip_forced=False, fresh episodes",
            f"{p['step_ms']:.2f} ms",
            f"restarts {p['step_restart_ms']:.2f} + compiled step {p['step_compiled_ms']:.2f} "
            f"+ observation {p['step_observe_ms']:.2f} + other {p['step_other_ms']:.2f} ms",
            "",
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    header = ("benchmark", "result", "ratio / detail", "target")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=False)]
    widths.append(max(len(row[3]) for row in rows))
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def print_extra(r: dict) -> None:
    """The floor row, the vector row against it, and the training row (when measured)."""
    f = r["floor"]
    v = r["default_vector"]
    floor_eps = 1000.0 / f["episode_ms"]
    print(
        f"FLOOR (bursty episode: requests + no-merge replay only): {f['episode_ms']:.2f} ms per "
        f"episode ({floor_eps:,.0f} episodes/s, {f['us_per_decision']:.2f} us per decision of "
        f"{f['decisions_per_episode']}); default vector env x{v['num_envs']} at "
        f"{v['diloco_episodes_per_s']:,.1f} episodes/s is "
        f"{floor_eps / v['diloco_episodes_per_s']:.2f}x slower than the floor"
    )
    print(
        f"FLOOR timed in the vector rounds: {v['floor_episodes_per_s']:,.0f} episodes/s; the "
        f"vector env is {v['vs_floor']:.2f}x slower (rounds {v['vs_floor_min']:.2f}-"
        f"{v['vs_floor_max']:.2f}; target within 1.5x); in CPU time "
        f"{v['diloco_cpu_ms_per_episode']:.3f} vs {v['floor_cpu_ms_per_episode']:.3f} ms per "
        f"episode: {v['vs_floor_cpu']:.2f}x; minor page faults per vector step "
        f"{v.get('page_faults_per_step', float('nan')):.1f}"
    )
    t = r.get("training")
    if t and "skipped" not in t:
        for name in ("ppo", "maskable_ppo"):
            d = t[name]
            print(
                f"TRAINING {name} ({t['n_envs']} envs, n_steps 256, batch 64, 1 epoch, "
                f"{t['timesteps']} steps): DiLoCo {d['diloco_steps_per_s']:,.0f} steps/s, "
                f"CartPole {d['cartpole_steps_per_s']:,.0f} steps/s, ratio {d['ratio']:.3f}"
            )
    elif t:
        print(f"TRAINING skipped: {t['skipped']}")


def print_default(r: dict) -> None:
    """The headline rows alone (``--default-only``)."""
    for key, label in (
        ("default_single", "single env"),
        ("default_vector", "vector env"),
        *((key, f"fleet env ({fid}, 4 sites)") for key, fid in FLEET_ROWS),
    ):
        d = r[key]
        extra = f" x{d['num_envs']}" if "num_envs" in d else ""
        print(
            f"DEFAULT {label}{extra}: {d['diloco_steps_per_s']:,.0f} decisions/s, "
            f"{d['diloco_episodes_per_s']:,.1f} episodes/s; CartPole "
            f"{d['cartpole_steps_per_s']:,.0f} steps/s; ratio {d['ratio']:.3f} "
            f"(rounds {d['ratio_min']:.3f}-{d['ratio_max']:.3f})"
        )
    d = r["fleet_vector"]
    if "skipped" in d:
        print(f"DEFAULT fleet vector env: skipped ({d['skipped']})")
    else:
        print(
            f"DEFAULT fleet vector env (DiLoCoFleet-v1, 4 sites, {d.get('class', '?')}) "
            f"x{d['num_envs']}: {d['diloco_steps_per_s']:,.0f} decisions/s, "
            f"{d['diloco_episodes_per_s']:,.1f} episodes/s; CartPole vector x{d['num_envs']} "
            f"{d['cartpole_steps_per_s']:,.0f} steps/s; ratio {d['ratio']:.3f} (rounds "
            f"{d['ratio_min']:.3f}-{d['ratio_max']:.3f})"
        )
        if "fleet_envs_steps_per_s" in d:
            print(
                f"  fleet envs' vector env (native=False) x{d['num_envs']}: "
                f"{d['fleet_envs_steps_per_s']:,.0f} decisions/s, ratio "
                f"{d['fleet_envs_ratio']:.3f}; the compiled one {d['speedup_over_fleet_envs']:.2f}x"
            )
    d = r["fleet_build"]
    print(
        f"FLEET BUILD (DiLoCoFleet-v1 episode, 4 sites, no step): {d['build_ms']:.2f} ms per "
        f"episode; with its {d['decisions_per_episode']:.1f} decisions and nothing else the "
        f"fleet env would reach {d['ceiling_decisions_per_s']:,.0f} decisions/s, ratio "
        f"{d['ceiling_ratio']:.3f}"
    )
    d = r["fleet_profile"]
    cp = d["compiled_parts_ms"]
    print(
        f"DEFAULT fleet env, one episode: {d['episode_ms']:.2f} ms = reset {d['reset_ms']:.2f} "
        f"(build {d['build_ms']:.2f}) + final replays {d['summary_ms']:.2f} + steps; compiled "
        f"work {d['compiled_ms']:.2f} ms (traces {cp['traces']:.2f}, episodes "
        f"{cp['episodes']:.2f}, cost queue {cp['cost_queue']:.2f}, steps {cp['steps']:.2f}, "
        f"replays {cp['replays']:.2f}), Python {d['python_ms']:.2f} ms; compiled work alone "
        f"would run at ratio {d['ceiling_ratio']:.3f} to CartPole-v1"
    )
    d = r["vector_parallel"]
    print(
        f"NON-DEFAULT vector env x{d['num_envs']}, parallel=True ({numba_threads()} numba "
        f"threads): {d['diloco_steps_per_s']:,.0f} decisions/s, ratio {d['ratio']:.3f} "
        f"(rounds {d['ratio_min']:.3f}-{d['ratio_max']:.3f}); {d['vs_floor']:.2f}x the "
        f"floor's time (rounds {d['vs_floor_min']:.2f}-{d['vs_floor_max']:.2f}, wall time)"
    )
    pd = r["profile_default"]
    print(
        f"DEFAULT single env, one episode: {pd['episode_ms']:.2f} ms = reset "
        f"{pd['reset_ms']:.2f} (build {pd['build_ms']:.2f}) + compiled steps "
        f"{pd['compiled_step_ms']:.2f} + final replay {pd['summary_ms']:.2f} + other "
        f"{pd['steps_other_ms']:.2f}"
    )
    print(
        f"DEFAULT vector x{pd['vector_num_envs']}, one step: {pd['vector_step_ms']:.2f} ms = "
        f"restarts {pd['vector_restart_ms']:.2f} ({pd['vector_episodes_per_step']:.1f} "
        f"episodes) + compiled step {pd['vector_compiled_step_ms']:.2f} + observation "
        f"{pd['vector_observe_ms']:.2f} + other {pd['vector_other_ms']:.2f}"
    )


def numba_threads() -> int:
    """numba's thread count (what ``parallel=True`` splits rows over)."""
    import numba

    return int(numba.get_num_threads())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a CI smoke run")
    ap.add_argument("--json", type=Path, help="save every number to this JSON file")
    ap.add_argument(
        "--default-only",
        action="store_true",
        help="only the headline rows (the default configuration)",
    )
    ap.add_argument("--num-envs", type=int, default=None, help="vector env size (1024)")
    ap.add_argument(
        "--ab",
        metavar="REV",
        help="only the headline rows of git revision REV's code and this checkout's, "
        "alternating subprocesses (e.g. --ab b9cd9ba; REV's package needs "
        "diloco_gym.envs.episode, which this benchmark imports: 0.4.0's c1f0745 lacks it)",
    )
    ap.add_argument("--ab-rounds", type=int, default=3, help="subprocesses per side (3)")
    ap.add_argument("--ab-child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument(
        "--training",
        action="store_true",
        help="also the training-throughput row (PPO and MaskablePPO vs CartPole; rl extra)",
    )
    ap.add_argument(
        "--memory-steps",
        type=int,
        default=None,
        help="env steps of the memory check with the episode pool (10,000,000)",
    )
    ap.add_argument(
        "--fresh-memory-steps",
        type=int,
        default=None,
        help="env steps of the memory check with fresh episodes (2,000,000)",
    )
    args = ap.parse_args(argv)
    if args.ab_child:
        _ab_child(args.ab_child)
        return 0
    if args.ab:
        ab = bench_ab(args.ab, args.ab_rounds)
        for name, rows in ab["results"].items():
            for row, d in rows.items():
                print(
                    f"A/B {name:>14} {row}: {d['diloco_steps_per_s']:,.0f} decisions/s, "
                    f"CartPole {d['cartpole_steps_per_s']:,.0f} steps/s, ratio {d['ratio']:.3f}"
                    + (f", {vf:.2f}x the floor's time" if (vf := d.get("vs_floor", 0)) > 0 else "")
                    + (
                        f", {vc:.2f}x this checkout's floor's time (no floor of its own)"
                        if (vc := d.get("vs_checkout_floor", 0)) > 0
                        else ""
                    )
                )
        if args.json:
            args.json.write_text(json.dumps(ab, indent=2, default=float))
        return 0
    q = args.quick
    num_envs = args.num_envs or (64 if q else 1024)
    memory_steps = args.memory_steps or (200_000 if q else 10_000_000)
    fresh_memory_steps = args.fresh_memory_steps or (50_000 if q else 2_000_000)

    results = {
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "gymnasium": gym.__version__,
            "diloco_gym": diloco_gym.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "quick": q,
        "targets": TARGETS,
    }
    results["default_single"] = bench_single_default(2_000 if q else 10_000, 3 if q else 11)
    results["default_vector"] = bench_vector_default(num_envs, 20 if q else 100, 1 if q else 5)
    results["vector_parallel"] = bench_vector_default(
        num_envs, 20 if q else 100, 1 if q else 5, parallel=True
    )
    for key, fid in FLEET_ROWS:
        results[key] = bench_single_default(500 if q else 3_000, 3 if q else 5, env_id=fid)
    results["fleet_vector"] = bench_fleet_vector(8, 50 if q else 400, 3 if q else 5)
    results["fleet_build"] = bench_fleet_build(
        10 if q else 100, 2 if q else 5, results["default_fleet_v1"]
    )
    results["fleet_profile"] = bench_fleet_profile(
        1_000 if q else 6_000, results["default_fleet_v1"]
    )
    results["profile_default"] = bench_profile_default(
        2_000 if q else 20_000, num_envs, 80 if q else 100
    )
    results["floor"] = bench_floor(5 if q else 40, 2 if q else 5)
    if args.training:
        results["training"] = bench_training(2_048 if q else 20_480, 8, 1 if q else 2)
    if args.default_only:
        print_default(results)
        print_extra(results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=float))
        return 0
    results["single"] = bench_single(2_000 if q else 10_000, 3 if q else 11)
    results["vector"] = bench_vector(num_envs, 1 if q else 2, 1 if q else 2)
    results["envelope"] = bench_envelope(1000, 3)
    results["oracle"] = bench_oracle(7200.0 if q else 86400.0, 1 if q else 2)
    results["profile"] = bench_profile(5 if q else 40, num_envs, 60 if q else 517)
    results["memory_pool"] = bench_memory(num_envs, memory_steps, pool=True)
    results["memory_fresh"] = bench_memory(num_envs, fresh_memory_steps, pool=False)
    print_table(results)
    print_extra(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
        print(f"\nsaved {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
