"""The compiled fleet vector env against the vector env of fleet envs (docs/fleet.md,
"Speed").

For each number of envs and each fleet (the default fleet, the default fleet with four
fragments, and ``docs/examples/fleet-v1.toml``), it steps ``gym.make_vec("DiLoCoFleet-v1", K,
vectorization_mode="vector_entry_point")`` (the compiled env) and the same with
``native=False`` (Gymnasium's ``SyncVectorEnv`` over K fleet envs) with the same random
actions, resets included, alternately in ``--rounds`` rounds after a warm-up, and prints
each one's env steps (decisions) per second and the median of the rounds' ratios::

    python benchmarks/fleet_vector.py
    python benchmarks/fleet_vector.py --envs 8 64 256 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

import diloco_gym  # noqa: E402, F401  (registers the ids)

ROOT = Path(__file__).resolve().parents[1]
FLEETS = {
    "default": {},
    "fragments=4": {"fragments": 4},
    # sites of four link shares (each request's thresholds from its site's sidecar), F = 4
    "fleet-v1.toml": {"fleet": str(ROOT / "docs/examples/fleet-v1.toml")},
}


def _rate(env, actions: np.ndarray) -> float:
    """Env steps per second over ``actions`` (one row per vector step)."""
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    return actions.size / (time.perf_counter() - t0)


def measure(num_envs: int, fleet_kw: dict, steps: int, rounds: int) -> dict:
    """The compiled env and the fleet envs' vector env of ``num_envs`` envs, alternately."""
    kw = {"num_envs": num_envs, "vectorization_mode": "vector_entry_point", **fleet_kw}
    envs = {
        "compiled": gym.make_vec("DiLoCoFleet-v1", **kw),
        "fleet_envs": gym.make_vec("DiLoCoFleet-v1", native=False, **kw),
    }
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs))
    for env in envs.values():
        env.reset(seed=0)
        _rate(env, actions[: steps // 4])  # warm-up: spreads the episode ends
    rates: dict[str, list[float]] = {k: [] for k in envs}
    for _ in range(rounds):
        for k, env in envs.items():
            rates[k].append(_rate(env, actions))
    ratio = np.array(rates["compiled"]) / np.array(rates["fleet_envs"])
    return {
        "num_envs": num_envs,
        "class": type(envs["compiled"]).__name__,
        "compiled_steps_per_s": float(np.median(rates["compiled"])),
        "fleet_envs_steps_per_s": float(np.median(rates["fleet_envs"])),
        "speedup": float(np.median(ratio)),
        "speedup_min": float(ratio.min()),
        "speedup_max": float(ratio.max()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--decisions", type=int, default=30_000, help="env steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write every number here")
    args = ap.parse_args(argv)
    out = []
    for name, fleet_kw in FLEETS.items():
        for k in args.envs:
            r = measure(k, fleet_kw, max(100, args.decisions // k), args.rounds)
            r["fleet"] = name
            out.append(r)
            print(
                f"{name:14s} x{k:<5d} compiled {r['compiled_steps_per_s']:>9,.0f}/s  fleet envs "
                f"{r['fleet_envs_steps_per_s']:>8,.0f}/s  {r['speedup']:.2f}x "
                f"(rounds {r['speedup_min']:.2f}-{r['speedup_max']:.2f})",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
