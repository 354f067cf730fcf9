"""Does Stable-Baselines3's PPO, with its default hyperparameters, learn the default task
from scratch? One training run of a reward design, then its deterministic policy on test
seeds against matched random (the protocol's control, through ``MatchedRandomScore``).

The reward designs of docs/training.md ("A default task that PPO learns") are env
keywords (``--kw``, any ``EnvParams`` field on top of ``DiLoCoSync-v1``'s) or, for the one
design the package does not ship, ``--potential stopping``: the expected least cost of the
merges left in the current interval, for independent costs drawn from the regime's history
episodes (an optimal-stopping value), as a potential-based shaping wrapper.

Usage (each run about 3.5 min of one core; results appended to ``--out`` as JSON lines)::

    python benchmarks/learnable.py --seed 0                                   # v1
    python benchmarks/learnable.py --seed 0 --kw '{"reward_shaping": "none"}'  # v1's scale only
    python benchmarks/learnable.py --seed 0 \\
        --kw '{"reward_shaping": "none", "excess_weight": 1.0}'              # v0
    python benchmarks/learnable.py --seed 0 --potential stopping \\
        --kw '{"reward_shaping": "none", "excess_weight": 1.0}'

These are single exploratory runs on 20 test seeds: the multi-seed result through the
protocol's own verdicts is the study of docs/training.md (``python -m diloco_gym.rl.seeds``).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import gymnasium as gym
import numpy as np
import torch
from scipy import stats

import diloco_gym
from diloco_gym.envs.shaping import HISTORY_SEEDS
from diloco_gym.wrappers import MatchedRandomScore


class StoppingPotential(gym.Wrapper):
    """Potential-based shaping with ``phi = -E[min of the costs of the decisions left in
    the interval]``, costs drawn independently from the history episodes' merge costs."""

    def __init__(self, env: gym.Env, gamma: float = 0.99) -> None:
        super().__init__(env)
        u = env.unwrapped
        p = u.params
        self.gamma, self.h_min, self.h_max = gamma, p.h_min, p.h_max
        self.interval = p.decision_interval
        costs = []
        for s in HISTORY_SEEDS:
            u.reset(seed=s)
            costs.append(u.oracle_costs() * u.episode.reward_per_request * p.excess_weight)
        x = np.sort(np.concatenate(costs))
        n, i = x.size, np.arange(x.size)
        self.emin = np.array(
            [0.0]
            + [
                float(np.sum(x * (((n - i) / n) ** m - ((n - i - 1) / n) ** m)))
                for m in range(1, self.h_max + 2)
            ]
        )
        self._phi = 0.0

    def _potential(self, info: dict) -> float:
        gap = info["gap_steps"] // self.interval
        return -float(self.emin[max(self.h_max - max(gap, self.h_min) + 1, 1)])

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._phi = self._potential(info)
        return obs, info

    def step(self, action):
        obs, reward, term, trunc, info = self.env.step(action)
        phi = self._potential(info)
        reward += self.gamma * phi - self._phi
        self._phi = phi
        return obs, reward, term, trunc, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="PPO's seed")
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--eval-seeds", type=int, default=20, help="test seeds 0..N-1")
    ap.add_argument("--draws", type=int, default=200, help="matched-random draws per episode")
    ap.add_argument("--kw", default="{}", help="EnvParams fields over DiLoCoSync-v1's (JSON)")
    ap.add_argument("--potential", choices=["stopping"], default=None)
    ap.add_argument("--out", default="learnable.jsonl")
    a = ap.parse_args()
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    kw = json.loads(a.kw)
    env = gym.make("DiLoCoSync-v1", **kw)
    if a.potential == "stopping":
        env = StoppingPotential(env)
    t0 = time.time()
    model = PPO("MlpPolicy", env, seed=a.seed, device="cpu")
    model.learn(a.steps, progress_bar=False)
    train_s = time.time() - t0
    judge = MatchedRandomScore(gym.make("DiLoCoSync-v1"), draws=a.draws)
    rows = []
    for s in range(a.eval_seeds):
        obs, info = judge.reset(seed=s)
        while True:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, term, trunc, info = judge.step(int(action))
            if term or trunc:
                rows.append(info["matched_random_score"])
                break
        print(f"test seed {s}: gap {rows[-1]['gap_pp']:+.2f} pp", flush=True)
    gap = np.array([r["gap_pp"] for r in rows])
    res = {
        "kw": kw,
        "potential": a.potential,
        "seed": a.seed,
        "steps": a.steps,
        "train_s": round(train_s),
        "sync_excess_pct": round(float(np.mean([r["sync_excess_pct"] for r in rows])), 3),
        "matched_random_pct": round(float(np.mean([r["matched_random_mean"] for r in rows])), 3),
        "gap_pp": round(float(gap.mean()), 3),
        "p_t_test": float(stats.ttest_1samp(gap, 0.0).pvalue) if gap.std() > 0 else 1.0,
        "merges_per_episode": float(np.mean([r["merges"] for r in rows])),
        "version": diloco_gym.__version__,
    }
    print(json.dumps(res))
    with open(a.out, "a") as f:
        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
