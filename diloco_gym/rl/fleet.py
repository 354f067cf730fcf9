"""Train a budget-conditioned MaskablePPO scheduler on a fleet (``DiLoCoFleet-v0``).

One policy for several fragment-sync budgets, warm-started by imitating the budget-aware
online forecaster on the fleet (behaviour cloning) and then trained with MaskablePPO: one
training env per budget (each
``Monitor(TrainSeedWrapper(BudgetFeatures(DiLoCoFleetEnv(fleet, merge_budget=M))))``),
episode seeds drawn from the training range (:mod:`diloco_gym.eval.seed_ranges`), so the
protocol's test seeds (below 900,000) are held out. The model is saved as ``model.zip``
with a ``meta.json`` (algorithm, fleet file, budgets, hyperparameters, seeds, versions,
observation transform and size) that :func:`diloco_gym.agents.learned.load_learned_agent` reads.

    python -m diloco_gym.rl.fleet --fleet docs/examples/fleet.toml --budgets 32 48 64 \
        --timesteps 60000 --seed 0 --out agents/reference/fleet-budget
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW

__all__ = ["FleetEnvSpec", "train_fleet_agent", "main", "HYPERPARAMETERS"]

#: MaskablePPO settings (as the single-host budget agents').
HYPERPARAMETERS: dict[str, Any] = {
    "n_steps": 512,
    "batch_size": 256,
    "n_epochs": 5,
    "learning_rate": 3e-4,
    "gamma": 0.995,
    "gae_lambda": 0.95,
    "ent_coef": 0.001,
    "clip_range": 0.2,
    "policy_kwargs": {"net_arch": [64, 64]},
}


@dataclass(frozen=True)
class FleetEnvSpec:
    """One kind of fleet training env: the fleet file and a fragment-sync budget (a
    :class:`~diloco_gym.rl.train_envs.TrainEnvKind` for
    :func:`~diloco_gym.rl.train_envs.make_vec_env`)."""

    fleet: str
    merge_budget: int

    def make(self, env_params: dict[str, Any] | None = None) -> Any:
        """A fresh ``DiLoCoFleetEnv`` with this budget and the ``env_params`` overrides."""
        from diloco_gym.envs.fleet import DiLoCoFleetEnv

        return DiLoCoFleetEnv(
            fleet=self.fleet, merge_budget=self.merge_budget, **dict(env_params or {})
        )


def clone_teacher(
    model: Any,
    vec: Any,
    teacher: str,
    episodes: int,
    epochs: int,
    seed: int,
    learning_rate: float = 1e-3,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Warm start: fit ``model``'s policy to a deployable teacher's actions (behaviour
    cloning, cross-entropy, Adam) on ``episodes`` training-range episodes of every env of
    ``vec``; the teacher is the registry heuristic through its fleet view
    (:func:`diloco_gym.agents.fleet.fleet_agent`), so it reads the fleet observation as on
    any fleet."""
    import numpy as np

    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.rl.imitation import fit_to_actions, teacher_samples

    rng = np.random.default_rng([seed, 77])
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for wrapped in vec.envs:
        env = wrapped.env.env  # Monitor(TrainSeedWrapper(BudgetFeatures(fleet env)))
        n_raw = env.unwrapped.observation_space.shape[0]
        agent = fleet_agent(make_agent(teacher))
        teacher_samples(env, agent, episodes, rng, n_raw, xs, ys)
    return {"teacher": teacher, "episodes_per_env": int(episodes), "samples": len(ys)} | (
        fit_to_actions(model, xs, ys, epochs, seed, learning_rate, batch_size)
    )


def train_fleet_agent(
    fleet: str,
    budgets: list[int],
    timesteps: int,
    seed: int,
    out: str | Path,
    excess_weight: float = 0.05,
    command: str = "",
    teacher: str | None = "online-forecast-budget",
    bc_episodes: int = 4,
    bc_epochs: int = 10,
) -> Path:
    """Train and save ``model.zip`` and ``meta.json`` in ``out``; returns the model path."""
    import torch
    from sb3_contrib import MaskablePPO

    from diloco_gym.envs.fleet import require_fixed_precision
    from diloco_gym.rl.algos import library_versions
    from diloco_gym.rl.train_envs import make_vec_env

    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"budgets must be integers >= 1, got {budgets}")
    first = FleetEnvSpec(str(fleet), int(budgets[0])).make()
    require_fixed_precision(first.fleet, "fleet training")
    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    specs = [FleetEnvSpec(str(fleet), int(b)) for b in budgets]
    # env i's episode seeds start from seed * 1000 + i (the shipped model's rule)
    params = {"excess_weight": excess_weight}
    vec = make_vec_env("dummy", specs, seed * 1000, len(specs), params, "budget")
    model = MaskablePPO("MlpPolicy", vec, seed=seed, verbose=0, device="cpu", **HYPERPARAMETERS)
    started = time.perf_counter()
    bc = None
    if teacher is not None and bc_episodes > 0:
        bc = clone_teacher(model, vec, teacher, bc_episodes, bc_epochs, seed)
    if timesteps > 0:
        model.learn(total_timesteps=timesteps)
    elapsed = time.perf_counter() - started
    model.save(out / "model.zip")
    base: Any = vec.envs[0].unwrapped  # the DiLoCoFleetEnv
    meta = {
        "algo": "maskable-ppo",
        "name": "fleet-budget",
        "fleet": str(fleet),
        "budgets": list(budgets),
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": int(timesteps),
        "seed": seed,
        "n_envs": len(budgets),
        "env_kwargs": {"excess_weight": excess_weight},
        "hyperparameters": HYPERPARAMETERS,
        "seed_ranges": {"train_episode_seeds": [TRAIN_SEED_LOW, TRAIN_SEED_HIGH]},
        "observation": {
            "transform": "budget",
            "base_size": int(base.observation_space.shape[0]),
            "features": [f[0] for f in base.obs_features],
        },
        "behaviour_cloning": bc,
        "train_seconds": elapsed,
        "command": command,
        "versions": library_versions(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out / "model.zip"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m diloco_gym.rl.fleet", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--fleet", required=True, help="fleet configuration TOML")
    ap.add_argument("--budgets", type=int, nargs="+", required=True, help="fragment syncs/episode")
    ap.add_argument("--timesteps", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--excess-weight", type=float, default=0.05)
    ap.add_argument("--out", required=True)
    ap.add_argument("--teacher", default="online-forecast-budget", help="warm-start teacher")
    ap.add_argument("--bc-episodes", type=int, default=4, help="teacher episodes per budget")
    a = ap.parse_args(argv)
    command = "python -m diloco_gym.rl.fleet " + " ".join(sys.argv[1:] if argv is None else argv)
    path = train_fleet_agent(
        a.fleet,
        a.budgets,
        a.timesteps,
        a.seed,
        a.out,
        a.excess_weight,
        command=command,
        teacher=a.teacher,
        bc_episodes=a.bc_episodes,
    )
    print(f"saved {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
