"""The value of placement on a fleet with per-site timing (docs/fleet.md, "Per-site timing").

For each fleet of N independent bursty sites (model v1, corridor [256, 512] steps so that
an 18 s round fits inside H_min), with one-instant syncs and with grace windows of 0, 4.5,
9 and 18 s (every site in the quorum), and for N = 4 with stragglers (every site ready
up to D seconds after a round opens), it runs the fleet report's protocol (``run_protocol``
of a ``FleetReportConfig``: exact replay, matched random of the agent's rounds and
contributing sites, the oracle over the round structure) for two agents:
``online-forecast`` (every site joins at once) and ``online-forecast+own`` (each site
joins when its own forecast is at or below its baseline). It writes a JSON file with, per
setting and agent, the means over seeds and the oracle / matched-random ratio, and a
figure.

    python benchmarks/fleet_rounds.py --seeds 100 --seed0 0 --out fleet_rounds_a.json
    python benchmarks/fleet_rounds.py --seeds 100 --seed0 1000 --out fleet_rounds_b.json

    python benchmarks/fleet_rounds.py --plot fleet_rounds_a.json --fig docs/fleet_rounds.png

Progress goes to stderr, one line per setting.

``--only correlation`` measures correlated traffic (``traffic_correlation``) between
synthetic sites; ``--only correlation-traces`` between the four trace sites of
``docs/examples/fleet-traces-corr.toml`` (the shipped traces; seeds 0..9 are its
independent units, so its rows also give oracle / matched random over those seeds alone):

    python benchmarks/fleet_rounds.py --only correlation-traces --seeds 100 --out corr_traces.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

AGENTS = ["online-forecast", "online-forecast+own"]


def fleet_file(
    folder: Path,
    n: int,
    timing: str,
    grace: float,
    delay: float,
    quorum: int | None = None,
    rho: float = 0.0,
) -> str:
    lines = ["[fleet]", "model_version = 1"]
    if rho:
        lines.append(f"traffic_correlation = {rho}")
    if timing == "rounds":
        lines += ['timing = "rounds"', f"grace_s = {grace}"]
    if quorum is not None:
        lines.append(f"quorum = {quorum}")
    for i in range(n):
        lines += ["", "[[site]]", f'name = "s{i}"', 'regime = "bursty"']
        if delay:
            lines.append(f"delay_max_s = {delay}")
    lines += ["", "[env]", "h_min_steps = 256", ""]
    path = folder / f"n{n}_{timing}_g{grace}_d{delay}_q{quorum}_r{rho}.toml"
    path.write_text("\n".join(lines))
    return str(path)


TRACES_FLEET = Path(__file__).resolve().parent.parent / "docs/examples/fleet-traces-corr.toml"


def traces_fleet_file(folder: Path, grace: float, rho: float, rate: float | None = None) -> str:
    """``docs/examples/fleet-traces-corr.toml`` with ``grace_s = grace``,
    ``traffic_correlation = rho`` and, if given, every site's ``target_rate_rps = rate``
    (its trace paths made absolute)."""
    traces = TRACES_FLEET.parent.parent.parent / "traces"
    text = TRACES_FLEET.read_text().replace("../../traces/", f"{traces.as_posix()}/")
    text = text.replace("grace_s = 0.0", f"grace_s = {grace}\ntraffic_correlation = {rho}")
    if rate is not None:
        text = text.replace("target_rate_rps = 0.55", f"target_rate_rps = {rate}")
    path = folder / f"traces_g{grace}_r{rho}_{rate}.toml"
    path.write_text(text)
    return str(path)


def settings(which: str = "all") -> list[dict]:
    if which == "correlation-traces":  # four trace sites sharing a common window (rho)
        return [
            {"n": 4, "timing": "rounds", "grace": g, "delay": 0.0, "rho": r, "traces": True}
            for r in (0.0, 1.0, 0.5)
            for g in (0.0, 18.0)
        ]
    if which == "correlation":  # sites whose traffic shares a common stream (rho)
        return [
            {"n": n, "timing": "rounds", "grace": g, "delay": 0.0, "rho": r}
            for n in (4, 8)
            for r in (0.0, 0.5, 1.0)
            for g in (0.0, 18.0)
        ]
    if which == "quorum":  # N = 4, 9 s grace: every site, 3 or 2 of 4 must join each round
        return [
            {"n": 4, "timing": "rounds", "grace": 9.0, "delay": 0.0, "quorum": q} for q in (4, 3, 2)
        ]
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
    ap.add_argument("--plot", help="draw the figure of this JSON file instead of running")
    ap.add_argument(
        "--only", choices=("all", "quorum", "correlation", "correlation-traces"), default="all"
    )
    ap.add_argument("--fig", default="fleet_rounds.png")
    ap.add_argument(
        "--trace-rate",
        type=float,
        help="correlation-traces: every site's target_rate_rps (default: the file's 0.55)",
    )
    args = ap.parse_args()
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), args.fig)
        return
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol

    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for st in settings(args.only):
            if st.get("traces"):
                path = traces_fleet_file(Path(tmp), st["grace"], st["rho"], args.trace_rate)
            else:
                path = fleet_file(
                    Path(tmp),
                    st["n"],
                    st["timing"],
                    st["grace"],
                    st["delay"],
                    st.get("quorum"),
                    st.get("rho", 0.0),
                )
            agents = AGENTS if st["timing"] == "rounds" else AGENTS[:1]
            cfg = FleetReportConfig(
                fleet=path,
                agents=agents,
                seeds=args.seeds,
                seed0=args.seed0,
                draws=args.draws,
                in_process_agents=True,
            )
            res = run_protocol(cfg)
            df = res["rows"]
            units = int(res["independent_units"])
            for agent in agents:
                g = df[df["agent"] == agent]
                # the independent units: every seed, or the first seed of each trace tile
                u = g[g["seed"] < args.seed0 + units]
                summ = res["summary"][res["summary"]["agent"] == agent].iloc[0]
                rows.append(
                    {
                        **st,
                        "trace_rate_rps": args.trace_rate if st.get("traces") else None,
                        "independent_units": units,
                        "oracle_over_random_units": float(
                            u["oracle_same_budget_pct"].mean() / u["matched_random_mean"].mean()
                        ),
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
                        "dropped_per_round": float(
                            g["dropped_contributions"].mean() / g["syncs"].mean()
                        )
                        if "dropped_contributions" in g
                        else 0.0,
                        "token_share": float(g["token_share_mean"].mean())
                        if "token_share_mean" in g
                        else 1.0,
                    }
                )
            print(f"{st} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    Path(args.out).write_text(
        json.dumps(
            {"seeds": args.seeds, "seed0": args.seed0, "draws": args.draws, "rows": rows},
            indent=1,
        )
    )


def plot(doc: dict, path: str) -> None:
    """Oracle / matched random against N per timing (left), and against the stragglers'
    largest delay at N = 4 (right), for the ``online-forecast`` rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r["agent"] == "online-forecast"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    inst = sorted((r["n"], r["oracle_over_random"]) for r in rows if r["timing"] == "instant")
    a.plot(*zip(*inst, strict=True), "k-o", label="one instant")
    for g in (0.0, 4.5, 9.0, 18.0):
        pts = sorted(
            (r["n"], r["oracle_over_random"])
            for r in rows
            if r["timing"] == "rounds" and r["grace"] == g and r["delay"] == 0.0
        )
        a.plot(*zip(*pts, strict=True), "--o" if g == 0.0 else "-o", label=f"rounds, grace {g:g} s")
    a.set_xscale("log", base=2)
    a.set_xlabel("sites N")
    a.set_ylabel("oracle / matched random (sync-excess)")
    a.set_title("Value of placement: lower is more")
    a.legend(fontsize=8)
    for g in (0.0, 9.0):
        pts = sorted(
            (r["delay"], r["oracle_over_random"])
            for r in rows
            if r["n"] == 4 and r["timing"] == "rounds" and r["grace"] == g
        )
        b.plot(*zip(*pts, strict=True), "-o", label=f"grace {g:g} s")
    b.set_xlabel("largest start delay of every site, s (N = 4)")
    b.set_ylabel("oracle / matched random")
    b.set_title("Stragglers")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
