"""What sealing deployable agents costs a report: wall time and CPU time (this process and
its worker processes together) of the report with agents sealed in their sandboxed
workers, as ratios to the same report with ``--in-process-agents``, both run in this
process, alternating, so that a change in the machine's load hits both.

Usage::

    python benchmarks/sealed_overhead.py                      # the default report (minutes)
    python benchmarks/sealed_overhead.py --seeds 5 --draws 200 --repeats 1
    python benchmarks/sealed_overhead.py --load 6             # with 6 busy processes beside

``--load N`` starts ``N`` processes that spin on the CPU for the whole measurement (a
loaded machine: on 2 cores, load about N); ``--load 0`` (the default) measures a quiet one.
The target is a CPU-time ratio of at most 1.5 at both loads: a sealed worker must not buy
its speed with a core that a loaded machine lacks (it blocks on its socket; it does not
spin). Every row states its configuration.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time

from diloco_gym.eval.report import ReportConfig, run_protocol


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (sealed workers
    end with each report, so a report's workers are counted once it has returned)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _spin(stop) -> None:  # a busy neighbour
    while not stop.is_set():
        pass


def _once(seeds: int, draws: int, regimes: list[str] | None, in_process: bool) -> tuple:
    kw = {"regimes": regimes} if regimes else {}
    cfg = ReportConfig(seeds=seeds, draws=draws, in_process_agents=in_process, **kw)
    c, t = _cpu(), time.perf_counter()
    run_protocol(cfg, progress=False)
    return time.perf_counter() - t, _cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--regimes", nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside (default 0)")
    a = ap.parse_args()
    stop = mp.get_context("fork").Event()
    spinners = [mp.get_context("fork").Process(target=_spin, args=(stop,)) for _ in range(a.load)]
    for p in spinners:
        p.start()
    try:
        inproc, sealed = [], []
        for _ in range(a.repeats):
            inproc.append(_once(a.seeds, a.draws, a.regimes, True))
            sealed.append(_once(a.seeds, a.draws, a.regimes, False))
    finally:
        stop.set()
        for p in spinners:
            p.join()
    conf = (
        f"report: regimes {' '.join(a.regimes) if a.regimes else 'all'}, {a.seeds} seeds, "
        f"{a.draws} draws, default agents, serial backend, {os.cpu_count()} cores, "
        f"{a.load} busy processes beside"
    )
    best_i = (min(w for w, _ in inproc), min(c for _, c in inproc))
    best_s = (min(w for w, _ in sealed), min(c for _, c in sealed))
    print(
        "| configuration | in-process wall / CPU s | sealed wall / CPU s "
        "| sealed / in-process wall | sealed / in-process CPU |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {conf} | {best_i[0]:.1f} / {best_i[1]:.1f} | {best_s[0]:.1f} / {best_s[1]:.1f} "
        f"| {best_s[0] / best_i[0]:.2f} | {best_s[1] / best_i[1]:.2f} |"
    )
    pairs = ", ".join(
        f"{i[0]:.1f}/{i[1]:.1f} vs {s[0]:.1f}/{s[1]:.1f}"
        for i, s in zip(inproc, sealed, strict=True)
    )
    print(f"(best of {a.repeats}; pairs in-process vs sealed, wall/CPU s: {pairs})")


if __name__ == "__main__":
    main()
