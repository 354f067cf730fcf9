"""What changing links do to a sync's cost and to placement (docs/fleet.md, "Links that
change over time").

On ``docs/examples/fleet-links.toml`` (the example fleet v1 with links at 100 / 75 / 50 %
of their nominal rate), per episode seed it measures:

* **Cost by link state**: each decision's sync cost (requests, summed over sites) with the
  links as they are, against the same sync on nominal links; means over the decisions
  where every link is nominal and where at least one is below.
* **The value of knowing the links** at ``M`` syncs (each of ``--syncs``): the oracle that
  plans on the true costs, the *link-blind* oracle that plans on the nominal-link costs,
  and ``--draws`` matched-random schedules, all scored by the fleet report's exact replay
  (:class:`~diloco_gym.eval.fleet.FleetScorer`). The share of the oracle's gain over
  matched random that the blind oracle keeps is how much of placement's value survives
  without the link state.

    python benchmarks/fleet_links.py --seeds 100 --seed0 0 --out fleet_links_a.json
    python benchmarks/fleet_links.py --seeds 100 --seed0 1000 --out fleet_links_b.json

Progress goes to stderr, one line per 10 seeds.

``--many-states`` measures instead what the exact scorer costs on a fleet whose links take
many states: 8 sites, 5 levels, a 2 s dwell (about one link state per decision). It prints
the link states met in one episode, the exact scorers built per site (one per distinct
window and slowdown of that site), the scorer's build time and its peak memory
(``tracemalloc``):

    python benchmarks/fleet_links.py --many-states
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

FLEET = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet-links.toml"


def episode_rows(env, seed: int, syncs: list[int], draws: int) -> dict:
    """One episode's measurements (see the module)."""
    from diloco_gym.eval import protocol
    from diloco_gym.eval.fleet import FleetScorer
    from diloco_gym.sim.schedules import optimal_schedule

    ep = env.build_episode(seed)
    p = env.params
    scorer = FleetScorer(ep, p, env.setup.sidecars)
    true = np.asarray(ep.merge_cost, dtype=np.float64)
    nominal = np.zeros_like(true)
    for e in ep.sites_of(env.setup.default_option):
        nominal += np.asarray(e.merge_cost, dtype=np.float64)
    rates = np.asarray(env.fleet.link_levels)[np.asarray(ep.link_states)]
    below = np.any(rates < 1.0, axis=1)  # a decision with a link below its nominal rate
    out: dict = {
        "seed": seed,
        "cost_nominal_links": float(true[~below].mean()) if (~below).any() else None,
        "cost_below": float(true[below].mean()) if below.any() else None,
        "cost_below_if_nominal": float(nominal[below].mean()) if below.any() else None,
        "share_below": float(below.mean()),
        "syncs": {},
    }
    counts = protocol.counts_for(ep.n_decisions, p, max(syncs) + 1)
    for m in syncs:
        rng = np.random.default_rng([seed, m, 11])
        ctrl = protocol.matched_control(scorer, m, draws, rng, counts)
        orc, _ = optimal_schedule(true, p.h_min, p.h_max, m)
        blind, _ = optimal_schedule(nominal, p.h_min, p.h_max, m)
        sc = scorer.score(np.stack([orc, blind]))
        out["syncs"][str(m)] = {
            "random": float(ctrl.scores.exact_pct.mean()),
            "oracle": float(sc.exact_pct[0]),
            "blind_oracle": float(sc.exact_pct[1]),
        }
    return out


def summarise(rows: list[dict], syncs: list[int]) -> dict:
    """Means over the episodes, and the shares of the oracle's gain."""

    def mean(key: str) -> float:
        vals = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(vals)) if vals else float("nan")

    out: dict = {
        "episodes": len(rows),
        "share_of_decisions_below": mean("share_below"),
        "cost_nominal_links": mean("cost_nominal_links"),
        "cost_below": mean("cost_below"),
        "cost_below_if_nominal": mean("cost_below_if_nominal"),
    }
    for m in syncs:
        r = np.array([row["syncs"][str(m)]["random"] for row in rows])
        o = np.array([row["syncs"][str(m)]["oracle"] for row in rows])
        b = np.array([row["syncs"][str(m)]["blind_oracle"] for row in rows])
        out[f"syncs_{m}"] = {
            "random_pp": float(r.mean()),
            "oracle_pp": float(o.mean()),
            "blind_oracle_pp": float(b.mean()),
            "oracle_over_random": float(o.mean() / r.mean()),
            "blind_keeps_share_of_gain": float((r.mean() - b.mean()) / (r.mean() - o.mean())),
        }
    return out


def many_states(fleet_path: str) -> dict:
    """The exact scorer's cost on 8 sites with 5 link levels and a 2 s dwell (module doc)."""
    import tracemalloc
    from dataclasses import replace

    from diloco_gym.envs.fleet import DiLoCoFleetEnv
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.eval.fleet import FleetScorer
    from diloco_gym.sim.fleet import SiteConfig
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    fleet, env_kw = load_fleet_toml(fleet_path)
    gbps = [10.0, 5.0, 4.0, 10.0]
    sites = tuple(
        SiteConfig(name=f"s{i}", regime="bursty", link_gbps=gbps[i % 4]) for i in range(8)
    )
    fleet = replace(
        fleet, sites=sites, link_levels=(1.0, 0.9, 0.8, 0.7, 0.6), link_probs=None,
        link_dwell_s=2.0,
    )  # fmt: skip
    env = DiLoCoFleetEnv(fleet=fleet, params=EnvParams(**env_kw))
    env.build_episode(1)  # compiles and warms what the first build needs
    ep = env.build_episode(0)
    tracemalloc.start()
    t0 = time.perf_counter()
    scorer = FleetScorer(ep, env.params, env.setup.sidecars)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    k = env.setup.default_option
    return {
        "decisions": ep.n_decisions,
        "link_states_met": len({ep.variant_at(d, k) for d in range(ep.n_decisions)}),
        "scorers_per_site": [len(s.parts) for s in scorer.sites],
        "scorer_build_s": round(seconds, 2),
        "scorer_peak_mb": round(peak / 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--syncs", type=int, nargs="+", default=[40, 60])
    ap.add_argument("--fleet", default=str(FLEET))
    ap.add_argument("--out", default="fleet_links.json")
    ap.add_argument("--many-states", action="store_true", help="the scorer's cost (module doc)")
    args = ap.parse_args(argv)
    if args.many_states:
        print(json.dumps(many_states(args.fleet), indent=1))
        return 0
    from diloco_gym.envs.fleet import DiLoCoFleetEnv
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    fleet, env_kw = load_fleet_toml(args.fleet)
    if fleet.link_levels is None:
        ap.error(f"{args.fleet}: set link_levels in [fleet] (this measures changing links)")
    env = DiLoCoFleetEnv(fleet=fleet, params=EnvParams(**env_kw))
    t0 = time.time()
    rows = []
    for i, seed in enumerate(range(args.seed0, args.seed0 + args.seeds)):
        rows.append(episode_rows(env, seed, args.syncs, args.draws))
        if (i + 1) % 10 == 0:
            print(
                f"fleet links: {i + 1}/{args.seeds} seeds, {time.time() - t0:.0f} s",
                file=sys.stderr,
            )
    doc = {
        "command": "python benchmarks/fleet_links.py " + " ".join(argv or sys.argv[1:]),
        "fleet": args.fleet,
        "seeds": [args.seed0, args.seed0 + args.seeds - 1],
        "draws": args.draws,
        "summary": summarise(rows, args.syncs),
        "episodes": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
