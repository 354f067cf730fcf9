"""Can standard MaskablePPO learn per-site timing? A training run on a rounds fleet.

Trains sb3-contrib's MaskablePPO from scratch on ``DiLoCoFleet-v1`` with per-site timing
(``docs/examples/fleet-rounds.toml`` by default: four bursty sites, 9 s grace window, one
straggler), on the ``MultiBinary(4)`` action with the env's flat action mask, training
episodes drawn from seeds in ``[10^6, 2^30)``. Then it scores the policy (deterministic)
by the fleet protocol's exact replay on held-out seeds, against matched random of its own
rounds and contributing sites (``diloco_gym.eval.fleet_rounds.score_rounds_episode``),
beside two heuristics run the same way: ``online-forecast`` (every site at once) and
``online-forecast+own`` (each site at its own quiet moment). Paired sign-flip test per
agent over the episodes.

    python benchmarks/fleet_rounds_ppo.py --timesteps 200000 --seeds 100 --seed0 0 --out a.json
    python benchmarks/fleet_rounds_ppo.py --load a.zip --seeds 100 --seed0 1000 --out b.json

Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

FLEET = "docs/examples/fleet-rounds.toml"


def make_env(fleet: str):
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    return gym.make("DiLoCoFleet-v1", fleet=fleet).unwrapped


class TrainSeeds:
    """Reset each training episode with a seed drawn from ``[10^6, 2^30)``."""

    def __init__(self, env, seed: int) -> None:
        import gymnasium as gym

        class W(gym.Wrapper):
            def __init__(self, e, rng):
                super().__init__(e)
                self._rng = rng

            def reset(self, *, seed=None, options=None):
                return self.env.reset(seed=int(self._rng.integers(10**6, 2**30)))

            def action_masks(self):
                return self.env.unwrapped.action_masks()

        self.env = W(env, np.random.default_rng(seed))


def train(fleet: str, timesteps: int, seed: int):
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda i=i: TrainSeeds(make_env(fleet), seed + i).env for i in range(4)])
    model = MaskablePPO(
        "MlpPolicy", venv, n_steps=512, batch_size=256, n_epochs=5, gamma=0.995,
        learning_rate=3e-4, ent_coef=0.001, policy_kwargs={"net_arch": [64, 64]}, seed=seed,
        verbose=0,
    )  # fmt: skip
    done = 0
    chunk = max(timesteps // 10, 2048)
    t0 = time.perf_counter()
    while done < timesteps:
        model.learn(chunk, reset_num_timesteps=False)
        done += chunk
        print(f"trained {done}/{timesteps} steps ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
    return model


def evaluate(model, fleet: str, seeds: list[int], draws: int) -> dict:
    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.agents.fleet_rounds import rounds_agent
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.eval import fleet_rounds as fr
    from diloco_gym.eval import protocol
    from diloco_gym.eval.rollout import run_episode

    env = make_env(fleet)
    agents = {
        "online-forecast": rounds_agent(fleet_agent(make_agents(["online-forecast"])[0])),
        "online-forecast+own": rounds_agent(
            fleet_agent(make_agents(["online-forecast"])[0]), "own-forecast"
        ),
    }
    rows: dict[str, list] = {k: [] for k in [*agents, "maskable-ppo"]}
    for i, seed in enumerate(seeds):
        ep = env.build_episode(seed)
        results = {k: run_episode(env, a, seed, episode=ep) for k, a in agents.items()}
        if model is not None:
            obs, _ = env.reset(seed=seed, options={"episode": ep})
            while True:
                a, _ = model.predict(obs, deterministic=True, action_masks=env.action_masks())
                obs, _, _, trunc, info = env.step(a)
                if trunc:
                    results["maskable-ppo"] = info["episode_summary"]
                    break
        for k, res in results.items():
            rng = np.random.default_rng([seed, len(res["round_sites"]), 7])
            sc = fr.score_rounds_episode(env, ep, res, draws, rng)
            rows[k].append((sc["sync_excess_pct"], sc["matched_random_mean"],
                            sc["oracle_same_budget_pct"], res["progress"],
                            len(res["round_sites"])))  # fmt: skip
        if (i + 1) % 20 == 0:
            print(f"evaluated {i + 1}/{len(seeds)} episodes", file=sys.stderr, flush=True)
    out = {}
    for k, r in rows.items():
        if not r:
            continue
        a = np.array(r)
        test = protocol.paired_test(a[:, 0] - a[:, 1], np.random.default_rng(0))
        out[k] = {
            "sync_excess_pct": float(a[:, 0].mean()),
            "matched_random_pct": float(a[:, 1].mean()),
            "oracle_pct": float(a[:, 2].mean()),
            "progress": float(a[:, 3].mean()),
            "rounds": float(a[:, 4].mean()),
            "diff_pp": float(test["mean"]),
            "ci": [float(test["ci_low"]), float(test["ci_high"])],
            "p_value": float(test["p_value"]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default=FLEET)
    ap.add_argument("--timesteps", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--load", help="a model.zip this script saved (trusted: it unpickles)")
    ap.add_argument("--save", help="where to save the trained model")
    ap.add_argument("--out", default="fleet_rounds_ppo.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.load:
        from sb3_contrib import MaskablePPO

        model = MaskablePPO.load(args.load)  # your own file: this script saved it
    else:
        model = train(args.fleet, args.timesteps, args.seed)
        if args.save:
            model.save(args.save)
    seeds = list(range(args.seed0, args.seed0 + args.seeds))
    res = evaluate(model, args.fleet, seeds, args.draws)
    doc = {"args": vars(args), "elapsed_s": time.perf_counter() - t0, "agents": res}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for k, v in res.items():
        lo, hi = v["ci"]
        print(
            f"{k:22s} {v['sync_excess_pct']:.2f} random {v['matched_random_pct']:.2f} "
            f"diff {v['diff_pp']:+.2f} [{lo:+.2f}, {hi:+.2f}] p {v['p_value']:.2g} "
            f"progress {v['progress']:.3f} rounds {v['rounds']:.1f}"
        )


if __name__ == "__main__":
    main()
