"""Fragments with per-site timing at an equal number of bytes per hour (docs/fleet.md,
"Per-site timing", "Fragments with per-site timing").

Four bursty sites, per-site timing (a 4.5 s grace window, every site in the quorum, the
last site a straggler ready up to 2.25 s after a round opens), 32-bit payloads, full-rate
sends, model v1, the corridor of ``docs/examples/fleet-rounds.toml`` (``h_min_steps =
256``) divided by F as fragments divide it. At F = 1, 2 and 4 fragments every
configuration moves the same bytes per hour: 12 whole-model rounds per 600 s episode, so
``merge_budget = 12 F`` rounds. For each F it runs the fleet report's protocol
(``run_protocol`` of a ``FleetReportConfig``: exact replay, matched random of the agent's
rounds and contributing sites, the oracle over the round structure and its certified lower
bound) for two budget-aware agents: ``online-forecast-budget`` (every site joins a round
at once) and ``online-forecast-budget+own`` (each site joins when its own forecast is at
or below its baseline). It writes a JSON file with, per F and agent, the means over the
independent episodes, the verdict, and the learners' progress.

    python benchmarks/fleet_rounds_fragments.py --seeds 100 --seed0 0 --out rf_a.json
    python benchmarks/fleet_rounds_fragments.py --seeds 100 --seed0 1000 --out rf_b.json

Progress goes to stderr, one line per configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

FRAGMENTS = (1, 2, 4)
#: Whole-model rounds per 600 s episode at every F (F x this many fragment rounds).
ROUNDS = 12
AGENTS = ["online-forecast-budget", "online-forecast-budget+own"]

FLEET = """[fleet]
model_version = 1
timing = "rounds"
grace_s = 4.5
quorum = 4
fragments = {f}
bits = 32

[[site]]
name = "a"
regime = "bursty"

[[site]]
name = "b"
regime = "bursty"

[[site]]
name = "c"
regime = "bursty"

[[site]]
name = "d"
regime = "bursty"
delay_max_s = 2.25

[env]
h_min_steps = 256
"""


def study(fragments: int, seeds: int, seed0: int, draws: int, folder: Path) -> dict:
    """One configuration's report, reduced to what the docs table shows."""
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol

    path = folder / f"rounds-f{fragments}.toml"
    path.write_text(FLEET.format(f=fragments))
    config = FleetReportConfig(
        fleet=str(path),
        agents=list(AGENTS),
        seeds=seeds,
        seed0=seed0,
        draws=draws,
        env={"merge_budget": ROUNDS * fragments},
        in_process_agents=True,
    )
    res = run_protocol(config, progress=False)
    rows = res["rows"]
    units = rows[rows["seed"].isin(res["verdict_seeds"])]
    out = {
        "fragments": fragments,
        "rounds": ROUNDS * fragments,
        "sync_window_s": res["fleet"]["sync_window_s"],
        "corridor_decisions": res["fleet"]["corridor_decisions"],
        "agents": {},
    }
    summary = res["summary"].set_index("agent")
    for name in AGENTS:
        g = units[units["agent"] == name]
        s = summary.loc[name]
        out["agents"][name] = {
            "sync_excess_pct": float(g["sync_excess_pct"].mean()),
            "matched_random_pct": float(g["matched_random_mean"].mean()),
            "oracle_pct": float(g["oracle_same_budget_pct"].mean()),
            "oracle_lower_bound_pct": float(g["oracle_lower_bound_pct"].mean()),
            "progress": float(g["progress"].mean()),
            "token_share": float(g["token_share_mean"].mean()),
            "p_holm": float(s["p_holm"]),
            "verdict": str(s["verdict"]),
            "units": int(s["units"]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in FRAGMENTS:
            t0 = time.perf_counter()
            results.append(study(f, args.seeds, args.seed0, args.draws, Path(tmp)))
            print(f"F = {f}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    record = {
        "command": "python benchmarks/fleet_rounds_fragments.py " + " ".join(sys.argv[1:]),
        "seeds": [args.seed0, args.seed0 + args.seeds - 1],
        "draws": args.draws,
        "elapsed_s": time.perf_counter() - started,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
