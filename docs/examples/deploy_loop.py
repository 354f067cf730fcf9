"""A scheduler in the loop: a shipped agent behind diloco_gym.deploy.Controller, fed
synthetic telemetry one decision interval at a time, printing its decisions.

In a real deployment the three measured things below come from the serving sidecar (the
requests that arrived in the interval), the hosts (network and checkpoint-I/O pressure now,
in [0, 1]) and the DiLoCo learners (each one's loss reduction and tokens since the last
merge); docs/deploy.md says where each plugs in.

    python docs/examples/deploy_loop.py                      # online-forecast, 200 decisions
    python docs/examples/deploy_loop.py --agent reference-ppo-v2 --budget 6
"""

from __future__ import annotations

import argparse

import numpy as np

from diloco_gym.agents.registry import make_agent
from diloco_gym.deploy import Controller, Telemetry
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim.learner_calibration import SHIPPED, learner_params, load_learner_calibration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default="online-forecast", help="a registry name or model path")
    ap.add_argument("--decisions", type=int, default=200, help="decision intervals in the run")
    ap.add_argument("--budget", type=int, default=None, help="exact merges in the run")
    ap.add_argument("--seed", type=int, default=0, help="the synthetic telemetry's seed")
    args = ap.parse_args()

    params = EnvParams()  # the env's corridor (16..64 decisions of 1.12 s), EWMAs, scales
    # DiLoCoSync-v2's learners: the shipped learner calibration's (only the number of
    # learners matters when the learners report their own loss and tokens, as here)
    learners = learner_params(load_learner_calibration(SHIPPED))
    ctrl = Controller(
        make_agent(args.agent),
        params,
        learners,
        serving_capacity_rps=20.0,  # the sidecar's capacity, requests per second
        decisions=args.decisions,
        merge_budget=args.budget,
    )

    rng = np.random.default_rng(args.seed)
    k, dec_s = learners.num_learners, params.decision_seconds
    speed = np.sort(12_000.0 * np.exp(rng.normal(0.0, 0.3, k)))  # tokens/s per learner
    net = 0.2
    for d in range(args.decisions):
        # synthetic traffic: 6 req/s, a burst of 25 req/s in the middle of every 90 decisions
        rate = 25.0 if 40 <= d % 90 < 55 else 6.0
        net = float(np.clip(0.9 * net + 0.1 * rng.random(), 0.0, 1.0))  # AR(1) pressure
        gap_s = ctrl.gap * dec_s  # the learners' time since the last merge
        tokens = speed * gap_s
        decision = ctrl.step(
            Telemetry(
                requests=int(rng.poisson(rate * dec_s)),
                network=net,
                checkpoint=None,  # not measured: 0, as the env without a pressure series
                loss_delta=(0.05 * (1.0 - np.exp(-tokens / 2e6))).tolist(),
                tokens=tokens.tolist(),
            )
        )
        if decision.merge:
            why = "forced (H_max or budget)" if decision.forced else "the agent's choice"
            print(
                f"decision {d:4d} (t = {d * dec_s:6.1f} s): merge after {decision.gap} "
                f"intervals, {why}"
            )
    print(f"{ctrl.n_merges} merges in {args.decisions} decisions with {args.agent}")


if __name__ == "__main__":
    main()
