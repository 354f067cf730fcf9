"""A short training comparison of the two reward modes at high load (MaskablePPO).

Trains one MaskablePPO policy per ``reward_mode`` on ``bursty`` at ``--rate-scale`` times its
load with an exact merge budget (so the policy must choose where its merges go), the same
seed, budget and training episodes for both, then scores each on held-out episodes by the
exact replay (``episode_summary["sync_excess_pct"]``), next to a masked random policy on the
same episodes. A small budget on a shared CPU: one training seed per mode, so a difference
within the seeds' spread is no evidence either way::

    python benchmarks/exact_reward_training.py --timesteps 30000 --eval 30
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.vec_env import DummyVecEnv

from diloco_gym import REGIMES, DiLoCoSyncEnv


def _env(mode: str, args) -> DiLoCoSyncEnv:
    reg = REGIMES["bursty"].with_load(rate_scale=args.rate_scale)
    return DiLoCoSyncEnv(reg, reward_mode=mode, merge_budget=args.budget)


def _score(env: DiLoCoSyncEnv, act, seeds) -> tuple[np.ndarray, float]:
    """Exact sync-excess (pp) of ``act(obs, mask)`` on each held-out episode, and the share
    of its free choices (both actions feasible) in which it merges."""
    out, merged, free = [], 0, 0
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        while True:
            mask = env.action_masks()
            a = act(obs, mask)
            if mask.all():
                free += 1
                merged += a
            obs, _, _, truncated, info = env.step(a)
            if truncated:
                out.append(info["episode_summary"]["sync_excess_pct"])
                break
    return np.array(out), merged / max(1, free)


def _clone(model, mode: str, args) -> None:
    """Behaviour cloning of ``--bc-teacher`` before training (the project's imitation step);
    the teacher's episodes come from the training seed range, the same for both modes."""
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.rl.imitation import fit_to_actions, teacher_samples

    env = _env(mode, args)
    xs: list = []
    ys: list = []
    rng = np.random.default_rng([args.seed, 77])
    n_raw = env.observation_space.shape[0]
    teacher_samples(env, make_agent(args.bc_teacher), args.bc_episodes, rng, n_raw, xs, ys)
    fit_to_actions(model, xs, ys, args.bc_epochs, args.seed, 1e-3, 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-scale", type=float, default=1.41)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--timesteps", type=int, default=30_000)
    ap.add_argument("--eval", type=int, default=30, help="held-out episodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--bc-teacher",
        default=None,
        help="warm-start each policy by behaviour cloning this deployable agent first "
        "(e.g. online-forecast-budget), the same samples for both reward modes",
    )
    ap.add_argument("--bc-episodes", type=int, default=40, help="teacher episodes")
    ap.add_argument("--bc-epochs", type=int, default=10)
    args = ap.parse_args()
    held_out = np.arange(100_000, 100_000 + args.eval)
    rng = np.random.default_rng(args.seed)
    rand, share = _score(
        _env("additive", args), lambda o, m: int(rng.choice(np.flatnonzero(m))), held_out
    )
    print(
        f"bursty x{args.rate_scale}, budget {args.budget}, {args.timesteps} steps per mode, "
        f"{args.eval} held-out episodes (exact sync-excess, pp)"
    )
    print(
        f"  masked random: mean {rand.mean():.3f} (sd {rand.std(ddof=1):.3f}); merges in "
        f"{share:.0%} of free choices"
    )
    results = {}
    for mode in ("additive", "exact"):
        t0 = time.perf_counter()
        venv = DummyVecEnv([lambda mode=mode: _env(mode, args) for _ in range(4)])
        venv.seed(args.seed)
        model = MaskablePPO(
            "MlpPolicy", venv, seed=args.seed, n_steps=512, batch_size=256, verbose=0, device="cpu"
        )
        if args.bc_teacher:
            _clone(model, mode, args)
        model.learn(args.timesteps)
        env = _env("additive", args)  # scored by the exact replay whatever the reward mode
        pol = lambda o, m, model=model: int(  # noqa: E731
            model.predict(o, action_masks=m, deterministic=True)[0]
        )
        s, share = _score(env, pol, held_out)
        results[mode] = s
        diff = s - rand
        print(
            f"  {mode:8s}: mean {s.mean():.3f} (sd {s.std(ddof=1):.3f}); minus random "
            f"{diff.mean():+.3f} +- {1.96 * diff.std(ddof=1) / np.sqrt(diff.size):.3f} "
            f"(95% CI, paired); merges in {share:.0%} of free choices; trained in "
            f"{time.perf_counter() - t0:.0f} s"
        )
    d = results["exact"] - results["additive"]
    print(
        f"  exact - additive: {d.mean():+.3f} +- {1.96 * d.std(ddof=1) / np.sqrt(d.size):.3f} "
        f"pp (95% CI, paired over episodes; one training seed each)"
    )


if __name__ == "__main__":
    main()
