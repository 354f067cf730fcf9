"""How tight the oracle is where it cannot enumerate: the best exact schedule found (the
exact local search) against the certified lower bound of ``diloco_gym.eval.lower_bound``,
on bursty load with bursts above the sidecar's capacity (merges interact), default
600 s episodes. Prints one line per episode and budget, then the bracket's mean and
maximum and its share of the span from the bound to matched random::

    python benchmarks/oracle_bracket.py --busy 24 --seeds 8 --budgets 10 16
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.eval.oracle import ORACLE_BOUND, oracle_score
from diloco_gym.eval.scorer import EpisodeScorer
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.schedules import sample_uniform


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=float, default=24.0, help="burst rate, req/s")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--budgets", type=int, nargs="+", default=[10, 16], help="merges/episode")
    ap.add_argument("--draws", type=int, default=200, help="matched-random draws")
    args = ap.parse_args()
    env = DiLoCoSyncEnv(regime=dataclasses.replace(REGIMES["bursty"], busy_rate_rps=args.busy))
    p = env.params
    rows = []
    started = time.perf_counter()
    for seed in range(args.seeds):
        ep = episode_from_seed(
            env.generator, seed, p, env.sidecar, env.learner_params, rate_rps=env.reward_rate_rps
        )
        scorer = EpisodeScorer(ep, p, env.sidecar)
        for m in args.budgets:
            o = oracle_score(ep, m, p, env.sidecar, scorer=scorer)
            rng = np.random.default_rng([seed, m])
            draws = sample_uniform(ep.n_decisions, p.h_min, p.h_max, m, args.draws, rng)
            mr = float(scorer.score(draws).exact_pct.mean())
            bound = o["status"] == ORACLE_BOUND
            rows.append((o["exact_pct"], o["lower_bound_pct"], mr, bound))
            print(
                f"seed {seed} merges {m:3d} {'local search' if bound else 'exact       '} "
                f"oracle {o['exact_pct']:.3f}  lower bound {o['lower_bound_pct']:.3f}  "
                f"matched random {mr:.3f} pp"
            )
    elapsed = time.perf_counter() - started
    r = np.array([x[:3] for x in rows if x[3]])
    if r.size:
        gap = r[:, 0] - r[:, 1]
        span = r[:, 2] - r[:, 1]
        print(
            f"{len(r)} local-search episodes: oracle - bound mean {gap.mean():.3f} pp, "
            f"max {gap.max():.3f} pp; share of (random - bound) {np.mean(gap / span):.3f}"
        )
    print(f"{len(rows)} episode-budgets in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
