"""The value of placement on a fleet with per-site timing (docs/fleet.md, "Per-site timing").

For each fleet of N independent bursty sites (model v1, corridor [256, 512] steps so that
an 18 s round fits inside H_min), with one-instant syncs and with grace windows of 0, 4.5,
9 and 18 s (every site in the quorum), and for N = 4 with stragglers (every site ready
up to D seconds after a round opens), it runs the fleet report's protocol
(``run_fleet_report``: exact replay, matched random of the agent's rounds and contributing
sites, the oracle over the round structure) for two agents: ``online-forecast`` (every site
joins at once) and ``online-forecast+own`` (each site joins when its own forecast is at or
below its baseline). It writes a JSON file with, per setting and agent, the means over
seeds and the oracle / matched-random ratio, and a figure.

    python benchmarks/fleet_rounds.py --seeds 100 --seed0 0 --out fleet_rounds_a.json
    python benchmarks/fleet_rounds.py --seeds 100 --seed0 1000 --out fleet_rounds_b.json

Progress goes to stderr, one line per setting.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

AGENTS = ["online-forecast", "online-forecast+own"]


def fleet_file(folder: Path, n: int, timing: str, grace: float, delay: float) -> str:
    lines = ["[fleet]", "model_version = 1"]
    if timing == "rounds":
        lines += ['timing = "rounds"', f"grace_s = {grace}"]
    for i in range(n):
        lines += ["", "[[site]]", f'name = "s{i}"', 'regime = "bursty"']
        if delay:
            lines.append(f"delay_max_s = {delay}")
    lines += ["", "[env]", "h_min_steps = 256", ""]
    path = folder / f"n{n}_{timing}_g{grace}_d{delay}.toml"
    path.write_text("\n".join(lines))
    return str(path)


def settings() -> list[dict]:
    out = []
    for n in (1, 2, 4, 8):
        out.append({"n": n, "timing": "instant", "grace": 0.0, "delay": 0.0})
        for g in (0.0, 4.5, 9.0, 18.0):
            out.append({"n": n, "timing": "rounds", "grace": g, "delay": 0.0})
    for d in (4.5, 9.0, 18.0):
        for g in (0.0, 9.0):
            out.append({"n": 4, "timing": "rounds", "grace": g, "delay": d})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--out", default="fleet_rounds.json")
    args = ap.parse_args()
    from diloco_gym.eval.fleet import FleetReportConfig, run_fleet_report

    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for st in settings():
            path = fleet_file(Path(tmp), st["n"], st["timing"], st["grace"], st["delay"])
            agents = AGENTS if st["timing"] == "rounds" else AGENTS[:1]
            cfg = FleetReportConfig(
                fleet=path,
                agents=agents,
                seeds=args.seeds,
                seed0=args.seed0,
                draws=args.draws,
                in_process_agents=True,
            )
            res = run_fleet_report(cfg)
            df = res["rows"]
            for agent in agents:
                g = df[df["agent"] == agent]
                summ = res["summary"][res["summary"]["agent"] == agent].iloc[0]
                rows.append(
                    {
                        **st,
                        "agent": agent,
                        "seeds": int(len(g)),
                        "rounds": float(g["syncs"].mean()),
                        "agent_pct": float(g["sync_excess_pct"].mean()),
                        "random_pct": float(g["matched_random_mean"].mean()),
                        "oracle_pct": float(g["oracle_same_budget_pct"].mean()),
                        "oracle_over_random": float(
                            g["oracle_same_budget_pct"].mean() / g["matched_random_mean"].mean()
                        ),
                        "diff_pp": float(summ["diff_pp"]),
                        "ci_low": float(summ["ci_low"]),
                        "ci_high": float(summ["ci_high"]),
                        "p_holm": float(summ["p_holm"]),
                        "verdict": str(summ["verdict"]),
                        "progress": float(g["progress"].mean()),
                    }
                )
            print(f"{st} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    Path(args.out).write_text(
        json.dumps(
            {"seeds": args.seeds, "seed0": args.seed0, "draws": args.draws, "rows": rows},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
