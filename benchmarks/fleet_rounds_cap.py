"""What the site cap does with per-site timing (docs/fleet.md, "Guardrails", "With
per-site timing").

On ``docs/examples/fleet-rounds-cap.toml`` (a bursty site beside an always-busy one,
rounds with a 9 s grace window, quorum 1, ``site_cap_pp = 6``) and on the same fleet
without ``site_cap_pp``, it runs each agent on the same episodes and gives, per agent and
fleet, the means over the episodes of what the agent's own run did: the fleet's and each
site's sync-excess by exact replay (pp of all, and of the site's own, requests), the
rounds and each site's contributions per episode, the token share merged, the learners'
progress, the cap's counters, and the episodes in which a site ended over its cap (its
summed isolated cost, pp of its nominal requests, above ``site_cap_pp``). No matched
random: this measures the guardrail's effect on the agents, not their placement.

    python benchmarks/fleet_rounds_cap.py --seeds 100 --seed0 0 --out rounds_cap_a.json
    python benchmarks/fleet_rounds_cap.py --seeds 100 --seed0 1000 --out rounds_cap_b.json

Progress goes to stderr, one line per 10 seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FLEET = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet-rounds-cap.toml"
AGENTS = ["online-forecast+own", "online-forecast", "pressure-gate"]


def uncapped_copy(path: Path, folder: Path) -> Path:
    """The fleet file without its ``site_cap_pp`` line."""
    lines = [x for x in path.read_text().splitlines() if not x.startswith("site_cap_pp")]
    out = folder / "uncapped.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def agent_means(env, agent, seeds: list[int], cap_pp: float) -> dict:
    """One agent's means over ``seeds`` (see the module)."""
    from diloco_gym.eval.rollout import run_episode

    names = env.setup.site_names
    rows = []
    for s in seeds:
        res = run_episode(env, agent, s)
        site = {x["site"]: x["sync_excess_pct"] for x in res["sites"]}
        used = res.get("site_cap_used_pp")
        rows.append(
            {
                "fleet_pp": res["sync_excess_pct"],
                **{f"{n}_pp": site[n] for n in names},
                "rounds": res["merges"],
                **{f"{n}_contributions": res["site_sync_counts"][n] for n in names},
                "token_share": res["token_share_mean"],
                "progress": res["progress"],
                **{
                    k: res.get(k, 0)
                    for k in (
                        "cap_masked_decisions",
                        "cap_vetoed_launches",
                        "cap_overridden_syncs",
                        "cap_overridden_contributions",
                    )
                },
                **(
                    {f"{n}_over_cap": float(used[n] > cap_pp) for n in names}
                    if used is not None
                    else {}
                ),
            }
        )
    out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    for n in names:  # episodes over the cap: a count, not a mean
        if f"{n}_over_cap" in out:
            out[f"{n}_over_cap"] = int(round(out[f"{n}_over_cap"] * len(rows)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--agents", nargs="+", default=AGENTS)
    ap.add_argument("--fleet", type=Path, default=FLEET)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args(argv)

    from diloco_gym.eval.fleet import FleetReportConfig, protocol_env, report_agents
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    cap_pp = load_fleet_toml(args.fleet)[0].site_cap_pp
    seeds = list(range(args.seed0, args.seed0 + args.seeds))
    started = time.perf_counter()
    result: dict = {"fleet": str(args.fleet), "seeds": [seeds[0], seeds[-1]], "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in (("cap", args.fleet), ("no cap", uncapped_copy(args.fleet, Path(tmp)))):
            config = FleetReportConfig(
                fleet=str(path), agents=list(args.agents), in_process_agents=True
            )
            env = protocol_env(config, "the rounds cap study")
            for agent in report_agents(config):
                means = agent_means(env, agent, seeds, cap_pp)
                result["rows"].append({"fleet": label, "agent": agent.name, **means})
                print(
                    f"{label}: {agent.name} done ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    result["elapsed_s"] = time.perf_counter() - started
    keys = ["fleet_pp", "bursty_pp", "busy_pp", "rounds", "busy_contributions"]
    keys += ["token_share", "progress", "cap_overridden_contributions", "busy_over_cap"]
    print("| fleet | agent | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for r in result["rows"]:
        cells = [f"{r.get(k, float('nan')):.3f}" for k in keys]
        print(f"| {r['fleet']} | {r['agent']} | " + " | ".join(cells) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
