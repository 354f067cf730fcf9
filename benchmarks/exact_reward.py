"""How often and how much the additive and the exact reward differ, at a chosen load.

Runs the protocol's heuristic agents on ``bursty`` scaled to ``--rate-scale`` times its load
with ``reward_mode="exact"`` (the schedule does not depend on the reward mode: these
agents do not learn), and compares, per agent-episode and per merge, the additive credit
(each merge's isolated cost, paid at launch) with the exact one (its marginal cost in the
exact replay, paid once its backlog has drained; the rewards' sum is the exact replay's
sync-excess, the protocol's score)::

    python benchmarks/exact_reward.py                    # 1.41x load, 20 seeds
    python benchmarks/exact_reward.py --rate-scale 1.0   # the regime's own load
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from diloco_gym import REGIMES, DiLoCoSyncEnv
from diloco_gym.agents.registry import make_agent
from diloco_gym.eval.rollout import run_episode

AGENTS = [
    "fixed-256",
    "fixed-512",
    "pressure-gate",
    "random-deferral",
    "wa-diloco",
    "calibrated-wa",
    "online-forecast",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-scale", type=float, default=1.41)
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    env = DiLoCoSyncEnv(
        REGIMES["bursty"].with_load(rate_scale=args.rate_scale), reward_mode="exact"
    )
    t0 = time.perf_counter()
    gap_pp, merge_diff, delay_s, n_merges = [], [], [], 0
    for name in AGENTS:
        for seed in range(args.seeds):
            s = run_episode(env, make_agent(name), seed)
            pct = env.episode.pct_per_request
            iso = np.array(s["merge_costs_requests"])
            marg = np.array(s["merge_marginal_requests"])
            exact_pct = float(marg.sum() * pct)
            assert abs(exact_pct - s["sync_excess_pct"]) < 0.05, (name, seed)  # whole replay
            gap_pp.append(float(iso.sum() * pct) - exact_pct)
            merge_diff.extend((marg - iso).tolist())
            starts = np.array(s["merge_decisions"]) * env.params.decision_interval
            ready = np.array(env._exact.ready_bins)  # noqa: SLF001 (a measurement)
            delay_s.extend(((ready - starts) * env.params.step_seconds).tolist())
            n_merges += iso.size
    gap, diff = np.array(gap_pp), np.array(merge_diff)
    print(
        f"bursty x{args.rate_scale}: {len(AGENTS)} agents x {args.seeds} seeds, "
        f"{gap.size} agent-episodes, {n_merges} merges ({time.perf_counter() - t0:.0f} s)"
    )
    print(
        f"additive - exact sync-excess per agent-episode (pp): mean {gap.mean():+.2f}, "
        f"min {gap.min():+.2f}, max {gap.max():+.2f}; |gap| > 0.01 pp in "
        f"{np.mean(np.abs(gap) > 0.01):.0%} of agent-episodes"
    )
    print(
        f"per merge, marginal exact - isolated cost (requests): differs in "
        f"{np.mean(diff != 0):.0%} of merges, mean {diff.mean():+.2f}, "
        f"min {diff.min():+.0f}, max {diff.max():+.0f}"
    )
    d = np.array(delay_s)
    print(
        f"exact credit due after launch (s): median {np.median(d):.1f}, p95 "
        f"{np.percentile(d, 95):.1f}, max {d.max():.1f} (the additive credit: at launch, "
        f"with {env.params.merge_steps * env.params.step_seconds + env.sidecar.tail_s:.1f} s "
        f"of look-ahead)"
    )


if __name__ == "__main__":
    main()
