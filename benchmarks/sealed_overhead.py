"""Wall time of the report with deployable agents sealed in their own processes, as a ratio
to the same report with ``--in-process-agents``, both run in this process (alternating, so
that a change in the machine's load hits both).

Usage::

    python benchmarks/sealed_overhead.py                      # the default report (minutes)
    python benchmarks/sealed_overhead.py --seeds 5 --draws 200 --repeats 1

Every row states its configuration. The sealed run starts one worker process for the
deployable agents (``spawn``: a fresh interpreter); the agents of a unit step in lockstep,
one message per decision of the episode that any of them is asked (``diloco_gym.eval.
rollout.run_episodes``); the oracle and the scoring are the same in both modes. The ratio
is given per pair (in-process run, then sealed run, back to back) and as the ratio of the
best times.
"""

from __future__ import annotations

import argparse
import time

from diloco_gym.eval.report import ReportConfig, run_protocol


def _once(seeds: int, draws: int, regimes: list[str] | None, in_process: bool) -> float:
    kw = {"regimes": regimes} if regimes else {}
    cfg = ReportConfig(seeds=seeds, draws=draws, in_process_agents=in_process, **kw)
    t = time.perf_counter()
    run_protocol(cfg, progress=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--regimes", nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    conf = (
        f"report: regimes {' '.join(a.regimes) if a.regimes else 'all'}, {a.seeds} seeds, "
        f"{a.draws} draws, default agents, serial backend"
    )
    inproc, sealed = [], []
    for _ in range(a.repeats):
        inproc.append(_once(a.seeds, a.draws, a.regimes, True))
        sealed.append(_once(a.seeds, a.draws, a.regimes, False))
    best_i, best_s = min(inproc), min(sealed)
    pairs = ", ".join(f"{s / i:.2f}" for i, s in zip(inproc, sealed, strict=True))
    print("| configuration | in-process s | sealed s | sealed / in-process (best) | per pair |")
    print("|---|---|---|---|---|")
    print(f"| {conf} | {best_i:.1f} | {best_s:.1f} | {best_s / best_i:.2f} | {pairs} |")
    runs = ", ".join(f"{i:.1f} / {s:.1f}" for i, s in zip(inproc, sealed, strict=True))
    print(f"(best of {a.repeats}; pairs in-process / sealed s: {runs})")


if __name__ == "__main__":
    main()
